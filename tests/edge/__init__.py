"""The SSE edge: Pushpin in front of the web processes, publishing, links and their checks, bin/edge."""

"""Streams and waits a web process serves itself: SSE, resumes, stream limits, LISTEN, runserver."""

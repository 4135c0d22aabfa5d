"""Kept for the stream hub (runs.streaming.hub) until it imports `runs.selectors.wire`, the event
wire format's home (docs/design/streaming.md#wire)."""

from runs.selectors.wire import run_events_frames, sse_frame

__all__ = ["run_events_frames", "sse_frame"]

"""Kept for the stream's wait (runs.streaming.wait) until it imports `runs.selectors.run_json` (docs/design/api.md#run-json)."""

from runs.selectors.run_json import run_with_current_attempt

__all__ = ["run_with_current_attempt"]

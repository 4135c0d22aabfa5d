"""What the CLI writes: agents' text made safe for a terminal, and each result in the format asked
(`-o text|json|jsonl`).

What agents write is not trusted: their text reaches the terminal without control sequences
(`printable`), which could otherwise move the cursor, rewrite what is shown, set the window's
title or, on some terminals, write to files or the clipboard.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from typing import Any, TextIO

# Terminal control sequences, whole (ESC [ … final byte; ESC ] … BEL or ST; ESC P/X/^/_ … ST; ESC
# and what follows it), then any other C0 control but tab and newline, DEL, and the C1 controls
# (U+0080 to U+009F, which some terminals obey as 8-bit ESC sequences).
_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[ -/]*[0-~]?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)
# In JSON text the C0 controls are always escaped; DEL and C1 may come raw.
_RAW_IN_JSON = re.compile(r"[\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` without terminal control sequences: what an agent wrote, safe to show."""
    return _CONTROL.sub("", text)


def printable_json(text: str) -> str:
    """JSON text with DEL and C1 characters escaped (\\u009b): the same JSON value, safe to show."""
    return _RAW_IN_JSON.sub(lambda found: f"\\u{ord(found[0]):04x}", text)


def dumps(value: Any, indent: int | None = None) -> str:
    # ASCII only: any control character an agent put in a value is written as an escape.
    return json.dumps(value, indent=indent, default=str)


def facts(pairs: Iterable[tuple[str, Any]]) -> str:
    """A record for people: a `name: value` line per fact that has a value, made safe to show."""
    return "\n".join(f"{name + ':':<12} {printable(str(value))}" for name, value in pairs if value not in (None, ""))


class Output:
    """Results written as `-o` says: `text` for people; `json`, one JSON value (an object, or an
    array for a command that answers many); `jsonl`, one JSON value per line. The JSON is the API's
    own (its field names), so scripts can rely on them."""

    def __init__(self, format: str, out: TextIO | None = None) -> None:
        self.format = format
        self.out = out or sys.stdout

    @property
    def text(self) -> bool:
        return self.format == "text"

    def one(self, value: Any, text: str) -> None:
        """One result: `text` (already safe to show), or `value` as JSON."""
        if self.format == "text":
            self.line(text)
        else:
            self.line(dumps(value, indent=2 if self.format == "json" else None))

    def many(self, values: Iterable[tuple[Any, str]]) -> None:
        """Many results, each (JSON value, text line), written as they come."""
        if self.format == "json":
            self.line(dumps([value for value, _ in values], indent=2))
            return
        for value, text in values:
            self.line(text if self.format == "text" else dumps(value))

    def deleted(self, name: str, value: str) -> None:
        """What a delete did: the API answers 204 with no body, so scripts get `{name: value, "deleted": true}`."""
        self.one({name: value, "deleted": True}, f"deleted {printable(value)}")

    def line(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

"""The events notifications a web process heard last, whatever run they were for, so a new feed
takes what committed between its opening's read and its start from them rather than from a read
(docs/design/streaming.md#hub-reads).
"""

from collections import deque

# The most notes kept, and characters of their payloads (a payload is at most 8,000 bytes): at a busy
# moment a few tens of milliseconds of notes, far more than an opening takes.
NOTES = 2000
NOTES_CHARACTERS = 1_000_000


class RecentNotes:
    """The last notes heard, numbered as heard, with what it takes to vouch for them: every note
    numbered above `complete_after` is kept, or None when they are not (the listener is down)."""

    def __init__(self, *, notes: int = NOTES, size: int = NOTES_CHARACTERS) -> None:
        self.notes = notes
        self.size = size
        self.heard = 0
        self.complete_after: int | None = None
        self._order: deque[tuple[int, str, int]] = deque()  # (number, run_id, characters), oldest first
        self._runs: dict[str, deque[tuple[int, int, str]]] = {}  # run_id: (number, seq, payload)
        self._characters = 0

    def connected(self) -> None:
        """Listening (again): what was sent before now was heard, or lost with the connection — so
        no mark read before now vouches for anything (the count moves on as if a note came)."""
        self.heard += 1
        self.complete_after = self.heard

    def disconnected(self) -> None:
        self.complete_after = None

    def mark(self) -> int | None:
        """Where the notes stand, read before a read of the table (from any thread: a count is read
        whole); None if they cannot be vouched for."""
        return None if self.complete_after is None else self.heard

    def add(self, run_id: str, seq: int, payload: str) -> None:
        self.heard += 1
        self._order.append((self.heard, run_id, len(payload)))
        self._runs.setdefault(run_id, deque()).append((self.heard, seq, payload))
        self._characters += len(payload)
        while len(self._order) > self.notes or self._characters > self.size:
            number, dropped, size = self._order.popleft()
            kept = self._runs[dropped]
            kept.popleft()
            if not kept:
                del self._runs[dropped]
            self._characters -= size
            if self.complete_after is not None:
                self.complete_after = max(self.complete_after, number)

    def after(self, run_id: str, seq: int, mark: int | None) -> list[tuple[int, str]] | None:
        """`run_id`'s notes heard since `mark` that go past `seq`, oldest first, as (the seq it got
        to, payload) — every such note heard so far — or None if that cannot be vouched for (not
        listening all the while since, or one of them dropped)."""
        if mark is None or self.complete_after is None or self.complete_after > mark:
            return None
        return [(last, payload) for number, last, payload in self._runs.get(run_id, ()) if number > mark and last > seq]

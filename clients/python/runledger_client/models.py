"""What the API answers, as small typed views over its JSON: a run, an event, a page of events.

Each keeps the JSON it was made from (`Run.data`, `Event.object`), so nothing the server sends is
lost to a field this client does not know yet.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled", "stopped"})
TERMINAL_EVENT_TYPES = frozenset({"run.completed", "run.failed", "run.cancelled", "run.stopped"})


@dataclass(frozen=True)
class Run:
    """A run as the API returned it (docs/design/api.md#run-json); `data` is the whole JSON
    object."""

    data: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def status(self) -> str:
        return str(self.data["status"])

    @property
    def metadata(self) -> dict[str, str]:
        """Your labels, as given at create (or the parent's, for a child run)."""
        metadata = self.data.get("metadata")
        return dict(metadata) if isinstance(metadata, dict) else {}

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def last_seq(self) -> int:
        return int(self.data.get("last_seq") or 0)

    @property
    def end_code(self) -> str:
        return str(self.data.get("end_code") or "")

    @property
    def output(self) -> Any:
        return self.data.get("output")

    @property
    def partial_output(self) -> dict[str, Any] | None:
        """What a run that ended failed, cancelled or stopped had produced (by default
        `{"text": ...}`, its deltas' text), or None; a run read by itself only (`get`), never in a
        list. A completed run's result is `output`."""
        partial = self.data.get("partial_output")
        return partial if isinstance(partial, dict) else None

    @property
    def usage(self) -> dict[str, Any]:
        """What the run used: `steps`, `events`, and its agent's counters (e.g. `input_tokens`),
        summed; `incomplete` true when the agent could not learn them all."""
        usage = self.data.get("usage")
        return dict(usage) if isinstance(usage, dict) else {}

    @property
    def max_steps(self) -> int | None:
        return _count_or_none(self.data.get("max_steps"))

    @property
    def steps_used(self) -> int:
        """The agent's steps so far, across attempts, counted against `max_steps`."""
        return int(self.data.get("steps_used") or 0)

    @property
    def max_events(self) -> int | None:
        return _count_or_none(self.data.get("max_events"))

    @property
    def events_used(self) -> int:
        """The events counted against `max_events`, across attempts: the agent's, and those a pause,
        resume, cancel or stop wrote (a cancel or stop may pass the budget)."""
        return int(self.data.get("events_used") or 0)

    @property
    def resume_ticket(self) -> str | None:
        """Present for the owner and holders of runs.change_run while the run is waiting."""
        ticket = self.data.get("resume_ticket")
        return None if ticket is None else str(ticket)

    @property
    def attempt(self) -> dict[str, Any] | None:
        """The current attempt (generation, worker, lease, `released_at`, `outcome`), or None."""
        attempt = self.data.get("attempt")
        return attempt if isinstance(attempt, dict) else None

    @property
    def truncated(self) -> tuple[str, ...]:
        """What a list left out of this run because it was big — `input`, `output`, `error` (null
        here) — or cut (`end_reason`); empty for a run read by itself (`get`), which has them whole."""
        return tuple(str(name) for name in self.data.get("truncated") or ())

    @property
    def released(self) -> bool:
        """No worker executes the run any more: it has no attempt, or its attempt was released."""
        return self.attempt is None or self.attempt.get("released_at") is not None


def _count_or_none(value: Any) -> int | None:
    # A budget is a count, or null for none.
    return None if value is None else int(value)


@dataclass(frozen=True, slots=True)
class Event:
    """One event of a run (docs/design/events.md#event-object). `object` is the event object as the
    API sent it, and `text` its JSON text (verbatim from a stream's `data:` line)."""

    seq: int
    type: str
    data: dict[str, Any]
    created_at: str
    attempt: int | None
    object: dict[str, Any]
    text: str

    @property
    def is_terminal(self) -> bool:
        return self.type in TERMINAL_EVENT_TYPES

    @classmethod
    def from_object(cls, obj: dict[str, Any], text: str | None = None) -> Event:
        return cls(
            seq=int(obj["seq"]),
            type=str(obj["type"]),
            data=obj.get("data") or {},
            created_at=str(obj.get("created_at")),
            attempt=obj.get("attempt"),
            object=obj,
            text=json.dumps(obj, separators=(",", ":")) if text is None else text,
        )

    @classmethod
    def from_json(cls, text: str) -> Event:
        return cls.from_object(json.loads(text), text)


@dataclass(frozen=True)
class EventPage:
    """`GET /api/runs/{id}/events/`: events with seq > after_seq, and where to continue."""

    events: list[Event]
    next_after_seq: int
    last_seq: int
    run_status: str
    end_of_stream: bool

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> EventPage:
        return cls(
            events=[Event.from_object(obj) for obj in body["results"]],
            next_after_seq=int(body["next_after_seq"]),
            last_seq=int(body["last_seq"]),
            run_status=str(body["run_status"]),
            end_of_stream=bool(body["end_of_stream"]),
        )


@dataclass(frozen=True)
class RunPage:
    """A page of `GET /api/runs/`: its runs, and the full URLs of the pages after and before it
    (None at either end), each with an opaque `cursor`."""

    runs: list[Run]
    next: str | None
    previous: str | None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> RunPage:
        return cls(
            runs=[Run(item) for item in body["results"]],
            next=None if body.get("next") is None else str(body["next"]),
            previous=None if body.get("previous") is None else str(body["previous"]),
        )


@dataclass(frozen=True)
class BulkResult:
    """What `cancel_where` or `stop_where` did (docs/design/commands.md#bulk-commands): `matched`
    runs, and by outcome — `cancelled` or `stopped` (by this command), `already_ended`,
    `no_longer_matching`, `forbidden`, `gone` — how many (`counts`) and which (`ids`)."""

    matched: int
    counts: dict[str, int]
    ids: dict[str, list[str]]

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> BulkResult:
        return cls(
            matched=int(body["matched"]),
            counts={str(k): int(v) for k, v in body["counts"].items()},
            ids={str(k): [str(i) for i in v] for k, v in body["ids"].items()},
        )

"""What the API answers, as plain typed classes: `Run`, `Attempt`, `Event`, `Agent`, `Schedule`,
`Webhook`, `WebhookDelivery`, and the pages and results that carry them.

Each model has one attribute per field of its OpenAPI component (`SCHEMA`; the suite checks them
against the schema the server serves), and keeps the JSON it was made from (`Run.data`,
`Event.object`): a field a newer server adds is not lost, and never breaks parsing.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled", "stopped"})
TERMINAL_EVENT_TYPES = frozenset({"run.completed", "run.failed", "run.cancelled", "run.stopped"})


def timestamp(value: Any) -> datetime | None:
    """An ISO 8601 time as the API writes it; None for null (or text that is not one)."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def api_fields(model: type) -> list[str]:
    """The names of `model`'s fields that come from the API (not those the client adds)."""
    local = getattr(model, "LOCAL_FIELDS", ())
    return [f.name for f in dataclasses.fields(model) if f.name not in local]


@dataclass(frozen=True)
class Attempt:
    """A run's current attempt (docs/design/execution.md): which worker holds it, its lease, and
    when it was released (the worker stopped executing it) with which `outcome`."""

    SCHEMA: ClassVar[tuple[str, ...]] = ("AttemptOutput",)
    LOCAL_FIELDS: ClassVar[tuple[str, ...]] = ("data",)

    generation: int
    worker: str
    claimed_at: datetime | None
    heartbeat_at: datetime | None
    lease_expires_at: datetime | None
    released_at: datetime | None
    outcome: str
    data: dict[str, Any] = field(repr=False, compare=False)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Attempt:
        return cls(
            generation=int(body.get("generation") or 0),
            worker=str(body.get("worker") or ""),
            claimed_at=timestamp(body.get("claimed_at")),
            heartbeat_at=timestamp(body.get("heartbeat_at")),
            lease_expires_at=timestamp(body.get("lease_expires_at")),
            released_at=timestamp(body.get("released_at")),
            outcome=str(body.get("outcome") or ""),
            data=body,
        )


@dataclass(frozen=True)
class RunSchedule:
    """The schedule that created a run (`Run.schedule`), and the due time it was created for."""

    SCHEMA: ClassVar[tuple[str, ...]] = ("RunSchedule",)
    LOCAL_FIELDS: ClassVar[tuple[str, ...]] = ()

    id: str
    due_at: datetime | None

    @classmethod
    def from_body(cls, body: Any) -> RunSchedule | None:
        return cls(id=str(body["id"]), due_at=timestamp(body.get("due_at"))) if isinstance(body, dict) else None


@dataclass(frozen=True)
class Run:
    """A run (docs/design/api.md#run-json). `data` is the JSON object the API sent, whole;
    `run["field"]` reads it."""

    SCHEMA: ClassVar[tuple[str, ...]] = ("RunOutput", "RunListItem")
    LOCAL_FIELDS: ClassVar[tuple[str, ...]] = ("data",)

    id: str
    agent: str
    status: str
    owner: str
    input: dict[str, Any] | None
    output: Any
    # What a run that ended failed, cancelled or stopped had produced (by default `{"text": ...}`,
    # its deltas' text), or None; a run read by itself only (`get`), never in a list.
    partial_output: dict[str, Any] | None
    error: Any
    metadata: dict[str, str]
    parent: str | None
    rerun_of: str | None
    # The schedule that created it and the due time it fired for; None for a run created otherwise.
    schedule: RunSchedule | None
    priority: int
    created_at: datetime | None
    start_after: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    deadline: datetime | None
    end_code: str
    end_reason: str
    ended_by: str
    last_seq: int
    max_steps: int | None
    steps_used: int
    max_events: int | None
    events_used: int
    # What the run used: `steps`, `events`, and its agent's counters (e.g. `input_tokens`), summed;
    # `incomplete` true when the agent could not learn them all.
    usage: dict[str, Any]
    max_attempts: int | None
    lost_attempts: int
    # Present for the owner and holders of runs.change_run while the run is waiting.
    resume_ticket: str | None
    attempt: Attempt | None
    # What a list left out of this run because it was big (`input`, `output`, `error`: None here)
    # or cut (`end_reason`); empty for a run read by itself (`get`), which has them whole.
    truncated: tuple[str, ...]
    data: dict[str, Any] = field(repr=False, compare=False)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def released(self) -> bool:
        """No worker executes the run any more: it has no attempt, or its attempt was released."""
        return self.attempt is None or self.attempt.released_at is not None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Run:
        attempt = body.get("attempt")
        metadata = body.get("metadata")
        return cls(
            id=str(body["id"]),
            agent=str(body.get("agent") or ""),
            status=str(body.get("status") or ""),
            owner=str(body.get("owner") or ""),
            input=body.get("input"),
            output=body.get("output"),
            partial_output=partial if isinstance(partial := body.get("partial_output"), dict) else None,
            error=body.get("error"),
            metadata=dict(metadata) if isinstance(metadata, dict) else {},
            parent=_str_or_none(body.get("parent")),
            rerun_of=_str_or_none(body.get("rerun_of")),
            schedule=RunSchedule.from_body(body.get("schedule")),
            priority=int(body.get("priority") or 0),
            created_at=timestamp(body.get("created_at")),
            start_after=timestamp(body.get("start_after")),
            started_at=timestamp(body.get("started_at")),
            ended_at=timestamp(body.get("ended_at")),
            deadline=timestamp(body.get("deadline")),
            end_code=str(body.get("end_code") or ""),
            end_reason=str(body.get("end_reason") or ""),
            ended_by=str(body.get("ended_by") or ""),
            last_seq=int(body.get("last_seq") or 0),
            max_steps=_int_or_none(body.get("max_steps")),
            steps_used=int(body.get("steps_used") or 0),
            max_events=_int_or_none(body.get("max_events")),
            events_used=int(body.get("events_used") or 0),
            usage=dict(usage) if isinstance(usage := body.get("usage"), dict) else {},
            max_attempts=_int_or_none(body.get("max_attempts")),
            lost_attempts=int(body.get("lost_attempts") or 0),
            resume_ticket=_str_or_none(body.get("resume_ticket")),
            attempt=Attempt.from_body(attempt) if isinstance(attempt, dict) else None,
            truncated=tuple(str(name) for name in body.get("truncated") or ()),
            data=body,
        )


@dataclass(frozen=True, slots=True)
class Event:
    """One event of a run (docs/design/events.md#event-object). `object` is the event object as the
    API sent it, and `text` its JSON text (verbatim from a stream's `data:` line)."""

    SCHEMA: ClassVar[tuple[str, ...]] = ("EventOutput",)
    LOCAL_FIELDS: ClassVar[tuple[str, ...]] = ("object", "text")

    seq: int
    type: str
    data: dict[str, Any]
    created_at: datetime | None
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
            created_at=timestamp(obj.get("created_at")),
            attempt=obj.get("attempt"),
            object=obj,
            text=json.dumps(obj, separators=(",", ":")) if text is None else text,
        )

    @classmethod
    def from_json(cls, text: str) -> Event:
        return cls.from_object(json.loads(text), text)


@dataclass(frozen=True)
class Agent:
    """A registered agent a run may name, and the event types of its own it declared."""

    SCHEMA: ClassVar[tuple[str, ...]] = ("Agent",)
    LOCAL_FIELDS: ClassVar[tuple[str, ...]] = ("data",)

    name: str
    event_types: tuple[str, ...]
    data: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Agent:
        return cls(name=str(body["name"]), event_types=tuple(str(t) for t in body.get("event_types") or ()), data=body)


@dataclass(frozen=True)
class EventPage:
    """`GET /api/runs/{id}/events/`: events with seq > after_seq, and where to continue."""

    SCHEMA: ClassVar[tuple[str, ...]] = ("RunEventsPage",)
    LOCAL_FIELDS: ClassVar[tuple[str, ...]] = ()

    results: list[Event]
    next_after_seq: int
    last_seq: int
    run_status: str
    end_of_stream: bool

    @property
    def events(self) -> list[Event]:
        return self.results

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> EventPage:
        return cls(
            results=[Event.from_object(obj) for obj in body["results"]],
            next_after_seq=int(body["next_after_seq"]),
            last_seq=int(body["last_seq"]),
            run_status=str(body["run_status"]),
            end_of_stream=bool(body["end_of_stream"]),
        )


@dataclass(frozen=True)
class Page:
    """A page of a list (`GET /api/runs/`, `/api/agents/`, `/api/webhooks/`, …): its `results`, and the full URLs of
    the pages after and before it (None at either end), each with an opaque `cursor`."""

    SCHEMA: ClassVar[tuple[str, ...]] = (
        "RunPage",
        "AgentPage",
        "SchedulePage",
        "WebhookEndpointPage",
        "WebhookDeliveryPage",
        "ApiTokenPage",
    )
    LOCAL_FIELDS: ClassVar[tuple[str, ...]] = ()

    results: list[Any]
    next: str | None
    previous: str | None

    @classmethod
    def parser(cls, item: Any) -> Any:
        def parse(body: dict[str, Any]) -> Page:
            return cls(
                results=[item(obj) for obj in body["results"]],
                next=_str_or_none(body.get("next")),
                previous=_str_or_none(body.get("previous")),
            )

        return parse


class RunPage(Page):
    """A page of `GET /api/runs/` (`runs`: its `results`)."""

    @property
    def runs(self) -> list[Run]:
        return self.results

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> RunPage:
        page: RunPage = cls.parser(Run.from_body)(body)
        return page


@dataclass(frozen=True)
class BulkResult:
    """What `cancel_where` or `stop_where` did (docs/design/commands.md#bulk-commands): `matched`
    runs, and by outcome — `cancelled` or `stopped` (by this command), `already_ended`,
    `no_longer_matching`, `forbidden`, `gone` — how many (`counts`) and which (`ids`)."""

    SCHEMA: ClassVar[tuple[str, ...]] = ("RunBulkCancelled", "RunBulkStopped")
    LOCAL_FIELDS: ClassVar[tuple[str, ...]] = ()

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

    def as_json(self) -> dict[str, Any]:
        return {"matched": self.matched, "counts": self.counts, "ids": self.ids}


@dataclass(frozen=True)
class ScheduleLastRun:
    """The last run a schedule created: its id and status (a schedule's `last_run`)."""

    SCHEMA: ClassVar[tuple[str, ...]] = ("ScheduleLastRun",)
    LOCAL_FIELDS: ClassVar[tuple[str, ...]] = ()

    id: str
    status: str

    @classmethod
    def from_body(cls, body: Any) -> ScheduleLastRun | None:
        return cls(id=str(body["id"]), status=str(body.get("status") or "")) if isinstance(body, dict) else None


@dataclass(frozen=True)
class Schedule:
    """A schedule (docs/design/schedules.md): a run of `agent` with `input` created at each due
    time of `cron` (read in `timezone`) or of every `every_seconds` — exactly one run per due time.
    `next_due_at` is None while nothing more is due (past `end_at`)."""

    SCHEMA: ClassVar[tuple[str, ...]] = ("Schedule",)
    LOCAL_FIELDS: ClassVar[tuple[str, ...]] = ("data",)

    id: str
    agent: str
    input: dict[str, Any]
    metadata: dict[str, str]
    priority: int
    # One of the two: a cron expression (five fields, or a macro such as @daily), or an interval.
    cron: str
    every_seconds: int | None
    timezone: str
    # skip, buffer_one, allow_all or cancel_other: what a due time does while the last run is live.
    overlap: str
    catchup_window_seconds: int
    start_at: datetime | None
    end_at: datetime | None
    paused: bool
    next_due_at: datetime | None
    last_run: ScheduleLastRun | None
    created_at: datetime | None
    updated_at: datetime | None
    data: dict[str, Any] = field(repr=False, compare=False)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Schedule:
        metadata = body.get("metadata")
        return cls(
            id=str(body["id"]),
            agent=str(body.get("agent") or ""),
            input=dict(given) if isinstance(given := body.get("input"), dict) else {},
            metadata={str(k): str(v) for k, v in metadata.items()} if isinstance(metadata, dict) else {},
            priority=int(body.get("priority") or 0),
            cron=str(body.get("cron") or ""),
            every_seconds=_int_or_none(body.get("every_seconds")),
            timezone=str(body.get("timezone") or "UTC"),
            overlap=str(body.get("overlap") or ""),
            catchup_window_seconds=int(body.get("catchup_window_seconds") or 0),
            start_at=timestamp(body.get("start_at")),
            end_at=timestamp(body.get("end_at")),
            paused=bool(body.get("paused")),
            next_due_at=timestamp(body.get("next_due_at")),
            last_run=ScheduleLastRun.from_body(body.get("last_run")),
            created_at=timestamp(body.get("created_at")),
            updated_at=timestamp(body.get("updated_at")),
            data=body,
        )


@dataclass(frozen=True)
class Webhook:
    """A webhook endpoint (docs/design/webhooks.md#endpoints): where Runledger POSTs a signed
    notification when one of `events` happens to a run its owner (or, with `all_runs`, anyone) has,
    whose metadata holds all of `metadata`. `secret` (`whsec_…`) is there only in the answer of
    `create` and `rotate_secret`: the server never shows it again."""

    SCHEMA: ClassVar[tuple[str, ...]] = ("WebhookEndpoint", "WebhookEndpointWithSecret")
    LOCAL_FIELDS: ClassVar[tuple[str, ...]] = ("data",)

    id: str
    url: str
    events: tuple[str, ...]
    metadata: dict[str, str]
    all_runs: bool
    enabled: bool
    # Why Runledger disabled it (every delivery failing for long); empty otherwise.
    disabled_reason: str
    failing_since: datetime | None
    owner: str
    created_at: datetime | None
    updated_at: datetime | None
    # Until then deliveries are signed with the rotated-out secret too.
    previous_secret_expires_at: datetime | None
    secret: str | None
    data: dict[str, Any] = field(repr=False, compare=False)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Webhook:
        metadata = body.get("metadata")
        return cls(
            id=str(body["id"]),
            url=str(body.get("url") or ""),
            events=tuple(str(event) for event in body.get("events") or ()),
            metadata={str(k): str(v) for k, v in metadata.items()} if isinstance(metadata, dict) else {},
            all_runs=bool(body.get("all_runs")),
            enabled=bool(body.get("enabled")),
            disabled_reason=str(body.get("disabled_reason") or ""),
            failing_since=timestamp(body.get("failing_since")),
            owner=str(body.get("owner") or ""),
            created_at=timestamp(body.get("created_at")),
            updated_at=timestamp(body.get("updated_at")),
            previous_secret_expires_at=timestamp(body.get("previous_secret_expires_at")),
            secret=_str_or_none(body.get("secret")),
            data=body,
        )


@dataclass(frozen=True)
class WebhookDelivery:
    """One notification to an endpoint (docs/design/webhooks.md#delivery): its `id` is the
    `webhook-id` of every attempt; `status` pending, delivered or failed (given up)."""

    SCHEMA: ClassVar[tuple[str, ...]] = ("WebhookDelivery",)
    LOCAL_FIELDS: ClassVar[tuple[str, ...]] = ("data",)

    id: str
    run_id: str
    seq: int
    event_type: str
    status: str
    attempts: int
    next_attempt_at: datetime | None
    created_at: datetime | None
    delivered_at: datetime | None
    last_error: str
    data: dict[str, Any] = field(repr=False, compare=False)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> WebhookDelivery:
        return cls(
            id=str(body["id"]),
            run_id=str(body.get("run_id") or ""),
            seq=int(body.get("seq") or 0),
            event_type=str(body.get("event_type") or ""),
            status=str(body.get("status") or ""),
            attempts=int(body.get("attempts") or 0),
            next_attempt_at=timestamp(body.get("next_attempt_at")),
            created_at=timestamp(body.get("created_at")),
            delivered_at=timestamp(body.get("delivered_at")),
            last_error=str(body.get("last_error") or ""),
            data=body,
        )


@dataclass(frozen=True)
class ApiToken:
    """An API token of yours (docs/design/api.md#tokens). `key` is there only in the answer of
    `create` — the server keeps its digest, never the key — and never in a repr."""

    SCHEMA: ClassVar[tuple[str, ...]] = ("ApiToken", "ApiTokenWithKey")
    LOCAL_FIELDS: ClassVar[tuple[str, ...]] = ("data",)

    name: str
    created_at: datetime | None
    # None: never.
    expires_at: datetime | None
    # None: never used; up to a minute behind (the server writes it at most once a minute).
    last_used_at: datetime | None
    # The token whose request issued this one: it expires no later, and is revoked with it.
    issued_by: str | None
    key: str | None = field(repr=False)
    data: dict[str, Any] = field(repr=False, compare=False)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> ApiToken:
        return cls(
            name=str(body.get("name") or ""),
            created_at=timestamp(body.get("created_at")),
            expires_at=timestamp(body.get("expires_at")),
            last_used_at=timestamp(body.get("last_used_at")),
            issued_by=_str_or_none(body.get("issued_by")),
            key=_str_or_none(body.get("key")),
            data=body,
        )

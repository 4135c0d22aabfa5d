"""What the API answers, as plain typed classes: `Run`, `Attempt`, `Event`, `Agent`, `Schedule`,
`Webhook`, `WebhookDelivery`, and the pages and results that carry them.

Each model has one attribute per field of its OpenAPI component (`SCHEMA`; the suite checks them
against the schema the server serves), and keeps the JSON it was made from (`Run.data`,
`Event.object`): a field a newer server adds is not lost, and never breaks parsing.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Self

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
    return [name for name, _ in _declared(model)]


def _declared(model: type) -> Iterator[tuple[str, str]]:
    """`model`'s API fields and their declared types, as written (this module's annotations are text)."""
    local = getattr(model, "LOCAL_FIELDS", ())
    return ((f.name, str(f.type)) for f in dataclasses.fields(model) if f.name not in local)


@dataclass(frozen=True)
class Model:
    """What each model read from an API object shares: `data` is that object, whole, and
    `model["field"]` reads it; `from_body` reads each of its API fields by the field's declared type
    (`READERS`): a missing or null value is that type's empty value, but for the `REQUIRED` ones.
    `SCHEMA` names the OpenAPI components the model reads."""

    SCHEMA: ClassVar[tuple[str, ...]]
    LOCAL_FIELDS: ClassVar[tuple[str, ...]] = ("data",)
    REQUIRED: ClassVar[tuple[str, ...]] = ()
    _PLAN: ClassVar[tuple[tuple[str, Callable[[Any], Any], bool], ...]]
    # Keyword-only, so that each model's own fields, declared after it, may be required.
    data: dict[str, Any] = field(repr=False, compare=False, kw_only=True)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Self:
        read = {name: reader(body[name] if required else body.get(name)) for name, reader, required in cls._plan()}
        return cls(**read, data=body)

    @classmethod
    def _plan(cls) -> tuple[tuple[str, Callable[[Any], Any], bool], ...]:
        """Each API field's name, reader and whether it is required: worked out once per model."""
        if "_PLAN" not in cls.__dict__:
            cls._PLAN = tuple((name, READERS[kind], name in cls.REQUIRED) for name, kind in _declared(cls))
        return cls._PLAN


@dataclass(frozen=True)
class Attempt(Model):
    """A run's current attempt (docs/design/execution.md): which worker holds it, its lease, and
    when it was released (the worker stopped executing it) with which `outcome`."""

    SCHEMA = ("AttemptOutput",)

    generation: int
    worker: str
    claimed_at: datetime | None
    heartbeat_at: datetime | None
    lease_expires_at: datetime | None
    released_at: datetime | None
    outcome: str


@dataclass(frozen=True)
class RunSchedule(Model):
    """The schedule that created a run (`Run.schedule`), and the due time it was created for."""

    SCHEMA = ("RunSchedule",)
    REQUIRED = ("id",)

    id: str
    due_at: datetime | None


@dataclass(frozen=True)
class ScheduleLastRun(Model):
    """The last run a schedule created: its id and status (a schedule's `last_run`)."""

    SCHEMA = ("ScheduleLastRun",)
    REQUIRED = ("id",)

    id: str
    status: str


def _object_or_none(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _held(model: type[Model]) -> Callable[[Any], Any]:
    """The reader of an object a model holds (a run's attempt): that model, or None for null."""
    return lambda value: model.from_body(value) if isinstance(value, dict) else None


# How `Model.from_body` reads a field of each declared type.
READERS: dict[str, Callable[[Any], Any]] = {
    "str": lambda value: str(value or ""),
    "int": lambda value: int(value or 0),
    "bool": bool,
    "str | None": _str_or_none,
    "int | None": _int_or_none,
    "datetime | None": timestamp,
    "tuple[str, ...]": lambda value: tuple(str(item) for item in value or ()),
    "dict[str, str]": lambda value: {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {},
    "dict[str, Any]": lambda value: dict(value) if isinstance(value, dict) else {},
    "dict[str, Any] | None": _object_or_none,
    "Any": lambda value: value,
    "Attempt | None": _held(Attempt),
    "RunSchedule | None": _held(RunSchedule),
    "ScheduleLastRun | None": _held(ScheduleLastRun),
}


@dataclass(frozen=True)
class Run(Model):
    """A run (docs/design/api.md#run-json). `data` is the JSON object the API sent, whole;
    `run["field"]` reads it."""

    SCHEMA = ("RunOutput", "RunListItem")
    REQUIRED = ("id",)

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

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def released(self) -> bool:
        """No worker executes the run any more: it has no attempt, or its attempt was released."""
        return self.attempt is None or self.attempt.released_at is not None


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
class Agent(Model):
    """A registered agent a run may name, and the event types of its own it declared."""

    SCHEMA = ("Agent",)
    REQUIRED = ("name",)

    name: str
    event_types: tuple[str, ...]


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
class Schedule(Model):
    """A schedule (docs/design/schedules.md): a run of `agent` with `input` created at each due
    time of `cron` (read in `timezone`) or of every `every_seconds` — exactly one run per due time.
    `next_due_at` is None while nothing more is due (past `end_at`)."""

    SCHEMA = ("Schedule",)
    REQUIRED = ("id",)

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


@dataclass(frozen=True)
class Webhook(Model):
    """A webhook endpoint (docs/design/webhooks.md#endpoints): where Runledger POSTs a signed
    notification when one of `events` happens to a run its owner (or, with `all_runs`, anyone) has,
    whose metadata holds all of `metadata`. `secret` (`whsec_…`) is there only in the answer of
    `create` and `rotate_secret`: the server never shows it again."""

    SCHEMA = ("WebhookEndpoint", "WebhookEndpointWithSecret")
    REQUIRED = ("id",)

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


@dataclass(frozen=True)
class WebhookDelivery(Model):
    """One notification to an endpoint (docs/design/webhooks.md#delivery): its `id` is the
    `webhook-id` of every attempt; `status` pending, delivered or failed (given up)."""

    SCHEMA = ("WebhookDelivery",)
    REQUIRED = ("id",)

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


@dataclass(frozen=True)
class ApiToken(Model):
    """An API token of yours (docs/design/api.md#tokens). `key` is there only in the answer of
    `create` — the server keeps its digest, never the key — and never in a repr."""

    SCHEMA = ("ApiToken", "ApiTokenWithKey")

    name: str
    created_at: datetime | None
    # None: never.
    expires_at: datetime | None
    # None: never used; up to a minute behind (the server writes it at most once a minute).
    last_used_at: datetime | None
    # The token whose request issued this one: it expires no later, and is revoked with it.
    issued_by: str | None
    key: str | None = field(repr=False)

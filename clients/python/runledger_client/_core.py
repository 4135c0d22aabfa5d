"""What the sync and async clients share, free of I/O: each API operation as a `Call` (the request
and how to read its answer), the retry policy, and the operations that take several requests —
`sending()` (a call's retries, as `Attempts` decides) and `wait()` — as steps.

A client only does each step (one try of a call, a sleep, a stream followed) and hands back what
it gave (`Driving`).
"""

from __future__ import annotations

import functools
import random
import time
import uuid
import warnings
from collections.abc import Callable, Container, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Generic, TypedDict, TypeVar
from urllib.parse import parse_qsl, quote, urlsplit

import httpx

from runledger_client.errors import TransportError, error_from, retry_after
from runledger_client.models import (
    Agent,
    ApiToken,
    BulkResult,
    EventPage,
    Page,
    Run,
    RunPage,
    Schedule,
    Webhook,
    WebhookDelivery,
)

__version__ = "0.2.0"

T = TypeVar("T")

# What the server may answer when it will be back soon; a call that is safe to repeat is retried.
TRANSIENT_STATUSES = frozenset({502, 503, 504})


def default_headers(token: str) -> dict[str, str]:
    return {
        "Authorization": f"Token {token}",
        "Accept": "application/json",
        "User-Agent": f"runledger-client/{__version__}",
    }


@dataclass(frozen=True)
class Retry:
    """How hard the client tries before it raises.

    A request that is safe to repeat (all of the API's: GETs, `create` with its Idempotency-Key,
    and the commands, which the server makes idempotent) is sent up to `attempts` times when the
    connection fails or the server answers 502/503/504. A stream reconnects after every drop; it
    gives up after `stream_attempts` connects in a row that the server did not accept. Waits double
    from `base` up to `cap` seconds, times a random 1-1.5 (so clients that lost one server do not
    all come back at once), and are never shorter than a `Retry-After` the server gave.
    """

    attempts: int = 5
    stream_attempts: int = 20
    base: float = 0.2
    cap: float = 5.0

    def backoff(self, failures: int, floor: float = 0.0) -> float:
        """The wait after `failures` (>= 1) failures in a row; `floor` is where the doubling starts
        when it is above `base` (a stream's `retry:`)."""
        start = max(self.base, floor)
        return jittered(min(max(self.cap, floor), start * 2 ** (failures - 1)))


class ClientOptions(TypedDict, total=False):
    """The options of `Client` and `AsyncClient`."""

    timeout: float  # seconds a request may take (default 30)
    # The longest wait for a stream's next bytes (default 60; the server sends a keep-alive every
    # 15 s); past it the connection counts as dropped, and the stream reconnects.
    stream_timeout: float
    retry: Retry
    # Tries after the first one (default 4): `Retry.attempts` - 1, as other SDKs spell it.
    max_retries: int


class Config:
    """What a client holds besides its connections: the server, its options, the httpx settings."""

    def __init__(self, url: str, token: str, options: ClientOptions) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.retry = options.get("retry") or Retry()
        if "max_retries" in options:
            self.retry = replace(self.retry, attempts=max(1, options["max_retries"] + 1))
        self.timeout = options.get("timeout", 30.0)
        self.stream_timeout = options.get("stream_timeout", 60.0)
        self.http: dict[str, Any] = {"base_url": self.url, "headers": default_headers(token), "timeout": self.timeout}

    def with_options(self, options: ClientOptions) -> Config:
        """This configuration with `options` changed (`with_options()`: per call, same connections)."""
        current: ClientOptions = {"timeout": self.timeout, "stream_timeout": self.stream_timeout, "retry": self.retry}
        return Config(self.url, self.token, {**current, **options})

    def stream_timeouts(self, read: float) -> httpx.Timeout:
        return httpx.Timeout(self.timeout, read=read)


def jittered(seconds: float) -> float:
    return seconds * (1 + random.random() / 2)


def past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def remaining(deadline: float | None, default: float) -> float:
    """`default`, or less when `deadline` (a time.monotonic()) comes sooner."""
    return default if deadline is None else max(0.0, min(default, deadline - time.monotonic()))


class CreateOptions(TypedDict, total=False):
    """`create()`'s options (docs/design/api.md#create): your labels (`metadata`, string to
    string), a parent run, budgets, an absolute deadline, a priority among your own queued runs and
    a time before which it does not start (docs/design/fair-use.md#priority)."""

    metadata: Mapping[str, str]
    parent: str
    max_steps: int
    max_events: int
    max_attempts: int
    deadline: datetime | str
    priority: int
    start_after: datetime | str


class RerunOptions(TypedDict, total=False):
    """`rerun()`'s overrides of the original's agent, input, budgets and labels (`metadata`), and a
    deadline (an absolute time, never copied from the original)."""

    agent: str
    input: dict[str, Any]
    max_steps: int
    max_events: int
    max_attempts: int
    deadline: datetime | str
    metadata: Mapping[str, str]


class RunMatch(TypedDict, total=False):
    """Which runs: the run list's filters, all of which must hold — `status` and `end_code` one
    value or several (any of them), `metadata` every key with its value; `created_after` is
    inclusive, `created_before` exclusive."""

    status: str | Sequence[str]
    end_code: str | Sequence[str]
    metadata: Mapping[str, str]
    agent: str
    parent: str
    # The runs a schedule created (its id).
    schedule: str
    created_after: datetime | str
    created_before: datetime | str


class RunFilters(RunMatch, total=False):
    """`list()`'s filters (`RunMatch`) and its page size."""

    page_size: int


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API request and how to read its answer: a status in `ok` is parsed with `parse`,
    anything else raises the typed error of its code."""

    method: str
    path: str
    parse: Callable[[Any], T]
    params: dict[str, str] | None = None
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    ok: Container[int] = (200,)
    idempotent: bool = True
    # Seconds the request may take, when not the client's `timeout` (a server-side wait).
    timeout: float | None = None

    def result(self, response: httpx.Response) -> T:
        if response.status_code not in self.ok:
            raise error_from(response)
        return self.parse(response.json() if response.content else None)

    def request_args(self) -> dict[str, Any]:
        args = {"params": self.params, "json": self.json, "content": self.content, "headers": self.headers}
        return args if self.timeout is None else args | {"timeout": self.timeout}


class Attempts:
    """The retry loop of one call: after each failure, how long to wait before the next try, or
    (out of tries, or a call that is not safe to repeat) the error to raise."""

    def __init__(self, call: Call[Any], retry: Retry) -> None:
        self.call = call
        self.retry = retry
        self.failures = 0

    def after_error(self, exc: httpx.TransportError) -> float:
        self.failures += 1
        if not self.call.idempotent or self.failures >= self.retry.attempts:
            raise TransportError(f"{self.call.method} {self.call.path}: {exc!r}") from exc
        return self.retry.backoff(self.failures)

    def after_answer(self, response: httpx.Response) -> float | None:
        """None when the answer is final; else the wait before trying again."""
        if response.status_code not in TRANSIENT_STATUSES or not self.call.idempotent:
            return None
        self.failures += 1
        wait = retry_after(response) or 0.0
        if self.failures >= self.retry.attempts or wait > self.retry.cap:
            return None
        return max(self.retry.backoff(self.failures), wait)


def raw(body: Any) -> Any:
    return body


def _json_value(value: object) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(key): _json_value(item) for key, item in value.items()}
    return value if isinstance(value, int | float | str | bool) else str(value)


def list_params(filters: Mapping[str, Any]) -> dict[str, str]:
    """`list()`'s filters as the query string the server reads: several values a comma list,
    each metadata key a `metadata.<key>` parameter of its own."""
    params: dict[str, str] = {}
    for name, value in filters.items():
        if value is None:
            continue
        if name == "metadata":
            params.update({f"metadata.{key}": str(item) for key, item in value.items()})
        elif isinstance(value, list | tuple | set | frozenset):
            params[name] = ",".join(str(item) for item in value)
        else:
            params[name] = str(_json_value(value))
    return params


def match_body(filters: Mapping[str, Any]) -> dict[str, Any]:
    """`RunMatch` as a bulk command's `filter` object: several values a list."""
    body: dict[str, Any] = {}
    for name, value in filters.items():
        if value is None:
            continue
        if isinstance(value, list | tuple | set | frozenset):
            body[name] = [str(item) for item in value]
        else:
            body[name] = _json_value(value)
    return body


def command_where(action: str, filters: Mapping[str, Any], fields: dict[str, Any], key: str | None) -> Call[BulkResult]:
    """`POST /api/runs/<action>/` (cancel or stop) of the runs `filters` match."""
    body = {"filter": match_body(filters), **fields}
    # Made once per command, so a retry after a lost answer is answered the first answer again.
    headers = {"Idempotency-Key": key or uuid.uuid4().hex}
    return Call("POST", f"/api/runs/{action}/", BulkResult.from_body, json=body, headers=headers)


def cancel_where(filters: Mapping[str, Any], *, max: int, note: str, key: str | None) -> Call[BulkResult]:
    return command_where("cancel", filters, {"max": max, "note": note}, key)


def stop_where(
    filters: Mapping[str, Any], *, max: int, reason: str, code: str | None, key: str | None
) -> Call[BulkResult]:
    fields = {"max": max, "reason": reason} | ({} if code is None else {"code": code})
    return command_where("stop", filters, fields, key)


def count_where(filters: Mapping[str, Any]) -> Call[BulkResult]:
    # `max` 0 does nothing: the answer is the count (a 409 when any match, read by the caller).
    return Call("POST", "/api/runs/cancel/", BulkResult.from_body, json={"filter": match_body(filters), "max": 0})


def create(agent: str, input: dict[str, Any] | None, options: dict[str, Any], key: str | None) -> Call[Run]:
    body = {"agent": agent, "input": {} if input is None else input}
    body.update({name: _json_value(value) for name, value in options.items() if value is not None})
    # Made once per create, so every retry of it is the same request to the server.
    headers = {"Idempotency-Key": key or uuid.uuid4().hex}
    return Call("POST", "/api/runs/", Run.from_body, json=body, headers=headers, ok=(200, 201))


def rerun(run_id: object, from_seq: int | None, options: Mapping[str, Any]) -> Call[Run]:
    """`options`: the overrides given (None: not given)."""
    body = {
        name: value if name == "input" else _json_value(value) for name, value in options.items() if value is not None
    }
    if from_seq is not None:
        body["from_seq"] = from_seq
    # Not repeated after a lost answer: a second try would make a second run.
    return Call("POST", RUNS.path(run_id, "rerun"), Run.from_body, json=body, ok=(201,), idempotent=False)


def types_param(types: str | Iterable[str] | None) -> dict[str, str]:
    """`?types=` of a stream or a page: event types and `prefix.*`, as a list or one comma-separated string."""
    if types is None:
        return {}
    return {"types": types if isinstance(types, str) else ",".join(types)}


def events(
    run_id: object, after_seq: int, limit: int | None, types: str | Iterable[str] | None = None
) -> Call[EventPage]:
    params = {"after_seq": str(after_seq)} | ({} if limit is None else {"limit": str(limit)}) | types_param(types)
    return Call("GET", RUNS.path(run_id, "events"), EventPage.from_body, params=params)


class ServerWait:
    """`wait()` through the server's wait (`GET /api/runs/{id}/wait/`): asked again after each
    `timeout` answer, at most `WAIT_MAX` seconds a request, until the run is terminal or `deadline`."""

    # The longest wait the server grants one request.
    WAIT_MAX = 60.0

    def __init__(self, run_id: object, deadline: float | None, request_timeout: float) -> None:
        self.run_id = run_id
        self.deadline = deadline
        self.request_timeout = request_timeout

    def next_call(self) -> Call[Run]:
        if past(self.deadline):
            raise TimeoutError(f"run {self.run_id} did not end in time")
        seconds = max(0.001, remaining(self.deadline, self.WAIT_MAX))
        params = {"timeout": f"{seconds:.3f}"}
        return Call(
            "GET", RUNS.path(self.run_id, "wait"), Run.from_body, params=params, timeout=seconds + self.request_timeout
        )

    @staticmethod
    def waits_for_resume(run: Run) -> bool:
        """The run waits (paused, or for input): the server answers at once until it is resumed,
        so the client follows its stream instead, through the resume to the end."""
        return bool(run["wait_result"] == "waiting")


def cancel(run_id: object, note: str) -> Call[Run]:
    return Call("POST", RUNS.path(run_id, "cancel"), Run.from_body, json={"note": note})


def stop(run_id: object, reason: str, code: str | None) -> Call[Run]:
    body = {"reason": reason} | ({} if code is None else {"code": code})
    return Call("POST", RUNS.path(run_id, "stop"), Run.from_body, json=body)


def pause(run_id: object) -> Call[Run]:
    # 202: the run is running and the worker parks it at its next safe boundary.
    return Call("POST", RUNS.path(run_id, "pause"), Run.from_body, ok=(200, 202))


def resume(run_id: object, ticket: str, input: Any) -> Call[Run]:
    return Call("POST", RUNS.path(run_id, "resume"), Run.from_body, json={"ticket": ticket, "input": input})


class RequestOptions(TypedDict, total=False):
    """`request()`'s options: what httpx sends, and whether the request is safe to repeat (by
    default GET, HEAD and OPTIONS are)."""

    params: dict[str, str]
    json: Any
    content: bytes
    headers: dict[str, str]
    idempotent: bool


def request(method: str, path: str, options: RequestOptions) -> Call[Any]:
    method = method.upper()
    safe = options.get("idempotent", method in ("GET", "HEAD", "OPTIONS"))
    return Call(
        method,
        path,
        raw,
        params=options.get("params"),
        json=options.get("json"),
        content=options.get("content"),
        headers=options.get("headers", {}),
        ok=range(200, 300),
        idempotent=safe,
    )


class Pages(Generic[T]):
    """A list read page by page (`runs.list()`, `agents.list()`), following each page's `next`
    (its cursor; docs/design/api.md#paging), so each item that matched when the first page was
    read comes once, whatever is created or ends meanwhile."""

    def __init__(self, path: str, filters: Mapping[str, Any], item: Callable[[Any], T]) -> None:
        self.path = path
        self.params: dict[str, str] | None = list_params(filters)
        self.parse: Callable[[Any], Page] = RunPage.from_body if item is Run.from_body else Page.parser(item)

    def next_call(self) -> Call[Page] | None:
        if self.params is None:
            return None
        return Call("GET", self.path, self.parse, params=self.params)

    def take(self, page: Page) -> list[T]:
        # The next page's query is `next`'s, sent to this client's server: the cursor and the
        # filters are in it; its scheme and host are the server's view of itself, which a proxy
        # between us may not share.
        self.params = None if page.next is None else dict(parse_qsl(urlsplit(page.next).query, keep_blank_values=True))
        return page.results


def _nothing(body: Any) -> None:
    return None


def _as_given(fields: Mapping[str, Any]) -> dict[str, Any]:
    return dict(fields)


@dataclass(frozen=True)
class Items(Generic[T]):
    """One of the API's collections (`/api/<name>/`): each item read, changed and deleted at its
    own path, the collection listed page by page, the same way for every kind of item."""

    path_prefix: str
    parse: Callable[[Any], T]
    # How a change's fields are sent (`update`).
    fields: Callable[[Mapping[str, Any]], dict[str, Any]] = _as_given

    def path(self, item_id: object, action: str = "") -> str:
        return f"{self.path_prefix}{quote(str(item_id), safe='')}/" + (f"{action}/" if action else "")

    def get(self, item_id: object) -> Call[T]:
        return Call("GET", self.path(item_id), self.parse)

    def update(self, item_id: object, changes: Mapping[str, Any]) -> Call[T]:
        return Call("PATCH", self.path(item_id), self.parse, json=self.fields(changes))

    def delete(self, item_id: object) -> Call[None]:
        return Call("DELETE", self.path(item_id), _nothing, ok=(204,))

    def pages(self, **filters: Any) -> Pages[T]:
        return Pages(self.path_prefix, filters, self.parse)


RUNS = Items("/api/runs/", Run.from_body)
AGENTS = Items("/api/agents/", Agent.from_body)


# --- webhook endpoints (docs/design/webhooks.md#endpoints) ---


class WebhookChanges(TypedDict, total=False):
    """`webhooks.update()`'s changes: each one given (None: left as it is)."""

    url: str | None
    events: Iterable[str] | None
    metadata: dict[str, str] | None
    all_runs: bool | None
    enabled: bool | None


def webhook_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The fields given (None: not given), as the API reads them: `events` a list."""
    return {name: list(value) if name == "events" else value for name, value in fields.items() if value is not None}


WEBHOOKS = Items("/api/webhooks/", Webhook.from_body, webhook_fields)


def webhook_create(
    url: str, events: Iterable[str], metadata: Mapping[str, str] | None, all_runs: bool
) -> Call[Webhook]:
    fields = {"url": url, "events": events, "metadata": metadata, "all_runs": all_runs or None}
    # Not repeated after a lost answer: the API takes no Idempotency-Key here, and a second try
    # would register a second endpoint.
    return Call("POST", "/api/webhooks/", Webhook.from_body, json=webhook_fields(fields), ok=(201,), idempotent=False)


def webhook_rotate_secret(webhook_id: object) -> Call[Webhook]:
    # Not repeated: a second rotation would retire the secret whose answer was lost, and with it
    # the overlap that lets receivers switch without failing a request.
    return Call("POST", WEBHOOKS.path(webhook_id, "rotate-secret"), Webhook.from_body, idempotent=False)


def webhook_delivery_pages(webhook_id: object, page_size: int | None) -> Pages[WebhookDelivery]:
    return Pages(WEBHOOKS.path(webhook_id, "deliveries"), {"page_size": page_size}, WebhookDelivery.from_body)


# --- schedules (docs/design/schedules.md) ---


class ScheduleOptions(TypedDict, total=False):
    """A schedule's fields besides its agent and input (docs/design/schedules.md): exactly one of
    `cron` (five fields or a macro, read in `timezone`, an IANA name) and `every_seconds`; the
    runs' `metadata` and `priority`; the `overlap` policy (skip, buffer_one, allow_all,
    cancel_other); how far back a restart fires missed due times (`catchup_window_seconds`);
    and when it starts and ends."""

    cron: str
    every_seconds: int
    timezone: str
    overlap: str
    catchup_window_seconds: int
    metadata: Mapping[str, str]
    priority: int
    start_at: datetime | str
    end_at: datetime | str


class ScheduleChanges(ScheduleOptions, total=False):
    """`update()`'s changes: any field of a schedule; `None` clears `start_at` or `end_at`."""

    agent: str
    input: dict[str, Any]


def schedule_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The fields as the API reads them: times in ISO 8601, the input as given."""
    return {name: value if name == "input" else _json_value_or_null(value) for name, value in fields.items()}


def _json_value_or_null(value: object) -> Any:
    return None if value is None else _json_value(value)


SCHEDULES = Items("/api/schedules/", Schedule.from_body, schedule_fields)


def schedule_create(agent: str, input: dict[str, Any] | None, options: Mapping[str, Any]) -> Call[Schedule]:
    body = {"agent": agent, "input": {} if input is None else input}
    body.update(schedule_fields({name: value for name, value in options.items() if value is not None}))
    # Not repeated after a lost answer: the API takes no Idempotency-Key here, and a second try
    # would make a second schedule (and fire it too).
    return Call("POST", "/api/schedules/", Schedule.from_body, json=body, ok=(201,), idempotent=False)


def schedule_command(schedule_id: object, action: str) -> Call[Schedule]:
    """`pause` or `resume`: the schedule as it is after it (the same again when repeated)."""
    return Call("POST", SCHEDULES.path(schedule_id, action), Schedule.from_body)


def schedule_trigger(schedule_id: object) -> Call[Run]:
    # Not repeated after a lost answer: each trigger is a due time of its own, so a second try
    # would create a second run.
    return Call("POST", SCHEDULES.path(schedule_id, "trigger"), Run.from_body, ok=(201,), idempotent=False)


def schedule_backfill(schedule_id: object, start: datetime | str, end: datetime | str, max: int) -> Call[list[Run]]:
    body = {"from": _json_value(start), "to": _json_value(end), "max": max}
    # Safe to repeat: a due time makes one run at most, whatever fires it, so a retry creates only
    # the runs the lost answer's request did not.
    return Call("POST", SCHEDULES.path(schedule_id, "backfill"), _backfilled, json=body)


def _backfilled(body: Any) -> list[Run]:
    return [Run.from_body(run) for run in body["runs"]]


# --- API tokens (docs/design/api.md#tokens) ---

TOKENS = Items("/api/tokens/", ApiToken.from_body)


def token_create(name: str, expires_in: int | None, expires_at: datetime | str | None) -> Call[ApiToken]:
    fields: dict[str, Any] = {"name": name}
    if expires_in is not None:
        fields["expires_in"] = expires_in
    if expires_at is not None:
        fields["expires_at"] = expires_at.isoformat() if isinstance(expires_at, datetime) else expires_at
    # Not repeated after a lost answer: its key was in it, and a second try would issue a second
    # token (or, by its name, be refused).
    return Call("POST", "/api/tokens/", ApiToken.from_body, json=fields, ok=(201,), idempotent=False)


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Follow:
    """Read a run's stream to its terminal event (or the deadline), from `after_seq`."""

    run_id: str
    after_seq: int
    deadline: float | None


# What a client's driver does for one step of an operation: one try of a call (the driver sends the
# answer back in, or throws in the httpx.TransportError that came instead), follow a stream, or sleep.
Step = Call[Any] | Follow | Sleep


def sending(call: Call[T], retry: Retry) -> Generator[Step, Any, T]:
    """`call` tried until its answer is final, as `Attempts` decides: its result, or its error."""
    attempts = Attempts(call, retry)
    while True:
        try:
            response = yield call
        except httpx.TransportError as exc:
            yield Sleep(attempts.after_error(exc))
            continue
        if (delay := attempts.after_answer(response)) is None:
            return call.result(response)
        yield Sleep(delay)


class Driving(Generic[T]):
    """An operation's steps as a client drives them: `step` is what to do next (None once the
    operation is done, and `result()` what it returned); `settle()` hands back what doing it gave."""

    def __init__(self, steps: Generator[Step, Any, T]) -> None:
        self._steps = steps
        self.step: Step | None = None
        self._done: list[T] = []
        self._resume(lambda: next(steps))

    def settle(self, outcome: object) -> None:
        """`outcome`: a try's answer, or the httpx.TransportError it met; None after a sleep or a stream."""
        if isinstance(outcome, httpx.TransportError):
            self._resume(lambda: self._steps.throw(outcome))
        else:
            self._resume(lambda: self._steps.send(outcome))

    def result(self) -> T:
        return self._done[0]

    def _resume(self, resume: Callable[[], Step]) -> None:
        try:
            self.step = resume()
        except StopIteration as done:
            self.step = None
            self._done.append(done.value)


def wait(run_id: str, *, released: bool, timeout: float | None, config: Config) -> Generator[Step, Any, Run]:
    """`runs.wait()`, free of I/O, for both clients: the run once it is terminal, through the
    server's wait (`ServerWait`; a run that waits for a resume is followed on its stream); with
    `released`, once its attempt has also recorded `released_at`. TimeoutError after `timeout`
    seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    waits, retry = ServerWait(run_id, deadline, config.timeout), config.retry
    run = yield from sending(waits.next_call(), retry)
    while not run.is_terminal:
        if waits.waits_for_resume(run):
            yield Follow(run_id, run.last_seq, deadline)
            run = yield from sending(RUNS.get(run_id), retry)
        else:
            run = yield from sending(waits.next_call(), retry)
    poll = ReleasePoll(deadline)
    while released and not run.released:
        yield Sleep(poll.delay())
        run = yield from sending(RUNS.get(run_id), retry)
    return run


class ReleasePoll:
    """`wait(released=True)`: how long to wait between reads of a terminal run until its attempt
    records `released_at` (nothing follows the terminal event, so this is polled, briefly)."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.interval = 0.05

    def delay(self) -> float:
        if past(self.deadline):
            raise TimeoutError("the run's attempt was not released in time")
        wait = remaining(self.deadline, self.interval)
        self.interval = min(1.0, self.interval * 1.5)
        return wait


class Deprecated:
    """A name of the flat 0.1 client kept for one release: it warns (DeprecationWarning), then
    does what `client.<namespace>.<name>` does."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, client: object, owner: type | None = None) -> Any:
        if client is None:
            return self
        target = getattr(getattr(client, self.namespace), self.name)
        new = f"{self.namespace}.{self.name}"

        @functools.wraps(target)
        def alias(*args: Any, **kwargs: Any) -> Any:
            warnings.warn(
                f"client.{self.name}() is deprecated: use client.{new}() (the flat names go in runledger-client 0.3)",
                DeprecationWarning,
                stacklevel=2,
            )
            return target(*args, **kwargs)

        return alias

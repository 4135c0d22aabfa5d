"""The synchronous client. `AsyncClient` (runledger_client.aio) has the same namespaces and methods,
awaited; both are thin drivers of the shared logic in `_core` (calls, retries, wait) and `_stream`
(streams)."""

from __future__ import annotations

import builtins
import time
from collections.abc import Generator, Iterable, Iterator
from datetime import datetime
from typing import Any, TypeVar, Unpack

import httpx

from runledger_client import _base, _core
from runledger_client._stream import StreamState, StreamTally
from runledger_client.errors import TooManyMatches
from runledger_client.models import (
    Agent,
    ApiToken,
    BulkResult,
    Event,
    EventPage,
    Run,
    Schedule,
    Webhook,
    WebhookDelivery,
)

T = TypeVar("T")


class Stream(StreamTally, _base.Closing):
    """A run's live events (`client.runs.stream(...)`): iterate it, ideally inside `with`, which
    closes the connection when the block ends — on `break` or an error too. `text()` and
    `until_end()` read it to its end."""

    def __init__(self, events: Generator[Event, None, None]) -> None:
        super().__init__()
        self._events = events

    def __iter__(self) -> Iterator[Event]:
        for event in self._events:
            self.tally(event)
            yield event

    def close(self) -> None:
        """Close the connection (the stream yields nothing more)."""
        self._events.close()

    def until_end(self) -> Event | None:
        """Read the rest; the terminal event (None when the server had nothing more: a 204)."""
        for _ in self:
            pass
        return self.terminal

    def text(self) -> str:
        """Read the rest; the text of every `output.delta` this stream yielded, joined."""
        self.until_end()
        return self.joined_text()


class Runs(_base.Namespace["Client"]):
    """`client.runs`: create, read, follow and command runs (docs/design/api.md)."""

    def create(
        self,
        agent: str,
        input: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        **options: Unpack[_core.CreateOptions],
    ) -> Run:
        """Create a run (201). Sent with an `Idempotency-Key` (made here unless given), so a retry
        after a lost answer returns the same run instead of making a second one."""
        return self._client._send(_core.create(agent, input, dict(options), idempotency_key))

    def get(self, run_id: str) -> Run:
        return self._client._send(_core.RUNS.get(run_id))

    def list(self, **filters: Unpack[_core.RunFilters]) -> Iterator[Run]:
        """The runs you can see that match `filters`, newest first, fetched page by page as you
        iterate (each page's `next`): every run that matched when the first page was read comes
        once, whatever is created or ends meanwhile."""
        return self._client._pages(_core.RUNS.pages(**filters))

    def events(
        self, run_id: str, after_seq: int = 0, limit: int | None = None, types: str | Iterable[str] | None = None
    ) -> EventPage:
        """One JSON page of events with seq > after_seq (at most `limit`, default 100, max 1000);
        with `types` (`["output.delta", "run.*"]`), only those and the terminal event."""
        return self._client._send(_core.events(run_id, after_seq, limit, types))

    def stream(self, run_id: str, after_seq: int = 0, types: str | Iterable[str] | None = None) -> Stream:
        """The run's events with seq > after_seq, live, until its terminal event (or at once, for a
        finished run already read to its end); with `types`, only those and the terminal event.
        Reconnects by itself after any drop, from the last event yielded; never yields a seq twice.
        Raises NotAuthenticated, PermissionDenied, NotFound or ValidationError when the server
        refuses the stream."""
        return Stream(self._client._stream(self._client._streaming(run_id, after_seq, types)))

    def wait(self, run_id: str, *, released: bool = False, timeout: float | None = None) -> Run:
        """The run once it is terminal (the server's wait; a run that waits for a resume is
        followed on its stream); with `released`, once its attempt has also recorded `released_at`
        (the worker stopped executing it). TimeoutError after `timeout` seconds."""
        return self._client._drive(_core.wait(run_id, released=released, timeout=timeout, config=self._client.config))

    def cancel(self, run_id: str, note: str = "") -> Run:
        """Cancel a queued, running or waiting run; a run already cancelled is returned as it is.
        A run that ended otherwise raises InvalidTransition, whose `run` is the committed one."""
        return self._client._send(_core.cancel(run_id, note))

    def stop(self, run_id: str, reason: str, code: str | None = None) -> Run:
        """Stop a run (needs runs.stop_run); `code` staff (default), policy, budget_exhausted or
        deadline_exceeded."""
        return self._client._send(_core.stop(run_id, reason, code))

    def pause(self, run_id: str) -> Run:
        """Pause: a queued run waits at once; a running one is parked by its worker at the next
        safe boundary (the run returned is then still `running`)."""
        return self._client._send(_core.pause(run_id))

    def resume(self, run_id: str, ticket: str, input: Any = None) -> Run:
        """Resume a waiting run with its `resume_ticket` (safe to retry with the same input)."""
        return self._client._send(_core.resume(run_id, ticket, input))

    def rerun(self, run_id: str, from_seq: int | None = None, **overrides: Unpack[_core.RerunOptions]) -> Run:
        """A new run of the ended run's agent, input and budgets (each as `overrides` says), its
        `rerun_of` the original. With `from_seq` a fork: it continues from a copy of the original's
        agent events up to that seq. A live run raises InvalidTransition; a `from_seq` past the log
        or inside a tool call, ValidationError. Not retried after a lost answer (it would make a
        second run)."""
        return self._client._send(_core.rerun(run_id, from_seq, overrides))

    # --- on every run that matches a filter (docs/design/commands.md#bulk-commands) ---

    def count_where(self, **filters: Unpack[_core.RunMatch]) -> int:
        """How many runs you see match `filters` (as `list()` reads them): what `cancel_where`
        would take as `max`. Nothing is done."""
        try:
            return self._client._send(_core.count_where(filters)).matched
        except TooManyMatches as exc:
            return exc.count

    def cancel_where(
        self, *, max: int, note: str = "", idempotency_key: str | None = None, **filters: Unpack[_core.RunMatch]
    ) -> BulkResult:
        """Cancel every run you see that matches `filters` and that you may cancel, each as
        `cancel()` would. More than `max` matches raise TooManyMatches (its `count`), and nothing
        is done. Sent with an `Idempotency-Key` (made here unless given): a retry after a lost
        answer gets the first answer."""
        return self._client._send(_core.cancel_where(filters, max=max, note=note, key=idempotency_key))

    def stop_where(
        self,
        *,
        max: int,
        reason: str,
        code: str | None = None,
        idempotency_key: str | None = None,
        **filters: Unpack[_core.RunMatch],
    ) -> BulkResult:
        """`cancel_where`, stopping each run with `reason` (and `code`) as `stop()` does."""
        return self._client._send(_core.stop_where(filters, max=max, reason=reason, code=code, key=idempotency_key))


class Agents(_base.Namespace["Client"]):
    """`client.agents`: the agents a run may name."""

    def list(self, *, page_size: int | None = None) -> Iterator[Agent]:
        """Every registered agent, by name, with the event types of its own it declared."""
        return self._client._pages(_core.AGENTS.pages(page_size=page_size))


class Schedules(_base.Namespace["Client"]):
    """`client.schedules`: your schedules, each creating a run at every due time (docs/design/
    schedules.md). Another user's schedule is NotFound."""

    def create(
        self, agent: str, input: dict[str, Any] | None = None, **options: Unpack[_core.ScheduleOptions]
    ) -> Schedule:
        """A schedule of runs of `agent` with `input`: give `cron="0 9 * * 1-5"` (with a
        `timezone`, default UTC) or `every_seconds=N`. A bad cron, an unknown zone or an interval
        shorter than the server's minimum raise ValidationError naming the field. Not retried after
        a lost answer (it would make a second schedule)."""
        return self._client._send(_core.schedule_create(agent, input, options))

    def list(self, *, page_size: int | None = None) -> Iterator[Schedule]:
        """Your schedules, newest first, fetched page by page as you iterate."""
        return self._client._pages(_core.SCHEDULES.pages(page_size=page_size))

    def get(self, schedule_id: str) -> Schedule:
        return self._client._send(_core.SCHEDULES.get(schedule_id))

    def update(self, schedule_id: str, **changes: Unpack[_core.ScheduleChanges]) -> Schedule:
        """Change what is given (`start_at=None` or `end_at=None` clears it); the next due time
        follows from the new timing."""
        return self._client._send(_core.SCHEDULES.update(schedule_id, changes))

    def delete(self, schedule_id: str) -> None:
        """Delete the schedule; the runs it created stay. A retry after a lost answer may find it
        gone: NotFound."""
        self._client._send(_core.SCHEDULES.delete(schedule_id))

    def pause(self, schedule_id: str) -> Schedule:
        """Fire nothing until resumed (a run it created goes on)."""
        return self._client._send(_core.schedule_command(schedule_id, "pause"))

    def resume(self, schedule_id: str) -> Schedule:
        """Fire again, from the next due time after now: what fell due while paused is not fired."""
        return self._client._send(_core.schedule_command(schedule_id, "resume"))

    def trigger(self, schedule_id: str) -> Run:
        """Create a run now, as a due time would: its overlap policy applies, and a fire it skips
        raises ScheduleOverlap. Not retried after a lost answer."""
        return self._client._send(_core.schedule_trigger(schedule_id))

    def backfill(self, schedule_id: str, *, start: datetime | str, end: datetime | str, max: int) -> builtins.list[Run]:
        """Fire the due times from `start` to `end` that have no run yet, oldest first, at most
        `max` of them: the runs created."""
        return self._client._send(_core.schedule_backfill(schedule_id, start, end, max))


class Webhooks(_base.Namespace["Client"]):
    """`client.webhooks`: your webhook endpoints, told when your runs end or wait
    (docs/design/webhooks.md). Another user's endpoint is NotFound."""

    def create(
        self, url: str, events: Iterable[str], metadata: dict[str, str] | None = None, *, all_runs: bool = False
    ) -> Webhook:
        """Register an endpoint for `events` (any of run.completed, run.failed, run.cancelled,
        run.stopped, run.waiting, and your schedules' schedule.skipped and schedule.failed) of your
        runs whose metadata holds all of `metadata` (every
        owner's runs with `all_runs`, which needs runs.view_run). The answer's `secret` is shown
        only here: keep it to verify the signatures. Not retried after a lost answer (it would
        register a second endpoint)."""
        return self._client._send(_core.webhook_create(url, events, metadata, all_runs))

    def list(self, *, page_size: int | None = None) -> Iterator[Webhook]:
        """Your endpoints, oldest first (staff with runs.change_run: everyone's), page by page."""
        return self._client._pages(_core.WEBHOOKS.pages(page_size=page_size))

    def get(self, webhook_id: str) -> Webhook:
        return self._client._send(_core.WEBHOOKS.get(webhook_id))

    def update(self, webhook_id: str, **changes: Unpack[_core.WebhookChanges]) -> Webhook:
        """Change what is given; `enabled=True` on an endpoint Runledger disabled clears its
        `disabled_reason` and its failures so far."""
        return self._client._send(_core.WEBHOOKS.update(webhook_id, changes))

    def delete(self, webhook_id: str) -> None:
        """Delete the endpoint with its deliveries (pending ones are not sent). A retry after a
        lost answer may find it gone: NotFound."""
        self._client._send(_core.WEBHOOKS.delete(webhook_id))

    def rotate_secret(self, webhook_id: str) -> Webhook:
        """A new signing secret (the answer's `secret`, shown only here); deliveries carry the old
        secret's signature too until `previous_secret_expires_at`. Not retried after a lost answer."""
        return self._client._send(_core.webhook_rotate_secret(webhook_id))

    def deliveries(self, webhook_id: str, *, page_size: int | None = None) -> Iterator[WebhookDelivery]:
        """The endpoint's notifications, newest first, with their status and attempts so far."""
        return self._client._pages(_core.webhook_delivery_pages(webhook_id, page_size))


class Tokens(_base.Namespace["Client"]):
    """`client.tokens`: your API tokens (docs/design/api.md#tokens). A key is in the answer of
    `create` only: the server keeps its digest."""

    def create(self, name: str, *, expires_in: int | None = None, expires_at: datetime | str | None = None) -> ApiToken:
        """Issue a token named `name` (unique among yours), expiring in `expires_in` seconds or at
        `expires_at` (neither: never — but never later than the token this client uses, with which
        it is revoked too). Its `key` is shown only here. Not retried after a lost answer."""
        return self._client._send(_core.token_create(name, expires_in, expires_at))

    def list(self, *, page_size: int | None = None) -> Iterator[ApiToken]:
        """Your tokens, oldest first: names, expiries, creation and last use — never a key."""
        return self._client._pages(_core.TOKENS.pages(page_size=page_size))

    def delete(self, name: str) -> None:
        """Revoke your token `name` at once, with the tokens it issued (this client's own too, if
        it is that one). A retry after a lost answer may find it gone: NotFound."""
        self._client._send(_core.TOKENS.delete(name))


class Client(_base.ClientBase[httpx.BaseTransport, httpx.Client], _base.Closing):
    """`Client(url=None, token=None, *, profile=None, **options)`: the Runledger API with an API
    token (`Authorization: Token <key>`). What is not given is read from the environment, then from
    the config file's profile (runledger_client._config). The options (`timeout`,
    `stream_timeout`, `retry`, `max_retries`) are `ClientOptions`; `with_options()` changes them
    for some calls.

    Every request that is safe to repeat is retried on connection errors and 502/503/504 (see
    `Retry`); errors are raised as the exception of their code (`runledger_client.errors`).
    """

    runs: Runs
    agents: Agents
    schedules: Schedules
    webhooks: Webhooks
    tokens: Tokens
    NAMESPACES = {"runs": Runs, "agents": Agents, "schedules": Schedules, "webhooks": Webhooks, "tokens": Tokens}

    def _connect(self, transport: httpx.BaseTransport | None) -> httpx.Client:
        return httpx.Client(transport=transport, **self.config.http)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **options: Unpack[_core.RequestOptions]) -> Any:
        """Any API request: the decoded JSON of a 2xx answer, else the typed error. Retried like
        the rest when it is safe to repeat (`idempotent`; by default GET, HEAD and OPTIONS)."""
        return self._send(_core.request(method, path, options))

    # --- the drivers: each step of _core's operations, done on this client's connections ---

    def _send(self, call: _core.Call[T]) -> T:
        return self._drive(_core.sending(call, self.config.retry))

    def _pages(self, pages: _core.Pages[T]) -> Iterator[T]:
        while (call := pages.next_call()) is not None:
            yield from pages.take(self._send(call))

    def _drive(self, steps: Generator[_core.Step, Any, T]) -> T:
        driving = _core.Driving(steps)
        while driving.step is not None:
            driving.settle(self._do(driving.step))
        return driving.result()

    def _do(self, step: _core.Step) -> object:
        """What doing `step` gave: a try's answer, or the transport error it met; None after a
        sleep or a stream."""
        if isinstance(step, _core.Sleep):
            time.sleep(step.seconds)
        elif isinstance(step, _core.Follow):
            for _ in self._stream(self._following(step)):
                pass
        else:
            try:
                return self._http.request(**self._exchange_args(step))
            except httpx.TransportError as exc:
                return exc
        return None

    def _stream(self, state: StreamState) -> Generator[Event, None, None]:
        while not state.finished:
            try:
                with self._http.stream(**self._stream_args(state)) as response:
                    if response.status_code != 200:
                        response.read()
                    if state.opened(response):
                        for chunk in response.iter_bytes():
                            yield from state.feed(chunk)
                            if state.finished:
                                return
            except httpx.TransportError as exc:
                state.lost(exc)
            if not state.finished:
                time.sleep(state.next_delay())

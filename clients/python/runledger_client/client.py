"""The synchronous client. `AsyncClient` (runledger_client.aio) has the same methods, awaited;
both are thin drivers of the shared logic in `_core` (calls, retries) and `_stream` (streams)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, TypeVar, Unpack

import httpx

from runledger_client import _core
from runledger_client._stream import StreamState
from runledger_client.errors import TooManyMatches
from runledger_client.models import BulkResult, Event, EventPage, Run

T = TypeVar("T")


class Client:
    """`Client(url, token, **options)`: the Runledger API with a DRF token (`Authorization: Token
    <key>`); the options (`timeout`, `stream_timeout`, `retry`) are `ClientOptions`.

    Every request that is safe to repeat is retried on connection errors and 502/503/504 (see
    `Retry`); errors are raised as the exception of their code (`runledger_client.errors`).
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        transport: httpx.BaseTransport | None = None,
        **options: Unpack[_core.ClientOptions],
    ) -> None:
        self.config = _core.Config(url, token, options)
        self._http = httpx.Client(transport=transport, **self.config.http)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # --- runs ---

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
        return self._send(_core.create(agent, input, dict(options), idempotency_key))

    def get(self, run_id: str) -> Run:
        return self._send(_core.get(run_id))

    def list(
        self,
        **filters: Unpack[_core.RunFilters],
    ) -> Iterator[Run]:
        """The runs you can see that match `filters`, newest first, fetched page by page as you
        iterate (each page's `next`): every run that matched when the first page was read comes
        once, whatever is created or ends meanwhile."""
        pages = _core.RunPages(dict(filters))
        while (call := pages.next_call()) is not None:
            yield from pages.take(self._send(call))

    def events(
        self, run_id: str, after_seq: int = 0, limit: int | None = None, types: str | Iterable[str] | None = None
    ) -> EventPage:
        """One JSON page of events with seq > after_seq (at most `limit`, default 100, max 1000);
        with `types` (`["output.delta", "run.*"]`), only those and the terminal event."""
        return self._send(_core.events(run_id, after_seq, limit, types))

    def stream(self, run_id: str, after_seq: int = 0, types: str | Iterable[str] | None = None) -> Iterator[Event]:
        """The run's events with seq > after_seq, live, until its terminal event (or at once, for a
        finished run already read to its end); with `types`, only those and the terminal event.
        Reconnects by itself after any drop, from the last event yielded; never yields a seq twice.
        Raises NotAuthenticated, PermissionDenied, NotFound or ValidationError when the server
        refuses the stream."""
        return self._stream(StreamState(run_id, after_seq, self.config.retry, types=types))

    def wait(self, run_id: str, *, released: bool = False, timeout: float | None = None) -> Run:
        """The run once it is terminal (the server's wait; a run that waits for a resume is
        followed on its stream); with `released`, once its attempt has also recorded `released_at`
        (the worker stopped executing it). TimeoutError after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        waits = _core.ServerWait(run_id, deadline, self.config.timeout)
        run = self._send(waits.next_call())
        while not run.is_terminal:
            if waits.waits_for_resume(run):
                for _ in self._stream(StreamState(run_id, run.last_seq, self.config.retry, deadline)):
                    pass
                run = self.get(run_id)
            else:
                run = self._send(waits.next_call())
        poll = _core.ReleasePoll(deadline)
        while released and not run.released:
            time.sleep(poll.delay())
            run = self.get(run_id)
        return run

    # --- commands ---

    def cancel(self, run_id: str, note: str = "") -> Run:
        """Cancel a queued, running or waiting run; a run already cancelled is returned as it is.
        A run that ended otherwise raises InvalidTransition, whose `run` is the committed one."""
        return self._send(_core.cancel(run_id, note))

    def stop(self, run_id: str, reason: str, code: str | None = None) -> Run:
        """Stop a run (needs runs.stop_run); `code` staff (default), policy, budget_exhausted or
        deadline_exceeded."""
        return self._send(_core.stop(run_id, reason, code))

    def pause(self, run_id: str) -> Run:
        """Pause: a queued run waits at once; a running one is parked by its worker at the next
        safe boundary (the run returned is then still `running`)."""
        return self._send(_core.pause(run_id))

    def resume(self, run_id: str, ticket: str, input: Any = None) -> Run:
        """Resume a waiting run with its `resume_ticket` (safe to retry with the same input)."""
        return self._send(_core.resume(run_id, ticket, input))

    def rerun(self, run_id: str, from_seq: int | None = None, **overrides: Unpack[_core.RerunOptions]) -> Run:
        """A new run of the ended run's agent, input and budgets (each as `overrides` says), its
        `rerun_of` the original. With `from_seq` a fork: it continues from a copy of the original's
        agent events up to that seq. A live run raises InvalidTransition; a `from_seq` past the log
        or inside a tool call, ValidationError. Not retried after a lost answer (it would make a
        second run)."""
        return self._send(_core.rerun(run_id, from_seq, {k: v for k, v in overrides.items() if v is not None}))

    # --- commands on every run that matches a filter (docs/design/commands.md#bulk-commands) ---

    def count_where(self, **filters: Unpack[_core.RunMatch]) -> int:
        """How many runs you see match `filters` (as `list()` reads them): what `cancel_where`
        would take as `max`. Nothing is done."""
        try:
            return self._send(_core.count_where(filters)).matched
        except TooManyMatches as exc:
            return exc.count

    def cancel_where(
        self, *, max: int, note: str = "", idempotency_key: str | None = None, **filters: Unpack[_core.RunMatch]
    ) -> BulkResult:
        """Cancel every run you see that matches `filters` and that you may cancel, each as
        `cancel()` would. More than `max` matches raise TooManyMatches (its `count`), and nothing
        is done. Sent with an `Idempotency-Key` (made here unless given): a retry after a lost
        answer gets the first answer."""
        return self._send(_core.command_where("cancel", filters, {"max": max, "note": note}, idempotency_key))

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
        return self._send(_core.stop_where(filters, max=max, reason=reason, code=code, key=idempotency_key))

    def request(self, method: str, path: str, **options: Unpack[_core.RequestOptions]) -> Any:
        """Any API request: the decoded JSON of a 2xx answer, else the typed error. Retried like
        the rest when it is safe to repeat (`idempotent`; by default GET, HEAD and OPTIONS)."""
        return self._send(_core.request(method, path, options))

    # --- the drivers ---

    def _send(self, call: _core.Call[T]) -> T:
        attempts = _core.Attempts(call, self.config.retry)
        while True:
            try:
                response = self._http.request(call.method, call.path, **call.request_args())
            except httpx.TransportError as exc:
                time.sleep(attempts.after_error(exc))
                continue
            if (delay := attempts.after_answer(response)) is None:
                return call.result(response)
            time.sleep(delay)

    def _stream(self, state: StreamState) -> Iterator[Event]:
        while not state.finished:
            headers = state.connect_headers()
            timeout = self.config.stream_timeouts(state.read_timeout(self.config.stream_timeout))
            try:
                with self._http.stream(
                    "GET", state.path, params=state.params, headers=headers, timeout=timeout
                ) as response:
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

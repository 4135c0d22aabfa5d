"""The asyncio client: `Client`'s methods, awaited (`list` and `stream` are async iterators)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from types import TracebackType
from typing import Any, TypeVar, Unpack

import httpx

from runledger_client import _core
from runledger_client._stream import StreamState
from runledger_client.errors import TooManyMatches
from runledger_client.models import BulkResult, Event, EventPage, Run

T = TypeVar("T")


class AsyncClient:
    """`AsyncClient(url, token)`: `Client` for asyncio; see there."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        **options: Unpack[_core.ClientOptions],
    ) -> None:
        self.config = _core.Config(url, token, options)
        self._http = httpx.AsyncClient(transport=transport, **self.config.http)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    # --- runs ---

    async def create(
        self,
        agent: str,
        input: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        **options: Unpack[_core.CreateOptions],
    ) -> Run:
        return await self._send(_core.create(agent, input, dict(options), idempotency_key))

    async def get(self, run_id: str) -> Run:
        return await self._send(_core.get(run_id))

    async def list(
        self,
        **filters: Unpack[_core.RunFilters],
    ) -> AsyncIterator[Run]:
        pages = _core.RunPages(dict(filters))
        while (call := pages.next_call()) is not None:
            for run in pages.take(await self._send(call)):
                yield run

    async def events(
        self, run_id: str, after_seq: int = 0, limit: int | None = None, types: str | Iterable[str] | None = None
    ) -> EventPage:
        return await self._send(_core.events(run_id, after_seq, limit, types))

    def stream(self, run_id: str, after_seq: int = 0, types: str | Iterable[str] | None = None) -> AsyncIterator[Event]:
        return self._stream(StreamState(run_id, after_seq, self.config.retry, types=types))

    async def wait(self, run_id: str, *, released: bool = False, timeout: float | None = None) -> Run:
        deadline = None if timeout is None else time.monotonic() + timeout
        waits = _core.ServerWait(run_id, deadline, self.config.timeout)
        run = await self._send(waits.next_call())
        while not run.is_terminal:
            if waits.waits_for_resume(run):
                async for _ in self._stream(StreamState(run_id, run.last_seq, self.config.retry, deadline)):
                    pass
                run = await self.get(run_id)
            else:
                run = await self._send(waits.next_call())
        poll = _core.ReleasePoll(deadline)
        while released and not run.released:
            await asyncio.sleep(poll.delay())
            run = await self.get(run_id)
        return run

    # --- commands ---

    async def count_where(self, **filters: Unpack[_core.RunMatch]) -> int:
        try:
            return (await self._send(_core.count_where(filters))).matched
        except TooManyMatches as exc:
            return exc.count

    async def cancel_where(
        self, *, max: int, note: str = "", idempotency_key: str | None = None, **filters: Unpack[_core.RunMatch]
    ) -> BulkResult:
        return await self._send(_core.command_where("cancel", filters, {"max": max, "note": note}, idempotency_key))

    async def stop_where(
        self,
        *,
        max: int,
        reason: str,
        code: str | None = None,
        idempotency_key: str | None = None,
        **filters: Unpack[_core.RunMatch],
    ) -> BulkResult:
        return await self._send(_core.stop_where(filters, max=max, reason=reason, code=code, key=idempotency_key))

    async def cancel(self, run_id: str, note: str = "") -> Run:
        return await self._send(_core.cancel(run_id, note))

    async def stop(self, run_id: str, reason: str, code: str | None = None) -> Run:
        return await self._send(_core.stop(run_id, reason, code))

    async def pause(self, run_id: str) -> Run:
        return await self._send(_core.pause(run_id))

    async def resume(self, run_id: str, ticket: str, input: Any = None) -> Run:
        return await self._send(_core.resume(run_id, ticket, input))

    async def rerun(self, run_id: str, from_seq: int | None = None, **overrides: Unpack[_core.RerunOptions]) -> Run:
        return await self._send(_core.rerun(run_id, from_seq, {k: v for k, v in overrides.items() if v is not None}))

    async def request(self, method: str, path: str, **options: Unpack[_core.RequestOptions]) -> Any:
        return await self._send(_core.request(method, path, options))

    # --- the drivers ---

    async def _send(self, call: _core.Call[T]) -> T:
        attempts = _core.Attempts(call, self.config.retry)
        while True:
            try:
                response = await self._http.request(call.method, call.path, **call.request_args())
            except httpx.TransportError as exc:
                await asyncio.sleep(attempts.after_error(exc))
                continue
            if (delay := attempts.after_answer(response)) is None:
                return call.result(response)
            await asyncio.sleep(delay)

    async def _stream(self, state: StreamState) -> AsyncIterator[Event]:
        while not state.finished:
            headers = state.connect_headers()
            timeout = self.config.stream_timeouts(state.read_timeout(self.config.stream_timeout))
            try:
                async with self._http.stream(
                    "GET", state.path, params=state.params, headers=headers, timeout=timeout
                ) as response:
                    if response.status_code != 200:
                        await response.aread()
                    if state.opened(response):
                        async for chunk in response.aiter_bytes():
                            for event in state.feed(chunk):
                                yield event
                            if state.finished:
                                return
            except httpx.TransportError as exc:
                state.lost(exc)
            if not state.finished:
                await asyncio.sleep(state.next_delay())

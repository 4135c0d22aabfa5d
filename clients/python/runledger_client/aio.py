"""The asyncio client: `Client`'s namespaces and methods, awaited (`runs.list`, `agents.list`,
`runs.stream`, `schedules.list`, `webhooks.list`, `webhooks.deliveries` and `tokens.list` are async
iterators; a stream is an async context manager)."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterable
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


class AsyncStream(StreamTally, _base.AsyncClosing):
    """`Stream` for asyncio: `async with client.runs.stream(id) as events: async for event in
    events: ...` closes the connection when the block ends."""

    def __init__(self, events: AsyncGenerator[Event, None]) -> None:
        super().__init__()
        self._events = events

    async def __aiter__(self) -> AsyncIterator[Event]:
        async for event in self._events:
            self.tally(event)
            yield event

    async def close(self) -> None:
        await self._events.aclose()

    async def until_end(self) -> Event | None:
        async for _ in self:
            pass
        return self.terminal

    async def text(self) -> str:
        await self.until_end()
        return self.joined_text()


class AsyncRuns(_base.Namespace["AsyncClient"]):
    """`client.runs` of `AsyncClient`: see `runledger_client.client.Runs`."""

    async def create(
        self,
        agent: str,
        input: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        **options: Unpack[_core.CreateOptions],
    ) -> Run:
        return await self._client._send(_core.create(agent, input, dict(options), idempotency_key))

    async def get(self, run_id: str) -> Run:
        return await self._client._send(_core.RUNS.get(run_id))

    def list(self, **filters: Unpack[_core.RunFilters]) -> AsyncIterator[Run]:
        return self._client._pages(_core.RUNS.pages(**filters))

    async def events(
        self, run_id: str, after_seq: int = 0, limit: int | None = None, types: str | Iterable[str] | None = None
    ) -> EventPage:
        return await self._client._send(_core.events(run_id, after_seq, limit, types))

    def stream(self, run_id: str, after_seq: int = 0, types: str | Iterable[str] | None = None) -> AsyncStream:
        return AsyncStream(self._client._stream(self._client._streaming(run_id, after_seq, types)))

    async def wait(self, run_id: str, *, released: bool = False, timeout: float | None = None) -> Run:
        return await self._client._drive(
            _core.wait(run_id, released=released, timeout=timeout, config=self._client.config)
        )

    async def cancel(self, run_id: str, note: str = "") -> Run:
        return await self._client._send(_core.cancel(run_id, note))

    async def stop(self, run_id: str, reason: str, code: str | None = None) -> Run:
        return await self._client._send(_core.stop(run_id, reason, code))

    async def pause(self, run_id: str) -> Run:
        return await self._client._send(_core.pause(run_id))

    async def resume(self, run_id: str, ticket: str, input: Any = None) -> Run:
        return await self._client._send(_core.resume(run_id, ticket, input))

    async def rerun(self, run_id: str, from_seq: int | None = None, **overrides: Unpack[_core.RerunOptions]) -> Run:
        return await self._client._send(_core.rerun(run_id, from_seq, overrides))

    async def count_where(self, **filters: Unpack[_core.RunMatch]) -> int:
        try:
            return (await self._client._send(_core.count_where(filters))).matched
        except TooManyMatches as exc:
            return exc.count

    async def cancel_where(
        self, *, max: int, note: str = "", idempotency_key: str | None = None, **filters: Unpack[_core.RunMatch]
    ) -> BulkResult:
        call = _core.cancel_where(filters, max=max, note=note, key=idempotency_key)
        return await self._client._send(call)

    async def stop_where(
        self,
        *,
        max: int,
        reason: str,
        code: str | None = None,
        idempotency_key: str | None = None,
        **filters: Unpack[_core.RunMatch],
    ) -> BulkResult:
        call = _core.stop_where(filters, max=max, reason=reason, code=code, key=idempotency_key)
        return await self._client._send(call)


class AsyncAgents(_base.Namespace["AsyncClient"]):
    def list(self, *, page_size: int | None = None) -> AsyncIterator[Agent]:
        return self._client._pages(_core.AGENTS.pages(page_size=page_size))


class AsyncSchedules(_base.Namespace["AsyncClient"]):
    """`client.schedules` of `Client`, awaited; `list` is an async iterator."""

    async def create(
        self, agent: str, input: dict[str, Any] | None = None, **options: Unpack[_core.ScheduleOptions]
    ) -> Schedule:
        return await self._client._send(_core.schedule_create(agent, input, options))

    def list(self, *, page_size: int | None = None) -> AsyncIterator[Schedule]:
        return self._client._pages(_core.SCHEDULES.pages(page_size=page_size))

    async def get(self, schedule_id: str) -> Schedule:
        return await self._client._send(_core.SCHEDULES.get(schedule_id))

    async def update(self, schedule_id: str, **changes: Unpack[_core.ScheduleChanges]) -> Schedule:
        return await self._client._send(_core.SCHEDULES.update(schedule_id, changes))

    async def delete(self, schedule_id: str) -> None:
        await self._client._send(_core.SCHEDULES.delete(schedule_id))

    async def pause(self, schedule_id: str) -> Schedule:
        return await self._client._send(_core.schedule_command(schedule_id, "pause"))

    async def resume(self, schedule_id: str) -> Schedule:
        return await self._client._send(_core.schedule_command(schedule_id, "resume"))

    async def trigger(self, schedule_id: str) -> Run:
        return await self._client._send(_core.schedule_trigger(schedule_id))

    async def backfill(
        self, schedule_id: str, *, start: datetime | str, end: datetime | str, max: int
    ) -> builtins.list[Run]:
        return await self._client._send(_core.schedule_backfill(schedule_id, start, end, max))


class AsyncWebhooks(_base.Namespace["AsyncClient"]):
    """`client.webhooks` of `Client`, awaited; `list` and `deliveries` are async iterators."""

    async def create(
        self, url: str, events: Iterable[str], metadata: dict[str, str] | None = None, *, all_runs: bool = False
    ) -> Webhook:
        return await self._client._send(_core.webhook_create(url, events, metadata, all_runs))

    def list(self, *, page_size: int | None = None) -> AsyncIterator[Webhook]:
        return self._client._pages(_core.WEBHOOKS.pages(page_size=page_size))

    async def get(self, webhook_id: str) -> Webhook:
        return await self._client._send(_core.WEBHOOKS.get(webhook_id))

    async def update(self, webhook_id: str, **changes: Unpack[_core.WebhookChanges]) -> Webhook:
        return await self._client._send(_core.WEBHOOKS.update(webhook_id, changes))

    async def delete(self, webhook_id: str) -> None:
        await self._client._send(_core.WEBHOOKS.delete(webhook_id))

    async def rotate_secret(self, webhook_id: str) -> Webhook:
        return await self._client._send(_core.webhook_rotate_secret(webhook_id))

    def deliveries(self, webhook_id: str, *, page_size: int | None = None) -> AsyncIterator[WebhookDelivery]:
        return self._client._pages(_core.webhook_delivery_pages(webhook_id, page_size))


class AsyncTokens(_base.Namespace["AsyncClient"]):
    """`client.tokens` of `Client`, awaited; `list` is an async iterator."""

    async def create(
        self, name: str, *, expires_in: int | None = None, expires_at: datetime | str | None = None
    ) -> ApiToken:
        return await self._client._send(_core.token_create(name, expires_in, expires_at))

    def list(self, *, page_size: int | None = None) -> AsyncIterator[ApiToken]:
        return self._client._pages(_core.TOKENS.pages(page_size=page_size))

    async def delete(self, name: str) -> None:
        await self._client._send(_core.TOKENS.delete(name))


class AsyncClient(_base.ClientBase[httpx.AsyncBaseTransport, httpx.AsyncClient], _base.AsyncClosing):
    """`AsyncClient(url=None, token=None, *, profile=None, **options)`: `Client` for asyncio; see
    there."""

    runs: AsyncRuns
    agents: AsyncAgents
    schedules: AsyncSchedules
    webhooks: AsyncWebhooks
    tokens: AsyncTokens
    NAMESPACES = {
        "runs": AsyncRuns,
        "agents": AsyncAgents,
        "schedules": AsyncSchedules,
        "webhooks": AsyncWebhooks,
        "tokens": AsyncTokens,
    }

    def _connect(self, transport: httpx.AsyncBaseTransport | None) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=transport, **self.config.http)

    async def close(self) -> None:
        await self._http.aclose()

    async def request(self, method: str, path: str, **options: Unpack[_core.RequestOptions]) -> Any:
        return await self._send(_core.request(method, path, options))

    # --- the drivers: each step of _core's operations, awaited on this client's connections ---

    async def _send(self, call: _core.Call[T]) -> T:
        return await self._drive(_core.sending(call, self.config.retry))

    async def _pages(self, pages: _core.Pages[T]) -> AsyncIterator[T]:
        while (call := pages.next_call()) is not None:
            for item in pages.take(await self._send(call)):
                yield item

    async def _drive(self, steps: Generator[_core.Step, Any, T]) -> T:
        driving = _core.Driving(steps)
        while driving.step is not None:
            driving.settle(await self._do(driving.step))
        return driving.result()

    async def _do(self, step: _core.Step) -> object:
        if isinstance(step, _core.Sleep):
            await asyncio.sleep(step.seconds)
        elif isinstance(step, _core.Follow):
            async for _ in self._stream(self._following(step)):
                pass
        else:
            try:
                return await self._http.request(**self._exchange_args(step))
            except httpx.TransportError as exc:
                return exc
        return None

    async def _stream(self, state: StreamState) -> AsyncGenerator[Event, None]:
        while not state.finished:
            try:
                async with self._http.stream(**self._stream_args(state)) as response:
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

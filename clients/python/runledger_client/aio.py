"""The asyncio client: `Client`'s namespaces and methods, awaited (`runs.list`, `agents.list`,
`runs.stream`, `schedules.list`, `webhooks.list`, `webhooks.deliveries` and `tokens.list` are async
iterators; a stream is an async context manager)."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterable
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar, Unpack

import httpx

from runledger_client import _core
from runledger_client._config import settings_for
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


class AsyncStream(StreamTally):
    """`Stream` for asyncio: `async with client.runs.stream(id) as events: async for event in
    events: ...` closes the connection when the block ends."""

    def __init__(self, events: AsyncGenerator[Event, None]) -> None:
        super().__init__()
        self._events = events

    async def __aiter__(self) -> AsyncIterator[Event]:
        async for event in self._events:
            self.tally(event)
            yield event

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        await self._events.aclose()

    async def until_end(self) -> Event | None:
        async for _ in self:
            pass
        return self.terminal

    async def text(self) -> str:
        await self.until_end()
        return self.joined_text()


class AsyncRuns:
    """`client.runs` of `AsyncClient`: see `runledger_client.client.Runs`."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

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
        return await self._client._send(_core.get(run_id))

    def list(self, **filters: Unpack[_core.RunFilters]) -> AsyncIterator[Run]:
        return self._client._pages(_core.run_pages(filters))

    async def events(
        self, run_id: str, after_seq: int = 0, limit: int | None = None, types: str | Iterable[str] | None = None
    ) -> EventPage:
        return await self._client._send(_core.events(run_id, after_seq, limit, types))

    def stream(self, run_id: str, after_seq: int = 0, types: str | Iterable[str] | None = None) -> AsyncStream:
        return AsyncStream(self._client._stream(StreamState(run_id, after_seq, self._client.config.retry, types=types)))

    async def wait(self, run_id: str, *, released: bool = False, timeout: float | None = None) -> Run:
        return await self._client._drive(
            _core.wait(run_id, released=released, timeout=timeout, request_timeout=self._client.config.timeout)
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
        overrides_given = {k: v for k, v in overrides.items() if v is not None}
        return await self._client._send(_core.rerun(run_id, from_seq, overrides_given))

    async def count_where(self, **filters: Unpack[_core.RunMatch]) -> int:
        try:
            return (await self._client._send(_core.count_where(filters))).matched
        except TooManyMatches as exc:
            return exc.count

    async def cancel_where(
        self, *, max: int, note: str = "", idempotency_key: str | None = None, **filters: Unpack[_core.RunMatch]
    ) -> BulkResult:
        call = _core.command_where("cancel", filters, {"max": max, "note": note}, idempotency_key)
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


class AsyncAgents:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    def list(self, *, page_size: int | None = None) -> AsyncIterator[Agent]:
        return self._client._pages(_core.agent_pages({"page_size": page_size}))


class AsyncSchedules:
    """`client.schedules` of `Client`, awaited; `list` is an async iterator."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(
        self, agent: str, input: dict[str, Any] | None = None, **options: Unpack[_core.ScheduleOptions]
    ) -> Schedule:
        return await self._client._send(_core.schedule_create(agent, input, options))

    def list(self, *, page_size: int | None = None) -> AsyncIterator[Schedule]:
        return self._client._pages(_core.schedule_pages(page_size))

    async def get(self, schedule_id: str) -> Schedule:
        return await self._client._send(_core.schedule_get(schedule_id))

    async def update(self, schedule_id: str, **changes: Unpack[_core.ScheduleChanges]) -> Schedule:
        return await self._client._send(_core.schedule_update(schedule_id, changes))

    async def delete(self, schedule_id: str) -> None:
        await self._client._send(_core.schedule_delete(schedule_id))

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


class AsyncWebhooks:
    """`client.webhooks` of `Client`, awaited; `list` and `deliveries` are async iterators."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(
        self, url: str, events: Iterable[str], metadata: dict[str, str] | None = None, *, all_runs: bool = False
    ) -> Webhook:
        fields = {"url": url, "events": events, "metadata": metadata, "all_runs": all_runs or None}
        return await self._client._send(_core.webhook_create(fields))

    def list(self, *, page_size: int | None = None) -> AsyncIterator[Webhook]:
        return self._client._pages(_core.webhook_pages(page_size))

    async def get(self, webhook_id: str) -> Webhook:
        return await self._client._send(_core.webhook_get(webhook_id))

    async def update(
        self,
        webhook_id: str,
        *,
        url: str | None = None,
        events: Iterable[str] | None = None,
        metadata: dict[str, str] | None = None,
        all_runs: bool | None = None,
        enabled: bool | None = None,
    ) -> Webhook:
        fields = {"url": url, "events": events, "metadata": metadata, "all_runs": all_runs, "enabled": enabled}
        return await self._client._send(_core.webhook_update(webhook_id, fields))

    async def delete(self, webhook_id: str) -> None:
        await self._client._send(_core.webhook_delete(webhook_id))

    async def rotate_secret(self, webhook_id: str) -> Webhook:
        return await self._client._send(_core.webhook_rotate_secret(webhook_id))

    def deliveries(self, webhook_id: str, *, page_size: int | None = None) -> AsyncIterator[WebhookDelivery]:
        return self._client._pages(_core.webhook_delivery_pages(webhook_id, page_size))


class AsyncTokens:
    """`client.tokens` of `Client`, awaited; `list` is an async iterator."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(
        self, name: str, *, expires_in: int | None = None, expires_at: datetime | str | None = None
    ) -> ApiToken:
        return await self._client._send(_core.token_create(name, expires_in, expires_at))

    def list(self, *, page_size: int | None = None) -> AsyncIterator[ApiToken]:
        return self._client._pages(_core.token_pages(page_size))

    async def delete(self, name: str) -> None:
        await self._client._send(_core.token_delete(name))


class AsyncClient:
    """`AsyncClient(url=None, token=None, *, profile=None, **options)`: `Client` for asyncio; see
    there."""

    runs: AsyncRuns
    agents: AsyncAgents
    schedules: AsyncSchedules
    webhooks: AsyncWebhooks
    tokens: AsyncTokens

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        profile: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        **options: Unpack[_core.ClientOptions],
    ) -> None:
        settings = settings_for(url, token, profile)
        self._attach(_core.Config(str(settings.url), str(settings.token), options))
        self._http = httpx.AsyncClient(transport=transport, **self.config.http)

    def _attach(self, config: _core.Config) -> None:
        self.config = config
        self.runs = AsyncRuns(self)
        self.agents = AsyncAgents(self)
        self.schedules = AsyncSchedules(self)
        self.webhooks = AsyncWebhooks(self)
        self.tokens = AsyncTokens(self)

    def with_options(self, **options: Unpack[_core.ClientOptions]) -> AsyncClient:
        copy = object.__new__(AsyncClient)
        copy._attach(self.config.with_options(options))
        copy._http = self._http
        return copy

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def request(self, method: str, path: str, **options: Unpack[_core.RequestOptions]) -> Any:
        return await self._send(_core.request(method, path, options))

    # The names of 0.1, before the namespaces: each warns, then does what client.runs.<name> does.
    create = _core.Deprecated("runs")
    get = _core.Deprecated("runs")
    list = _core.Deprecated("runs")
    events = _core.Deprecated("runs")
    stream = _core.Deprecated("runs")
    wait = _core.Deprecated("runs")
    cancel = _core.Deprecated("runs")
    stop = _core.Deprecated("runs")
    pause = _core.Deprecated("runs")
    resume = _core.Deprecated("runs")
    rerun = _core.Deprecated("runs")
    count_where = _core.Deprecated("runs")
    cancel_where = _core.Deprecated("runs")
    stop_where = _core.Deprecated("runs")

    # --- the drivers ---

    async def _send(self, call: _core.Call[T]) -> T:
        attempts = _core.Attempts(call, self.config.retry)
        while True:
            try:
                response = await self._http.request(
                    call.method, call.path, **({"timeout": self.config.timeout} | call.request_args())
                )
            except httpx.TransportError as exc:
                await asyncio.sleep(attempts.after_error(exc))
                continue
            if (delay := attempts.after_answer(response)) is None:
                return call.result(response)
            await asyncio.sleep(delay)

    async def _pages(self, pages: _core.Pages[T]) -> AsyncIterator[T]:
        while (call := pages.next_call()) is not None:
            for item in pages.take(await self._send(call)):
                yield item

    async def _drive(self, steps: Generator[_core.Step, Any, T]) -> T:
        result: Any = None
        try:
            while True:
                step = steps.send(result)
                if isinstance(step, _core.Sleep):
                    await asyncio.sleep(step.seconds)
                    result = None
                elif isinstance(step, _core.Follow):
                    state = StreamState(step.run_id, step.after_seq, self.config.retry, step.deadline)
                    async for _ in self._stream(state):
                        pass
                    result = None
                else:
                    result = await self._send(step)
        except StopIteration as done:
            value: T = done.value
            return value

    async def _stream(self, state: StreamState) -> AsyncGenerator[Event, None]:
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

"""What `Client` and `AsyncClient` share besides `_core`'s operations: how one is made (its
configuration, namespaces, connections), `with_options()`, the flat names of 0.1, and the arguments
of each request and stream they send. Each adds only what waits: its sends, sleeps and reads."""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import Any, ClassVar, Generic, Self, TypeVar, Unpack

import httpx

from runledger_client import _core
from runledger_client._config import settings_for
from runledger_client._stream import StreamState


class Closing:
    """`with it:` closes it when the block ends (on `break` or an error too)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


class AsyncClosing:
    """`async with it:` closes it when the block ends (on `break` or an error too)."""

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.close()


Owner = TypeVar("Owner")


class Namespace(Generic[Owner]):
    """`client.runs`, `client.webhooks`, …: a part of the API, sent through the client that owns it."""

    def __init__(self, client: Owner) -> None:
        self._client = client


Transport = TypeVar("Transport", httpx.BaseTransport, httpx.AsyncBaseTransport)
Http = TypeVar("Http", httpx.Client, httpx.AsyncClient)


class ClientBase(Generic[Transport, Http]):
    """`Client(url=None, token=None, *, profile=None, transport=None, **options)`, either kind: what
    is not given is read from the environment, then from the config file's profile
    (runledger_client._config)."""

    # Each namespace's attribute and class (`runs`: `Runs`), made for each client and its copies.
    NAMESPACES: ClassVar[dict[str, type]]
    config: _core.Config
    _http: Http

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        profile: str | None = None,
        transport: Transport | None = None,
        **options: Unpack[_core.ClientOptions],
    ) -> None:
        settings = settings_for(url, token, profile)
        self._attach(_core.Config(str(settings.url), str(settings.token), options))
        self._http = self._connect(transport)

    def _connect(self, transport: Transport | None) -> Http:
        raise NotImplementedError

    def _attach(self, config: _core.Config) -> None:
        self.config = config
        for name, namespace in self.NAMESPACES.items():
            setattr(self, name, namespace(self))

    def with_options(self, **options: Unpack[_core.ClientOptions]) -> Self:
        """This client with other options (`timeout`, `max_retries`, …), sharing its connections:
        `client.with_options(timeout=5).runs.get(id)`."""
        copy = object.__new__(type(self))
        copy._attach(self.config.with_options(options))
        copy._http = self._http
        return copy

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

    # --- what the drivers send ---

    def _exchange_args(self, call: _core.Call[Any]) -> dict[str, Any]:
        """httpx's arguments for one try of `call`."""
        return {"method": call.method, "url": call.path, "timeout": self.config.timeout} | call.request_args()

    def _stream_args(self, state: StreamState) -> dict[str, Any]:
        """httpx's arguments for the next connect of a stream."""
        return {
            "method": "GET",
            "url": state.path,
            "params": state.params,
            "headers": state.connect_headers(),
            "timeout": self.config.stream_timeouts(state.read_timeout(self.config.stream_timeout)),
        }

    def _following(self, step: _core.Follow) -> StreamState:
        return StreamState(step.run_id, step.after_seq, self.config.retry, step.deadline)

    def _streaming(self, run_id: str, after_seq: int, types: str | Iterable[str] | None) -> StreamState:
        return StreamState(run_id, after_seq, self.config.retry, types=types)

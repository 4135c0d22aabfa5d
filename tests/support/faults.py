"""Clients for the fault-injection tests (tests/worker/test_faults.py).

JSON requests and SSE streams over raw asyncio sockets, one connection per request, each bounded
in time. They ride out killed web processes and an unreachable database the way a careful program
does — retrying connection errors and 503s with a bounded, jittered backoff, against any of the
web processes — and record what they saw, so that the test can hold the server to its promises:
no 5xx but a 503 `database_unavailable` in the error shape, no request left without an answer,
every stream reassembled exactly from its Last-Event-ID reconnects.
"""

import asyncio
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from runs.events import TERMINAL_EVENT_TYPES
from tests.support.sse import Event, Stream, auth_headers

# What breaks a connection under a client: a refused connect (the web process is restarting), a
# reset or an early EOF (it was killed mid-answer).
TRANSPORT_ERRORS = (OSError, asyncio.IncompleteReadError)


class Hang(AssertionError):
    """A request or stream that got no answer (not even a keep-alive) within its bound."""


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    tries: int = 1  # requests `Api.call` sent to get this answer (more after transport errors, 503s)

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


async def _request(base_url: str, method: str, path: str, headers: dict[str, str], body: Any) -> Response:
    url = urlsplit(base_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    reader, writer = await asyncio.open_connection(host, port)
    try:
        payload = b"" if body is None else json.dumps(body).encode()
        lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close", "Accept: application/json"]
        lines += [f"Content-Length: {len(payload)}"]
        lines += ["Content-Type: application/json"] if body is not None else []
        lines += [f"{k}: {v}" for k, v in headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        response_headers: dict[str, str] = {}
        for line in header_lines:
            if line:
                name, _, value = line.partition(":")
                response_headers[name.strip().lower()] = value.strip()
        if response_headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                parts.append(await reader.readexactly(size))
                await reader.readexactly(2)
            data = b"".join(parts)
        elif "content-length" in response_headers:
            data = await reader.readexactly(int(response_headers["content-length"]))
        else:
            data = await reader.read()
        return Response(int(status_line.split(" ")[1]), response_headers, data)
    finally:
        writer.transport.abort()


async def request(
    base_url: str,
    method: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    body: Any = None,
    timeout: float = 10,
) -> Response:
    """One request on its own connection. Transport failures raise (`TRANSPORT_ERRORS`); no
    complete answer within `timeout` raises `Hang`."""
    try:
        return await asyncio.wait_for(_request(base_url, method, path, headers or {}, body), timeout)
    except TimeoutError as exc:
        raise Hang(f"{method} {path} on {base_url}: no answer within {timeout}s") from exc


def assert_not_a_server_error(what: str, response: Response) -> None:
    """Below 500, or the one server error the API promises: 503 `database_unavailable`, as JSON."""
    if response.status < 500:
        return
    assert response.status == 503, f"{what}: {response.status} {response.body[:2000]!r}"
    assert response.headers.get("content-type", "").startswith("application/json"), (what, response.headers)
    body = response.json()
    assert body["error"]["code"] == "database_unavailable", (what, body)


def token_header(token: str) -> dict[str, str]:
    return {"Authorization": f"Token {token}"}


@dataclass
class Stats:
    ops: Counter[str] = field(default_factory=Counter)  # operations answered, by kind
    answers: Counter[str] = field(default_factory=Counter)  # "<kind> <status>"
    retries: Counter[str] = field(default_factory=Counter)  # "transport" / "503", by what was retried
    slowest: float = 0.0  # the longest a single request took to be answered (s)


class Api:
    """Requests to whichever web process answers, retried over transport errors and 503s.

    Every other answer is returned, after checking that it is no server error; a request that
    keeps failing for `give_up_after` seconds fails the test, as does one left without an answer
    for `request_timeout` seconds (a hang)."""

    def __init__(
        self,
        webs: list[str],
        rng: random.Random,
        stats: Stats,
        *,
        request_timeout: float = 10,
        give_up_after: float = 45,
    ) -> None:
        self.webs = webs
        self.rng = rng
        self.stats = stats
        self.request_timeout = request_timeout
        self.give_up_after = give_up_after

    async def backoff(self, delay: float) -> float:
        await asyncio.sleep(delay * self.rng.uniform(0.5, 1.5))  # the retry's backoff
        return min(2 * delay, 1.0)

    async def call(
        self,
        kind: str,
        token: str,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.give_up_after
        delay = 0.05
        tries = 0
        while True:
            started = loop.time()
            tries += 1
            try:
                response = await request(
                    self.rng.choice(self.webs),
                    method,
                    path,
                    headers=token_header(token) | (headers or {}),
                    body=body,
                    timeout=self.request_timeout,
                )
            except TRANSPORT_ERRORS:
                self.stats.retries[f"{kind} transport"] += 1
            else:
                self.stats.slowest = max(self.stats.slowest, loop.time() - started)
                assert_not_a_server_error(f"{kind} {method} {path}", response)
                if response.status != 503:
                    self.stats.ops[kind] += 1
                    self.stats.answers[f"{kind} {response.status}"] += 1
                    response.tries = tries
                    return response
                self.stats.retries[f"{kind} 503"] += 1
            assert loop.time() < deadline, f"{kind} {method} {path}: only errors for {self.give_up_after}s"
            delay = await self.backoff(delay)


# --- streams ------------------------------------------------------------------------------------


@dataclass
class Watch:
    """One client's view of one run's stream, reassembled across its reconnects."""

    run_id: str
    events: list[Event] = field(default_factory=list)
    connects: int = 0  # streams opened (200)
    drops: int = 0  # connections the client cut itself, at a random byte
    broken: int = 0  # connections that failed under it (a killed web process) or could not be made
    ended_early: int = 0  # streams the server ended before the terminal event
    unavailable: int = 0  # 503s
    final_status: int = 0  # the answer to a reconnect after the terminal event (204)

    @property
    def reconnects(self) -> int:
        """Connections tried again after one ended without the terminal event."""
        return self.drops + self.broken + self.ended_early + self.unavailable

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1].event in TERMINAL_EVENT_TYPES


def drop_budget(rng: random.Random) -> int:
    """How many body bytes a connection gets before the client cuts it, possibly mid-frame."""
    return rng.randint(0, 60) if rng.random() < 0.25 else rng.randint(0, 1500)


async def _read(stream: Stream, watch: Watch, budget: int | None, stall: float) -> str:
    """Feed the stream's frames into the watch until it ends, breaks, or the budget cuts it."""
    chunks = stream.chunks()
    while True:
        try:
            data = await asyncio.wait_for(anext(chunks), stall)
        except StopAsyncIteration:
            return "ended"
        except TimeoutError as exc:
            # The server sends a keep-alive every RUNLEDGER_SSE_KEEPALIVE_SECONDS: silence is a hang.
            raise Hang(f"stream of run {watch.run_id}: nothing for {stall}s") from exc
        except (*TRANSPORT_ERRORS, ValueError):
            return "broken"
        if budget is not None and stream.bytes_read + len(data) >= budget:
            data = data[: budget - stream.bytes_read]
            stream.bytes_read += len(data)
            watch.events.extend(stream.parser.feed(data))
            stream.abort()
            return "dropped"
        stream.bytes_read += len(data)
        watch.events.extend(stream.parser.feed(data))


async def follow(
    api: Api,
    token: str,
    run_id: str,
    rng: random.Random,
    *,
    drop_rate: float,
    stall: float = 10,
    give_up_after: float = 90,
) -> Watch:
    """Read a run's stream to its terminal event as an `EventSource` would, through connections
    that the client cuts at random bytes (`drop_rate` of them) or that break under it, each
    reconnect going to a random web process with the last *dispatched* id as Last-Event-ID. Then
    one more reconnect, which must say 204: nothing more will come."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + give_up_after
    watch = Watch(run_id)
    path = f"/api/runs/{run_id}/stream/?after_seq=0"  # as EventSource: the URL never changes
    last_id: str | None = None
    delay = 0.05
    while True:
        assert loop.time() < deadline, f"stream of run {run_id}: not finished within {give_up_after}s"
        stream = Stream(rng.choice(api.webs), path, auth_headers(token, last_id))
        try:
            await stream.open(timeout=stall)
        except TimeoutError as exc:
            raise Hang(f"stream of run {run_id}: no answer within {stall}s") from exc
        except (*TRANSPORT_ERRORS, ValueError):
            watch.broken += 1
            stream.abort()
            delay = await api.backoff(delay)
            continue
        if stream.status == 503:
            assert_not_a_server_error(f"stream of run {run_id}", Response(503, stream.headers, stream.body))
            watch.unavailable += 1
            delay = await api.backoff(delay)
            continue
        if watch.done:
            assert stream.status == 204, (run_id, stream.status, stream.body)
            watch.final_status = stream.status
            return watch
        assert stream.status == 200, (run_id, stream.status, stream.body)
        watch.connects += 1
        delay = 0.05
        budget = drop_budget(rng) if rng.random() < drop_rate else None
        try:
            how = await _read(stream, watch, budget, stall)
        finally:
            stream.abort()
        last_id = stream.parser.last_event_id or last_id
        if how == "dropped":
            watch.drops += 1
        elif how == "broken":
            watch.broken += 1
        elif not watch.done:
            watch.ended_early += 1

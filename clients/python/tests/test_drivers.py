"""The sync and async drivers against an in-process server (httpx.MockTransport) that fails on
purpose: connections that die before an answer or mid-stream, 503s. The live suite (the project's
tests/client/test_python_client.py) does the same against real processes."""

import asyncio
import json
import random
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest

import runledger_client as rl

FAST = rl.Retry(attempts=4, base=0.001, cap=0.005)
RUN = {"id": "r1", "status": "queued", "last_seq": 0}


def frame(seq: int, last: int) -> bytes:
    type_ = "run.completed" if seq == last else "output.delta"
    body = json.dumps({"seq": seq, "type": type_, "data": {"text": f"t{seq}"}, "created_at": "x", "attempt": 1})
    return f"id: {seq}\nevent: {type_}\ndata: {body}\n\n".encode()


class Cut(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body that dies after `limit` bytes, as a dropped connection does."""

    def __init__(self, body: bytes, limit: int) -> None:
        self.body, self.limit = body, limit

    def __iter__(self) -> Iterator[bytes]:
        yield self.body[: self.limit]
        if self.limit < len(self.body):
            raise httpx.ReadError("connection cut")

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self:
            yield part


def stream_server(last: int, seed: int) -> tuple[Callable[[httpx.Request], httpx.Response], list[str | None]]:
    """Serves a finished run of `last` events, cutting every answer at a random byte."""
    rng = random.Random(seed)
    asked: list[str | None] = []

    def handle(request: httpx.Request) -> httpx.Response:
        cursor_header = request.headers.get("Last-Event-ID")
        asked.append(cursor_header)
        cursor = int(cursor_header or request.url.params["after_seq"])
        if cursor >= last:
            return httpx.Response(204)
        body = b"retry: 0\n\n" + b"".join(frame(s, last) for s in range(cursor + 1, last + 1))
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, stream=Cut(body, rng.randint(0, 400)))

    return handle, asked


def test_sync_stream_reassembles_the_log_across_cuts_at_random_bytes() -> None:
    handle, asked = stream_server(last=60, seed=1)
    with rl.Client("http://test", "t", retry=FAST, transport=httpx.MockTransport(handle)) as client:
        seqs = [e.seq for e in client.runs.stream("r1")]
    assert seqs == list(range(1, 61))
    assert len(asked) > 10


def test_async_stream_reassembles_the_log_across_cuts_at_random_bytes() -> None:
    handle, asked = stream_server(last=60, seed=2)

    async def read() -> list[int]:
        async with rl.AsyncClient("http://test", "t", retry=FAST, transport=httpx.MockTransport(handle)) as client:
            return [e.seq async for e in client.runs.stream("r1")]

    assert asyncio.run(read()) == list(range(1, 61))
    assert len(asked) > 10


def flaky_create() -> tuple[Callable[[httpx.Request], httpx.Response], list[httpx.Request]]:
    """Create fails twice (a dead connection, then a 503) before it answers."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) == 1:
            raise httpx.ConnectError("refused")
        if len(seen) == 2:
            return httpx.Response(503, json={"error": {"code": "database_unavailable", "message": "", "detail": None}})
        return httpx.Response(201, json=RUN)

    return handle, seen


def test_create_retries_with_one_idempotency_key() -> None:
    handle, seen = flaky_create()
    with rl.Client("http://test", "t", retry=FAST, transport=httpx.MockTransport(handle)) as client:
        assert client.runs.create("demo", {"deltas": 1}).id == "r1"
    keys = {r.headers["Idempotency-Key"] for r in seen}
    assert len(seen) == 3 and len(keys) == 1
    assert json.loads(seen[-1].content) == {"agent": "demo", "input": {"deltas": 1}}


def test_async_create_retries_with_one_idempotency_key() -> None:
    handle, seen = flaky_create()

    async def create() -> rl.Run:
        async with rl.AsyncClient("http://test", "t", retry=FAST, transport=httpx.MockTransport(handle)) as client:
            return await client.runs.create("demo")

    assert asyncio.run(create()).id == "r1"
    assert len(seen) == 3 and len({r.headers["Idempotency-Key"] for r in seen}) == 1


def test_retries_are_bounded_and_end_with_the_typed_error() -> None:
    def unavailable(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"error": {"code": "database_unavailable", "message": "", "detail": None}})

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    for handle, error in ((unavailable, rl.DatabaseUnavailable), (refused, rl.TransportError)):
        client = rl.Client("http://test", "t", retry=FAST, transport=httpx.MockTransport(handle))
        with client, pytest.raises(error):
            client.runs.get("r1")


def test_a_request_not_safe_to_repeat_is_sent_once() -> None:
    seen: list[httpx.Request] = []

    def refused(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        raise httpx.ConnectError("refused")

    client = rl.Client("http://test", "t", retry=FAST, transport=httpx.MockTransport(refused))
    with client, pytest.raises(rl.TransportError):
        client.request("POST", "/api/elsewhere/")
    assert len(seen) == 1


def test_list_follows_each_pages_next_with_the_filters_as_the_server_reads_them() -> None:
    pages = {
        None: {
            "next": "http://elsewhere:9/api/runs/?cursor=c2&status=queued%2Crunning",
            "previous": None,
            "results": [{"id": "a"}, {"id": "b"}],
        },
        "c2": {"next": None, "previous": "http://elsewhere:9/api/runs/?cursor=p", "results": [{"id": "c"}]},
    }
    seen: list[httpx.URL] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url)
        assert request.url.params["status"] == "queued,running"
        return httpx.Response(200, json=pages[request.url.params.get("cursor")])

    with rl.Client("http://test", "t", transport=httpx.MockTransport(handle)) as client:
        runs = list(client.runs.list(status=["queued", "running"], metadata={"customer": "42"}, end_code="x"))
    assert [r.id for r in runs] == ["a", "b", "c"]
    first, second = seen
    assert (first.host, first.params["metadata.customer"], first.params["end_code"]) == ("test", "42", "x")
    # The cursor's page is asked of this client's server, whatever host `next` names.
    assert (second.host, second.path, second.params["cursor"]) == ("test", "/api/runs/", "c2")


def wait_server() -> tuple[Callable[[httpx.Request], httpx.Response], list[httpx.Request]]:
    """The server's wait of a run that times out once, loses one answer mid-body (as a wait that
    cannot answer after all does), then waits for a resume; its stream goes on from there to the end."""
    answers = [
        {**RUN, "status": "running", "last_seq": 2, "wait_result": "timeout"},
        None,  # cut
        {**RUN, "status": "waiting", "last_seq": 3, "wait_result": "waiting"},
    ]
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/api/runs/r1/wait/":
            answer = answers.pop(0)
            if answer is None:
                return httpx.Response(200, headers={"Content-Type": "application/json"}, stream=Cut(b'{"id": "r1"', 5))
            return httpx.Response(200, json=answer)
        if request.url.path == "/api/runs/r1/stream/":
            body = b"".join(frame(seq, 5) for seq in range(int(request.url.params["after_seq"]) + 1, 6))
            return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, content=body)
        return httpx.Response(200, json={**RUN, "status": "completed", "last_seq": 5})

    return handle, seen


def test_wait_asks_the_servers_wait_again_and_follows_the_stream_of_a_run_that_waits() -> None:
    for make in ("sync", "async"):
        handle, seen = wait_server()
        transport = httpx.MockTransport(handle)
        if make == "sync":
            with rl.Client("http://test", "t", retry=FAST, transport=transport) as client:
                run = client.runs.wait("r1", timeout=30)
        else:

            async def wait(transport: httpx.MockTransport) -> rl.Run:
                async with rl.AsyncClient("http://test", "t", retry=FAST, transport=transport) as client:
                    return await client.runs.wait("r1", timeout=30)

            run = asyncio.run(wait(transport))
        assert run.status == "completed"
        waits = [r for r in seen if r.url.path.endswith("/wait/")]
        assert len(waits) == 3 and all(0 < float(r.url.params["timeout"]) <= 30 for r in waits)
        streams = [r for r in seen if r.url.path.endswith("/stream/")]
        assert [r.url.params["after_seq"] for r in streams] == ["3"]

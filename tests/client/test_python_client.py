"""The Python client (clients/python) against the real thing: a uvicorn web process and a worker
on PostgreSQL (one pair for the module, tests/support/live.py), reached through a CuttableProxy
that cuts streams server-side mid-frame and drops answers after the server sent them: streams
reassembled, retries that command once, every error code its exception.

The cut offsets are seeded; the seed is printed (shown with a failure) and can be replayed with
RUNLEDGER_TEST_SEED=<seed>.
"""

import asyncio
import http.server
import json
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User

import runledger_client as rl
from runs import services
from runs.agents.demo import demo_text
from runs.models import Run
from tests.factories import queued_run
from tests.support.db import token_for
from tests.support.live import FAST, assert_is_the_stored_log, cut_budgets, mid_frame, run_async
from tests.support.procs import Procs, free_port, subprocess_env
from tests.support.proxies import CuttableProxy
from tests.support.runs import event_types
from tests.support.seed import SEED

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


# --- streams through cuts -------------------------------------------------------------------------


def test_streams_reassemble_every_stored_event_through_200_server_side_cuts(
    proxy: CuttableProxy, alice: User, client: rl.Client
) -> None:
    """Runs streamed live while a worker executes them, every stream connection cut by the server
    side after a random number of bytes: each stream is exactly the stored log, 1..last."""
    print(f"seed {SEED}")
    proxy.cut_streams_after(cut_budgets(SEED))
    demo = {"deltas": 120, "delay_ms": 2}
    token = token_for(alice)

    async def five_at_once() -> list[tuple[str, list[Any]]]:
        """Four runs on one AsyncClient and one on the sync Client (in a thread), all at once."""
        async with rl.AsyncClient(proxy.url, token, retry=FAST) as aclient:
            runs = [await aclient.runs.create("demo", demo) for _ in range(4)]

            async def read(run: rl.Run) -> tuple[str, list[Any]]:
                return run.id, [event.object async for event in aclient.runs.stream(run.id)]

            def read_sync() -> tuple[str, list[Any]]:
                run = client.runs.create("demo", demo)
                return run.id, [event.object for event in client.runs.stream(run.id)]

            return list(await asyncio.gather(asyncio.to_thread(read_sync), *(read(run) for run in runs)))

    rounds = 0
    while proxy.cuts < 200 and rounds < 6:
        for run_id, objects in run_async(five_at_once):
            assert_is_the_stored_log(objects, run_id)
            assert objects[-1]["type"] == "run.completed"
        rounds += 1
    mid = sum(mid_frame(tail) for tail in proxy.cut_tails)
    print(f"{rounds} rounds, {proxy.cuts} cuts ({mid} mid-frame), {len(proxy.stream_requests())} stream requests")
    assert proxy.cuts >= 200, f"seed {SEED}"
    assert mid >= 100, f"seed {SEED}"


def test_a_stream_ends_at_204_for_a_finished_run_read_to_its_end(client: rl.Client) -> None:
    run = client.runs.wait(client.runs.create("demo", {"deltas": 3, "delay_ms": 0}).id)
    assert run.status == "completed"
    assert list(client.runs.stream(run.id, after_seq=run.last_seq)) == []
    tail = list(client.runs.stream(run.id, after_seq=run.last_seq - 2))
    assert [e.seq for e in tail] == [run.last_seq - 1, run.last_seq]


def test_wait_is_the_servers_and_streams_and_pages_take_types(proxy: CuttableProxy, client: rl.Client) -> None:
    run = client.runs.wait(client.runs.create("demo", {"deltas": 4, "delay_ms": 0}).id)
    assert (run.status, run["wait_result"]) == ("completed", "ended")
    waits = [r for r in list(proxy.requests) if r.path.startswith(f"/api/runs/{run.id}/wait/")]
    assert waits and all("timeout=" in r.path for r in waits)
    with client.runs.stream(run.id, types=["output.delta"]) as stream:
        deltas = list(stream)
    assert [e.type for e in deltas] == ["output.delta"] * 4 + ["run.completed"]
    assert [e.type for e in client.runs.events(run.id, types="run.*").events] == [
        "run.created",
        "run.started",
        "run.completed",
    ]
    with pytest.raises(rl.ValidationError):
        client.runs.events(run.id, types=["nope.*"])


def test_json_event_pages_are_the_stored_log(client: rl.Client) -> None:
    run = client.runs.wait(client.runs.create("demo", {"deltas": 7, "delay_ms": 0}).id)
    objects: list[Any] = []
    page = client.runs.events(run.id, limit=3)
    while True:
        assert len(page.events) <= 3
        objects += [e.object for e in page.events]
        if page.end_of_stream:
            break
        page = client.runs.events(run.id, after_seq=page.next_after_seq, limit=3)
    assert_is_the_stored_log(objects, run.id)
    assert page.run_status == "completed" and page.last_seq == run.last_seq


# --- retries across lost answers ------------------------------------------------------------------


def test_create_retried_across_a_dropped_answer_makes_one_run(
    proxy: CuttableProxy, alice: User, client: rl.Client
) -> None:
    proxy.drop_next_answer("/api/runs/")
    run = client.runs.create("demo", {"deltas": 2, "delay_ms": 0})
    posts = [r for r in proxy.requests if r.method == "POST"]
    assert proxy.dropped_answers == 1
    assert len(posts) == 2 and posts[0].headers["idempotency-key"] == posts[1].headers["idempotency-key"]
    assert list(Run.objects.filter(owner=alice).values_list("pk", flat=True)) == [uuid.UUID(run.id)]
    assert client.runs.wait(run.id).output["text"] == demo_text(2)


def test_a_cancel_retried_across_a_dropped_answer_returns_the_cancelled_run_and_waits_for_its_release(
    proxy: CuttableProxy, alice: User
) -> None:
    token = token_for(alice)

    async def scenario() -> tuple[rl.Run, rl.Run]:
        async with rl.AsyncClient(proxy.url, token, retry=FAST) as aclient:
            run = await aclient.runs.create("demo", {"deltas": 2, "tool": "slow", "tool_ms": 60_000})
            async for event in aclient.runs.stream(run.id):
                if event.type == "tool.started":
                    break
            proxy.drop_next_answer(f"/api/runs/{run.id}/cancel/")
            cancelled = await aclient.runs.cancel(run.id, note="enough")
            return cancelled, await aclient.runs.wait(run.id, released=True, timeout=30)

    cancelled, released = run_async(scenario)
    assert proxy.dropped_answers == 1
    assert cancelled.status == "cancelled" and cancelled.end_code == "cancelled_by_user"
    assert event_types(Run.objects.get(pk=cancelled.id)).count("run.cancelled") == 1
    assert released.attempt is not None and released.attempt["released_at"] is not None
    # What it produced before the tool began, kept: in the cancel's answer already.
    assert cancelled.partial_output == released.partial_output == {"text": demo_text(1)}
    assert released.usage == {"steps": released.steps_used, "events": released.events_used}


# --- commands, wait, list -------------------------------------------------------------------------


def test_ask_resume_pause_cancel_and_stop_through_the_async_client(proxy: CuttableProxy, make_user: Any) -> None:
    token = token_for(make_user(perms=("runs.stop_run",)))

    async def scenario() -> dict[str, rl.Run]:
        async with rl.AsyncClient(proxy.url, token, retry=FAST) as aclient:
            asked = await aclient.runs.create("demo", {"deltas": 4, "delay_ms": 0, "ask": "name?"})
            async for event in aclient.runs.stream(asked.id):
                if event.type == "run.waiting":
                    assert event.data == {"reason": "input_required", "prompt": "name?"}
                    break
            waiting = await aclient.runs.get(asked.id)
            assert waiting.status == "waiting" and waiting.resume_ticket
            await aclient.runs.resume(asked.id, waiting.resume_ticket, {"name": "Ada"})
            # Retried after a lost answer, the same resume is answered again and changes nothing.
            await aclient.runs.resume(asked.id, waiting.resume_ticket, {"name": "Ada"})
            answered = await aclient.runs.wait(asked.id, timeout=30)

            paused = await aclient.runs.create("demo", {"deltas": 400, "delay_ms": 20})
            async for event in aclient.runs.stream(paused.id):
                if event.seq == 3:  # the first output.delta: running
                    pending = await aclient.runs.pause(paused.id)
                    assert pending.status == "running"  # 202: the worker parks it at its next boundary
                elif event.type == "run.waiting":
                    assert event.data["reason"] == "paused"
                    break
            cancelled = await aclient.runs.cancel(paused.id)

            stopped = await aclient.runs.create("demo", {"deltas": 400, "delay_ms": 20})
            async for event in aclient.runs.stream(stopped.id):
                if event.type == "output.delta":
                    break
            with pytest.raises(TimeoutError):
                await aclient.runs.wait(stopped.id, timeout=0.3)
            stop = await aclient.runs.stop(stopped.id, "over budget", code="policy")
            return {"answered": answered, "cancelled": cancelled, "stop": stop}

    runs = run_async(scenario)
    assert runs["answered"].status == "completed" and runs["answered"].output["answer"] == {"name": "Ada"}
    assert event_types(Run.objects.get(pk=runs["answered"].id)).count("run.resumed") == 1
    assert runs["cancelled"].status == "cancelled"
    assert "run.waiting" in event_types(Run.objects.get(pk=runs["cancelled"].id))
    assert (runs["stop"].status, runs["stop"].end_code) == ("stopped", "policy")


def test_list_iterates_every_page_newest_first_with_filters(client: rl.Client, bob: User) -> None:
    made = [client.runs.create("demo", {"deltas": 1, "delay_ms": 0}) for _ in range(5)]
    for run in made:
        client.runs.wait(run.id)
    cancelled = client.runs.create("demo", {"deltas": 100, "delay_ms": 50}, metadata={"customer": "42"})
    assert cancelled.metadata == {"customer": "42"}
    client.runs.cancel(cancelled.id)
    services.run_cancel(run_id=queued_run(bob).pk, actor=bob)  # not alice's: never listed
    listed = list(client.runs.list(page_size=2))
    assert [r.id for r in listed] == [cancelled.id, *(r.id for r in reversed(made))]
    assert [r.id for r in client.runs.list(status="cancelled")] == [cancelled.id]
    assert [r.id for r in client.runs.list(status=["cancelled", "completed"], page_size=2)] == [r.id for r in listed]
    assert [r.id for r in client.runs.list(metadata={"customer": "42"}, end_code="cancelled_by_user")] == [cancelled.id]
    assert list(client.runs.list(metadata={"customer": "7"})) == []
    assert list(client.runs.list(agent="nobody")) == []


# --- every error code is its exception ------------------------------------------------------------


def test_every_error_code_the_server_sends_is_its_exception(
    client: rl.Client, proxy: CuttableProxy, alice: User
) -> None:
    run = client.runs.wait(client.runs.create("demo", {"deltas": 1, "delay_ms": 0}).id)
    unknown = str(uuid.uuid4())

    def raised(exception: type[rl.APIError], call: Callable[[], Any]) -> rl.APIError:
        with pytest.raises(exception) as caught:
            call()
        assert type(caught.value) is exception
        return caught.value

    refused = raised(rl.ValidationError, lambda: client.runs.create("no-such-agent"))
    assert refused.status == 400 and "agent" in refused.detail
    with rl.Client(proxy.url, "wrong-token") as stranger:
        assert raised(rl.NotAuthenticated, lambda: stranger.runs.get(run.id)).status == 401
        raised(rl.NotAuthenticated, lambda: list(stranger.runs.stream(run.id)))
    assert raised(rl.PermissionDenied, lambda: client.runs.stop(run.id, "no")).status == 403
    raised(rl.NotFound, lambda: client.runs.get(unknown))
    raised(rl.NotFound, lambda: list(client.runs.stream(unknown)))
    conflict = raised(rl.InvalidTransition, lambda: client.runs.cancel(run.id))
    assert conflict.status == 409 and conflict.run is not None and conflict.run.status == "completed"
    key = uuid.uuid4().hex
    client.runs.create("demo", {"deltas": 1, "delay_ms": 0}, idempotency_key=key)
    assert (
        raised(rl.IdempotencyMismatch, lambda: client.runs.create("demo", {"deltas": 2}, idempotency_key=key)).status
        == 422
    )
    assert raised(rl.PayloadTooLarge, lambda: client.runs.create("demo", {"pad": "x" * 300_000})).status == 413
    assert raised(rl.MethodNotAllowed, lambda: client.request("DELETE", f"/api/runs/{run.id}/")).status == 405

    def unsupported() -> Any:
        return client.request("POST", "/api/runs/", content=b"agent=demo", headers={"Content-Type": "text/plain"})

    assert raised(rl.UnsupportedMediaType, unsupported).status == 415

    asking = client.runs.create("demo", {"deltas": 2, "delay_ms": 0, "ask": "?"})
    for event in client.runs.stream(asking.id):
        if event.type == "run.waiting":
            break
    stale = raised(rl.StaleTicket, lambda: client.runs.resume(asking.id, "not-the-ticket"))
    assert stale.run is not None and stale.run.status == "waiting"
    # Its question (run.waiting) took the one event of its budget: a resume would pass it.
    full = client.runs.create("demo", {"deltas": 1, "delay_ms": 0, "ask": "?"}, max_events=1)
    for event in client.runs.stream(full.id):
        if event.type == "run.waiting":
            break
    ticket = client.runs.get(full.id).resume_ticket
    assert ticket is not None
    exhausted = raised(rl.BudgetExhausted, lambda: client.runs.resume(full.id, ticket))
    assert exhausted.status == 409 and exhausted.run is not None
    assert (exhausted.run.status, exhausted.run.events_used, exhausted.run.max_events) == ("waiting", 1, 1)
    client.runs.cancel(full.id)
    # A cursor past the end of a live run.
    raised(rl.ValidationError, lambda: list(client.runs.stream(asking.id, after_seq=10_000)))
    client.runs.cancel(asking.id)
    for _ in range(2):  # a cancel of a cancelled run is a success, not an error
        assert client.runs.cancel(asking.id).status == "cancelled"


def test_a_server_without_its_database_is_retried_then_raises_database_unavailable(procs: Procs, alice: User) -> None:
    # A web process whose database is a port nothing listens on: every request that needs the
    # database is a 503 database_unavailable.
    token = token_for(alice)
    dead = procs.uvicorn(env=subprocess_env(DATABASE_URL=f"postgres://nobody@127.0.0.1:{free_port()}/none"))
    proxy = CuttableProxy(upstream_port=int(dead.port or 0)).start()
    try:
        client = rl.Client(proxy.url, token, retry=rl.Retry(attempts=3, base=0.01, cap=0.05))
        with client, pytest.raises(rl.DatabaseUnavailable) as caught:
            client.runs.create("demo")
    finally:
        proxy.stop()
    assert caught.value.status == 503
    posts = [r for r in proxy.requests if r.method == "POST"]
    assert len(posts) == 3 and len({r.headers["idempotency-key"] for r in posts}) == 1


class _TooManyRequests(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"error": {"code": "too_many_requests", "message": "slow down", "detail": None}})
        self.send_response(429)
        self.send_header("Content-Type", "application/json")
        self.send_header("Retry-After", "7")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


def test_too_many_requests_carries_retry_after() -> None:
    # A 429 on demand (docs/design/fair-use.md#refusals): a stand-in HTTP server answers it, in the
    # API's error shape, rather than driving a real server to one of its limits.
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TooManyRequests)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = rl.Client(f"http://127.0.0.1:{server.server_address[1]}", "t")
        with client, pytest.raises(rl.TooManyRequests) as caught:
            client.runs.get(str(uuid.uuid4()))
    finally:
        server.shutdown()
        server.server_close()
    assert (caught.value.status, caught.value.retry_after, caught.value.message) == (429, 7.0, "slow down")


def test_rerun_and_fork_through_the_client(client: rl.Client) -> None:
    original = client.runs.wait(client.runs.create("demo", {"deltas": 6, "delay_ms": 0}).id)
    fourth = [e for e in client.runs.events(original.id).events if e.type == "output.delta"][3]

    again = client.runs.rerun(original.id, input={"deltas": 2, "delay_ms": 0}, max_steps=9)
    fork = client.runs.rerun(original.id, from_seq=fourth.seq)

    assert (again["rerun_of"], again["input"], again.max_steps) == (original.id, {"deltas": 2, "delay_ms": 0}, 9)
    assert client.runs.wait(fork.id).output == original.output == {"text": demo_text(6), "deltas": 6}
    with pytest.raises(rl.ValidationError, match="passes the end"):
        client.runs.rerun(original.id, from_seq=original.last_seq + 1)
    live = client.runs.create("demo", {"deltas": 1000, "delay_ms": 50})
    with pytest.raises(rl.InvalidTransition):
        client.runs.rerun(live.id)
    client.runs.cancel(live.id)


def test_create_takes_a_priority_and_a_start_time(client: rl.Client, alice: User) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    run = client.runs.create("demo", {"deltas": 2}, priority=7, start_after=later)
    assert (run["priority"], datetime.fromisoformat(run["start_after"])) == (7, later)
    stored = Run.objects.get(pk=run.id)
    assert (stored.priority, stored.start_after, stored.status) == (7, later, "queued")
    with pytest.raises(rl.ValidationError) as refused:
        client.runs.create("demo", {}, priority=101)
    assert "priority" in str(refused.value.detail)


def test_cancel_and_stop_where_across_a_dropped_answer_command_each_run_once(
    proxy: CuttableProxy, alice: User, client: rl.Client, make_user: Any
) -> None:
    slow = {"deltas": 1000, "delay_ms": 50}
    mine = [queued_run(alice, input=slow, metadata={"customer": "42"}) for _ in range(3)]
    queued_run(alice, input=slow, metadata={"customer": "7"})
    assert client.runs.count_where(metadata={"customer": "42"}) == 3
    assert client.runs.count_where(metadata={"customer": "none"}) == 0
    with pytest.raises(rl.TooManyMatches) as too_many:
        client.runs.cancel_where(max=2, metadata={"customer": "42"})
    assert too_many.value.count == 3 and too_many.value.run is None
    proxy.drop_next_answer("/api/runs/cancel/")
    done = client.runs.cancel_where(max=3, note="gone", metadata={"customer": "42"}, status=["queued", "running"])
    posts = [r for r in proxy.requests if r.method == "POST" and r.path == "/api/runs/cancel/"]
    assert proxy.dropped_answers == 1 and posts[-1].headers["idempotency-key"] == posts[-2].headers["idempotency-key"]
    # The retry was answered the first answer: the runs the lost answer cancelled, as cancelled.
    assert done.counts["cancelled"] == 3 and set(done.ids["cancelled"]) == {str(r.pk) for r in mine}
    assert {event_types(run).count("run.cancelled") for run in mine} == {1}
    stopper = make_user("stopper", perms=("runs.view_run", "runs.stop_run"))
    with rl.Client(proxy.url, token_for(stopper), retry=FAST) as staff:
        stopped = staff.runs.stop_where(max=10, reason="maintenance", code="policy", status="queued,running")
    assert stopped.matched == 1 and stopped.counts["stopped"] == 1

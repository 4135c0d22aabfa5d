"""Fault injection: a mixed workload over HTTP while processes die, and PostgreSQL
restarted under it. Real uvicorn and worker processes on PostgreSQL; the clients (tests/support/faults.py)
retry as a careful program does, and the end state is judged from the database
(tests/support/checks.py): every run terminal with a sound log, no attempt writing outside its
tenure or overlapping another, every end asked for by someone, every reassembled stream exactly the
stored log.

The randomness is seeded; the seed is printed (shown with a failure) and can be replayed with
RUNLEDGER_TEST_SEED=<seed>. Replays repeat every choice (each run's shape and plan, the chaos
schedule, each stream's cuts), not the timing between processes.
"""

import asyncio
import random
import socket
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from runs.models import Run, RunEvent
from runs.transitions import TERMINAL
from tests.support.checks import assert_no_crash_logged, check_runs
from tests.support.db import listening, token_for
from tests.support.faults import (
    TRANSPORT_ERRORS,
    Api,
    Hang,
    Response,
    Stats,
    Watch,
    assert_not_a_server_error,
    follow,
    request,
    token_header,
)
from tests.support.pg import PgCluster
from tests.support.procs import UNCAPPED, Proc, Procs, subprocess_env
from tests.support.seed import SEED
from tests.support.sse import Stream

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes, pytest.mark.slow]


def alive(processes: list[Proc]) -> bool:
    return all(p.popen.poll() is None for p in processes)


# --- 1. a mixed workload while workers and web processes are killed ------------------------------

WORKERS = 3
CONCURRENCY = 4
CHAOS_SECONDS = 20.0
MAX_RUNS = 60
SETTLE_SECONDS = 60.0  # after the chaos, for every run to end


@dataclass
class Workload:
    api: Api
    owner: str  # tokens
    staff: str
    seed: int
    watches: list[Watch] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    cancel_asked: set[str] = field(default_factory=set)
    stop_asked: set[str] = field(default_factory=set)
    stale_resumes_refused: int = 0

    async def run_json(self, kind: str, token: str, method: str, path: str, body: Any = None) -> dict[str, Any]:
        response = await self.api.call(kind, token, method, path, body)
        assert response.status == 200, (kind, path, response.status, response.body)
        data: dict[str, Any] = response.json()
        return data


def run_shape(rng: random.Random, i: int) -> dict[str, Any]:
    """A small demo run: plain, asking for input halfway, calling a tool, or with children."""
    shape = rng.choices(["plain", "ask", "tool", "children"], weights=[4, 2, 2, 2])[0]
    data: dict[str, Any] = {"deltas": rng.randint(10, 40), "delay_ms": rng.randint(30, 80)}
    if shape == "ask":
        data["ask"] = f"question {i}?"
    elif shape == "tool":
        data["tool"] = rng.choice(["slow", "slow", "stubborn"])
        data["tool_ms"] = rng.randint(200, 800)
    elif shape == "children":
        data["children"] = rng.randint(1, 2)
    return data


async def drive_run(w: Workload, i: int) -> None:
    """One client's life with one run: create it, watch it (0 to 2 streams), act on it once (cancel,
    stop, pause, or nothing), answer it whenever it waits, until it ends."""
    rng = random.Random(f"{w.seed}:run:{i}")
    loop = asyncio.get_running_loop()
    body: dict[str, Any] = {"agent": "demo", "input": run_shape(rng, i)}
    if rng.random() < 0.75:
        body["max_attempts"] = 8  # the rest keep the default 3, and may run out under the kills
    plan = rng.choices(["finish", "cancel", "stop", "pause"], weights=[4, 2, 1, 2])[0]
    # A create retried after its answer was lost replays the first one: one run per key.
    created = await w.api.call("create", w.owner, "POST", "/api/runs/", body, {"Idempotency-Key": f"{w.seed}-{i}"})
    assert created.status == 201, created.body
    if created.headers.get("idempotent-replayed") == "true":
        assert created.tries > 1, created.headers  # only a retry replays
        w.api.stats.ops["create (replayed)"] += 1
    run_id: str = created.json()["id"]
    w.created.append(run_id)
    watchers = [
        asyncio.create_task(follow(w.api, w.owner, run_id, random.Random(f"{w.seed}:watch:{i}:{k}"), drop_rate=0.6))
        for k in range(rng.choice([0, 1, 1, 2]))
    ]
    path = f"/api/runs/{run_id}/"
    act_at = loop.time() + rng.uniform(0.05, 2.5)
    acted = plan == "finish"
    while True:
        run = await w.run_json("get", w.owner, "GET", path)
        if run["status"] in TERMINAL:
            break
        if not acted and loop.time() >= act_at:
            acted = True
            await act(w, plan, run)
        elif run["status"] == "waiting":
            await asyncio.sleep(rng.uniform(0, 0.4))  # the client takes a moment to answer
            await resume(w, run, {"answer": f"answer {i}"})
        else:
            await asyncio.sleep(rng.uniform(0.15, 0.4))  # the client's polling interval
    w.watches.extend(await asyncio.gather(*watchers))


async def act(w: Workload, plan: str, run: dict[str, Any]) -> None:
    path = f"/api/runs/{run['id']}/{plan}/"
    if plan == "cancel":
        w.cancel_asked.add(run["id"])
        response = await w.api.call("cancel", w.owner, "POST", path, {"note": "fault test"})
        ended = response.json() if response.status == 200 else response.json()["run"]
        assert response.status in (200, 409) and ended["status"] in TERMINAL, (response.status, response.body)
        assert (response.status == 200) == (ended["status"] == "cancelled"), response.body
        if response.status == 200 and run["status"] == "waiting":
            # The cancel invalidated the ticket the client held: a resume with it fails closed.
            refused = await w.api.call(
                "resume", w.owner, "POST", f"/api/runs/{run['id']}/resume/", {"ticket": run["resume_ticket"]}
            )
            assert refused.status == 409 and refused.json()["error"]["code"] == "stale_ticket", refused.body
            w.stale_resumes_refused += 1
    elif plan == "stop":
        w.stop_asked.add(run["id"])
        response = await w.api.call("stop", w.staff, "POST", path, {"code": "policy", "reason": "fault test"})
        ended = response.json() if response.status == 200 else response.json()["run"]
        assert response.status in (200, 409) and ended["status"] in TERMINAL, (response.status, response.body)
        assert (response.status == 200) == (ended["status"] == "stopped"), response.body
    elif plan == "pause":
        response = await w.api.call("pause", w.owner, "POST", path)
        # queued → waiting (200), running → requested (202), already waiting (200), ended (409).
        assert response.status in (200, 202, 409), (response.status, response.body)


async def resume(w: Workload, run: dict[str, Any], answer: dict[str, Any]) -> None:
    ticket = run["resume_ticket"]
    assert ticket, run
    response = await w.api.call(
        "resume", w.owner, "POST", f"/api/runs/{run['id']}/resume/", {"ticket": ticket, "input": answer}
    )
    if response.status != 200:
        # Only a retry may find the ticket used: by its own earlier try, whose answer was lost.
        assert response.tries > 1 and response.json()["error"]["code"] == "stale_ticket", response.body
        w.api.stats.ops["resume (already used)"] += 1


@dataclass
class Chaos:
    """Every 0.8 to 2.5 s, SIGKILL a worker or a web process, and start its replacement a moment
    later (a web process on the same port, so that clients find it again). At least one worker
    and one web process stay up; the first four kills are two of each kind, in random order; a
    worker that holds runs is chosen over an idle one."""

    procs: Procs
    env: dict[str, str]
    rng: random.Random
    api: Api
    staff: str  # a token that sees every run
    webs: list[Proc | None]
    workers: list[Proc | None]
    kills: Counter[str] = field(default_factory=Counter)
    busy_victims: int = 0  # workers killed while they held runs

    def up(self) -> list[Proc]:
        return [p for p in self.webs + self.workers if p is not None]

    async def run(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        deck = ["worker", "worker", "web", "web"]
        self.rng.shuffle(deck)
        replacing: list[asyncio.Task[None]] = []
        while True:
            await asyncio.sleep(self.rng.uniform(0.8, 2.5))  # the chaos's own schedule
            if loop.time() >= end:
                break
            # Drawn every time, so that a replay makes the same draws whatever the timing.
            kind = deck[-1] if deck else self.rng.choice(["worker", "web"])
            pick, delay = self.rng.random(), self.rng.uniform(0, 1.0)
            slots = self.workers if kind == "worker" else self.webs
            up = [i for i, p in enumerate(slots) if p is not None]
            if len(up) < 2:
                continue  # the last one of its kind stays up
            if deck:
                deck.pop()
            if kind == "worker":
                busy = await self.busy_workers()
                holding = [i for i in up if self.worker_name(i) in busy]
                candidates = holding or up
                self.busy_victims += bool(holding)
            else:
                candidates = up
            i = candidates[int(pick * len(candidates))]
            victim = slots[i]
            assert victim is not None
            slots[i] = None
            await asyncio.to_thread(victim.kill)
            self.kills[kind] += 1
            name = f"w{WORKERS + self.kills['worker'] - 1}"
            replacing.append(asyncio.create_task(self.replace(kind, i, name, victim.port, delay)))
        await asyncio.gather(*replacing)

    def worker_name(self, i: int) -> str:
        proc = self.workers[i]
        assert proc is not None
        return proc.name.removeprefix("worker-")

    async def busy_workers(self) -> set[str]:
        page = await self.api.call("list", self.staff, "GET", "/api/runs/?status=running&page_size=500")
        assert page.status == 200, page.body
        return {run["attempt"]["worker"] for run in page.json()["results"] if run["attempt"]}

    async def replace(self, kind: str, i: int, name: str, port: int | None, delay: float) -> None:
        await asyncio.sleep(delay)  # the replacement comes up a moment later
        if kind == "worker":
            self.workers[i] = await asyncio.to_thread(self.procs.worker, name, concurrency=CONCURRENCY, env=self.env)
        else:
            self.webs[i] = await asyncio.to_thread(self.procs.uvicorn, env=self.env, port=port)


@pytest.mark.timeout(180)
def test_a_mixed_workload_survives_random_sigkills_of_workers_and_web_processes(
    procs: Procs, alice: User, make_user: Callable[..., User]
) -> None:
    print(f"seed {SEED}")
    staff = make_user("staff", perms=("runs.view_run", "runs.stop_run"), is_staff=True)
    # Up to 60 runs of one owner, each with its watchers, over two web processes.
    env = subprocess_env(**UNCAPPED)
    webs = [procs.uvicorn(env=env) for _ in range(2)]
    workers = [procs.worker(f"w{i}", concurrency=CONCURRENCY, env=env) for i in range(WORKERS)]
    stats = Stats()
    api = Api([web.url for web in webs], random.Random(f"{SEED}:api"), stats)
    w = Workload(api=api, owner=token_for(alice), staff=token_for(staff), seed=SEED)
    chaos = Chaos(procs, env, random.Random(f"{SEED}:chaos"), api, w.staff, list(webs), list(workers))
    timings: dict[str, float] = {}

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        killing = asyncio.create_task(chaos.run(CHAOS_SECONDS))
        pace = random.Random(f"{SEED}:pace")
        drivers = []
        while len(drivers) < MAX_RUNS and not killing.done():
            drivers.append(asyncio.create_task(drive_run(w, len(drivers))))
            await asyncio.sleep(pace.uniform(0.15, 0.5))  # the arrival of new clients
        await killing
        timings["chaos"] = loop.time() - started
        # The kills are over and every replacement is up.
        assert alive(chaos.up()) and len(chaos.up()) == len(webs) + WORKERS
        await asyncio.wait_for(asyncio.gather(*drivers), SETTLE_SECONDS)
        timings["settle"] = loop.time() - started - timings["chaos"]

    asyncio.run(scenario())
    assert alive(chaos.up())

    runs = list(Run.objects.filter(owner=alice))
    top_level = [r for r in runs if r.parent_id is None]
    # One run per client, whatever retries its create needed.
    assert sorted(str(r.pk) for r in top_level) == sorted(w.created) and len(w.created) == len(set(w.created))
    spawned = RunEvent.objects.filter(run__owner=alice, type="child.spawned").count()
    assert len(runs) == len(top_level) + spawned
    checked = check_runs(runs, cancelled_by_client=w.cancel_asked, stopped_by_client=w.stop_asked, watches=w.watches)
    assert_no_crash_logged(procs)

    assert chaos.kills["worker"] >= 2 and chaos.kills["web"] >= 2, chaos.kills
    # The kills really took runs from under their workers, and streams from under their clients.
    assert chaos.busy_victims > 0 and checked.lost_attempts > 0
    assert sum(watch.broken for watch in w.watches) > 0
    print(
        f"seed {SEED}: {timings['chaos']:.1f}s of chaos, settled in {timings['settle']:.1f}s\n"
        f"kills (each followed by a restart): {dict(chaos.kills)}, {chaos.busy_victims} workers killed holding runs\n"
        f"operations: {dict(stats.ops)}\n"
        f"answers: {dict(sorted(stats.answers.items()))}\n"
        f"retries: {dict(sorted(stats.retries.items()))}; slowest answer {stats.slowest:.2f}s\n"
        f"stale tickets refused after a cancel: {w.stale_resumes_refused}\n"
        f"runs checked: {checked.runs} ({len(top_level)} created, {spawned} children), "
        f"{checked.attempts} attempts, {checked.lost_attempts} lost, {checked.requeued_runs} runs requeued\n"
        f"ends: {dict(sorted(checked.statuses.items()))}\n"
        f"streams checked: {checked.streams} ({checked.stream_events} events); "
        f"reconnects {sum(x.reconnects for x in w.watches)}: {sum(x.drops for x in w.watches)} cut by the client, "
        f"{sum(x.broken for x in w.watches)} broken under it, {sum(x.ended_early for x in w.watches)} ended early, "
        f"{sum(x.unavailable for x in w.watches)} 503s"
    )


# --- 2. PostgreSQL restarted mid-workload ---------------------------------------------------------

LEASE = 3.0
PG_RUNS = 24
PG_INPUT: dict[str, Any] = {"deltas": 30, "delay_ms": 100}  # about 3 s a run
ANSWER_BOUND = 10.0  # seconds: no request goes unanswered longer, database or not


@dataclass
class Probe:
    kind: str
    started: float
    ended: float
    status: int  # 0: the connection failed or closed without an answer
    marker: str = ""


PROBE_KINDS = ("readyz", "list", "get", "events", "create", "stream")


@dataclass
class Prober:
    """Single requests of every kind (no retries), recording when each started and ended."""

    webs: list[str]
    token: str
    run_ids: list[str]
    rng: random.Random
    probes: list[Probe]

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.probe(self.rng.choice(PROBE_KINDS), self.rng.choice(self.webs))
            await asyncio.sleep(self.rng.uniform(0.02, 0.15))  # the pace of this client's requests

    async def probe(self, kind: str, base: str) -> Probe:
        loop = asyncio.get_running_loop()
        run_id = self.rng.choice(self.run_ids)
        auth = token_header(self.token)
        marker = ""
        started = loop.time()
        try:
            if kind == "stream":
                # Open a stream and leave after its head: 200 while the database is up, else 503.
                stream = Stream(base, f"/api/runs/{run_id}/stream/?after_seq=0", auth)
                try:
                    await stream.open(timeout=ANSWER_BOUND)
                except TimeoutError as exc:
                    raise Hang(f"stream probe on {base}: no answer within {ANSWER_BOUND}s") from exc
                finally:
                    stream.abort()
                response = Response(stream.status, stream.headers, stream.body)
            elif kind == "create":
                marker = f"probe-{uuid.uuid4()}"
                body = {"agent": "demo", "input": {"deltas": 2, "delay_ms": 1, "probe": marker}}
                response = await request(base, "POST", "/api/runs/", headers=auth, body=body, timeout=ANSWER_BOUND)
            else:
                path = {
                    "readyz": "/readyz/",
                    "list": "/api/runs/?page_size=5",
                    "get": f"/api/runs/{run_id}/",
                    "events": f"/api/runs/{run_id}/events/?after_seq=0&limit=5",
                }[kind]
                response = await request(base, "GET", path, headers=auth, timeout=ANSWER_BOUND)
            status = response.status
            assert_not_a_server_error(f"{kind} probe", response)
            assert status in (200, 201, 503), (kind, status, response.body)
            if kind == "readyz" and status == 503:
                assert response.json()["status"] == "unavailable"
        except TRANSPORT_ERRORS:
            status = 0
        probe = Probe(kind, started, loop.time(), status, marker)
        self.probes.append(probe)
        return probe


@pytest.mark.pg_cluster
@pytest.mark.timeout(180)
def test_postgresql_restarted_mid_workload_answers_503_and_everyone_reconnects(
    procs: Procs, alice: User, pg_cluster: PgCluster
) -> None:
    print(f"seed {SEED}")
    env = subprocess_env(RUNLEDGER_LEASE_SECONDS=str(LEASE), RUNLEDGER_HEARTBEAT_SECONDS="0.5", **UNCAPPED)
    webs = [procs.uvicorn(env=env) for _ in range(2)]
    workers = [procs.worker(f"w{i}", concurrency=6, env=env) for i in range(2)]
    everyone = webs + workers
    pids = [p.pid for p in everyone]
    token = token_for(alice)
    stats = Stats()
    api = Api([web.url for web in webs], random.Random(f"{SEED}:api"), stats, give_up_after=60)
    probes: list[Probe] = []
    outage_round: list[Probe] = []
    t: dict[str, float] = {}
    streams_open: list[int] = []
    watches: list[Watch] = []
    recovered: dict[str, float] = {}

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        run_ids: list[str] = []
        for i in range(PG_RUNS):
            body = {"agent": "demo", "input": PG_INPUT}
            created = await api.call("create", token, "POST", "/api/runs/", body, {"Idempotency-Key": f"{SEED}-{i}"})
            assert created.status == 201, created.body
            run_ids.append(created.json()["id"])
        watchers = [
            asyncio.create_task(follow(api, token, run_id, random.Random(f"{SEED}:watch:{i}"), drop_rate=0.3))
            for i, run_id in enumerate(run_ids)
        ]
        urls = [web.url for web in webs]
        probers = [Prober(urls, token, run_ids, random.Random(f"{SEED}:probe:{k}"), probes) for k in range(4)]
        stop_probing = asyncio.Event()
        probing = [asyncio.create_task(p.run(stop_probing)) for p in probers]

        # The restart comes mid-way: runs completed, more running, more queued, streams open.
        async def running() -> int:
            page = await api.call("list", token, "GET", "/api/runs/?status=running&page_size=500")
            return len(page.json()["results"])

        while await running() < 8:
            await asyncio.sleep(0.1)  # polling the workload's progress
        t["stopping"] = loop.time()
        await asyncio.to_thread(pg_cluster.stop)
        t["down"] = loop.time()
        streams_open.append(sum(not task.done() for task in watchers))
        # Once it is down, one request of every kind to every web process, all at once; their
        # answers must all come while it is still down.
        checking = asyncio.gather(*(probers[0].probe(kind, url) for kind in PROBE_KINDS for url in urls))
        # The outage is the scenario: 1.5 leases, so that every lease held when the server went
        # down lapses while it is down. Every process must stay up through it.
        while loop.time() - t["down"] < 1.5 * LEASE or not checking.done():
            assert alive(everyone)
            await asyncio.sleep(0.1)  # the outage's own clock
        outage_round.extend(await checking)
        t["starting"] = loop.time()
        await asyncio.to_thread(pg_cluster.start)
        t["up"] = loop.time()

        # Nobody is restarted: each web process finds the database again by itself.
        async def ready(web: Proc) -> None:
            while (await request(web.url, "GET", "/readyz/", timeout=ANSWER_BOUND)).status != 200:
                await asyncio.sleep(0.05)  # polling the probe
            recovered[f":{web.port}"] = loop.time() - t["up"]

        await asyncio.wait_for(asyncio.gather(*(ready(web) for web in webs)), 30)
        # New work is taken up after the restart too.
        late = []
        for i in range(4):
            body = {"agent": "demo", "input": {"deltas": 5, "delay_ms": 10}}
            created = await api.call(
                "create", token, "POST", "/api/runs/", body, {"Idempotency-Key": f"{SEED}-late-{i}"}
            )
            assert created.status == 201, created.body
            late.append(created.json()["id"])
        watchers += [
            asyncio.create_task(follow(api, token, run_id, random.Random(f"{SEED}:late:{i}"), drop_rate=0.3))
            for i, run_id in enumerate(late)
        ]
        stop_probing.set()
        await asyncio.gather(*probing)
        watches.extend(await asyncio.wait_for(asyncio.gather(*watchers), 60))
        t["streams done"] = loop.time()

    asyncio.run(scenario())
    connection.close()  # the test's own connection belonged to the old server

    # Nobody was restarted, and everyone is back on the database.
    assert alive(everyone) and [p.pid for p in everyone] == pids
    assert listening("web") >= {web.pid for web in webs}
    assert listening("worker") >= {worker.pid for worker in workers}
    assert "could not renew its lease in time" in "".join(worker.log() for worker in workers)

    # While the server was down every request was answered 503, promptly — a stream too, or its
    # connection closed — and wrote nothing.
    assert all(t["down"] <= p.started and p.ended < t["starting"] for p in outage_round)
    inside = [p for p in probes if t["down"] <= p.started and p.ended < t["starting"]]
    assert {p.kind for p in inside} == set(PROBE_KINDS)
    assert all(p.status == 503 or (p.kind == "stream" and p.status == 0) for p in inside), inside
    slowest = max(p.ended - p.started for p in probes)
    assert slowest < ANSWER_BOUND
    refused = {p.marker for p in inside if p.kind == "create"}
    # A create whose answer straddled the outage may or may not have committed; either way its
    # run's log must be sound, which check_runs asserts of every run below.
    runs = list(Run.objects.filter(owner=alice))
    assert not [r.pk for r in runs if r.input.get("probe") in refused]
    checked = check_runs(runs, watches=watches)
    assert_no_crash_logged(procs)
    assert checked.statuses == Counter({"completed": len(runs)}), checked.statuses
    assert checked.requeued_runs > 0  # the outage really took runs from under their workers

    in_flight = sum(p.started < t["stopping"] < p.ended for p in probes)
    answers = Counter(f"{p.kind} {p.status or 'closed'}" for p in inside)
    print(
        f"seed {SEED}: PostgreSQL stopped (took {t['down'] - t['stopping']:.2f}s), down "
        f"{t['starting'] - t['down']:.1f}s, started again (took {t['up'] - t['starting']:.2f}s)\n"
        f"in flight when it stopped: {in_flight} requests, {streams_open[0]} streams\n"
        f"answered while down: {dict(sorted(answers.items()))}; slowest answer of all {slowest:.2f}s, "
        f"slowest while down {max(p.ended - p.started for p in inside):.2f}s\n"
        f"web processes ready again after {', '.join(f'{k} {v:.2f}s' for k, v in recovered.items())}; "
        f"every stream done {t['streams done'] - t['up']:.1f}s after the restart\n"
        f"probes: {len(probes)} ({len(inside)} while down); client operations {dict(stats.ops)}, "
        f"retries {dict(sorted(stats.retries.items()))}\n"
        f"runs checked: {checked.runs} ({dict(checked.statuses)}), {checked.attempts} attempts, "
        f"{checked.lost_attempts} lost, {checked.requeued_runs} runs requeued\n"
        f"streams checked: {checked.streams} ({checked.stream_events} events), reconnects "
        f"{sum(x.reconnects for x in watches)}: {sum(x.drops for x in watches)} cut by the client, "
        f"{sum(x.broken for x in watches)} broken, {sum(x.ended_early for x in watches)} ended early by the server, "
        f"{sum(x.unavailable for x in watches)} 503s"
    )


# --- 3. a storm of stream requests while the database is unreachable ------------------------------


def test_a_storm_of_stream_requests_while_the_database_is_unreachable_is_answered_503_promptly(
    procs: Procs,
) -> None:
    """Each stream request's checks run on a small pool of threads, and while the database does
    not answer each check waits out the connect timeout (3 s) before it fails. Queued behind one
    another, n requests took n / 4 * 3 s: 24 took 18 s, a thousand browsers' reconnects minutes.
    Each must be answered 503 promptly instead, whatever the queue."""
    # A "database" that accepts connections and never says a word, as behind a network cut.
    with socket.create_server(("127.0.0.1", 0), backlog=64) as silent:
        port = silent.getsockname()[1]
        web = procs.uvicorn(env=subprocess_env(DATABASE_URL=f"postgres://nobody@127.0.0.1:{port}/x?connect_timeout=3"))
        path = f"/api/runs/{uuid.uuid4()}/stream/"

        async def one() -> tuple[int, float, Any]:
            loop = asyncio.get_running_loop()
            started = loop.time()
            stream = Stream(web.url, path, token_header("0123456789abcdef"))
            await stream.open(timeout=60)
            return stream.status, loop.time() - started, stream.json()

        async def storm() -> list[tuple[int, float, Any]]:
            return await asyncio.gather(*(one() for _ in range(24)))

        answers = asyncio.run(storm())
    assert {status for status, _, _ in answers} == {503}
    assert all(body["error"]["code"] == "database_unavailable" for _, _, body in answers)
    slowest = max(took for _, took, _ in answers)
    print(f"24 stream requests, database unreachable: slowest answer {slowest:.2f}s")
    assert slowest < 8, sorted(round(took, 1) for _, took, _ in answers)

"""A live server for the Python client's tests: one uvicorn web process and one worker for a
whole module (each test makes its own users and runs), and per test a `CuttableProxy` in front of
the web process, through which the client talks.

The web process sends `retry: 20` (ms), so a client that honours it resumes after a cut in
tens of milliseconds and hundreds of cuts fit in a few seconds.
"""

import asyncio
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import runledger_client as rl
from runs.models import RunEvent
from tests.support.procs import Proc, Procs, subprocess_env
from tests.support.proxies import CuttableProxy

# The Python client's retry against the live server: quick, since every failure here is a cut.
FAST = rl.Retry(base=0.02, cap=0.2)
# Webhook endpoints on 127.0.0.1 for the clients' webhooks tests (nothing listens: their
# deliveries are listed, pending).
LIVE_ENV = {"RUNLEDGER_SSE_RETRY_MS": "20", "RUNLEDGER_WEBHOOKS_ALLOW_PRIVATE": "1"}


@dataclass
class Live:
    web: Proc
    worker: Proc
    env: dict[str, str]


@pytest.fixture(scope="module")
def live(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    registry = Procs(Path(tmp_path_factory.mktemp("live")))
    try:
        with django_db_blocker.unblock():
            env = subprocess_env(**LIVE_ENV)
        web = registry.uvicorn(env=env)
        worker = registry.worker("live", concurrency=8, env=env)
        yield Live(web=web, worker=worker, env=env)
    finally:
        registry.stop_all()


@pytest.fixture
def proxy(live: Live) -> Iterator[CuttableProxy]:
    started = CuttableProxy(upstream_port=int(live.web.port or 0)).start()
    try:
        yield started
    finally:
        started.stop()


def cut_budgets(seed: int) -> Callable[[], int]:
    """Body bytes each stream connection gets before the proxy cuts it, anywhere in a frame: a
    quarter die in or just after the first frame, most within the next few frames, and one in
    ten may carry up to 20 kB — or a frame larger than the usual budgets (a run's terminal event
    carries its whole output) would never get through, on any client."""
    rng = random.Random(seed)

    def budget() -> int:
        draw = rng.random()
        return rng.randint(0, 200 if draw < 0.25 else 1500 if draw < 0.9 else 20_000)

    return budget


def mid_frame(tail: bytes) -> bool:
    """A cut that let `tail` through last fell inside a frame (not at the blank line ending one,
    nor at the end of the HTTP chunk after it)."""
    return not tail.endswith((b"\n\n", b"\n\n\r\n"))


def assert_is_the_stored_log(objects: list[Any], run_id: object) -> None:
    """`objects` (event objects as a client got them) are exactly the run's stored events: seq
    1..last, in order, no gap, no duplicate, each equal to the stored one."""
    stored = [e.as_dict() for e in RunEvent.objects.filter(run_id=run_id).order_by("seq")]
    assert [o["seq"] for o in objects] == list(range(1, len(stored) + 1))
    assert objects == stored


def run_async(make: Callable[[], Any], timeout: float = 60) -> Any:
    """Run the coroutine `make()` to its end, within `timeout` seconds."""
    return asyncio.run(asyncio.wait_for(make(), timeout))

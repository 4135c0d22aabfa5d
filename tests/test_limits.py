"""Fair use (docs/design/fair-use.md): the active-runs cap at create, the running cap and fair
claiming at claim, default budgets and deadline, the demo agent's input bounds, and limit settings
that cannot work refused at start. (Stream limits: tests/test_stream_limits.py; throttles:
tests/test_auth_throttle.py.)"""

import subprocess
import sys
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from rest_framework.test import APIClient

from runs import services
from runs.conf import conf
from runs.exceptions import TooManyRequests
from runs.models import Run
from runs.worker import Worker
from tests.factories import queued_run, running_run
from tests.support.db import token_for
from tests.support.procs import ROOT, Procs, subprocess_env
from tests.support.runs import fresh
from tests.support.threads import race
from tests.support.waiting import wait_until
from tests.support.workers import wait_status

LONG = {"deltas": 1000, "delay_ms": 100}


def api_for(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def create(client: APIClient, input: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> Any:
    return client.post("/api/runs/", {"agent": "demo", "input": input or {}}, format="json", headers=headers)


# --- the active-runs cap ---------------------------------------------------------------------------


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
@override_settings(RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER=3, RUNLEDGER_LIMIT_RETRY_AFTER_SECONDS=7)
def test_a_create_beyond_the_active_runs_cap_is_429_with_retry_after_and_writes_nothing(alice: User, bob: User) -> None:
    api = api_for(alice)
    first = create(api, headers={"Idempotency-Key": "k1"})
    assert first.status_code == 201
    assert [create(api).status_code for _ in range(2)] == [201, 201]

    refused = create(api)
    assert refused.status_code == 429
    assert refused["Retry-After"] == "7"
    assert refused.json()["error"]["code"] == "too_many_requests"
    assert refused.json()["error"]["detail"] == {"active_runs": 3, "limit": 3}
    assert Run.objects.filter(owner=alice).count() == 3
    # A retry of a create that succeeded replays it, cap or not; another user is not held back.
    again = create(api, headers={"Idempotency-Key": "k1"})
    assert again.status_code == 201 and again.json()["id"] == first.json()["id"]
    assert create(api_for(bob)).status_code == 201

    # A run that ends frees its place.
    services.run_cancel(run_id=first.json()["id"], actor=alice)
    assert create(api).status_code == 201


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_a_web_process_refuses_creates_beyond_the_cap_from_its_environment(procs: Procs, alice: User) -> None:
    env = subprocess_env(RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER="2", RUNLEDGER_LIMIT_RETRY_AFTER_SECONDS="3")
    web = procs.uvicorn(env=env)
    with httpx.Client(base_url=web.url, headers={"Authorization": f"Token {token_for(alice)}"}, timeout=10) as api:
        answers = [api.post("/api/runs/", json={"agent": "demo", "input": {}}) for _ in range(3)]
    assert [a.status_code for a in answers] == [201, 201, 429]
    assert answers[2].headers["Retry-After"] == "3"
    assert answers[2].json()["error"]["code"] == "too_many_requests"
    assert Run.objects.filter(owner=alice).count() == 2


@pytest.mark.django_db(transaction=True)
@override_settings(RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER=5)
def test_concurrent_creates_never_pass_the_cap(alice: User) -> None:
    def make(i: int) -> Any:
        return services.run_create(owner=alice, agent="demo", input={"deltas": 1})

    results = race(16, make)
    made = [r for r in results if isinstance(r, Run)]
    refused = [r for r in results if isinstance(r, TooManyRequests)]
    assert len(made) == 5 and len(refused) == 11, results
    assert Run.objects.filter(owner=alice).count() == 5


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
@override_settings(RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER=0)
def test_a_cap_of_zero_is_unlimited(alice: User) -> None:
    for _ in range(5):
        queued_run(alice)
    with override_settings(RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER=5), pytest.raises(TooManyRequests):
        queued_run(alice)


# --- default budgets and deadline ------------------------------------------------------------------


@pytest.mark.sqlite
@pytest.mark.django_db
def test_runs_created_without_budgets_or_deadline_get_the_defaults(alice: User) -> None:
    run = create(api_for(alice)).json()
    assert (run["max_events"], run["max_steps"]) == (100_000, 10_000)
    stored = Run.objects.get(pk=run["id"])
    assert stored.deadline is not None
    assert stored.deadline - stored.created_at == timedelta(seconds=86_400)

    chosen = api_for(alice).post(
        "/api/runs/",
        {"agent": "demo", "input": {}, "max_events": 5, "max_steps": 2, "deadline": "2099-01-01T00:00:00Z"},
        format="json",
    )
    assert (chosen.json()["max_events"], chosen.json()["max_steps"]) == (5, 2)
    assert chosen.json()["deadline"].startswith("2099-01-01")

    with override_settings(
        RUNLEDGER_DEFAULT_MAX_EVENTS=0, RUNLEDGER_DEFAULT_MAX_STEPS=0, RUNLEDGER_DEFAULT_DEADLINE_SECONDS=0
    ):
        bare = create(api_for(alice)).json()
    assert (bare["max_events"], bare["max_steps"], bare["deadline"]) == (None, None, None)


# --- the demo agent's input bounds -----------------------------------------------------------------


@pytest.mark.sqlite
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("key", "most"), [("deltas", 100_000), ("delay_ms", 60_000), ("tool_ms", 600_000), ("children", 10)]
)
def test_the_demo_inputs_are_bounded_at_create(alice: User, key: str, most: int) -> None:
    api = api_for(alice)
    for bad in (most + 1, -1, "many", True, [1]):
        refused = create(api, {key: bad})
        assert refused.status_code == 400, bad
        assert refused.json()["error"]["code"] == "validation_error"
        assert list(refused.json()["error"]["detail"]["input"]) == [key]
        assert key in refused.json()["error"]["message"]
    assert not Run.objects.exists()
    # The bound itself is fine, and keys the demo does not know are accepted and ignored.
    assert create(api, {key: most, "colour": "blue"}).status_code == 201


@pytest.mark.sqlite
@pytest.mark.django_db
def test_an_unknown_tool_is_refused_at_create(alice: User) -> None:
    refused = create(api_for(alice), {"tool": "hammer", "child_input": 3})
    assert refused.status_code == 400
    assert set(refused.json()["error"]["detail"]["input"]) == {"tool", "child_input"}


# --- fair claiming and the running cap -------------------------------------------------------------


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
def test_a_claim_takes_the_owner_with_the_fewest_running_runs_first(alice: User, bob: User) -> None:
    running_run(bob, input=LONG), running_run(bob, input=LONG)
    bobs_older = queued_run(bob, input=LONG)
    alices = queued_run(alice, input=LONG)
    claimed = services.run_claim(worker="w")
    assert claimed is not None and claimed[0].pk == alices.pk
    claimed = services.run_claim(worker="w")
    assert claimed is not None and claimed[0].pk == bobs_older.pk


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
@override_settings(RUNLEDGER_MAX_RUNNING_PER_USER=2)
def test_a_claim_passes_over_an_owner_at_the_running_cap(alice: User, bob: User) -> None:
    bobs = [queued_run(bob, input=LONG) for _ in range(4)]
    assert [services.run_claim(worker="w") is not None for _ in range(3)] == [True, True, False]
    assert [fresh(r).status for r in bobs] == ["running", "running", "queued", "queued"]
    alices = queued_run(alice, input=LONG)
    claimed = services.run_claim(worker="w")
    assert claimed is not None and claimed[0].pk == alices.pk
    services.run_cancel(run_id=bobs[0].pk, actor=bob)
    claimed = services.run_claim(worker="w")
    assert claimed is not None and claimed[0].pk == bobs[2].pk


@pytest.mark.django_db(transaction=True)
@override_settings(RUNLEDGER_MAX_RUNNING_PER_USER=2)
def test_racing_claims_never_take_an_owner_past_the_running_cap(alice: User, bob: User) -> None:
    for _ in range(8):
        queued_run(bob, input=LONG)
    alices = queued_run(alice, input=LONG)
    results = race(8, lambda i: services.run_claim(worker=f"w{i}"))
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert Run.objects.filter(owner=bob, status="running").count() == 2
    assert fresh(alices).status == "running"


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(90)
def test_an_owner_over_the_running_cap_does_not_hold_another_users_run_in_the_queue(
    procs: Procs, alice: User, bob: User
) -> None:
    """The starved newcomer: one worker with four slots, Bob's six long runs, Alice's one short run."""
    procs.worker("w1", concurrency=4, env=subprocess_env(RUNLEDGER_MAX_RUNNING_PER_USER="2"))
    bobs = [queued_run(bob, input=LONG) for _ in range(6)]
    wait_until(lambda: Run.objects.filter(owner=bob, status="running").count() == 2, what="Bob's two running")
    alices = queued_run(alice, input={"deltas": 2, "delay_ms": 1})
    # Started by the wake-up its create sends, not after any of Bob's: they run for 100 s.
    wait_status(alices, "completed", timeout=15)
    assert Run.objects.filter(owner=bob, status="running").count() == 2
    # When one of Bob's ends, the next of his starts at once (the end wakes the claim).
    services.run_cancel(run_id=bobs[0].pk, actor=bob)
    wait_status(bobs[2], "running", timeout=15)
    assert [fresh(r).status for r in bobs[3:]] == ["queued"] * 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(90)
def test_without_a_cap_claims_are_still_fair_across_owners(procs: Procs, alice: User, bob: User) -> None:
    """Bob's six runs were queued first; with two slots, Alice's still starts with the first two."""
    bobs = [queued_run(bob, input=LONG) for _ in range(6)]
    alices = queued_run(alice, input=LONG)
    procs.worker("w1", concurrency=2)
    wait_until(lambda: Run.objects.filter(status="running").count() == 2, what="two running")
    assert fresh(alices).status == "running"
    assert [fresh(r).status for r in bobs] == ["running"] + ["queued"] * 5


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
def test_a_newcomer_claim_takes_only_a_run_of_an_owner_with_none_running(alice: User, bob: User) -> None:
    running_run(bob, input=LONG)
    bobs = queued_run(bob, input=LONG)
    assert services.run_claim(worker="w", newcomer=True) is None  # Bob has one running: not for him
    alices = [queued_run(alice, input=LONG) for _ in range(2)]
    claimed = services.run_claim(worker="w", newcomer=True)
    assert claimed is not None and claimed[0].pk == alices[0].pk
    assert services.run_claim(worker="w", newcomer=True) is None  # now Alice has one running too
    # An open slot takes the owner with the fewest running, as before: a tie, Bob's older run.
    claimed = services.run_claim(worker="w")
    assert claimed is not None and claimed[0].pk == bobs.pk


@pytest.mark.django_db(transaction=True)
def test_racing_newcomer_claims_give_an_owner_one_kept_slot(alice: User, bob: User) -> None:
    running_run(bob, input=LONG)
    alices = [queued_run(alice, input=LONG) for _ in range(4)]
    results = race(4, lambda i: services.run_claim(worker=f"w{i}", newcomer=True))
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert [r is not None for r in results].count(True) == 1
    assert [fresh(r).status for r in alices].count("running") == 1


@pytest.mark.sqlite
def test_a_worker_keeps_its_newcomer_slots_only_while_two_stay_open_to_everyone() -> None:
    assert [Worker(worker_id="w", concurrency=n).newcomer_slots for n in (1, 2, 3, 4, 16)] == [0, 0, 1, 1, 1]
    with override_settings(RUNLEDGER_WORKER_NEWCOMER_SLOTS=3):
        assert [Worker(worker_id="w", concurrency=n).newcomer_slots for n in (2, 4, 16)] == [0, 2, 3]
    with override_settings(RUNLEDGER_WORKER_NEWCOMER_SLOTS=0):
        assert Worker(worker_id="w", concurrency=16).newcomer_slots == 0


@pytest.mark.sqlite
@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(90)
def test_on_the_default_settings_alices_run_starts_within_seconds_under_bobs_four_slow_runs(
    procs: Procs, alice: User, bob: User
) -> None:
    """The default install's case — one worker of four slots, no running cap — and Bob's
    four runs that emit a delta a minute. A lone user gets three of the four slots; the fourth
    waits for an owner with no run running."""
    procs.worker("w1", concurrency=4)
    slow = {"deltas": 100, "delay_ms": 60_000}
    bobs = [queued_run(bob, input=slow) for _ in range(4)]
    wait_until(lambda: Run.objects.filter(owner=bob, status="running").count() == 3, what="three of Bob's running")
    alices = queued_run(alice, input={"deltas": 2, "delay_ms": 1})
    done = wait_status(alices, "completed", timeout=15)
    assert done.started_at is not None and done.started_at - done.created_at < timedelta(seconds=3)
    # Bob's runs hold what they held: three running, the fourth still waiting for a slot.
    assert sorted(fresh(r).status for r in bobs) == ["queued", "running", "running", "running"]


# --- limit settings that cannot work ----------------------------------------------------------------


@pytest.mark.sqlite
@pytest.mark.parametrize("value", ["-1", "lots", "1.5", "nan"])
def test_limit_settings_that_are_not_whole_numbers_from_the_environment_stop_every_process(value: str) -> None:
    env = subprocess_env(RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER=value)
    for command in (["manage.py", "check"], ["-c", "import config.asgi"]):
        done = subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode != 0
        assert (
            f"RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER must be a whole number ≥ 0 (0 = unlimited), not '{value}'"
            in done.stderr
        )


@pytest.mark.sqlite
@pytest.mark.django_db
def test_limit_settings_made_in_code_are_checked_too() -> None:
    with override_settings(RUNLEDGER_MAX_STREAMS_PER_USER=-2, RUNLEDGER_SSE_MAX_SECONDS="300"):
        problems = conf.problems()
        assert problems == [
            "RUNLEDGER_SSE_MAX_SECONDS must be a number of seconds ≥ 0 (0 = unlimited), not '300'",
            "RUNLEDGER_MAX_STREAMS_PER_USER must be a whole number ≥ 0 (0 = unlimited), not -2",
        ]
        with pytest.raises(ImproperlyConfigured, match="RUNLEDGER_MAX_STREAMS_PER_USER"):
            Worker(worker_id="w")
    assert conf.problems() == []

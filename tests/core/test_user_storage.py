"""Runs kept and bytes stored, bounded per user: what each run stores is counted with
the writes that store it, a create (or a resume) past RUNLEDGER_MAX_RUNS_PER_USER or
RUNLEDGER_MAX_STORED_BYTES_PER_USER is a 429 that writes nothing, an agent's own writes are never
refused by them, and `purge_runs` frees what it deletes."""

import io
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from runs import services
from runs.events import EventType, WaitReason
from runs.exceptions import TooManyRequests
from runs.models import Run, RunEvent
from runs.storable import json_bytes
from runs.transitions import FailCode
from tests.factories import running_run, waiting_run
from tests.support.api import api_for, assert_error
from tests.support.db import migrated_across, token_for
from tests.support.procs import Procs, subprocess_env
from tests.support.storage import assert_sizes_stored, measured_bytes
from tests.support.threads import race

# In process, on the test database: each within a minute (those that start processes say their own).
pytestmark = pytest.mark.timeout(60)


def create(api: APIClient, input: dict[str, Any] | None = None, key: str | None = None) -> Any:
    """POST a demo run with `input`, under Idempotency-Key `key` if given."""
    headers = {} if key is None else {"Idempotency-Key": key}
    return api.post("/api/runs/", {"agent": "demo", "input": input or {}}, format="json", headers=headers)


def purge() -> None:
    call_command("purge_runs", "--older-than", "0s", "--yes", stdout=io.StringIO())


# --- what a run stores -----------------------------------------------------------------------------


@pytest.mark.sqlite
@pytest.mark.django_db
def test_a_runs_stored_bytes_are_its_input_events_output_and_error_counted_as_they_are_written(
    alice: User,
) -> None:
    # Every kind of write: create, claim, the agent's events (tool calls among them), a wait, a
    # resume with an input, a requeue, a pause that seals an open call, a cancel, a completion, a
    # failure with an error; non-ASCII too, counted in UTF-8.
    run = running_run(alice, input={"deltas": 2, "note": "héllo ✓"})
    events = [
        (EventType.OUTPUT_DELTA, {"text": "ünïcode " * 20}),
        (EventType.TOOL_STARTED, {"call_id": "c1", "name": "slow", "arguments": {"x": 1}}),
        (EventType.TOOL_FINISHED, {"call_id": "c1", "name": "slow", "status": "ok", "result": [1, 2.5, None]}),
    ]
    services.run_events_append(run_id=run.pk, generation=run.generation, events=events)
    services.run_wait(run_id=run.pk, generation=run.generation, reason=WaitReason.INPUT_REQUIRED, prompt="name?")
    run = Run.objects.get(pk=run.pk)
    services.run_resume(run_id=run.pk, ticket=run.resume_ticket, input={"name": "Zoë"})
    claimed = services.run_claim(worker="w")
    assert claimed is not None
    run = claimed[0]
    services.run_requeue(run_id=run.pk, generation=run.generation, cause="worker_shutdown")
    run, _ = services.run_claim(worker="w") or (None, None)
    assert run is not None
    opened = [(EventType.TOOL_STARTED, {"call_id": "c2", "name": "slow", "arguments": {}})]
    services.run_events_append(run_id=run.pk, generation=run.generation, events=opened)
    services.run_pause(run_id=run.pk)
    services.run_requeue(run_id=run.pk, generation=run.generation, cause="worker_shutdown")  # parks it, sealed
    services.run_cancel(run_id=run.pk, actor=alice, note="done ✓")
    assert_sizes_stored(run)

    completed = running_run(alice)
    services.run_complete(run_id=completed.pk, generation=completed.generation, output={"answer": "42 ✓"})
    assert_sizes_stored(completed)
    failed = running_run(alice)
    services.run_fail(
        run_id=failed.pk, generation=failed.generation, code=FailCode.AGENT_ERROR, reason="boom", error={"trace": "é"}
    )
    assert_sizes_stored(failed)
    assert Run.objects.get(pk=failed.pk).error_bytes == json_bytes({"trace": "é"})


# --- the caps --------------------------------------------------------------------------------------


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
@override_settings(RUNLEDGER_MAX_RUNS_PER_USER=3, RUNLEDGER_LIMIT_RETRY_AFTER_SECONDS=7)
def test_a_create_past_the_runs_cap_is_429_with_retry_after_writes_nothing_and_purge_frees_it(
    alice: User, bob: User
) -> None:
    api = api_for(alice)
    first = create(api, key="k1")
    assert first.status_code == 201
    assert [create(api).status_code for _ in range(2)] == [201, 201]
    for run in Run.objects.filter(owner=alice):
        services.run_cancel(run_id=run.pk, actor=alice)  # finished runs count too

    refused = create(api)
    body = assert_error(refused, 429, "too_many_requests")
    assert refused["Retry-After"] == "7"
    assert body["error"]["detail"] == {"runs": 3, "limit": 3}
    assert Run.objects.filter(owner=alice).count() == 3
    # A retry of a create that succeeded replays it, cap or not; another user is not held back.
    again = create(api, key="k1")
    assert again.status_code == 201 and again.json()["id"] == first.json()["id"]
    assert create(api_for(bob)).status_code == 201

    purge()
    assert Run.objects.filter(owner=alice).count() == 0
    assert create(api).status_code == 201


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
def test_a_create_past_the_stored_bytes_cap_is_429_writes_nothing_and_purge_frees_it(alice: User, bob: User) -> None:
    api = api_for(alice)
    pad = {"deltas": 1, "pad": "x" * 40_000}
    with override_settings(RUNLEDGER_MAX_STORED_BYTES_PER_USER=100_000):
        assert [create(api, pad).status_code for _ in range(2)] == [201, 201]
        stored = sum(Run.objects.filter(owner=alice).values_list("stored_bytes", flat=True))
        assert stored == sum(measured_bytes(run) for run in Run.objects.filter(owner=alice))

        refused = create(api, pad)
        body = assert_error(refused, 429, "too_many_requests")
        assert int(refused["Retry-After"]) >= 1
        assert body["error"]["detail"] == {"stored_bytes": stored, "adding_bytes": json_bytes(pad), "limit": 100_000}
        assert Run.objects.filter(owner=alice).count() == 2
        assert create(api, {"deltas": 1}).status_code == 201  # what still fits, fits
        assert create(api_for(bob), pad).status_code == 201

        for run in Run.objects.filter(owner=alice):
            services.run_cancel(run_id=run.pk, actor=alice)
        assert create(api, pad).status_code == 429  # ended, but kept: still counted
        purge()
        assert create(api, pad).status_code == 201

    # 0 is unlimited, as for every limit.
    with override_settings(RUNLEDGER_MAX_STORED_BYTES_PER_USER=0, RUNLEDGER_MAX_RUNS_PER_USER=0):
        assert [create(api, pad).status_code for _ in range(4)] == [201] * 4


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
def test_a_resume_whose_input_would_pass_the_stored_bytes_cap_is_429_and_changes_nothing(alice: User) -> None:
    run = waiting_run(alice)
    api = api_for(alice)
    stored = Run.objects.get(pk=run.pk).stored_bytes
    big = {"text": "x" * 50_000}
    with override_settings(RUNLEDGER_MAX_STORED_BYTES_PER_USER=stored + 50_000):
        refused = api.post(f"/api/runs/{run.pk}/resume/", {"ticket": run.resume_ticket, "input": big}, format="json")
        body = assert_error(refused, 429, "too_many_requests")
        assert body["error"]["detail"]["stored_bytes"] == stored
        after = Run.objects.get(pk=run.pk)
        assert (after.status, after.resume_ticket, after.last_seq) == ("waiting", run.resume_ticket, run.last_seq)

        small = {"text": "ok"}
        resumed = api.post(f"/api/runs/{run.pk}/resume/", {"ticket": run.resume_ticket, "input": small}, format="json")
        assert resumed.status_code == 200 and resumed.json()["status"] == "queued"
    # Past the cap now, a retry of the resume that succeeded still answers 200 and writes nothing.
    with override_settings(RUNLEDGER_MAX_STORED_BYTES_PER_USER=1):
        retried = api.post(f"/api/runs/{run.pk}/resume/", {"ticket": run.resume_ticket, "input": small}, format="json")
        assert retried.status_code == 200
    assert_sizes_stored(run)


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
def test_an_agents_events_output_and_children_are_never_refused_by_the_per_user_caps(alice: User) -> None:
    run = running_run(alice)
    with override_settings(RUNLEDGER_MAX_STORED_BYTES_PER_USER=10_000, RUNLEDGER_MAX_RUNS_PER_USER=1):
        big = [(EventType.OUTPUT_DELTA, {"text": "y" * 8_000})] * 3
        services.run_events_append(run_id=run.pk, generation=run.generation, events=big)
        child = services.run_child_spawn(run_id=run.pk, generation=run.generation, input={"deltas": 1})
        services.run_complete(run_id=run.pk, generation=run.generation, output={"text": "z" * 8_000})
        with pytest.raises(TooManyRequests):
            services.run_create(owner=alice, agent="demo", input={"deltas": 1})
    assert Run.objects.get(pk=run.pk).status == "completed"
    assert Run.objects.get(pk=child.pk).owner_id == alice.pk
    assert_sizes_stored(run)
    assert sum(Run.objects.filter(owner=alice).values_list("stored_bytes", flat=True)) > 10_000


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("caps", "made"), [({"RUNLEDGER_MAX_RUNS_PER_USER": 5}, 5), ({"RUNLEDGER_MAX_STORED_BYTES_PER_USER": 35_000}, 3)]
)
def test_concurrent_creates_never_pass_the_runs_or_the_bytes_cap(alice: User, caps: dict[str, int], made: int) -> None:
    # 10 kB inputs: three fit in 35,000 bytes with their `run.created`, a fourth does not.
    with override_settings(RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER=0, **caps):
        results = race(16, lambda i: services.run_create(owner=alice, agent="demo", input={"pad": "x" * 10_000}))
    assert all(isinstance(r, Run | TooManyRequests) for r in results), results
    assert sum(isinstance(r, Run) for r in results) == made
    assert Run.objects.filter(owner=alice).count() == made


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_a_web_process_takes_both_caps_from_its_environment(procs: Procs, alice: User) -> None:
    env = subprocess_env(
        RUNLEDGER_MAX_RUNS_PER_USER="2",
        RUNLEDGER_MAX_STORED_BYTES_PER_USER="60000",
        RUNLEDGER_LIMIT_RETRY_AFTER_SECONDS="3",
    )
    web = procs.uvicorn(env=env)
    with httpx.Client(base_url=web.url, headers={"Authorization": f"Token {token_for(alice)}"}, timeout=10) as api:
        big = api.post("/api/runs/", json={"agent": "demo", "input": {"pad": "x" * 40_000}})
        over_bytes = api.post("/api/runs/", json={"agent": "demo", "input": {"pad": "x" * 40_000}})
        small = api.post("/api/runs/", json={"agent": "demo", "input": {}})
        over_runs = api.post("/api/runs/", json={"agent": "demo", "input": {}})
    assert [a.status_code for a in (big, over_bytes, small, over_runs)] == [201, 429, 201, 429]
    assert over_bytes.json()["error"]["detail"]["limit"] == 60_000
    assert over_runs.json()["error"]["detail"] == {"runs": 2, "limit": 2}
    assert over_runs.headers["Retry-After"] == "3"
    assert Run.objects.filter(owner=alice).count() == 2


# --- migration 0008 --------------------------------------------------------------------------------


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_migration_0008_measures_the_runs_stored_before_it(alice: User) -> None:
    with migrated_across("0007_attempt_guards", "0008_stored_bytes") as old:
        now = timezone.now()
        OldRun, OldEvent = old.get_model("runs", "Run"), old.get_model("runs", "RunEvent")
        run = OldRun.objects.create(
            owner_id=alice.pk,
            agent="demo",
            input={"deltas": 1, "note": "é"},
            status="failed",
            end_code="agent_error",
            output=None,
            error={"trace": "x" * 300},
            last_seq=2,
            created_at=now,
            ended_at=now,
            updated_at=now,
        )
        for seq, data in ((1, {"agent": "demo"}), (2, {"code": "agent_error", "error": {"trace": "x" * 300}})):
            OldEvent.objects.create(run_id=run.pk, seq=seq, type="run.x", data=data, created_at=now)
    migrated = Run.objects.get(pk=run.pk)
    # Measured in the database's own text of the JSON: at least the compact size, a little above it.
    exact = {"input": json_bytes(migrated.input), "error": json_bytes(migrated.error)}
    assert exact["input"] <= migrated.input_bytes <= exact["input"] + 10
    assert exact["error"] <= migrated.error_bytes <= exact["error"] + 10
    assert migrated.output_bytes == 0
    events = sum(json_bytes(data) for data in RunEvent.objects.filter(run=migrated).values_list("data", flat=True))
    total = exact["input"] + exact["error"] + events
    assert total <= migrated.stored_bytes <= total + 40
    assert migrated.ended_bytes == migrated.stored_bytes  # ended: summed from the index from now on
    assert list(RunEvent.objects.filter(run=migrated).values_list("data_bytes", flat=True)) == [None, None]

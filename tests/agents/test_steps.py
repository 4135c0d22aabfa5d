"""Durable steps (docs/design/execution.md#steps): `ctx.step` stores each result before it returns
it, a later attempt gets it back without calling the step, retries follow the policy, and a replay
that differs from the stored log fails the run (docs/design/execution.md#determinism).

In process with `runs.testing` (the real services and attempt driver, a fake clock, attempts killed
after a step as SIGKILL would), on both databases; tests/worker/test_steps_processes.py does the
same with real worker processes.
"""

import asyncio
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from runs import services
from runs.agents import NO_RETRY, AgentContext, Complete, Directive, Emit, Retry, RetryableError, Wait, base
from runs.events import EventType, WaitReason
from runs.models import Run, RunEvent
from runs.testing import FakeClock, execute
from tests.factories import assert_log_is_sound, queued_run
from tests.support.agents import NOTE
from tests.support.docs import block

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite, pytest.mark.timeout(60)]


def events(run: Run, *types: str) -> list[RunEvent]:
    found = RunEvent.objects.filter(run_id=run.pk).order_by("seq")
    return list(found.filter(type__in=types) if types else found)


def calls(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def emitted(run: Run) -> list[tuple[str, Any]]:
    """What the agent emitted and its steps stored, in order: the run's log without the platform's
    record of its attempts."""
    platform = {EventType.RUN_CREATED, EventType.RUN_STARTED, EventType.RUN_REQUEUED}
    return [(e.type, e.data) for e in events(run) if e.type not in platform]


def steps_run(owner: User, tmp_path: Path, **input: Any) -> Run:
    return queued_run(owner, agent="test-steps", input={"calls": str(tmp_path / "calls"), **input})


def test_each_steps_result_is_stored_as_step_completed_with_its_ordinal_and_returned(
    alice: User, tmp_path: Path
) -> None:
    run = steps_run(alice, tmp_path, steps=["search", "read", "search"])

    trial = execute(run)

    run = trial.run
    assert (run.status, trial.attempts) == ("completed", 1)
    keys = [f"{run.pk}:{n}" for n in (1, 2, 3)]
    results = [{"name": name, "key": key} for name, key in zip(["search", "read", "search"], keys, strict=True)]
    assert run.output == {"results": results}
    stored = events(run, EventType.STEP_COMPLETED)
    assert [e.data for e in stored] == [
        {"name": r["name"], "ordinal": n, "result": r} for n, r in enumerate(results, start=1)
    ]
    # Each step's result committed before the agent went on: its note for the next step follows it.
    types = [t for t, _ in emitted(run)]
    assert types == [NOTE, "step.completed"] * 3 + ["output.delta", "run.completed"]
    assert calls(tmp_path / "calls") == [f"{r['name']} {r['key']}" for r in results]
    assert run.steps_used == 3
    assert_log_is_sound(run)


@pytest.mark.parametrize("kill_after", [1, 2, 3])
def test_an_attempt_killed_after_a_step_resumes_exactly_without_calling_it_again(
    alice: User, tmp_path: Path, kill_after: int
) -> None:
    whole = steps_run(alice, tmp_path / "whole", steps=["a", "b", "c"])
    (tmp_path / "whole").mkdir()
    (tmp_path / "killed").mkdir()
    reference = execute(whole).run
    run = steps_run(alice, tmp_path / "killed", steps=["a", "b", "c"])

    trial = execute(run, kill_after_steps=[kill_after])

    assert (trial.run.status, trial.attempts, trial.kills) == ("completed", 2, [kill_after])
    assert trial.run.lost_attempts == 1
    # Each step called once (its own side effect), with the same idempotency key as ever.
    assert [line.split()[0] for line in calls(tmp_path / "killed" / "calls")] == ["a", "b", "c"]
    # The log reads as one uninterrupted execution's: nothing emitted twice.
    rename = {str(whole.pk): str(run.pk)}

    def same_ids(log: list[tuple[str, Any]]) -> str:
        text = repr(log)
        for old, new in rename.items():
            text = text.replace(old, new)
        return text

    assert same_ids(emitted(reference)) == repr(emitted(trial.run))
    assert trial.run.output["results"] == [  # type: ignore[index]
        {"name": n, "key": f"{run.pk}:{i}"} for i, n in enumerate("abc", start=1)
    ]
    assert trial.run.steps_used == 3
    assert_log_is_sound(trial.run)


def test_a_step_raising_a_retryable_error_twice_then_succeeding_records_two_retries(
    alice: User, tmp_path: Path
) -> None:
    run = steps_run(alice, tmp_path, steps=["one"], fail="one", fail_times=2, backoff=0.01)

    trial = execute(run)

    assert trial.run.status == "completed"
    retrying = events(trial.run, EventType.STEP_RETRYING)
    assert [(e.data["name"], e.data["ordinal"], e.data["call"]) for e in retrying] == [("one", 1, 1), ("one", 1, 2)]
    assert {e.data["error"] for e in retrying} == {"RetryableError"}
    assert {e.data["message"] for e in retrying} == {"one is busy"}
    # Jittered in the upper half of 0.01 * 2**(call - 1).
    assert 0.005 <= retrying[0].data["wait"] <= 0.01 and 0.01 <= retrying[1].data["wait"] <= 0.02
    (completed,) = events(trial.run, EventType.STEP_COMPLETED)
    assert completed.seq > retrying[-1].seq
    assert len(calls(tmp_path / "calls.failed")) == 2 and len(calls(tmp_path / "calls")) == 1
    # One step for the call, one more for each retry.
    assert trial.run.steps_used == 3


def test_a_retry_waits_at_least_what_retry_after_asks(alice: User, tmp_path: Path) -> None:
    run = steps_run(alice, tmp_path, steps=["one"], fail="one", fail_times=1, backoff=0.01, retry_after=7)
    clock = FakeClock()

    trial = execute(run, clock=clock)

    assert trial.run.status == "completed"
    assert clock.waits == [7.0]
    (retrying,) = events(trial.run, EventType.STEP_RETRYING)
    assert retrying.data["wait"] == 7.0


def test_a_step_that_exhausts_its_policy_fails_the_run_naming_the_step(alice: User, tmp_path: Path) -> None:
    run = steps_run(alice, tmp_path, steps=["one", "flaky"], fail="flaky", fail_times=5, attempts=3)

    trial = execute(run)

    run = trial.run
    assert (run.status, run.end_code) == ("failed", "agent_error")
    assert run.end_reason == (
        "the agent raised StepFailed: step 'flaky' (#2) failed 3 times; last: RetryableError: flaky is busy"
    )
    assert len(events(run, EventType.STEP_RETRYING)) == 2
    assert [e.data["name"] for e in events(run, EventType.STEP_COMPLETED)] == ["one"]


def test_a_step_whose_result_is_nan_fails_the_run_invalid_output(alice: User, tmp_path: Path) -> None:
    run = steps_run(alice, tmp_path, steps=["one", "two"], nan="two")

    trial = execute(run)

    run = trial.run
    assert (run.status, run.end_code) == ("failed", "invalid_output")
    assert run.end_reason == "step 'two' (#2): its result cannot be stored: $.score: nan is not a finite number"
    assert [e.data["name"] for e in events(run, EventType.STEP_COMPLETED)] == ["one"]
    assert_log_is_sound(run)


def test_injected_failures_are_retried_by_the_steps_policy_on_the_fake_clock(alice: User, tmp_path: Path) -> None:
    run = steps_run(alice, tmp_path, steps=["one", "two"], backoff=2)
    clock = FakeClock(seed=1)

    trial = execute(run, raises={2: (2, lambda: ConnectionError("reset by peer"))}, clock=clock)

    assert (trial.run.status, trial.raised) == ("completed", {2: 2})
    retrying = events(trial.run, EventType.STEP_RETRYING)
    assert [(e.data["name"], e.data["error"], e.data["message"]) for e in retrying] == [
        ("two", "ConnectionError", "reset by peer")
    ] * 2
    assert clock.waits == [e.data["wait"] for e in retrying]
    assert 1 <= clock.waits[0] <= 2 and 2 <= clock.waits[1] <= 4
    assert len(calls(tmp_path / "calls")) == 2  # the injected failures never called the tool


def test_each_step_and_retry_counts_toward_max_steps(alice: User, tmp_path: Path) -> None:
    run = queued_run(
        alice,
        agent="test-steps",
        input={"calls": str(tmp_path / "calls"), "steps": ["one", "two"], "fail": "two", "fail_times": 1},
        max_steps=2,
    )

    trial = execute(run)

    run = trial.run
    assert (run.status, run.end_code, run.steps_used) == ("stopped", "budget_exhausted", 2)
    # The retry of "two" was the step past the budget: it never started.
    assert len(calls(tmp_path / "calls.failed")) == 1 and len(calls(tmp_path / "calls")) == 1


# --- replay and determinism -----------------------------------------------------------------------


async def _order_by_attempt(ctx: AgentContext) -> AsyncIterator[Directive]:
    """Non-deterministic on purpose: its second attempt takes its steps in another order."""
    names = ["fetch", "parse"] if ctx.generation == 1 else ["parse", "fetch"]
    for name in names:
        await ctx.step(name, _constant, name)
    yield Complete(None)


async def _emits_by_attempt(ctx: AgentContext) -> AsyncIterator[Directive]:
    yield Emit(EventType.OUTPUT_DELTA, {"text": f"attempt {ctx.generation}"})
    await ctx.step("fetch", _constant, "fetch")
    yield Complete(None)


async def _streams_after_its_step(ctx: AgentContext) -> AsyncIterator[Directive]:
    """After its one step, the same event, then one that differs by attempt (a model's answer), then
    a question asked once."""
    await ctx.step("fetch", _constant, "fetch")
    yield Emit(EventType.OUTPUT_DELTA, {"text": "same "})
    yield Emit(EventType.OUTPUT_DELTA, {"text": f"attempt {ctx.generation} "})
    if not any(e.type == EventType.RUN_WAITING for e in ctx.events):
        yield Wait(WaitReason.INPUT_REQUIRED, "go on?")
    yield Complete(None)


async def _constant(name: str) -> str:
    return name


def test_a_replay_taking_a_step_out_of_order_fails_the_run_naming_it(alice: User, agent_named: Any) -> None:
    run = queued_run(alice, agent=agent_named("test-out-of-order", _order_by_attempt), input={})

    trial = execute(run, kill_after_steps=[2])

    run = trial.run
    (fetch, _) = events(run, EventType.STEP_COMPLETED)
    assert (run.status, run.end_code) == ("failed", "agent_error")
    assert run.end_reason == (
        f"non-determinism: replaying its stored log, the agent took step 'parse' (#1) where seq {fetch.seq} "
        "holds step 'fetch' (#1): a step out of order (docs/design/execution.md#determinism)"
    )


def test_a_replay_emitting_otherwise_fails_the_run_naming_the_first_differing_event(
    alice: User, agent_named: Any
) -> None:
    run = queued_run(alice, agent=agent_named("test-emits-otherwise", _emits_by_attempt), input={})

    trial = execute(run, kill_after_steps=[1])

    run = trial.run
    (delta,) = events(run, EventType.OUTPUT_DELTA)
    assert (run.status, run.end_code) == ("failed", "agent_error")
    assert run.end_reason == (
        'non-determinism: replaying its stored log, the agent emitted output.delta {"text": "attempt 2"} where '
        f'seq {delta.seq} holds output.delta {{"text": "attempt 1"}} (docs/design/execution.md#determinism)'
    )


def test_a_fork_copies_completed_steps_and_its_agent_gets_their_results_without_calling_them(
    alice: User, tmp_path: Path
) -> None:
    original = execute(steps_run(alice, tmp_path, steps=["a", "b"])).run
    (first, _) = events(original, EventType.STEP_COMPLETED)

    fork = services.run_rerun(run_id=original.pk, owner=alice, from_seq=first.seq)
    trial = execute(fork)

    assert trial.run.status == "completed"
    # Step "a" came from the copy; only "b" was called again, by the fork.
    assert [line.split() for line in calls(tmp_path / "calls")] == [
        ["a", f"{original.pk}:1"],
        ["b", f"{original.pk}:2"],
        ["b", f"{fork.pk}:2"],
    ]
    assert trial.run.output == {"results": [first.data["result"], {"name": "b", "key": f"{fork.pk}:2"}]}
    copied = events(trial.run, EventType.STEP_COMPLETED)[0]
    assert copied.data["forked_from_seq"] == first.seq
    assert trial.run.steps_used == 1


# --- the how-to's tests, on the guide's agent ------------------------------------------------------


def test_the_how_tos_tests_prove_the_guides_agent_resumes_after_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_agents.py").write_text(block("how-to/agents.md", "python", "my_agents.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_agents", raising=False)
    tests: dict[str, Any] = {}
    code = block("how-to/test-agents.md", "python", "test_my_agents.py")
    try:
        exec(compile(code, "docs/how-to/test-agents.md", "exec"), tests)
        names = [name for name in tests if name.startswith("test_")]
        assert names == [
            "test_the_explainer_resumes_exactly_after_every_step",
            "test_a_busy_look_up_is_retried_after_the_wait_the_encyclopedia_asks",
        ]
        for name in names:
            tests[name]()
    finally:
        base._REGISTRY.pop("explainer", None)
        sys.modules.pop("my_agents", None)


# --- the demo agent with "steps": true ------------------------------------------------------------


def demo_log(run: Run) -> list[tuple[str, Any]]:
    return [(t, d) for t, d in emitted(run) if t != EventType.RUN_CREATED]


def test_the_demos_steps_make_the_text_and_output_of_its_plain_run_and_resume_exactly_after_each(
    alice: User,
) -> None:
    input = {"deltas": 6, "delay_ms": 0, "tool": "slow", "tool_ms": 1}
    plain = execute(queued_run(alice, input=input)).run
    durable = execute(queued_run(alice, input={**input, "steps": True})).run

    assert durable.status == plain.status == "completed"
    assert durable.output == plain.output
    assert [d["text"] for t, d in emitted(durable) if t == EventType.OUTPUT_DELTA] == [
        d["text"] for t, d in emitted(plain) if t == EventType.OUTPUT_DELTA
    ]
    steps = events(durable, EventType.STEP_COMPLETED)
    assert [e.data["name"] for e in steps] == ["model", "tool", "model"]
    assert durable.steps_used == plain.steps_used == 3
    for n in range(1, len(steps) + 1):
        trial = execute(queued_run(alice, input={**input, "steps": True}), kill_after_steps=[n])
        assert (trial.run.status, trial.kills, trial.run.output) == ("completed", [n], durable.output)
        assert demo_log(trial.run) == demo_log(durable)


def test_the_demos_flaky_tool_is_retried_as_often_as_it_is_busy(alice: User) -> None:
    input = {"deltas": 2, "delay_ms": 0, "tool": "blocking", "tool_ms": 1, "flaky": 2, "steps": True}
    clock = FakeClock()

    trial = execute(queued_run(alice, input=input), clock=clock)

    assert trial.run.status == "completed"
    retrying = events(trial.run, EventType.STEP_RETRYING)
    assert [(e.data["name"], e.data["call"], e.data["message"]) for e in retrying] == [
        ("tool", 1, "the blocking tool is busy"),
        ("tool", 2, "the blocking tool is busy"),
    ]
    assert clock.waits == [e.data["wait"] for e in retrying]


def test_the_run_page_of_the_console_shows_the_steps_and_their_retries(alice: User, client: Client) -> None:
    input = {"deltas": 2, "delay_ms": 0, "tool": "blocking", "tool_ms": 1, "flaky": 2, "steps": True}
    run = execute(queued_run(alice, input=input)).run
    plain = execute(queued_run(alice, input={"deltas": 2, "delay_ms": 0})).run
    client.force_login(User.objects.create_superuser("staff"))

    page = client.get(reverse("admin:runs_run_change", args=[run.pk])).content.decode()
    assert "Durable steps" in page
    assert "3 completed · retries: tool retried 2 times (last: RetryableError: the blocking tool is busy)" in page
    assert "3 completed" not in client.get(reverse("admin:runs_run_change", args=[plain.pk])).content.decode()


def test_the_demos_question_on_steps_is_asked_once_and_its_answer_kept_across_a_kill(alice: User) -> None:
    input = {"deltas": 4, "delay_ms": 0, "ask": "name?", "steps": True}
    run = queued_run(alice, input=input)
    assert execute(run).run.status == "waiting"
    services.run_resume(run_id=run.pk, ticket=Run.objects.get(pk=run.pk).resume_ticket, input={"name": "Ada"})

    trial = execute(run, kill_after_steps=[2])

    assert (trial.run.status, trial.kills) == ("completed", [2]), trial.run.end_reason
    assert trial.run.output["answer"] == {"name": "Ada"}  # type: ignore[index]
    assert len(events(trial.run, EventType.RUN_WAITING)) == 1
    assert [e.data["name"] for e in events(trial.run, EventType.STEP_COMPLETED)] == ["model", "model"]


def test_past_the_last_step_a_replay_repeats_what_is_stored_once_and_a_difference_only_ends_it(
    alice: User, agent_named: Any
) -> None:
    run = queued_run(alice, agent=agent_named("test-streams-after", _streams_after_its_step), input={})
    assert execute(run).run.status == "waiting"
    services.run_resume(run_id=run.pk, ticket=Run.objects.get(pk=run.pk).resume_ticket, input=None)

    trial = execute(run)

    assert trial.run.status == "completed", trial.run.end_reason
    texts = [(e.data["text"], e.attempt) for e in events(trial.run, EventType.OUTPUT_DELTA)]
    assert texts == [("same ", 1), ("attempt 1 ", 1), ("attempt 2 ", 2)]
    assert len(events(trial.run, EventType.STEP_COMPLETED)) == 1


# --- what ctx.step accepts --------------------------------------------------------------------------


def _blocking_key(ctx: AgentContext) -> dict[str, Any]:
    # Plain code runs in a thread of its own, with the step's key readable there.
    return {"key": ctx.step_key, "thread": threading.current_thread() is not threading.main_thread()}


async def _blocking_step(ctx: AgentContext) -> AsyncIterator[Directive]:
    result = await ctx.step("blocking", _blocking_key, ctx, retry=NO_RETRY)
    yield Complete({"result": result, "key_after": ctx.step_key})


async def _two_at_once(ctx: AgentContext) -> AsyncIterator[Directive]:
    await asyncio.gather(ctx.step("a", asyncio.sleep, 0.01), ctx.step("b", asyncio.sleep, 0.01))
    yield Complete(None)


def test_a_plain_function_runs_in_a_thread_and_reads_the_steps_key_there(alice: User, agent_named: Any) -> None:
    run = execute(queued_run(alice, agent=agent_named("test-blocking-step", _blocking_step), input={})).run
    assert run.output == {"result": {"key": f"{run.pk}:1", "thread": True}, "key_after": None}


def test_two_steps_at_once_fail_the_run_as_their_order_would_be_chance(alice: User, agent_named: Any) -> None:
    run = execute(queued_run(alice, agent=agent_named("test-two-at-once", _two_at_once), input={})).run
    assert (run.status, run.end_code) == ("failed", "agent_error")
    assert run.end_reason == (
        "the agent raised RuntimeError: step 'b' started while another step runs: await each step before the next"
    )


@pytest.mark.parametrize(
    ("policy", "problem"),
    [
        ({"attempts": 0}, "Retry: attempts counts every call, at least 1, not 0"),
        ({"backoff": -1}, "Retry: backoff must be a finite number of seconds ≥ 0, not -1"),
        ({"max_backoff": float("inf")}, "Retry: max_backoff must be a finite number of seconds ≥ 0, not inf"),
        ({"retry_on": ValueError}, "Retry: retry_on must be a tuple of exception classes, not <class 'ValueError'>"),
    ],
)
def test_a_bad_retry_policy_is_refused_where_it_is_written(policy: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError) as refused:
        Retry(**policy)
    assert str(refused.value) == problem


def test_waits_grow_to_their_ceiling_jittered_in_its_upper_half_and_never_below_retry_after() -> None:
    policy = Retry(attempts=10, backoff=1, max_backoff=8)
    error = ConnectionError("reset")
    assert [policy.wait(error, call=n, draw=0.0) for n in range(1, 6)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert [policy.wait(error, call=n, draw=0.999) for n in (1, 5)] == pytest.approx([0.9995, 7.996])
    assert policy.wait(RetryableError("busy", retry_after=20), call=1, draw=0.5) == 20.0
    assert policy.retries(error, call=9) and not policy.retries(error, call=10)
    assert not policy.retries(ValueError("a bug"), call=1)

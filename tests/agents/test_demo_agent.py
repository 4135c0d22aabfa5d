"""The built-in `demo` agent, executed by an in-process worker run with `--once`."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import transaction

from runs import services
from runs.agents.demo import TOOL_CALL_ID, delta_text, demo_text
from runs.models import Run, RunEvent
from runs.services.creation import insert_run
from runs.worker import Worker
from tests.factories import assert_log_is_sound, queued_run
from tests.support.runs import stored_text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]


def run_once(**kwargs: Any) -> int:
    return Worker(once=True, worker_id="in-process", **kwargs).run(install_signals=False)


def events(run: Run, type_: str | None = None) -> list[RunEvent]:
    qs = RunEvent.objects.filter(run_id=run.pk).order_by("seq")
    return list(qs.filter(type=type_) if type_ else qs)


def test_the_demo_streams_its_deltas_and_completes(alice: User) -> None:
    run = queued_run(alice, input={"deltas": 5, "delay_ms": 1})

    call_command("runworker", "--once", "--worker-id", "cmd")

    run.refresh_from_db()
    assert run.status == "completed"
    assert stored_text(run) == demo_text(5) == "chunk 0 chunk 1 chunk 2 chunk 3 chunk 4 "
    assert run.output == {"text": demo_text(5), "deltas": 5}
    assert run.events_used == 5
    assert run.steps_used == 2  # two model turns: before and after the halfway point
    assert [e.type for e in events(run)] == ["run.created", "run.started", *["output.delta"] * 5, "run.completed"]
    assert all(e.attempt == 1 for e in events(run)[1:])
    assert_log_is_sound(run)


def test_fast_deltas_are_batched_into_few_transactions(alice: User) -> None:
    run = queued_run(alice, input={"deltas": 400, "delay_ms": 0})

    run_once()

    run.refresh_from_db()
    assert run.status == "completed"
    deltas = events(run, "output.delta")
    assert [e.data["text"] for e in deltas] == [delta_text(i) for i in range(400)]
    # created_at is taken once per transaction: many deltas share each append transaction.
    transactions = {e.created_at for e in deltas}
    assert len(transactions) <= 40, len(transactions)
    assert_log_is_sound(run)


@pytest.mark.parametrize("tool", ["slow", "stubborn", "process", "blocking"])
def test_the_tool_is_called_halfway(alice: User, tool: str) -> None:
    run = queued_run(alice, input={"deltas": 4, "delay_ms": 0, "tool": tool, "tool_ms": 20})

    run_once()

    run.refresh_from_db()
    assert run.status == "completed"
    types = [e.type for e in events(run)]
    assert types == [
        "run.created",
        "run.started",
        "output.delta",
        "output.delta",
        "tool.started",
        "tool.finished",
        "output.delta",
        "output.delta",
        "run.completed",
    ]
    started, finished = events(run, "tool.started")[0], events(run, "tool.finished")[0]
    pid = started.data.pop("pid", None)
    assert started.data == {"call_id": TOOL_CALL_ID, "name": tool, "arguments": {"seconds": 0.02}}
    assert (pid is not None) == (tool == "process")  # a child process names its pid
    assert finished.data["call_id"] == TOOL_CALL_ID and finished.data["name"] == tool
    assert finished.data["status"] == "ok"
    assert finished.data["result"]["slept_ms"] == 20
    if tool == "process":
        assert finished.data["result"] == {"slept_ms": 20, "returncode": 0, "stdout": "slept 20 ms"}
    assert run.output["tool_result"] == finished.data["result"]
    assert run.steps_used == 3  # two model turns and one tool call


def in_its_tool(owner: User) -> Run:
    """A demo run of six chunks whose first attempt streamed three of them and started its tool."""
    run = queued_run(owner, input={"deltas": 6, "delay_ms": 0, "tool": "slow", "tool_ms": 10})
    claimed = services.run_claim(worker="first")
    assert claimed is not None
    first = [("output.delta", {"text": delta_text(i)}) for i in range(3)]
    first.append(("tool.started", {"call_id": TOOL_CALL_ID, "name": "slow", "arguments": {"seconds": 0.01}}))
    services.run_events_append(run_id=run.pk, generation=1, events=first)
    return run


def test_a_new_attempt_continues_from_the_stored_events(alice: User) -> None:
    run = in_its_tool(alice)
    # Then its worker shut down.
    services.run_requeue(run_id=run.pk, generation=1, cause="worker_shutdown")

    run_once()

    run.refresh_from_db()
    assert run.status == "completed" and run.generation == 2
    assert stored_text(run) == demo_text(6)  # no chunk twice, none missing
    assert len(events(run, "tool.started")) == 1  # not re-emitted
    assert len(events(run, "tool.finished")) == 1  # the interrupted call was finished once
    assert [e.attempt for e in events(run, "output.delta")] == [1, 1, 1, 2, 2, 2]
    assert_log_is_sound(run)


def test_a_tool_call_sealed_at_a_pause_is_started_anew_after_the_resume(alice: User) -> None:
    run = in_its_tool(alice)
    # Then it was paused there.
    services.run_pause(run_id=run.pk)
    parked = services.run_wait(run_id=run.pk, generation=1, reason="paused")
    services.run_resume(run_id=run.pk, ticket=parked.resume_ticket)

    run_once()

    run.refresh_from_db()
    assert run.status == "completed" and stored_text(run) == demo_text(6)
    calls = [(e.type, e.data["status"] if e.type == "tool.finished" else None, e.attempt) for e in events(run)]
    assert [c for c in calls if c[0].startswith("tool.")] == [
        ("tool.started", None, 1),
        ("tool.finished", "interrupted", 1),
        ("tool.started", None, 2),
        ("tool.finished", "ok", 2),
    ]
    assert run.output["tool_result"] == {"slept_ms": 10}


def test_asking_parks_the_run_and_the_answer_is_echoed(alice: User) -> None:
    run = queued_run(alice, input={"deltas": 4, "delay_ms": 0, "ask": "which colour?"})

    run_once()

    run.refresh_from_db()
    assert run.status == "waiting" and run.resume_ticket
    assert events(run)[-1].data == {"reason": "input_required", "prompt": "which colour?"}
    assert stored_text(run) == demo_text(2)
    services.run_resume(run_id=run.pk, ticket=run.resume_ticket, input={"colour": "teal"})

    run_once()

    run.refresh_from_db()
    assert run.status == "completed"
    assert run.output["answer"] == {"colour": "teal"}
    assert stored_text(run) == demo_text(4)
    assert len(events(run, "run.waiting")) == 1  # the question is not asked again
    assert_log_is_sound(run)


def test_children_are_spawned_once_and_belong_to_the_parents_owner(alice: User) -> None:
    parent = queued_run(alice, input={"deltas": 2, "delay_ms": 0, "children": 3})
    # A first attempt spawned one child, then its worker shut down.
    assert services.run_claim(worker="first") is not None
    services.run_child_spawn(run_id=parent.pk, generation=1, input={"deltas": 2, "delay_ms": 0, "children": 0})
    services.run_requeue(run_id=parent.pk, generation=1, cause="worker_shutdown")

    run_once(concurrency=1)

    parent.refresh_from_db()
    assert parent.status == "completed"
    children = list(Run.objects.filter(parent_id=parent.pk))
    assert len(children) == 3
    assert {c.owner_id for c in children} == {alice.pk}
    assert all(c.input == {"deltas": 2, "delay_ms": 0, "children": 0} for c in children)
    spawned = events(parent, "child.spawned")
    assert [e.data["run_id"] for e in spawned] == [str(c.pk) for c in sorted(children, key=lambda c: c.created_at)]
    assert parent.output["children"] == [e.data["run_id"] for e in spawned]
    # A child spawns no children of its own, whatever it ran into.
    assert not Run.objects.filter(parent_id__in=[c.pk for c in children]).exists()


def unchecked_run(owner: User, input: dict[str, Any]) -> Run:
    """A run whose input never met the create check (made in code, or before the check existed)."""
    with transaction.atomic():
        return insert_run(services.RunSpec(agent="demo", input=input), owner=owner)


def test_bad_input_the_create_check_did_not_see_fails_the_run_with_a_reason(alice: User) -> None:
    bad_tool = unchecked_run(alice, {"deltas": 2, "tool": "hammer"})
    bad_deltas = unchecked_run(alice, {"deltas": "many"})

    run_once()

    for run in (bad_tool, bad_deltas):
        run.refresh_from_db()
        assert run.status == "failed" and run.end_code == "agent_error"
        assert_log_is_sound(run)
    assert "hammer" in bad_tool.end_reason

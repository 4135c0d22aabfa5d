"""Bring your own agent (docs/design/execution.md#agents, docs/design/events.md#agent-types): agent
modules named in RUNLEDGER_AGENTS, declared event types, GET /api/agents/, and the sealing of tool
calls left open when a run ends.

The example agent of docs/how-to/agents.md is run here from the page's own text, in real web and
worker processes started with RUNLEDGER_AGENTS naming a module outside the project.
"""

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from runs import services
from runs.agents import AgentContext, Directive, Emit, register
from runs.events import TERMINAL_EVENT, EventType, ToolStatus
from runs.exceptions import StaleAttempt
from runs.models import Run, RunAttempt, RunEvent
from runs.transitions import FailCode, Status
from runs.worker import Worker
from tests.factories import assert_log_is_sound, queued_run, running_run
from tests.support.db import token_for
from tests.support.docs import block
from tests.support.procs import ROOT, Procs, subprocess_env
from tests.support.runs import event_types, fresh, released, stored_text
from tests.support.waiting import wait_until

# --- registering --------------------------------------------------------------------------------------


async def _nothing(ctx: AgentContext) -> AsyncIterator[Directive]:
    yield Emit(EventType.OUTPUT_DELTA, {"text": "hi"})


@pytest.mark.sqlite
@pytest.mark.parametrize(
    ("name", "event_types", "problem"),
    [
        ("", [], "agent name"),
        ("x" * 65, [], "agent name"),
        ("ok", ["output.delta"], "is a type of the platform"),
        ("ok", ["run.completed"], "is a type of the platform"),
        ("ok", ["Plan.Updated"], "is not an event type"),
        ("ok", ["plan"], "is not an event type"),
        ("ok", ["plan." + "x" * 60], "is not an event type"),
        ("ok", "plan.updated", "a list of types"),
    ],
)
def test_register_refuses_bad_names_and_types_at_import(name: str, event_types: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        register(name, event_types=event_types)(_nothing)


@pytest.mark.sqlite
def test_a_name_cannot_be_taken_by_another_agent(agent_named: Callable[..., str]) -> None:
    agent_named("test-taken", _nothing)

    async def another(ctx: AgentContext) -> AsyncIterator[Directive]:
        yield Emit(EventType.OUTPUT_DELTA, {"text": "hi"})

    with pytest.raises(ValueError, match="already registered"):
        register("test-taken")(another)
    register("test-taken")(_nothing)  # the same agent again (a module imported twice) is fine


@pytest.mark.django_db
@pytest.mark.sqlite
def test_the_api_lists_the_agents_and_their_declared_types(alice: User, agent_named: Callable[..., str]) -> None:
    agent_named("test-planner", _nothing, event_types=["plan.updated", "plan.step_done"])
    client = APIClient()
    assert client.get("/api/agents/").status_code == 401
    client.force_authenticate(alice)
    body = client.get("/api/agents/").json()
    agents = {a["name"]: a["event_types"] for a in body["results"]}
    assert agents["demo"] == []
    assert agents["test-planner"] == ["plan.step_done", "plan.updated"]
    assert set(body) == {"next", "previous", "results"} and body["next"] is None


@pytest.mark.django_db
@pytest.mark.sqlite
def test_an_unknown_agent_is_a_400_that_lists_the_registered_ones(alice: User) -> None:
    client = APIClient()
    client.force_authenticate(alice)
    response = client.post("/api/runs/", {"agent": "my_agent", "input": {}}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert "unknown agent 'my_agent'" in error["message"] and "registered agents: demo" in error["message"]
    assert not Run.objects.exists()


# --- what an agent may emit ---------------------------------------------------------------------------


async def _undeclared(ctx: AgentContext) -> AsyncIterator[Directive]:
    yield Emit("plan.updated", {"steps": 1})  # declared
    yield Emit("plan.secret", {"steps": 2})  # not declared


async def _spawns_by_hand(ctx: AgentContext) -> AsyncIterator[Directive]:
    yield Emit(EventType.CHILD_SPAWNED, {"run_id": "forged"})


async def _unsealed_finish(ctx: AgentContext) -> AsyncIterator[Directive]:
    yield Emit(EventType.TOOL_STARTED, {"call_id": "c1", "name": "t"})
    yield Emit(EventType.TOOL_FINISHED, {"call_id": "c1", "name": "t", "status": ToolStatus.INTERRUPTED})


async def _tool_calls(ctx: AgentContext) -> AsyncIterator[Directive]:
    for call_id, finish in (("c1", {"result": 1}), ("c2", {"error": "boom"}), ("c3", {"status": "ok"})):
        yield Emit(EventType.TOOL_STARTED, {"call_id": call_id, "name": "t"})
        yield Emit(EventType.TOOL_FINISHED, {"call_id": call_id, "name": "t", **finish})


@pytest.mark.django_db(transaction=True)
@pytest.mark.sqlite
def test_a_type_the_agent_did_not_declare_fails_the_run_invalid_output(
    alice: User, agent_named: Callable[..., str]
) -> None:
    undeclared = queued_run(alice, agent=agent_named("test-undeclared", _undeclared, ["plan.updated"]), input={})
    by_hand = queued_run(alice, agent=agent_named("test-by-hand", _spawns_by_hand), input={})
    unsealed = queued_run(alice, agent=agent_named("test-unsealed", _unsealed_finish), input={})
    tools = queued_run(alice, agent=agent_named("test-tools", _tool_calls), input={})

    Worker(once=True).run(install_signals=False)

    for run, says in ((undeclared, "'plan.secret'"), (by_hand, "child.spawned"), (unsealed, "'interrupted'")):
        run = fresh(run)
        assert (run.status, run.end_code) == ("failed", "invalid_output"), run.end_reason
        assert says in run.end_reason
        assert_log_is_sound(run)
    assert "plan.updated" in event_types(undeclared) and "plan.secret" not in event_types(undeclared)
    # The tool call the agent opened is sealed by the failure; its forged finish was never stored.
    finishes = RunEvent.objects.filter(run=unsealed, type=EventType.TOOL_FINISHED)
    assert [e.data["status"] for e in finishes] == [ToolStatus.INTERRUPTED]
    assert event_types(unsealed)[-2:] == [EventType.TOOL_FINISHED, EventType.RUN_FAILED]
    # A finish without a status is `error` when it carries one, else `ok`.
    assert fresh(tools).status == Status.COMPLETED
    statuses = [e.data["status"] for e in RunEvent.objects.filter(run=tools, type=EventType.TOOL_FINISHED)]
    assert statuses == ["ok", "error", "ok"]


# --- sealing open tool calls ------------------------------------------------------------------------


def _open_calls(run: Run, *call_ids: str) -> None:
    started = [(EventType.TOOL_STARTED, {"call_id": c, "name": f"tool-{c}", "arguments": {}}) for c in call_ids]
    services.run_events_append(run_id=run.pk, generation=run.generation, events=started)


def _cancel(run: Run, owner: User) -> None:
    services.run_cancel(run_id=run.pk, actor=owner, note="enough")


def _stop(run: Run, owner: User) -> None:
    services.run_stop(run_id=run.pk, actor=None, reason="maintenance")


def _fail(run: Run, owner: User) -> None:
    services.run_fail(run_id=run.pk, generation=run.generation, code=FailCode.AGENT_ERROR, reason="boom")


def _complete(run: Run, owner: User) -> None:
    services.run_complete(run_id=run.pk, generation=run.generation, output=None)


def _deadline(run: Run, owner: User) -> None:
    services.run_deadline_stop(run_id=run.pk, as_of=timezone.now() + timedelta(days=2))


def _budget(run: Run, owner: User) -> None:
    # The run was made with max_events 3, filled by two starts and a finish: a delta overflows it.
    with pytest.raises(StaleAttempt, match="max_events"):
        services.run_events_append(
            run_id=run.pk, generation=run.generation, events=[(EventType.OUTPUT_DELTA, {"text": "x"})] * 2
        )


ENDERS = {
    "cancel": (_cancel, Status.CANCELLED),
    "stop": (_stop, Status.STOPPED),
    "failure": (_fail, Status.FAILED),
    "completion": (_complete, Status.COMPLETED),
    "deadline": (_deadline, Status.STOPPED),
    "budget": (_budget, Status.STOPPED),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.sqlite
@pytest.mark.parametrize("ender", sorted(ENDERS))
def test_whoever_ends_a_run_seals_its_open_tool_calls_just_before_the_terminal_event(alice: User, ender: str) -> None:
    end, status = ENDERS[ender]
    run = running_run(alice, deadline=timezone.now() + timedelta(days=1), max_events=3)
    _open_calls(run, "a", "b")
    services.run_events_append(
        run_id=run.pk,
        generation=run.generation,
        events=[(EventType.TOOL_FINISHED, {"call_id": "a", "name": "tool-a", "status": "ok"})],
    )

    end(run, alice)

    run = fresh(run)
    assert run.status == status and run.open_tool_calls == []
    events = assert_log_is_sound(run)
    seal, terminal = events[-2], events[-1]
    assert terminal.type == TERMINAL_EVENT[status]
    assert (seal.type, seal.data) == (
        EventType.TOOL_FINISHED,
        {"call_id": "b", "name": "tool-b", "status": ToolStatus.INTERRUPTED},
    )
    assert seal.created_at == terminal.created_at and seal.attempt == terminal.attempt
    assert [e.data["call_id"] for e in events if e.type == EventType.TOOL_FINISHED] == ["a", "b"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.sqlite
def test_a_cascade_seals_the_open_tool_calls_of_each_child(alice: User) -> None:
    parent = queued_run(alice)
    child = queued_run(alice, parent_id=parent.pk)
    claimed = services.run_claim(worker="test-worker")
    assert claimed is not None and claimed[0].pk == parent.pk
    claimed = services.run_claim(worker="test-worker")
    assert claimed is not None and claimed[0].pk == child.pk
    _open_calls(claimed[0], "c1")

    _cancel(parent, alice)

    child = fresh(child)
    assert (child.status, child.end_code) == ("cancelled", "parent_cancelled")
    types = [(e.type, e.data.get("status")) for e in assert_log_is_sound(child)]
    assert types[-2:] == [(EventType.TOOL_FINISHED, ToolStatus.INTERRUPTED), (EventType.RUN_CANCELLED, None)]


# --- agent modules named in RUNLEDGER_AGENTS, in real processes --------------------------------------


def _guide_agent() -> str:
    return block("how-to/agents.md", "python", "my_agents.py")


def _agents_env(folder: Path, modules: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess_env(RUNLEDGER_AGENTS=modules, PYTHONPATH=path)


def test_a_bad_agent_module_stops_every_process_with_a_message_naming_it(procs: Procs, tmp_path: Path) -> None:
    (tmp_path / "broken_agents.py").write_text("import nowhere_to_be_found\n")
    env = _agents_env(tmp_path, "runs.agents.demo,broken_agents,missing.agents")
    check = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert check.returncode != 0
    for name in ("broken_agents", "missing.agents"):
        assert f"runs.E001) RUNLEDGER_AGENTS names '{name}'" in check.stderr, check.stderr
    worker = procs.start("worker", [sys.executable, "manage.py", "runworker", "--skip-checks"], env)
    web = procs.start("uvicorn", [sys.executable, "-m", "uvicorn", "config.asgi:application", "--port", "0"], env)
    for proc in (worker, web):
        assert proc.popen.wait(timeout=60) != 0
        log = proc.log()
        assert "RUNLEDGER_AGENTS names 'broken_agents', which cannot be imported" in log
        assert "No module named 'nowhere_to_be_found'" in log and "'missing.agents'" in log


@pytest.mark.django_db(transaction=True)
def test_the_guides_agent_runs_in_real_processes_continues_after_its_worker_dies_and_stops_on_cancel(
    procs: Procs, tmp_path: Path, alice: User
) -> None:
    (tmp_path / "my_agents.py").write_text(_guide_agent())
    env = _agents_env(tmp_path, "runs.agents.demo,my_agents")
    web = procs.uvicorn(env=env)
    first = procs.worker("first", env=env)
    api = httpx.Client(base_url=web.url, headers={"Authorization": f"Token {token_for(alice)}"}, timeout=10)

    agents = {a["name"]: a["event_types"] for a in api.get("/api/agents/").json()["results"]}
    assert agents == {"demo": [], "explainer": ["plan.updated"]}

    def create(**input: Any) -> Run:
        response = api.post("/api/runs/", json={"agent": "explainer", "input": input})
        assert response.status_code == 201, response.text
        return Run.objects.get(pk=response.json()["id"])

    def finished(run: Run) -> Run:
        wait_until(lambda: fresh(run).status == Status.COMPLETED, what="the run's completion", timeout=30)
        return fresh(run)

    # Its input check: a bad create is a 400 naming each key, and stores nothing.
    refused = api.post("/api/runs/", json={"agent": "explainer", "input": {"topic": 7, "delay_ms": "fast"}})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "validation_error"
    assert set(refused.json()["error"]["detail"]["input"]) == {"topic", "delay_ms"}
    assert not Run.objects.filter(agent="explainer").exists()

    answer = "the sky is blue because air scatters blue sunlight more than red "
    # To completion: its own declared type, a tool call, the deltas, the output.
    run = finished(create(delay_ms=5))
    assert run.output == {"text": answer, "source": "encyclopedia"}
    assert event_types(run)[:4] == [
        EventType.RUN_CREATED,
        EventType.RUN_STARTED,
        "plan.updated",
        EventType.STEP_COMPLETED,
    ]
    assert stored_text(run) == answer and run.steps_used == 2

    # Its worker dies mid-answer: the next attempt gets the look-up's stored result and goes on
    # after the stored words, nothing twice.
    run = create(delay_ms=150)
    wait_until(lambda: event_types(run).count(EventType.OUTPUT_DELTA) >= 3, what="some of the answer")
    first.kill()
    procs.worker("second", env=env)
    run = finished(run)
    assert stored_text(run) == answer
    types = event_types(run)
    assert types.count("plan.updated") == types.count(EventType.STEP_COMPLETED) == 1
    assert EventType.RUN_REQUEUED in types and run.steps_used == 2

    # Cancelled during its look-up: the await stops, the attempt is released, no result stored.
    run = create(tool_ms=60_000)
    wait_until(lambda: "plan.updated" in event_types(run), what="the look-up")
    response = api.post(f"/api/runs/{run.pk}/cancel/", json={"note": "enough"})
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    attempt = wait_until(lambda: released(run), what="the attempt's release")
    assert isinstance(attempt, RunAttempt) and attempt.outcome == "cancelled"
    events = assert_log_is_sound(run)
    assert [e.type for e in events][-2:] == ["plan.updated", EventType.RUN_CANCELLED]

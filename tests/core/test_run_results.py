"""What a run produced and used, whatever its end: its `partial_output`
when it ended other than `completed` (docs/design/execution.md#partial-output) and its `usage`
(docs/design/events.md#usage).

The demo runs are executed by the real attempt driver: in this process (`Worker(once=True)`) where
the run ends by itself — a budget, an invalid event, a completion —, in a worker process where it
is cancelled from outside while it streams. The JSON is read through the API.
"""

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.agents import base
from runs.agents.base import AgentContext, Complete, Directive, Emit
from runs.agents.demo import demo_text
from runs.events import PARTIAL_OUTPUT, TERMINAL_EVENT, USAGE_MAX, EventType
from runs.exceptions import ValidationFailed
from runs.metrics import series
from runs.models import AttemptOutcome, Run, RunEvent
from runs.transitions import Status
from runs.worker import Worker
from tests.factories import queued_run, running_run
from tests.support.agents import AGENTS_ENV
from tests.support.api import api_for
from tests.support.metrics import parse, value
from tests.support.procs import Procs, subprocess_env
from tests.support.runs import delta_count, delta_texts, fresh, released, stored_text
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

SCRIPTED = "test-results-scripted"
PLANNER = "test-results-planner"
PLAN = "plan.updated"
SCRIPTS: dict[str, list[Directive]] = {}


async def scripted(ctx: AgentContext) -> Iterator[Directive]:  # type: ignore[misc]
    for directive in SCRIPTS[str(ctx.run_id)]:
        yield directive


@pytest.fixture(autouse=True, scope="module")
def _agents() -> Iterator[None]:
    base.register(SCRIPTED)(scripted)
    # An agent whose partial output is a plan it emits as events of its own, and not its deltas.
    base.register(PLANNER, event_types=[PLAN], partial_output={"plan": (PLAN, "step")})(scripted)
    yield
    base._REGISTRY.pop(SCRIPTED, None)
    base._REGISTRY.pop(PLANNER, None)


def run_here(run: Run, script: list[Directive] | None = None) -> dict[str, Any]:
    """Execute the queued `run` with the real attempt driver in this process; its JSON after."""
    if script is not None:
        SCRIPTS[str(run.pk)] = script
    try:
        Worker(once=True, listen=False).run(install_signals=False)
    finally:
        SCRIPTS.pop(str(run.pk), None)
    return run_json(run)


def run_json(run: Run) -> dict[str, Any]:
    response = api_for(run.owner).get(f"/api/runs/{run.pk}/")
    assert response.status_code == 200, response.content
    return dict(response.json())


def terminal_data(run: Run) -> dict[str, Any]:
    run = fresh(run)
    return dict(RunEvent.objects.get(run=run, type=TERMINAL_EVENT[Status(run.status)]).data)


# --- partial output ---------------------------------------------------------------------------------


@pytest.mark.sqlite
def test_a_completed_run_has_no_partial_output_its_output_is_the_result(alice: User) -> None:
    run = queued_run(alice, input={"deltas": 4, "delay_ms": 0})
    data = run_here(run)
    assert data["status"] == "completed"
    assert data["partial_output"] is None and data["output"] is not None
    assert PARTIAL_OUTPUT not in terminal_data(run)


@pytest.mark.sqlite
def test_a_run_stopped_by_its_budget_has_the_text_of_the_deltas_it_stored(alice: User) -> None:
    run = queued_run(alice, input={"deltas": 40, "delay_ms": 0}, max_events=7)
    data = run_here(run)
    assert (data["status"], data["end_code"]) == ("stopped", "budget_exhausted")
    assert delta_count(run) == 7
    assert data["partial_output"] == {"text": demo_text(7)} == {"text": stored_text(run)}
    assert terminal_data(run)[PARTIAL_OUTPUT] is True


@pytest.mark.sqlite
def test_a_run_failed_by_an_invalid_event_has_the_text_up_to_the_bad_event(alice: User) -> None:
    script = [
        Emit(EventType.OUTPUT_DELTA, {"text": "one "}),
        Emit(EventType.OUTPUT_DELTA, {"text": "two "}),
        Emit(EventType.OUTPUT_DELTA, {"text": "three ", "score": float("nan")}),
        Emit(EventType.OUTPUT_DELTA, {"text": "four "}),
        Complete({"text": "one two three four "}),
    ]
    run = queued_run(alice, agent=SCRIPTED, input={})
    data = run_here(run, script)
    assert (data["status"], data["end_code"]) == ("failed", "invalid_output")
    assert data["partial_output"] == {"text": "one two "}
    assert terminal_data(run)[PARTIAL_OUTPUT] is True


@pytest.mark.sqlite
def test_a_run_that_ended_before_any_output_has_none_and_its_end_says_so(alice: User) -> None:
    run = queued_run(alice, input={"deltas": 3})
    services.run_cancel(run_id=run.pk, actor=alice)
    assert run_json(run)["partial_output"] is None
    assert terminal_data(run)[PARTIAL_OUTPUT] is False


@pytest.mark.sqlite
def test_a_cancel_runs_the_same_statements_whether_or_not_the_run_has_a_partial_output(alice: User) -> None:
    # What keeps the cancel latency: its transaction neither reads the events nor writes more.
    bare, streamed = running_run(alice), running_run(alice)
    deltas = [(EventType.OUTPUT_DELTA, {"text": f"{i} "}) for i in range(50)]
    services.run_events_append(run_id=streamed.pk, generation=streamed.generation, events=deltas)
    statements = {}
    for run in (bare, streamed):
        with CaptureQueriesContext(connection) as captured:
            services.run_cancel(run_id=run.pk, actor=alice)
        statements[run.pk] = [q["sql"].split(" ")[0] for q in captured.captured_queries]
    assert statements[bare.pk] == statements[streamed.pk]
    assert (terminal_data(bare)[PARTIAL_OUTPUT], terminal_data(streamed)[PARTIAL_OUTPUT]) == (False, True)


@pytest.mark.sqlite
def test_an_agent_declares_what_its_partial_output_is_made_of(alice: User) -> None:
    run = running_run(alice, agent=PLANNER, input={})
    events = [
        (EventType.OUTPUT_DELTA, {"text": "thinking "}),
        (PLAN, {"step": "1. read; "}),
        (PLAN, {"step": "2. write"}),
    ]
    services.run_events_append(run_id=run.pk, generation=run.generation, events=events)
    assert fresh(run).partial_events == 2  # the rule reads plan.updated only
    services.run_stop(run_id=run.pk, actor=None, reason="enough")
    assert run_json(run)["partial_output"] == {"plan": "1. read; 2. write"}
    assert terminal_data(run)[PARTIAL_OUTPUT] is True


def test_the_rule_an_agent_declares_is_checked_when_it_registers() -> None:
    with pytest.raises(ValueError, match=r"neither output\.delta nor its own"):
        base.register("test-results-bad", partial_output={"plan": ("plan.updated", "step")})
    with pytest.raises(ValueError, match="non-empty mapping"):
        base.register("test-results-bad", partial_output={})
    assert not base.is_registered("test-results-bad")


@pytest.mark.processes
def test_a_run_cancelled_mid_stream_has_the_text_of_every_delta_stored_before_the_cancel(
    procs: Procs, alice: User
) -> None:
    procs.worker("w1", env=subprocess_env(**AGENTS_ENV))
    run = queued_run(alice, input={"deltas": 3000, "delay_ms": 5})
    wait_until(lambda: delta_count(run) >= 25, what="the run streaming")

    response = api_for(alice).post(f"/api/runs/{run.pk}/cancel/", {}, format="json")

    # In the cancel's own answer already: the deltas its commit found stored, in order.
    assert response.status_code == 200, response.content
    stored = delta_texts(run)
    assert len(stored) >= 25
    assert response.json()["partial_output"] == {"text": "".join(stored)} == {"text": demo_text(len(stored))}
    assert terminal_data(run)[PARTIAL_OUTPUT] is True
    wait_until(lambda: released(run), what="the attempt's release")
    assert run_json(run)["partial_output"] == {"text": demo_text(len(stored))}


@pytest.mark.sqlite
def test_a_list_of_runs_leaves_the_partial_output_to_the_run_itself(alice: User) -> None:
    run = queued_run(alice)
    services.run_cancel(run_id=run.pk, actor=alice)
    (item,) = api_for(alice).get("/api/runs/").json()["results"]
    assert "partial_output" not in item and item["usage"] == {"steps": 0, "events": 1}


# --- usage ------------------------------------------------------------------------------------------


def usage_counted(agent: str, counter: str) -> float:
    samples = series.made().USAGE.collect()[0].samples
    return sum(
        s.value for s in samples if s.name.endswith("_total") and s.labels == {"agent": agent, "counter": counter}
    )


@pytest.mark.sqlite
def test_reported_usage_is_summed_into_the_run_and_counted_by_agent(alice: User) -> None:
    before = usage_counted("demo", "input_tokens")
    run = running_run(alice)
    fence = {"run_id": run.pk, "generation": run.generation}
    services.run_steps_record(**fence, steps=2)
    services.run_events_append(**fence, events=[(EventType.USAGE_REPORTED, {"input_tokens": 10, "output_tokens": 3})])
    services.run_events_append(
        **fence,
        events=[
            (EventType.OUTPUT_DELTA, {"text": "hi"}),
            (EventType.USAGE_REPORTED, {"input_tokens": 5, "cost_usd": 0.25, "incomplete": True}),
        ],
    )
    services.run_complete(**fence, output={"text": "hi"})

    usage = run_json(run)["usage"]
    assert usage == {
        "steps": 2,
        "events": 3,
        "input_tokens": 15,
        "output_tokens": 3,
        "cost_usd": 0.25,
        "incomplete": True,
    }
    assert usage_counted("demo", "input_tokens") - before == 15


@pytest.mark.sqlite
@pytest.mark.parametrize(
    "data",
    [{"input_tokens": -1}, {"input_tokens": "12"}, {"Tokens": 1}, {"steps": 1}, {"incomplete": "yes"}],
    ids=["negative", "text", "name", "platform-counter", "incomplete"],
)
def test_a_usage_report_that_is_not_counters_is_refused_and_nothing_is_stored(
    alice: User, data: dict[str, Any]
) -> None:
    run = running_run(alice)
    with pytest.raises(ValidationFailed):
        services.run_events_append(run_id=run.pk, generation=run.generation, events=[(EventType.USAGE_REPORTED, data)])
    assert fresh(run).last_seq == run.last_seq and fresh(run).reported_usage == {}


@pytest.mark.sqlite
def test_a_usage_sum_past_the_largest_number_is_held_there_marked_saturated_and_the_run_completes(
    alice: User,
) -> None:
    # Each report is valid; their sum is infinity, which neither database stores. Through the
    # real attempt driver: the agent's writes, batched as the worker batches them.
    huge = {"input_tokens": 1.5e308, "output_tokens": 1}
    script: list[Directive] = [Emit(EventType.USAGE_REPORTED, huge), Emit(EventType.OUTPUT_DELTA, {"text": "a"})]
    script += [Emit(EventType.USAGE_REPORTED, huge), Complete({"text": "a"})]
    run = queued_run(alice, agent=SCRIPTED, input={})

    data = run_here(run, script)

    assert data["status"] == "completed", (data["end_code"], data["error"])
    usage = data["usage"]
    # PostgreSQL gives the largest double back as the integer of its digits; JSON readers take it as
    # the same number.
    assert float(usage.pop("input_tokens")) == USAGE_MAX
    assert usage == {"steps": 0, "events": 3, "output_tokens": 2, "saturated": ["input_tokens"]}
    # Appended one report a transaction (the stored sum read back first), and once more past it.
    again = running_run(alice)
    fence = {"run_id": again.pk, "generation": again.generation}
    for report in (huge, huge, {"input_tokens": 1, "output_tokens": 1}):
        services.run_events_append(**fence, events=[(EventType.USAGE_REPORTED, report)])
    services.run_complete(**fence, output=None)
    usage = run_json(again)["usage"]
    assert float(usage.pop("input_tokens")) == USAGE_MAX
    assert usage == {"steps": 0, "events": 3, "output_tokens": 3, "saturated": ["input_tokens"]}


@pytest.mark.sqlite
@pytest.mark.parametrize(
    ("report", "says"),
    [({"input_tokens": 10**309}, "from 0 to"), ({"saturated": 1}, "the platform's own")],
    ids=["past-the-largest-number", "saturated"],
)
def test_a_counter_past_the_largest_number_or_named_saturated_is_refused(
    alice: User, report: dict[str, Any], says: str
) -> None:
    run = running_run(alice)
    with pytest.raises(ValidationFailed, match=says):
        services.run_events_append(
            run_id=run.pk, generation=run.generation, events=[(EventType.USAGE_REPORTED, report)]
        )
    assert fresh(run).last_seq == run.last_seq and fresh(run).reported_usage == {}


@pytest.mark.sqlite
@pytest.mark.processes
@pytest.mark.parametrize(
    ("input", "kept"),
    [
        ({"digits": 5000, "at_stop": {"input_tokens": 3}}, {}),
        ({"at_stop": {"input_tokens": 3, "output_tokens": 4}}, {"input_tokens": 3, "output_tokens": 4}),
    ],
    ids=["a-5000-digit-count-dropped", "kept"],
)
def test_a_usage_report_at_stop_is_checked_as_any_report_and_never_costs_the_release(
    procs: Procs, alice: User, input: dict[str, Any], kept: dict[str, Any]
) -> None:
    worker = procs.worker("w1", env=subprocess_env(**AGENTS_ENV))
    run = queued_run(alice, agent="test-usage-at-stop", input=input)
    wait_until(lambda: delta_count(run) >= 1, what="the run streaming")

    services.run_cancel(run_id=run.pk, actor=alice)

    # Released by its worker within the grace — not lost a lease later — with what was valid.
    attempt = wait_until(lambda: released(run), timeout=10, what="the attempt's release")
    assert attempt.outcome == AttemptOutcome.CANCELLED
    assert fresh(run).reported_usage == kept
    if not kept:
        assert "a usage report at stop was dropped: usage counter 'output_tokens' must be a number" in worker.log()


@pytest.mark.sqlite
def test_usage_reported_as_a_run_is_cancelled_under_its_attempt_is_added_once_with_its_release(alice: User) -> None:
    run = running_run(alice)
    services.run_cancel(run_id=run.pk, actor=alice)
    release = {"run_id": run.pk, "generation": run.generation, "usage": {"output_tokens": 7, "incomplete": True}}
    services.run_attempt_release(**release)
    services.run_attempt_release(**release)  # a retried release adds nothing
    assert run_json(run)["usage"] == {"steps": 0, "events": 1, "output_tokens": 7, "incomplete": True}


@pytest.mark.sqlite
def test_a_fork_copies_the_text_and_not_the_usage_of_its_original(alice: User) -> None:
    run = running_run(alice)
    fence = {"run_id": run.pk, "generation": run.generation}
    events = [(EventType.OUTPUT_DELTA, {"text": "a"}), (EventType.USAGE_REPORTED, {"output_tokens": 1})]
    services.run_events_append(**fence, events=events)
    services.run_complete(**fence, output={"text": "a"})
    fork = services.run_rerun(run_id=run.pk, owner=alice, from_seq=fresh(run).last_seq)
    assert fresh(fork).reported_usage == {} and fresh(fork).partial_events == 1
    assert [e.type for e in RunEvent.objects.filter(run=fork, type=EventType.USAGE_REPORTED)] == []


# --- where staff and operators see it ---------------------------------------------------------------


@pytest.mark.sqlite
def test_usage_and_partial_output_are_on_the_run_page_the_dashboard_and_metrics(
    alice: User, make_user: Callable[..., User], settings: Any
) -> None:
    run = running_run(alice)
    fence = {"run_id": run.pk, "generation": run.generation}
    events = [(EventType.OUTPUT_DELTA, {"text": "half an answer"}), (EventType.USAGE_REPORTED, {"output_tokens": 41})]
    services.run_events_append(**fence, events=events)
    services.run_cancel(run_id=run.pk, actor=alice)
    staff = Client()
    staff.force_login(make_user("oncall", perms=("runs.view_run",), is_staff=True))

    page = staff.get(f"/admin/runs/run/{run.pk}/change/").content.decode()
    assert "&quot;text&quot;: &quot;half an answer&quot;" in page and "&quot;output_tokens&quot;: 41" in page

    dashboard = staff.get("/admin/runs/dashboard/?figures=1").content.decode()
    assert 'data-usage-agent="demo"' in dashboard and '<span data-counter="output_tokens"><b>41</b>' in dashboard

    settings.RUNLEDGER_METRICS_TOKEN = token = "scrape-me-0123456789"
    scraped = parse(staff.get("/metrics/", headers={"Authorization": f"Bearer {token}"}).content.decode())
    assert value(scraped, "runledger_usage_total", agent="demo", counter="output_tokens") >= 41

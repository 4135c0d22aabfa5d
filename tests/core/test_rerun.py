"""Rerun and fork (docs/design/commands.md#rerun): `POST /api/runs/{id}/rerun/` makes a new run of
an ended one; with `from_seq` it forks, and the agent continues from the copied events."""

from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from runs import services
from runs.agents.base import AgentContext, Directive
from runs.agents.demo import TOOL_CALL_ID, demo_text
from runs.conf import conf
from runs.events import EventType, WaitReason
from runs.models import Run, RunEvent
from tests.factories import assert_log_is_sound, queued_run, running_run
from tests.support.api import api_for, assert_error
from tests.support.procs import Procs
from tests.support.runs import stored_text
from tests.support.workers import wait_status, wait_streaming

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def rerun(user: User, run: Run, **body: Any) -> Any:
    return api_for(user).post(f"/api/runs/{run.pk}/rerun/", body, format="json")


def completed_run(owner: User, **kwargs: Any) -> Run:
    run = running_run(owner, **kwargs)
    return services.run_complete(run_id=run.pk, generation=run.generation, output={"text": "done"})


def logged(run: Run | str) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=getattr(run, "pk", run)).order_by("seq"))


def eventful_run(owner: User, **kwargs: Any) -> Run:
    """A cancelled run whose log has each kind of event a fork copies or leaves: deltas, a tool
    call, a child, a wait and a resume, a requeue and the lifecycle around them."""
    run = running_run(owner, input={"deltas": 6}, **kwargs)
    append = services.run_events_append
    append(run_id=run.pk, generation=1, events=[(EventType.OUTPUT_DELTA, {"text": "chunk 0 "})])  # seq 3
    services.run_child_spawn(run_id=run.pk, generation=1, input={"deltas": 1})  # seq 4
    call = {"call_id": TOOL_CALL_ID, "name": "slow"}
    append(run_id=run.pk, generation=1, events=[(EventType.TOOL_STARTED, call)])  # seq 5
    append(run_id=run.pk, generation=1, events=[(EventType.TOOL_FINISHED, call | {"result": 1})])  # seq 6
    waiting = services.run_wait(run_id=run.pk, generation=1, reason=WaitReason.INPUT_REQUIRED, prompt="?")  # seq 7
    services.run_resume(run_id=run.pk, ticket=waiting.resume_ticket, input="yes")  # seq 8
    again = services.run_claim(worker="test-worker")  # seq 9
    assert again is not None and again[0].pk == run.pk
    append(run_id=run.pk, generation=2, events=[(EventType.OUTPUT_DELTA, {"text": "chunk 1 "})])  # seq 10
    append(run_id=run.pk, generation=2, events=[(EventType.TOOL_STARTED, call)])  # seq 11
    services.run_cancel(run_id=run.pk, actor=owner)  # seq 12: the seal, 13: run.cancelled
    run.refresh_from_db()
    assert run.last_seq == 13, [e.type for e in logged(run)]
    return run


@pytest.mark.sqlite
def test_a_rerun_is_a_new_run_of_the_same_agent_input_and_budgets_linked_to_the_original(alice: User) -> None:
    deadline = timezone.now() + timedelta(hours=1)
    original = completed_run(
        alice, input={"deltas": 3}, max_steps=7, max_events=70, max_attempts=2, deadline=deadline, metadata={"k": "v"}
    )

    response = rerun(alice, original)

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["rerun_of"] == str(original.pk) and body["id"] != str(original.pk)
    assert (body["agent"], body["input"], body["owner"], body["status"]) == ("demo", {"deltas": 3}, "alice", "queued")
    assert (body["max_steps"], body["max_events"], body["max_attempts"]) == (7, 70, 2)
    assert body["metadata"] == {"k": "v"}
    # An absolute time is not copied: the rerun has the default deadline, counted from its create.
    again = Run.objects.get(pk=body["id"])
    assert again.deadline == again.created_at + timedelta(seconds=conf.DEFAULT_DEADLINE_SECONDS) != deadline
    assert body["parent"] is None and body["last_seq"] == 1
    [created] = logged(body["id"])
    assert created.type == EventType.RUN_CREATED
    assert created.data == {
        "agent": "demo",
        "input_keys": ["deltas"],
        "parent": None,
        "rerun_of": str(original.pk),
        "from_seq": None,
    }
    assert list(original.reruns.values_list("pk", flat=True)) == [Run.objects.get(pk=body["id"]).pk]
    assert api_for(alice).get(f"/api/runs/{original.pk}/").json()["rerun_of"] is None


@pytest.mark.sqlite
def test_each_of_the_agent_input_budgets_and_metadata_may_be_given_instead(alice: User) -> None:
    original = completed_run(alice, input={"deltas": 3}, max_steps=7, metadata={"k": "v"})
    deadline = timezone.now() + timedelta(hours=1)

    body = rerun(
        alice, original, input={"deltas": 9}, max_steps=2, max_events=5, deadline=deadline.isoformat(), metadata={}
    ).json()

    assert (body["input"], body["max_steps"], body["max_events"]) == ({"deltas": 9}, 2, 5)
    assert body["metadata"] == {}
    assert body["deadline"] is not None


@pytest.mark.sqlite
def test_a_live_run_cannot_be_rerun_and_nothing_is_written(alice: User) -> None:
    live = running_run(alice)

    body = assert_error(rerun(alice, live), 409, "invalid_transition")

    assert body["run"]["id"] == str(live.pk) and body["run"]["status"] == "running"
    assert Run.objects.count() == 1


@pytest.mark.sqlite
def test_who_may_rerun_and_who_owns_the_rerun(make_user: Callable[..., User], alice: User, bob: User) -> None:
    original = completed_run(alice)
    viewer = make_user("viewer", perms=("runs.view_run",))
    staff = make_user("staff", perms=("runs.change_run",))

    assert_error(rerun(bob, original), 404, "not_found")
    assert_error(rerun(viewer, original), 403, "permission_denied")
    assert Run.objects.count() == 1
    response = rerun(staff, original)

    assert response.status_code == 201 and response.json()["owner"] == "staff"


@pytest.mark.sqlite
def test_a_priority_above_100_is_copied_only_to_a_caller_who_may_give_it(make_user: Callable[..., User]) -> None:
    urgent = make_user("urgent", perms=("runs.prioritize_run", "runs.change_run"))
    oncall = make_user("oncall", perms=("runs.change_run",))
    original, ranked = queued_run(urgent, priority=900), queued_run(oncall, priority=42)
    services.run_cancel(run_id=original.pk, actor=urgent)
    services.run_cancel(run_id=ranked.pk, actor=oncall)

    # Without runs.prioritize_run the rerun keeps the original's rank as far as its caller may
    # give one (docs/design/fair-use.md#priority): 100, never a jump over fair share.
    assert rerun(oncall, original).json()["priority"] == 100
    assert rerun(oncall, original, from_seq=1).json()["priority"] == 100
    assert rerun(urgent, original).json()["priority"] == 900
    assert rerun(oncall, ranked).json()["priority"] == 42
    assert sorted(Run.objects.filter(rerun_of__isnull=False).values_list("priority", flat=True)) == [42, 100, 100, 900]


@pytest.mark.sqlite
def test_a_fork_copies_the_agent_events_up_to_from_seq_with_their_original_seq(alice: User) -> None:
    original = eventful_run(alice)

    response = rerun(alice, original, from_seq=10)

    assert response.status_code == 201, response.content
    fork = Run.objects.get(pk=response.json()["id"])
    events = assert_log_is_sound(fork)
    # Its own run.created, then the deltas, the finished tool call, and the question with its
    # answer: not the rest of the original's lifecycle, nor its child (the fork spawns its own).
    assert [(e.seq, e.type, e.data.get("forked_from_seq"), e.attempt) for e in events] == [
        (1, "run.created", None, None),
        (2, "output.delta", 3, None),
        (3, "tool.started", 5, None),
        (4, "tool.finished", 6, None),
        (5, "run.waiting", 7, None),
        (6, "run.resumed", 8, None),
        (7, "output.delta", 10, None),
    ]
    assert events[0].data["from_seq"] == 10 and events[0].data["rerun_of"] == str(original.pk)
    assert events[4].data == {"reason": "input_required", "prompt": "?", "forked_from_seq": 7}
    # The answer is carried; the original's spent ticket is not (the fork never held it).
    assert events[5].data == {"input": "yes", "forked_from_seq": 8}
    assert events[6].data == {"text": "chunk 1 ", "forked_from_seq": 10}
    assert fork.events_used == 6 and fork.open_tool_calls == [] and fork.status == "queued"
    assert fork.stored_bytes == fork.input_bytes + sum(e.data_bytes or 0 for e in events)


@pytest.mark.sqlite
def test_a_fork_at_a_question_not_yet_answered_leaves_it_out_and_asks_again(alice: User) -> None:
    # Seq 7 is the original's run.waiting; its answer (seq 8) is past the fork.
    original = eventful_run(alice)

    fork = rerun(alice, original, from_seq=7).json()

    assert [e.type for e in logged(fork["id"])] == ["run.created", "output.delta", "tool.started", "tool.finished"]


@pytest.mark.sqlite
def test_a_fork_copies_the_types_its_agent_declared(alice: User, agent_named: Callable[..., str]) -> None:
    async def planner(ctx: AgentContext) -> AsyncIterator[Directive]:
        return
        yield

    name = agent_named("test-planner", planner, event_types=["plan.updated"])
    run = running_run(alice, agent=name, input={})
    services.run_events_append(run_id=run.pk, generation=1, events=[("plan.updated", {"steps": 2})])
    services.run_cancel(run_id=run.pk, actor=alice)

    fork = rerun(alice, run, from_seq=3).json()

    assert [(e.type, e.data) for e in logged(fork["id"])][1:] == [("plan.updated", {"steps": 2, "forked_from_seq": 3})]


@pytest.mark.sqlite
@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"from_seq": 14}, "from_seq", "passes the end"),
        ({"from_seq": 5}, "from_seq", "cuts tool call 'call-1'"),
        ({"from_seq": 11}, "from_seq", "started at seq 11"),
        ({"from_seq": 10, "max_events": 3}, "from_seq", "more than its max_events of 3"),
        ({"from_seq": 10, "agent": "openai_chat"}, "agent", "continues the original's agent"),
        ({"from_seq": 10, "agent": "demo"}, "agent", "continues the original's agent"),
        ({"from_seq": 0}, "from_seq", "greater than or equal to 1"),
        ({"from_seq": "ten"}, "from_seq", "valid integer"),
        ({"input": [1]}, "input", "dictionary"),
        ({"agent": "nope"}, "agent", "unknown agent"),
    ],
)
def test_a_bad_rerun_is_a_400_naming_the_field_and_writes_nothing(
    alice: User, body: dict[str, Any], field: str, says: str
) -> None:
    original = eventful_run(alice)
    before = (Run.objects.count(), RunEvent.objects.count())

    error = assert_error(rerun(alice, original, **body), 400, "validation_error")["error"]

    assert says in " ".join(error["detail"][field]), error
    assert (Run.objects.count(), RunEvent.objects.count()) == before


@pytest.mark.sqlite
def test_a_fork_at_the_seal_of_a_call_the_run_ended_in_continues_from_a_closed_call(alice: User) -> None:
    # The cancel sealed the open call (seq 12, `interrupted`): forking there is not cutting it.
    original = eventful_run(alice)

    fork = rerun(alice, original, from_seq=13).json()

    statuses = [e.data.get("status") for e in logged(fork["id"]) if e.type == EventType.TOOL_FINISHED]
    assert statuses == [None, "interrupted"]


@pytest.mark.sqlite
def test_purging_the_original_leaves_its_reruns(alice: User) -> None:
    original = completed_run(alice)
    again = Run.objects.get(pk=rerun(alice, original).json()["id"])

    services.runs_purge(ended_before=timezone.now() + timedelta(seconds=1))

    again.refresh_from_db()
    assert again.rerun_of_id is None and not Run.objects.filter(pk=original.pk).exists()


@pytest.mark.sqlite
@pytest.mark.timeout(90)
def test_a_demo_run_forked_at_its_50th_delta_writes_the_text_of_an_uninterrupted_run(procs: Procs, alice: User) -> None:
    # The original is cancelled somewhere past its 50th delta, by a real worker process.
    demo = {"deltas": 100, "delay_ms": 10}
    procs.worker("w1")
    original = services.run_create(owner=alice, agent="demo", input=demo)
    wait_streaming(original, deltas=60)
    services.run_cancel(run_id=original.pk, actor=alice)
    fiftieth = RunEvent.objects.filter(run=original, type=EventType.OUTPUT_DELTA).order_by("seq")[49]
    assert fiftieth.data["text"] == "chunk 49 "

    response = rerun(alice, original, from_seq=fiftieth.seq)
    assert response.status_code == 201, response.content
    fork = wait_status(Run.objects.get(pk=response.json()["id"]), "completed", "failed", timeout=60)
    uninterrupted = wait_status(services.run_create(owner=alice, agent="demo", input=demo), "completed", timeout=60)

    assert fork.status == "completed", fork.error
    assert stored_text(fork) == stored_text(uninterrupted) == demo_text(100)
    assert fork.output == uninterrupted.output == {"text": demo_text(100), "deltas": 100}
    deltas = [e for e in assert_log_is_sound(fork) if e.type == EventType.OUTPUT_DELTA]
    # The first 50 are the original's, copied; the other 50 the fork's own attempt wrote.
    assert [e.data.get("forked_from_seq") for e in deltas[:50]] == [
        e.seq for e in RunEvent.objects.filter(run=original, type=EventType.OUTPUT_DELTA).order_by("seq")[:50]
    ]
    assert [e.attempt for e in deltas] == [None] * 50 + [1] * 50
    assert fork.events_used == uninterrupted.events_used == 100


@pytest.mark.sqlite
@pytest.mark.timeout(90)
def test_a_run_forked_after_its_question_was_answered_continues_with_the_answer_without_asking(
    procs: Procs, alice: User
) -> None:
    # A real worker runs the demo agent: it asks halfway, is answered, and completes.
    demo = {"deltas": 6, "delay_ms": 10, "ask": "your name?"}
    procs.worker("w1")
    original = services.run_create(owner=alice, agent="demo", input=demo)
    waiting = wait_status(original, "waiting", timeout=30)
    services.run_resume(run_id=original.pk, ticket=waiting.resume_ticket, input="Ada")
    original = wait_status(original, "completed", "failed", timeout=30)
    assert original.output == {"text": demo_text(6), "deltas": 6, "answer": "Ada"}, original.error
    resumed = RunEvent.objects.get(run=original, type=EventType.RUN_RESUMED)
    fourth = RunEvent.objects.filter(run=original, type=EventType.OUTPUT_DELTA).order_by("seq")[3]
    assert resumed.seq < fourth.seq

    # Forked right after the answer, and after a delta the answer led to: each continues.
    for from_seq in (resumed.seq, fourth.seq):
        response = rerun(alice, original, from_seq=from_seq)
        assert response.status_code == 201, response.content
        fork = wait_status(Run.objects.get(pk=response.json()["id"]), "completed", "failed", "waiting", timeout=30)

        assert fork.status == "completed", (fork.status, fork.error)
        assert fork.output == original.output
        assert stored_text(fork) == demo_text(6)
        log = assert_log_is_sound(fork)
        # The question and its answer are the original's, copied; the fork's own attempt asked nothing.
        asked = [(e.type, e.data.get("forked_from_seq"), e.attempt) for e in log if e.type.startswith("run.w")]
        assert asked == [(EventType.RUN_WAITING, resumed.seq - 1, None)]
        answered = [e.data for e in log if e.type == EventType.RUN_RESUMED]
        assert answered == [{"input": "Ada", "forked_from_seq": resumed.seq}]


@pytest.mark.sqlite
def test_the_admin_reruns_an_ended_run_from_its_page_and_links_both_ways(
    make_user: Callable[..., User], alice: User
) -> None:
    staff = make_user("oncall", perms=("runs.view_run", "runs.change_run"), is_staff=True)
    looker = make_user("looker", perms=("runs.view_run",), is_staff=True)
    original = eventful_run(alice)
    live = running_run(alice)
    page, button = f"/admin/runs/run/{original.pk}/change/", f"/admin/runs/run/{original.pk}/rerun/"
    client = Client()
    client.force_login(staff)

    assert f'href="{button}"' in client.get(page).content.decode()
    assert "/rerun/" not in client.get(f"/admin/runs/run/{live.pk}/change/").content.decode()
    assert "Fork at seq" in client.get(button).content.decode() and Run.objects.count() == 3
    refused = client.post(button, {"post": "yes", "from_seq": "11"})
    assert "cuts tool call" in refused.content.decode() and Run.objects.count() == 3
    done = client.post(button, {"post": "yes", "from_seq": "10"})

    fork = Run.objects.get(rerun_of=original)
    assert done.status_code == 302 and done["Location"] == f"/admin/runs/run/{fork.pk}/change/"
    assert (fork.rerun_of_id, fork.owner, fork.last_seq) == (original.pk, staff, 7)
    assert (
        f'<a href="/admin/runs/run/{original.pk}/change/">{original.pk}</a>'
        in client.get(done["Location"]).content.decode()
    )
    assert f'<a href="/admin/runs/run/{fork.pk}/change/">{str(fork.pk)[:8]}</a>' in client.get(page).content.decode()
    assert client.get(f"/admin/runs/run/?rerun_of={original.pk}").status_code == 200
    client.force_login(looker)
    assert "/rerun/" not in client.get(page).content.decode()
    assert client.post(button, {"post": "yes"}).status_code == 403 and Run.objects.count() == 4


@pytest.mark.sqlite
def test_the_watch_page_says_what_a_rerun_reruns(alice: User) -> None:
    original = completed_run(alice)
    again = rerun(alice, original).json()["id"]
    client = Client()
    client.force_login(alice)

    body = client.get(f"/runs/{again}/").content.decode()

    assert f'<dt>Rerun of</dt><dd id="rerun-of"><a href="/runs/{original.pk}/">{str(original.pk)[:8]}</a>' in body
    assert "Rerun of" not in client.get(f"/runs/{original.pk}/").content.decode()

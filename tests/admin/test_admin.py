"""The staff console through Django's test client: list, run page, actions, permissions."""

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from runs import services
from runs.models import Run, RunEvent
from runs.transitions import Status
from tests.factories import assert_log_is_sound, queued_run, running_run, waiting_run
from tests.support.runs import status_of

pytestmark = [pytest.mark.sqlite, pytest.mark.django_db]

LIST_URL = "/admin/runs/run/"
ALL_PERMS = ("runs.view_run", "runs.change_run", "runs.cancel_run", "runs.stop_run")


def change_url(run: Run) -> str:
    return reverse("admin:runs_run_change", args=[run.pk])


def cancel_url(run: Run) -> str:
    return reverse("admin:runs_run_cancel", args=[run.pk])


def stop_url(run: Run) -> str:
    return reverse("admin:runs_run_stop", args=[run.pk])


def message_texts(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def completed_run(owner: User) -> Run:
    run = running_run(owner)
    return services.run_complete(run_id=run.pk, generation=run.generation, output={"text": "done"})


@pytest.fixture
def staff(make_user: Callable[..., User]) -> User:
    return make_user("oncall", perms=ALL_PERMS, is_staff=True)


@pytest.fixture
def viewer(make_user: Callable[..., User]) -> User:
    """Staff who may look at every run but neither cancel nor stop one."""
    return make_user("looker", perms=("runs.view_run", "runs.change_run"), is_staff=True)


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def populate(owners: list[User], n: int) -> list[Run]:
    """n runs in a mix of states with attempts, children and several owners, through the services.

    A claim takes the oldest queued run, so every claimed run is made before any run stays queued.
    """
    made = []
    for i in range(n):
        run = running_run(owners[i % len(owners)], agent="demo")
        if i % 4 == 1:
            services.run_complete(run_id=run.pk, generation=run.generation, output={})
        elif i % 4 == 2:
            services.run_cancel(run_id=run.pk, actor=owners[0], note="")
        elif i % 4 == 3:
            services.run_events_append(
                run_id=run.pk, generation=run.generation, events=[("output.delta", {"text": "x"})]
            )
        made.append(run)
    for parent in made[::4]:  # still running: children may be created under them
        running_run(parent.owner, parent_id=parent.pk)
    return made


# --- the list ------------------------------------------------------------------------------------


def test_the_list_shows_each_run_with_its_status_badge_heartbeat_and_end_code(staff: User, alice: User) -> None:
    running = running_run(alice)
    cancelled = running_run(alice)
    services.run_cancel(run_id=cancelled.pk, actor=staff, note="")
    response = logged_in(staff).get(LIST_URL)
    assert response.status_code == 200
    html = response.content.decode()
    for run in (running, cancelled):
        assert str(run.pk)[:8] in html
        assert change_url(run) in html
    assert 'class="rl-badge rl-status-running"' in html
    assert 'class="rl-badge rl-status-cancelled"' in html
    assert "cancelled_by_staff" in html
    assert " ago</span>" in html  # the current attempt's heartbeat
    assert "alice" in html


@pytest.mark.parametrize(
    "query",
    [
        "",
        "?status__exact=running",
        "?agent=demo",
        "?owner=1",
        "?has_parent=yes",
        "?has_parent=no",
        "?heartbeat=stale",
        "?heartbeat=fresh",
        "?running_for=1h",
        "?created_at__gte=2000-01-01+00%3A00%3A00%2B00%3A00",  # as the date filter's links write it
        "?q=user",
        "?q=0123abcd",
        "?o=9",  # sorted by last heartbeat
        "?p=1",
    ],
)
def test_the_list_costs_the_same_queries_for_5_runs_as_for_50(
    staff: User, make_user: Callable[..., User], query: str
) -> None:
    owners = [make_user(f"user{i}") for i in range(3)]
    client = logged_in(staff)
    counts = []
    for n in (5, 50):
        populate(owners, n)
        client.get(LIST_URL + query)  # warm the session and content-type caches
        with CaptureQueriesContext(connection) as captured:
            response = client.get(LIST_URL + query)
        assert response.status_code == 200, query
        counts.append(len(captured))
    assert counts[0] == counts[1], f"{query}: {counts[0]} queries for 5 runs, {counts[1]} for 55"
    assert counts[1] <= 12, counts


def test_the_list_paginates_without_counting_the_whole_table(staff: User, alice: User) -> None:
    populate([alice], 55)
    html = logged_in(staff).get(LIST_URL).content.decode()
    assert html.count('name="_selected_action"') == 50
    assert "?p=2" in html


def test_the_status_agent_owner_and_parent_filters_narrow_the_list(staff: User, alice: User, bob: User) -> None:
    a_running = running_run(alice)
    b_completed = completed_run(bob)
    child = queued_run(alice, parent_id=a_running.pk)
    client = logged_in(staff)

    def listed(query: str) -> set[str]:
        response = client.get(LIST_URL + query)
        assert response.status_code == 200, query
        return set(re.findall(r'name="_selected_action" value="([0-9a-f-]+)"', response.content.decode()))

    everything = {str(a_running.pk), str(b_completed.pk), str(child.pk)}
    assert listed("") == everything
    assert listed("?status__exact=completed") == {str(b_completed.pk)}
    assert listed(f"?owner={bob.pk}") == {str(b_completed.pk)}
    assert listed("?owner=nobody") == set()
    # Not a plain integer, or beyond what a user id can be: nothing listed, never a 500.
    assert listed("?owner=²") == set()
    assert listed("?owner=99999999999999999999999999") == set()
    assert listed("?owner=2147483648") == set()
    assert listed("?agent=demo") == everything
    assert listed("?has_parent=yes") == {str(child.pk)}
    assert listed("?has_parent=no") == {str(a_running.pk), str(b_completed.pk)}
    assert listed(f"?parent={a_running.pk}") == {str(child.pk)}  # the run page's "all child runs" link
    # The date filter's own links: "Today" and a range in the future.
    today = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    assert listed("?" + urlencode({"created_at__gte": str(today)})) == everything
    assert listed("?" + urlencode({"created_at__gte": str(today.replace(year=2999))})) == set()


def test_the_heartbeat_filter_finds_running_runs_silent_for_a_whole_lease(
    staff: User, alice: User, settings: Any
) -> None:
    running = running_run(alice)
    completed_run(alice)
    queued = queued_run(alice)
    client = logged_in(staff)

    def listed(query: str) -> set[str]:
        html = client.get(LIST_URL + query).content.decode()
        return set(re.findall(r'name="_selected_action" value="([0-9a-f-]+)"', html))

    # Time cannot be moved forward, so the lease is: a heartbeat an hour old is fresh under a
    # one-day lease and stale under a zero lease.
    settings.RUNLEDGER_LEASE_SECONDS = 86400
    assert listed("?heartbeat=stale") == set()
    assert listed("?heartbeat=fresh") == {str(running.pk)}
    settings.RUNLEDGER_LEASE_SECONDS = 0
    assert listed("?heartbeat=stale") == {str(running.pk)}
    assert listed("?heartbeat=fresh") == set()
    assert str(queued.pk) not in listed("?heartbeat=stale")


def test_the_running_longer_than_filter_finds_only_long_running_runs(staff: User, alice: User) -> None:
    old = running_run(alice)
    young = running_run(alice)
    # Time cannot be moved forward: the start of one run is set two hours back instead.
    Run.objects.filter(pk=old.pk).update(started_at=timezone.now() - timezone.timedelta(hours=2))
    html = logged_in(staff).get(LIST_URL + "?running_for=1h").content.decode()
    assert str(old.pk) in html
    assert str(young.pk) not in html
    assert str(old.pk) not in logged_in(staff).get(LIST_URL + "?running_for=1d").content.decode()


def test_search_finds_a_run_by_its_whole_id_its_first_characters_or_its_owner(
    staff: User, alice: User, bob: User
) -> None:
    mine = queued_run(alice)
    theirs = queued_run(bob)
    client = logged_in(staff)

    def found(term: str) -> set[str]:
        html = client.get(LIST_URL, {"q": term}).content.decode()
        return set(re.findall(r'name="_selected_action" value="([0-9a-f-]+)"', html))

    assert found(str(mine.pk)) == {str(mine.pk)}
    assert found(str(mine.pk).upper()) == {str(mine.pk)}
    assert found(str(mine.pk)[:8]) == {str(mine.pk)}
    assert found("alic") == {str(mine.pk)}
    assert found("bob") == {str(theirs.pk)}
    assert found("no-such-thing") == set()


def test_the_list_finds_runs_by_a_metadata_label_and_the_run_page_shows_their_metadata(
    staff: User, alice: User
) -> None:
    labelled = queued_run(alice, metadata={"customer": "42", "team": "a=b"})
    queued_run(alice, metadata={"customer": "7"})
    queued_run(alice)
    client = logged_in(staff)

    def found(term: str) -> set[str]:
        response = client.get(LIST_URL, {"q": term})
        assert response.status_code == 200
        return set(re.findall(r'name="_selected_action" value="([0-9a-f-]+)"', response.content.decode()))

    assert found("customer=42") == {str(labelled.pk)}
    assert found(" customer = 42 ") == {str(labelled.pk)}
    assert found("team=a=b") == {str(labelled.pk)}
    assert found("customer=4") == set()
    assert found("x[y]=1") == set()  # no run could carry such a key
    assert found("=42") == set()
    page = client.get(change_url(labelled)).content.decode()
    assert "metadata" in page and "&quot;customer&quot;: &quot;42&quot;" in page


# --- nothing can be added, edited or deleted ----------------------------------------------------------


def test_runs_cannot_be_added_edited_or_deleted_in_the_admin(staff: User, alice: User) -> None:
    run = running_run(alice)
    client = logged_in(staff)
    assert client.get("/admin/runs/run/add/").status_code == 403
    assert client.post("/admin/runs/run/add/", {"agent": "demo"}).status_code == 403
    assert client.get(reverse("admin:runs_run_delete", args=[run.pk])).status_code == 403
    assert client.post(reverse("admin:runs_run_delete", args=[run.pk]), {"post": "yes"}).status_code == 403
    forged = {"status": "completed", "last_seq": "99", "end_code": "", "agent": "other"}
    assert client.post(change_url(run), forged).status_code == 403
    run.refresh_from_db()
    assert (run.status, run.last_seq, run.agent) == ("running", 2, "demo")

    page = client.get(change_url(run)).content.decode()
    assert 'name="status"' not in page
    assert 'name="_save"' not in page
    # The attempts are shown read-only: no field of theirs is an input, and none can be deleted.
    assert 'name="attempts-0-worker"' not in page and 'name="attempts-0-outcome"' not in page
    assert "attempts-0-DELETE" not in page
    assert "delete_selected" not in client.get(LIST_URL).content.decode()
    # Events and attempts have no admin pages of their own.
    for name in ("admin:runs_runevent_changelist", "admin:runs_runattempt_changelist"):
        with pytest.raises(NoReverseMatch):
            reverse(name)


def test_a_forged_delete_selected_action_changes_nothing(staff: User, alice: User) -> None:
    run = completed_run(alice)
    response = logged_in(staff).post(
        LIST_URL, {"action": "delete_selected", "_selected_action": [str(run.pk)], "post": "yes", "index": "0"}
    )
    assert response.status_code in (200, 302)
    assert Run.objects.filter(pk=run.pk).exists()


# --- the run page ---------------------------------------------------------------------------------


def test_the_run_page_shows_facts_attempts_children_and_a_live_tail(staff: User, alice: User) -> None:
    parent = running_run(alice)
    child = queued_run(alice, parent_id=parent.pk)
    html = logged_in(staff).get(change_url(parent)).content.decode()
    assert "data-rl-run-status>running</span>" in html
    assert "test-worker" in html  # the attempt's worker
    assert "Child runs (1)" in html and change_url(child) in html
    assert 'id="rl-live-tail"' in html
    assert f'data-after-seq="{parent.last_seq}"' in html
    assert f'data-stream-url="/api/runs/{parent.pk}/stream/"' in html
    assert f'data-run-id="{parent.pk}"' in html
    assert "run.started" in html and "generation: 1 · worker: test-worker" in html
    assert "Cancel run…" in html and "Stop run…" in html

    child_html = logged_in(staff).get(change_url(child)).content.decode()
    assert change_url(parent) in child_html  # the parent link


def test_an_ended_run_page_has_no_live_tail_and_no_command_buttons(staff: User, alice: User) -> None:
    run = completed_run(alice)
    html = logged_in(staff).get(change_url(run)).content.decode()
    assert 'id="rl-live-tail"' not in html
    assert "Cancel run…" not in html and "Stop run…" not in html
    assert "run.completed" in html


def test_the_timeline_is_paginated_by_seq_and_opens_on_the_newest_events(staff: User, alice: User) -> None:
    run = running_run(alice)
    deltas = [("output.delta", {"text": f"chunk-{i}-end"}) for i in range(248)]
    services.run_events_append(run_id=run.pk, generation=run.generation, events=deltas)  # seq 3..250
    client = logged_in(staff)

    def seqs(html: str) -> list[int]:
        return [int(s) for s in re.findall(r'<tr data-seq="(\d+)">', html)]

    newest = client.get(change_url(run)).content.decode()
    assert seqs(newest) == list(range(201, 251))
    assert "page 3 of 3" in newest
    assert 'data-after-seq="250"' in newest
    first = client.get(change_url(run) + "?events_page=1").content.decode()
    assert seqs(first) == list(range(1, 101))
    assert "chunk-0-end" in first and 'id="rl-live-tail"' not in first
    assert seqs(client.get(change_url(run) + "?events_page=99").content.decode()) == list(range(201, 251))
    assert seqs(client.get(change_url(run) + "?events_page=x").content.decode()) == list(range(201, 251))

    with CaptureQueriesContext(connection) as few:
        client.get(change_url(run) + "?events_page=2")
    services.run_events_append(run_id=run.pk, generation=run.generation, events=deltas * 4)
    with CaptureQueriesContext(connection) as many:
        client.get(change_url(run) + "?events_page=2")
    assert len(few) == len(many)


def test_the_attempts_show_how_long_the_worker_ran_on_after_a_cancel(staff: User, alice: User) -> None:
    run = running_run(alice)
    services.run_cancel(run_id=run.pk, actor=staff, note="")
    client = logged_in(staff)
    assert "not released yet" in client.get(change_url(run)).content.decode()
    services.run_attempt_release(run_id=run.pk, generation=run.generation)
    html = client.get(change_url(run)).content.decode()
    run.refresh_from_db()
    attempt = run.attempts.get()
    assert attempt.released_at is not None and run.ended_at is not None
    latency = (attempt.released_at - run.ended_at).total_seconds()
    assert f"{latency:.3f} s" in html


def test_the_attempts_show_a_lost_workers_release_when_its_lease_lapsed(staff: User, alice: User) -> None:
    run = running_run(alice)
    services.run_cancel(run_id=run.pk, actor=staff, note="")  # its worker is dead
    lease = run.attempts.get().lease_expires_at
    client = logged_in(staff)
    assert "not released yet (lease lapses " in client.get(change_url(run)).content.decode()

    services.runs_sweep(as_of=lease + timedelta(milliseconds=1))

    run.refresh_from_db()
    latency = (lease - run.ended_at).total_seconds() if run.ended_at else None
    assert f"{latency:.3f} s (worker lost: its lease lapsed)" in client.get(change_url(run)).content.decode()


# --- cancel and stop: actions ---------------------------------------------------------------------------


def test_cancel_selected_asks_first_then_reports_each_outcome(staff: User, alice: User) -> None:
    running = [running_run(alice), running_run(alice)]
    completed = completed_run(alice)
    cancelled = running_run(alice)
    services.run_cancel(run_id=cancelled.pk, actor=alice, note="")
    selected = [str(r.pk) for r in (*running, completed, cancelled)]
    client = logged_in(staff)

    confirm = client.post(LIST_URL, {"action": "cancel_selected", "_selected_action": selected, "index": "0"})
    assert confirm.status_code == 200
    page = confirm.content.decode()
    assert "2</strong> of the 4 selected runs are live" in page
    assert 'name="post" value="yes"' in page and "csrfmiddlewaretoken" in page
    assert [status_of(r) for r in running] == ["running", "running"]  # nothing happened yet

    done = client.post(
        LIST_URL, {"action": "cancel_selected", "_selected_action": selected, "post": "yes", "note": "runaway"}
    )
    assert done.status_code == 302
    assert message_texts(done) == ["2 cancelled, 1 was already cancelled, 1 had already completed."]
    for run in running:
        run.refresh_from_db()
        assert (run.status, run.end_code, run.end_reason, run.ended_by) == (
            "cancelled",
            "cancelled_by_staff",
            "runaway",
            "oncall",
        )
        assert_log_is_sound(run)
    assert status_of(completed) == "completed"
    assert Run.objects.get(pk=cancelled.pk).end_code == "cancelled_by_user"  # untouched
    assert LogEntry.objects.filter(object_id__in=[str(r.pk) for r in running]).count() == 2


def test_stop_selected_needs_a_code_and_a_reason(staff: User, alice: User) -> None:
    run = running_run(alice)
    client = logged_in(staff)
    base = {"action": "stop_selected", "_selected_action": [str(run.pk)], "post": "yes"}

    for missing in ({"code": "staff", "reason": ""}, {"code": "staff", "reason": "   "}, {"code": "staff"}):
        response = client.post(LIST_URL, {**base, **missing})
        assert response.status_code == 200  # the form again, with its error
        assert "This field is required." in response.content.decode()
    response = client.post(LIST_URL, {**base, "code": "parent_stopped", "reason": "x"})
    assert "Select a valid choice" in response.content.decode()
    response = client.post(LIST_URL, {**base, "reason": "no code"})
    assert "This field is required." in response.content.decode()
    assert status_of(run) == "running"

    response = client.post(LIST_URL, {**base, "code": "policy", "reason": "too expensive"})
    assert response.status_code == 302
    assert message_texts(response) == ["1 stopped."]
    run.refresh_from_db()
    assert (run.status, run.end_code, run.end_reason, run.ended_by) == ("stopped", "policy", "too expensive", "oncall")


def test_stop_selected_reports_a_mixed_selection(staff: User, alice: User) -> None:
    running = running_run(alice)
    stopped = running_run(alice)
    services.run_stop(run_id=stopped.pk, actor=None, code="budget_exhausted", reason="budget")
    cancelled = waiting_run(alice)
    services.run_cancel(run_id=cancelled.pk, actor=alice, note="")
    failed = running_run(alice)
    services.run_fail(run_id=failed.pk, generation=failed.generation, code="agent_error", reason="boom")
    queued = queued_run(alice)
    selected = [str(r.pk) for r in (running, stopped, cancelled, failed, queued)]
    response = logged_in(staff).post(
        LIST_URL,
        {"action": "stop_selected", "_selected_action": selected, "post": "yes", "code": "staff", "reason": "r"},
    )
    assert message_texts(response) == [
        "2 stopped, 1 was already stopped, 1 had already failed, 1 had already been cancelled."
    ]
    assert status_of(running) == status_of(queued) == "stopped"
    assert Run.objects.get(pk=stopped.pk).end_code == "budget_exhausted"


def test_select_all_across_pages_acts_on_the_filtered_runs_only(staff: User, alice: User) -> None:
    running = [running_run(alice) for _ in range(3)]
    queued = queued_run(alice)
    client = logged_in(staff)
    url = LIST_URL + "?status__exact=running"
    token = [str(running[0].pk)]
    confirm = client.post(
        url, {"action": "cancel_selected", "_selected_action": token, "select_across": "1", "index": "0"}
    )
    assert "3</strong> of the 3 selected runs are live" in confirm.content.decode()
    assert 'name="select_across" value="1"' in confirm.content.decode()
    done = client.post(
        url, {"action": "cancel_selected", "_selected_action": token, "select_across": "1", "post": "yes", "note": ""}
    )
    assert message_texts(done) == ["3 cancelled."]
    assert [status_of(r) for r in running] == ["cancelled"] * 3
    assert status_of(queued) == "queued"


# --- cancel and stop: buttons on the run page ------------------------------------------------------------


def test_the_cancel_button_confirms_then_cancels_through_the_service(staff: User, alice: User) -> None:
    run = running_run(alice)
    client = logged_in(staff)
    confirm = client.get(cancel_url(run))
    assert confirm.status_code == 200
    assert "This run is live and will be <strong>cancelled</strong>" in confirm.content.decode()
    assert status_of(run) == "running"

    done = client.post(cancel_url(run), {"post": "yes", "note": "from the page"})
    assert done.status_code == 302 and done["Location"] == change_url(run)
    assert message_texts(done) == [f"Run {str(run.pk)[:8]} cancelled."]
    run.refresh_from_db()
    assert (run.status, run.end_code, run.end_reason) == ("cancelled", "cancelled_by_staff", "from the page")

    again = client.post(cancel_url(run), {"post": "yes", "note": ""})
    assert message_texts(again)[-1] == f"Run {str(run.pk)[:8]} was already cancelled."
    assert RunEvent.objects.filter(run=run, type="run.cancelled").count() == 1


def test_the_stop_button_requires_a_reason_and_reports_a_run_that_already_ended(staff: User, alice: User) -> None:
    run = running_run(alice)
    client = logged_in(staff)
    refused = client.post(stop_url(run), {"post": "yes", "code": "staff", "reason": ""})
    assert refused.status_code == 200 and "This field is required." in refused.content.decode()
    assert status_of(run) == "running"

    services.run_complete(run_id=run.pk, generation=run.generation, output=None)
    late = client.post(stop_url(run), {"post": "yes", "code": "staff", "reason": "too late"})
    assert message_texts(late) == [f"Run {str(run.pk)[:8]} had already completed."]
    assert status_of(run) == "completed"


def test_a_get_on_any_command_url_changes_nothing(staff: User, alice: User) -> None:
    run = running_run(alice)
    client = logged_in(staff)
    ids = {"_selected_action": [str(run.pk)], "post": "yes", "select_across": "1", "index": "0"}
    # The list treats unknown GET parameters as a bad filter and redirects to itself (?e=1).
    assert client.get(LIST_URL, {**ids, "action": "cancel_selected"}).status_code in (200, 302)
    stop = {**ids, "action": "stop_selected", "code": "staff", "reason": "r"}
    assert client.get(LIST_URL, stop).status_code in (200, 302)
    assert client.get(cancel_url(run), {"post": "yes", "note": "n"}).status_code == 200
    assert client.get(stop_url(run), {"post": "yes", "code": "staff", "reason": "r"}).status_code == 200
    # A POST that skips the confirmation step only shows it.
    assert client.post(cancel_url(run), {"note": "n"}).status_code == 200
    assert status_of(run) == "running"
    assert_log_is_sound(run)


def test_commands_need_the_csrf_token(staff: User, alice: User) -> None:
    run = running_run(alice)
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    assert client.post(cancel_url(run), {"post": "yes"}).status_code == 403
    forged = {"action": "cancel_selected", "_selected_action": [str(run.pk)], "post": "yes"}
    assert client.post(LIST_URL, forged).status_code == 403
    assert status_of(run) == "running"


# --- permissions ---------------------------------------------------------------------------------


def test_staff_without_the_command_permissions_are_not_offered_them_and_forged_posts_change_nothing(
    viewer: User, alice: User
) -> None:
    run = running_run(alice)
    client = logged_in(viewer)
    listing = client.get(LIST_URL).content.decode()
    assert listing.count(str(run.pk)) >= 1  # they can see it
    assert "cancel_selected" not in listing and "stop_selected" not in listing
    page = client.get(change_url(run)).content.decode()
    assert "Cancel run…" not in page and "Stop run…" not in page
    assert 'id="rl-live-tail"' in page  # watching needs no command permission

    for action, extra in (("cancel_selected", {}), ("stop_selected", {"code": "staff", "reason": "r"})):
        forged = {"action": action, "_selected_action": [str(run.pk)], "post": "yes", **extra}
        assert client.post(LIST_URL, forged).status_code == 200  # just the list again
    assert client.get(cancel_url(run)).status_code == 403
    assert client.post(cancel_url(run), {"post": "yes"}).status_code == 403
    assert client.post(stop_url(run), {"post": "yes", "code": "staff", "reason": "r"}).status_code == 403
    assert status_of(run) == "running"


def test_cancel_and_stop_are_granted_separately(make_user: Callable[..., User], alice: User) -> None:
    canceller = make_user("canceller", perms=("runs.view_run", "runs.cancel_run"), is_staff=True)
    run = running_run(alice)
    client = logged_in(canceller)
    listing = client.get(LIST_URL).content.decode()
    assert "cancel_selected" in listing and "stop_selected" not in listing
    page = client.get(change_url(run)).content.decode()
    assert "Cancel run…" in page and "Stop run…" not in page
    assert client.post(stop_url(run), {"post": "yes", "code": "staff", "reason": "r"}).status_code == 403
    assert status_of(run) == "running"


def test_staff_without_view_permission_cannot_open_runs(make_user: Callable[..., User], alice: User) -> None:
    only_cancel = make_user("nosy", perms=("runs.cancel_run",), is_staff=True)
    run = running_run(alice)
    client = logged_in(only_cancel)
    assert client.get(LIST_URL).status_code == 403
    assert client.get(cancel_url(run)).status_code == 404
    assert status_of(run) == "running"


def test_a_non_staff_user_is_sent_to_the_admin_login(alice: User) -> None:
    run = running_run(alice)
    response = logged_in(alice).post(cancel_url(run), {"post": "yes"})
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert status_of(run) == Status.RUNNING

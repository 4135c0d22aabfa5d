"""The run list's "Cancel all that match" and "Stop all that match" (runs/admin/matching.py): the
list's current filters and search, a confirmation that shows the count, and nothing done when more
match by the time it is confirmed."""

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.test import Client

from runs.models import Run
from tests.factories import queued_run, running_run
from tests.support.many_runs import create_runs
from tests.support.runs import status_of

pytestmark = [pytest.mark.sqlite, pytest.mark.django_db]

LIST_URL = "/admin/runs/run/"
CANCEL_MATCHING = "/admin/runs/run/cancel-matching/"
STOP_MATCHING = "/admin/runs/run/stop-matching/"


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


@pytest.fixture
def staff(make_user: Callable[..., User]) -> User:
    return make_user("oncall", perms=("runs.view_run", "runs.cancel_run", "runs.stop_run"), is_staff=True)


def test_the_list_offers_the_commands_on_its_current_filters(staff: User, make_user: Callable[..., User]) -> None:
    page = logged_in(staff).get(LIST_URL, {"status__exact": "queued", "q": "customer=42", "p": "2"})
    html = page.content.decode()
    assert f'href="{CANCEL_MATCHING}?status__exact=queued&amp;q=customer%3D42"' in html
    assert "Stop all that match" in html
    looker = make_user("looker", perms=("runs.view_run",), is_staff=True)
    assert "all that match" not in logged_in(looker).get(LIST_URL).content.decode()
    assert logged_in(looker).get(CANCEL_MATCHING).status_code == 403


def test_cancel_all_that_match_confirms_the_count_then_cancels_those_runs_only(staff: User, alice: User) -> None:
    running = running_run(alice, metadata={"customer": "42"})
    ours = create_runs(alice, 3, metadata={"customer": "42"})
    others = create_runs(alice, 2, metadata={"customer": "7"})
    client = logged_in(staff)
    query = "?q=customer%3D42&status__exact=queued"
    confirm = client.get(CANCEL_MATCHING + query)
    html = confirm.content.decode()
    assert "<strong>3</strong> runs match the list's filters" in html
    assert 'name="max" value="3"' in html
    assert {status_of(r) for r in ours} == {"queued"}

    done = client.post(CANCEL_MATCHING + query, {"post": "yes", "max": "3", "note": "incident"})
    assert done.status_code == 302 and done["Location"] == LIST_URL + query
    assert messages_of(done) == ["3 cancelled."]
    assert {status_of(r) for r in ours} == {"cancelled"}
    assert {status_of(r) for r in others} == {"queued"} and status_of(running) == "running"
    assert {Run.objects.get(pk=r.pk).end_reason for r in ours} == {"incident"}


def test_more_matches_than_confirmed_does_nothing(staff: User, alice: User) -> None:
    runs = create_runs(alice, 2)
    client = logged_in(staff)
    assert 'name="max" value="2"' in client.get(STOP_MATCHING).content.decode()
    runs.append(queued_run(alice))  # arrived while the page was read
    refused = client.post(STOP_MATCHING, {"post": "yes", "max": "2", "code": "staff", "reason": "r"})
    assert messages_of(refused) == ["3 runs match now, more than the 2 you confirmed: nothing was done."]
    assert {status_of(r) for r in runs} == {"queued"}
    forged = client.post(STOP_MATCHING, {"post": "yes", "max": "x", "code": "staff", "reason": "r"})
    assert "nothing was done" in messages_of(forged)[-1] and {status_of(r) for r in runs} == {"queued"}
    done = client.post(STOP_MATCHING, {"post": "yes", "max": "3", "code": "staff", "reason": "r"})
    assert messages_of(done)[-1] == "3 stopped." and {status_of(r) for r in runs} == {"stopped"}

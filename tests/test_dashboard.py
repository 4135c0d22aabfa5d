"""The staff dashboard (issue 22): who may open it, and a query count that does not grow with the
tables. What it shows, in a real browser, is tests/test_dashboard_browser.py."""

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.models import Run
from tests.factories import queued_run, running_run, waiting_run

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite, pytest.mark.timeout(120)]

URL = "/admin/runs/dashboard/"


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("url", [URL, URL + "?figures=1"])
def test_anonymous_and_non_staff_are_sent_to_log_in_and_staff_without_view_run_get_403(
    make_user: Callable[..., User], url: str
) -> None:
    response = Client().get(url)
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/?next=/admin/runs/dashboard/")
    # The admin site's own rule: a user who is not staff is sent to log in, permission or not.
    outsider = make_user("outsider", perms=("runs.view_run",))
    assert logged_in(outsider).get(url).status_code == 302
    staff = make_user("staff-no-view", perms=("runs.cancel_run", "runs.stop_run"), is_staff=True)
    assert logged_in(staff).get(url).status_code == 403
    for perm in ("runs.view_run", "runs.change_run"):
        assert logged_in(make_user(perms=(perm,), is_staff=True)).get(url).status_code == 200


def test_the_admin_index_and_the_run_list_link_to_it(make_user: Callable[..., User]) -> None:
    client = logged_in(make_user("oncall", perms=("runs.view_run",), is_staff=True))
    for page in ("/admin/", "/admin/runs/run/"):
        assert f'href="{URL}"' in client.get(page).content.decode(), page


def _history(owner: User, size: int) -> None:
    """`size` runs of each kind the dashboard counts: ended with events, cancelled while running and
    released, live in every state, held by a worker."""
    for _ in range(size):
        run = running_run(owner, input={"deltas": 2})
        services.run_events_append(
            run_id=run.pk, generation=run.generation, events=[("output.delta", {"text": "x"})] * 5
        )
        services.run_complete(run_id=run.pk, generation=run.generation, output={"text": "x"})
        run = running_run(owner)
        services.run_cancel(run_id=run.pk, actor=owner)
        services.run_attempt_release(run_id=run.pk, generation=run.generation)
        waiting_run(owner)
        running_run(owner)
    # Queued last: a claim above would take them first.
    for _ in range(size):
        queued_run(owner)


def _queries(client: Client) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(URL).status_code == 200
        assert client.get(URL + "?figures=1").status_code == 200
    return [q["sql"] for q in captured.captured_queries]


def test_the_pages_queries_do_not_grow_with_the_runs(make_user: Callable[..., User], alice: User) -> None:
    client = logged_in(make_user("oncall", perms=("runs.view_run",), is_staff=True))
    _history(alice, 2)
    small = _queries(client)
    for run in Run.objects.filter(status="queued"):  # so that the next claims take their own runs
        services.run_cancel(run_id=run.pk, actor=alice)
    _history(alice, 20)
    large = _queries(client)
    assert len(large) == len(small)
    # Two pages, each: the session, the user, their two permission sets, the database's clock
    # (PostgreSQL), the six reads of the figures.
    assert len(small) <= 2 * 11, small

"""Access over every URL the project routes: only the public ones of docs/design/api.md#public
answer the anonymous; another user's run is a 404 everywhere; actions need their permission.

The URL list is read from the resolver, so a new endpoint is covered (or fails this test) the day
it is added.
"""

import json
import re
from collections.abc import Callable

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.test import Client

from runs import access, services
from runs.access import sees_every_run
from runs.exceptions import NotFound, PermissionDenied
from runs.models import Run, RunEvent
from runs.selectors import users_active
from tests.factories import running_run
from tests.support.urls import routes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]

PUBLIC = {"/healthz/", "/readyz/", "/accounts/login/", "/admin/login/", "/api/schema/", "/api/docs/"}


def concrete(route: str, run: Run) -> str | None:
    """A URL for the route with this run's id in it; None for routes that take no run here."""
    route = route.replace("^", "").replace("$", "")
    route = re.sub(r"<(str|path):(run_id|object_id)>", str(run.pk), route)
    route = re.sub(r"\(\?P<app_label>[^)]*\)", "runs", route)
    route = re.sub(r"\(\?P<(url|path)>\.\*\)", "anything/", route)
    if "<" in route or "(" in route:
        return None  # other objects' pages (users, groups, tokens): the admin guards them alike
    return "/" + route


@pytest.fixture
def run(alice: User) -> Run:
    return running_run(alice)


def all_urls(run: Run) -> list[str]:
    urls = {url for route in routes() if (url := concrete(route, run)) is not None}
    assert len(urls) > 30
    return sorted(urls)


def test_the_anonymous_get_only_the_public_urls(run: Run) -> None:
    anonymous = Client()
    for url in all_urls(run):
        for method in ("get", "post"):
            response = getattr(anonymous, method)(url)
            code = response.status_code
            if url in PUBLIC:
                assert code < 400 or code == 405, (method, url, code)
            elif url == "/api/anything/":
                assert code == 404  # no endpoint there, for anyone
            elif url == "/metrics/":
                # Its own credential (the bearer token) or a user: for Prometheus a status, never a
                # redirect to a login page; it is read-only.
                assert code == (401 if method == "get" else 405), (method, url, code)
            elif url.startswith("/api/"):
                assert code == 401, (method, url, code)
                assert json.loads(response.content)["error"]["code"] == "not_authenticated"
            elif url.startswith("/admin/") or url == "/accounts/logout/":
                # The admin sends the anonymous to its login page; logging out needs no session.
                assert code in (302, 403) or url.endswith("/logout/"), (method, url, code)
                if code == 302 and not url.endswith("/logout/"):
                    assert "/login/" in response["Location"], (method, url, response["Location"])
            elif url == "/":
                assert code == 302 and response["Location"] == "/runs/"
            else:
                assert code == 302 and response["Location"].startswith("/accounts/login/"), (method, url, code)
    assert Run.objects.get(pk=run.pk).status == "running"


def test_another_users_run_is_404_on_every_url_that_names_it(run: Run, bob: User) -> None:
    other = Client()
    other.force_login(bob)
    before = RunEvent.objects.count()
    for url in all_urls(run):
        if str(run.pk) not in url or url.startswith("/admin/"):
            continue
        for method in ("get", "post"):
            response = getattr(other, method)(url)
            assert response.status_code in (404, 405), (method, url, response.status_code)
            if url.startswith("/api/") and response.status_code == 404:
                assert json.loads(response.content)["error"]["code"] == "not_found"
    assert RunEvent.objects.count() == before


def test_a_non_staff_user_gets_nothing_from_the_admin(run: Run, alice: User) -> None:
    owner = Client()
    owner.force_login(alice)
    for url in all_urls(run):
        if url.startswith("/admin/") and not url.endswith(("/login/", "/logout/")):
            response = owner.get(url)
            assert response.status_code in (302, 403, 404), (url, response.status_code)
            if response.status_code == 302:
                assert "/login/" in response["Location"], (url, response["Location"])


def test_actions_need_their_permission(run: Run, make_user: "pytest.FixtureRequest") -> None:
    viewer = make_user("viewer", perms=("runs.view_run",))  # type: ignore[operator]
    client = Client()
    client.force_login(viewer)
    base = f"/api/runs/{run.pk}/"
    assert client.get(base).status_code == 200  # visible …
    for action, body in (
        ("cancel/", {}),
        ("stop/", {"code": "staff", "reason": "x"}),
        ("pause/", {}),
        ("resume/", {"ticket": "x"}),
    ):
        response = client.post(base + action, data=body, content_type="application/json")
        assert response.status_code == 403, action  # … but not theirs to act on
    assert Run.objects.get(pk=run.pk).status == "running"


def test_a_command_refuses_its_caller_on_the_row_it_locks_404_before_403_writing_nothing(
    run: Run, bob: User, make_user: Callable[..., User]
) -> None:
    """The services check the API's `caller` by runs.access: a stranger is told no such run, a
    viewer that the rule refuses them, and neither writes an event."""
    viewer = make_user("viewer", perms=("runs.view_run",))
    commands: dict[str, Callable[[User], object]] = {
        access.CANCEL.refusal: lambda user: services.run_cancel(run_id=run.pk, actor=user, caller=user),
        access.STOP.refusal: lambda user: services.run_stop(run_id=run.pk, actor=user, reason="x", caller=user),
        access.PAUSE_RESUME.refusal: lambda user: services.run_pause(run_id=run.pk, caller=user),
        access.RERUN.refusal: lambda user: services.run_rerun(run_id=run.pk, owner=user, caller=user),
    }
    for refusal, command in commands.items():
        with pytest.raises(NotFound, match=f"^run {run.pk} not found$"):
            command(bob)
        with pytest.raises(PermissionDenied) as refused:
            command(viewer)
        assert refused.value.message == refusal
    with pytest.raises(PermissionDenied):
        services.run_resume(run_id=run.pk, ticket="x", caller=viewer)
    assert Run.objects.get(pk=run.pk).last_seq == run.last_seq
    assert services.run_pause(run_id=run.pk, caller=run.owner).pending


def test_the_streams_recheck_sees_every_run_for_exactly_the_users_sees_every_run_does(
    make_user: Callable[..., User],
) -> None:
    """`selectors.users_active` (one query for many users) against `access.sees_every_run` (the
    permission backend), for each way of holding the right and of not holding it."""
    make = make_user
    group = Group.objects.create(name="run-staff")
    group.permissions.add(Permission.objects.get(content_type__app_label="runs", codename="change_run"))
    users = {
        "plain": make("plain"),
        "viewer": make("viewer", perms=("runs.view_run",)),
        "changer": make("changer", perms=("runs.change_run",)),
        "canceller": make("canceller", perms=("runs.cancel_run",)),  # another permission: not enough
        "in_group": make("in_group"),
        "superuser": make("superuser"),
        "inactive_viewer": make("inactive_viewer", perms=("runs.view_run",)),
    }
    users["in_group"].groups.add(group)
    User.objects.filter(pk=users["superuser"].pk).update(is_superuser=True)
    User.objects.filter(pk=users["inactive_viewer"].pk).update(is_active=False)
    fresh = {name: User.objects.get(pk=user.pk) for name, user in users.items()}

    found = users_active(user_ids=[user.pk for user in fresh.values()] + [10**9])
    assert found == {user.pk: sees_every_run(user) for user in fresh.values() if user.is_active}
    assert {name for name, user in fresh.items() if found.get(user.pk)} == {
        "viewer",
        "changer",
        "in_group",
        "superuser",
    }

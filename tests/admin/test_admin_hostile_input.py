"""A hostile-input sweep over the whole staff console: no 5xx anywhere, no error logged,
and nothing written by a refused command.

Every URL the admin site declares, read from its URL patterns (so a new one is swept the day it is
added): changelists, add, change, history and delete pages, the console's own views (cancel,
stop, rerun) and the admin's own (login, password change, autocomplete, view on site, app
lists), each with a real object's id, a missing one, a huge one and malformed ones. Then hostile
values in every query parameter each view reads: list filters, search, ordering, pagination,
every field lookup a changelist accepts, `_changelist_filters`, `_popup`, `_to_field`, the run
page's `events_page`. As a superuser, and as staff who hold only
`runs.view_run`. Then hostile bodies posted to the commands.
"""

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection, models
from django.template import Template
from django.test import Client, RequestFactory, override_settings
from django.test.utils import _TestState

from runs import services
from runs.admin.hardening import HardenedAdmin
from runs.models import ApiToken, Run, RunEvent, Schedule, WebhookDelivery, WebhookEndpoint
from runs.services.schedules import schedule_create, schedule_trigger
from runs.services.tokens import token_create
from runs.services.webhook_endpoints import webhook_create
from tests.factories import queued_run, running_run
from tests.support.urls import routes

# Each request on its own (autocommit): a database error in one must not hide the next ones.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]

# On SQLite as well, as the superuser, who reaches every view: a database's own failures (integer
# overflow, NUL, regular expressions) depend on the values, not on who sends them. The staff
# viewer's sweep runs on PostgreSQL only, to keep the suite's time.
WHO = [pytest.param("superuser", marks=pytest.mark.sqlite), "viewer"]
# Each sweep in this many parts, each a test of its own: the parallel workers share them out
# (bin/test spreads the in-process tests one by one), where a whole sweep made one of them the
# suite's longest task.
SHARDS = 6

# One of each kind that has failed in a database: a NUL, an integer beyond any column, a year
# beyond Python's dates, an invalid regular expression, a string that is not JSON.
LOOKUP_VALUES = ["\x00", "99999999999999999999999999", "-1", "(", "[1,"]

HOSTILE_VALUES = [
    "²",  # str.isdigit() says yes, int() says no
    "99999999999999999999999999",  # beyond any integer column
    "-1",
    "1.5",
    "\x00",
    "x" * 5000,
    "9" * 5000,  # beyond Python's int() digit limit
    "\u202e\U0001f4a5",
    "",
    "' OR 1=1 --",
    "%_",
    "2026-13-45",
    "0001-01-01 00:00:00+14:00",  # a valid date that is before year 1 in UTC
    "[1,",
]

# Fewer, for the sweeps that repeat the superuser's on PostgreSQL: the SQLite run (these are the
# values a database fails on in its own way: integer overflow, NUL, Python's int() digit limit,
# dates, JSON) and the staff viewer (the same parameter code; what differs for it is which views
# refuse it, which every value shows).
FEW_VALUES = ["²", "99999999999999999999999999", "\x00", "9" * 5000, "0001-01-01 00:00:00+14:00", "[1,"]


def values_for(who: str) -> list[str]:
    return HOSTILE_VALUES if who == "superuser" and connection.vendor == "postgresql" else FEW_VALUES


BAD_IDS = [
    "abc",
    "0",
    "-1",
    "²",
    "1.5",
    "99999999999999999999999999",
    "9223372036854775808",
    "00000000-0000-0000-0000-000000000000",
    "\x00",
    "x" * 300,
    "' OR 1=1 --",
    "_5F_00",  # the admin's own quoting of "_" and NUL
]

# Query parameters each kind of admin view reads (a changelist's filters are read from it).
CHANGELIST_PARAMS = ["q", "o", "p", "all", "e", "_facets", "_popup", "_to_field", "_changelist_filters"]
VIEW_PARAMS = {
    "add": ["_changelist_filters", "_popup", "_to_field"],
    "change": ["_changelist_filters", "_popup", "_to_field", "events_page"],
    "delete": ["_changelist_filters", "_popup", "_to_field"],
    "history": ["_changelist_filters", "p"],
    "password": ["_popup"],
    "autocomplete": ["term", "app_label", "model_name", "field_name", "page"],
    "login": ["next"],
    "logout": ["next"],
}


@dataclass(frozen=True)
class Target:
    url: str
    params: tuple[str, ...] = ()
    # Lookups the view does not offer, which it must refuse whatever their value: a few values.
    lookups: tuple[str, ...] = ()


@dataclass
class World:
    run: Run
    group: Group
    token_user: User
    token: ApiToken
    webhook: WebhookEndpoint
    delivery: WebhookDelivery
    schedule: Schedule


@pytest.fixture
def world(make_user: Callable[..., User]) -> World:
    owner = make_user("owner-of-runs")
    run = running_run(owner)
    services.run_events_append(run_id=run.pk, generation=run.generation, events=[("output.delta", {"text": "x"})] * 3)
    running_run(owner, parent_id=run.pk)
    token, _ = token_create(user=owner, name="hostile")
    with override_settings(RUNLEDGER_WEBHOOKS_ALLOW_PRIVATE=True):
        webhook = webhook_create(owner=owner, url="http://127.0.0.1:9/in", events=["run.cancelled"])
    services.run_cancel(run_id=queued_run(owner).pk, actor=owner)
    delivery = WebhookDelivery.objects.get()
    schedule = schedule_create(owner=owner, agent="demo", input={}, every_seconds=3600)
    schedule_trigger(schedule_id=schedule.pk, actor=owner)  # its list shows a last run
    return World(
        run=run,
        group=Group.objects.create(name="oncall"),
        token_user=owner,
        token=token,
        webhook=webhook,
        delivery=delivery,
        schedule=schedule,
    )


@pytest.fixture
def superuser() -> User:
    return User.objects.create_superuser("root", password="pw-for-tests")


@pytest.fixture
def viewer(make_user: Callable[..., User]) -> User:
    return make_user("viewer", perms=("runs.view_run",), is_staff=True)


def _real_ids(world: World) -> dict[str, str]:
    return {
        "runs/run/": str(world.run.pk),
        "auth/user/": str(world.token_user.pk),
        "auth/group/": str(world.group.pk),
        "runs/apitoken/": str(world.token.pk),
        "runs/webhookendpoint/": str(world.webhook.pk),
        "runs/webhookdelivery/": str(world.delivery.pk),
        "runs/schedule/": str(world.schedule.pk),
    }


def _quoted(value: str) -> str:
    return quote(value, safe="")


def _model_admin(route: str) -> admin.ModelAdmin | None:
    for model, model_admin in admin.site._registry.items():
        if route.startswith(f"{model._meta.app_label}/{model._meta.model_name}/"):
            return model_admin
    return None


def _changelist_params(model_admin: admin.ModelAdmin, user: User) -> list[str]:
    """The parameters this changelist reads: the generic ones and its filters' own."""
    request = RequestFactory().get("/")
    request.user = user
    changelist = model_admin.get_changelist_instance(request)
    specs = [name for spec in changelist.filter_specs for name in spec.expected_parameters() or []]
    return sorted({*CHANGELIST_PARAMS, *specs, *getattr(model_admin, "extra_lookups", ())})


def _field_lookups(model: type[models.Model]) -> list[str]:
    """Lookups on each of the model's fields, which Django's changelist applies when given: the
    plain one, and one that the database can fail on for the kind of field."""
    lookups = set()
    for field in model._meta.concrete_fields:
        lookups.add(field.attname)
        if isinstance(field, models.DateField):
            lookups.add(f"{field.name}__year")
        elif isinstance(field, models.IntegerField | models.AutoField):
            lookups.add(f"{field.name}__gt")
        elif isinstance(field, models.JSONField):
            lookups.add(f"{field.name}__contains")
        else:
            lookups.add(f"{field.name}__regex")
    return sorted(lookups)


def admin_targets(world: World, user: User) -> Iterator[Target]:
    """Every URL of the admin site with every id, and the parameters each view reads (swept with
    the real id only: a bad id ends the request before any parameter is read)."""
    real = _real_ids(world)
    run_type = str(ContentType.objects.get_for_model(Run).pk)
    # Beside the site's own URLs (config/urls.py): the dashboard.
    yield Target("/admin/runs/dashboard/", ("figures",))
    for route in routes(admin.site.get_urls()):
        view = route.rstrip("/").rsplit("/", 1)[-1]
        if route.startswith("r/"):  # view on site: a content type and an object
            for content_type, object_id in [(run_type, str(world.run.pk)), *((run_type, bad) for bad in BAD_IDS)]:
                yield Target(f"/admin/r/{_quoted(content_type)}/{_quoted(object_id)}/")
            for bad in BAD_IDS:
                yield Target(f"/admin/r/{_quoted(bad)}/{world.run.pk}/")
            continue
        if "(?P<app_label>" in route:
            for label in ("auth", "runs", "nothing"):
                yield Target(f"/admin/{label}/")
            continue
        if "(?P<url>" in route:
            for rest in ("nothing/here/", _quoted("\x00"), "x" * 300, "runs/run/1/2/3/"):
                yield Target(f"/admin/{rest}")
            continue
        model_admin = _model_admin(route)
        if "<" not in route:
            if model_admin is None:
                yield Target("/admin/" + route, tuple(VIEW_PARAMS.get(view, [])))
            elif view == "add":  # its form takes initial values from the query string
                fields = tuple(f.name for f in model_admin.model._meta.concrete_fields)
                yield Target("/admin/" + route, tuple(VIEW_PARAMS["add"]), fields)
            else:
                params = tuple(_changelist_params(model_admin, user))
                yield Target("/admin/" + route, params, tuple(_field_lookups(model_admin.model)))
            continue
        prefix = next(p for p in real if route.startswith(p))
        params = VIEW_PARAMS.get(view, [])
        for object_id in [real[prefix], *BAD_IDS]:
            url = "/admin/" + re.sub(r"<(path:object_id|id)>", _quoted(object_id), route)
            yield Target(url, tuple(params) if object_id == real[prefix] else ())


def hostile_queries(target: Target, values: list[str]) -> Iterator[str]:
    for name in target.params:
        for value in values:
            yield urlencode({name: value})
        yield urlencode([(name, "1"), (name, "²"), (name, "\x00")])  # repeated keys
    for name in target.lookups:
        for value in LOOKUP_VALUES:
            yield urlencode({name: value})


class ErrorLog(logging.Handler):
    """Errors logged while the sweep runs. django.security's are left out: refusing a suspicious
    request (a lookup the admin does not allow: 400) is its job, and it logs each one."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not record.name.startswith("django.security"):
            self.records.append(record)


@pytest.fixture
def error_log() -> Iterator[ErrorLog]:
    handler = ErrorLog()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


def sweep_urls(targets: list[Target], values: list[str]) -> list[str]:
    """Every target bare and with every hostile query."""
    return [
        target.url + ("?" + query if query else "")
        for target in targets
        for query in ["", *hostile_queries(target, values)]
    ]


def sweep(client: Client, urls: list[str]) -> list[str]:
    """GET each of `urls`; the 5xx answers."""
    failures = []
    for url in urls:
        response = client.get(url)
        if response.status_code >= 500:
            failures.append(f"{response.status_code} GET {url[:200]!r}")
    return failures


def logged_in(user: User) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


@pytest.fixture
def uninstrumented_templates() -> Iterator[None]:
    """Templates rendered as in production. The test environment makes every render send a signal
    on which the test client copies the whole context, for `response.context`, which no sweep
    reads: most of the CPU of a sweep's thousands of admin pages."""
    instrumented = Template._render
    Template._render = _TestState.saved_data.template_render  # what setup_test_environment replaced
    try:
        yield
    finally:
        Template._render = instrumented


def swept(test: Callable[..., None]) -> Callable[..., None]:
    """A sweep: for each of WHO, in SHARDS parts; slow (thousands of admin pages rendered), so
    `bin/test --quick`, the inner loop, leaves it out, and the whole suite (and CI) runs it."""
    parts = pytest.mark.parametrize("shard", range(SHARDS))(pytest.mark.parametrize("who", WHO)(test))
    return pytest.mark.slow(pytest.mark.usefixtures("uninstrumented_templates")(parts))


@swept
def test_no_admin_url_or_query_parameter_answers_5xx_or_logs_an_error(
    world: World, superuser: User, viewer: User, error_log: ErrorLog, who: str, shard: int
) -> None:
    user = superuser if who == "superuser" else viewer
    targets = list(admin_targets(world, user))
    assert len(targets) > 100
    # The console's own views are among them.
    assert any(t.url.endswith(f"/{world.run.pk}/rerun/") for t in targets)
    assert any(t.url.endswith(f"/{world.run.pk}/stop/") for t in targets)
    before = stored()
    urls = sweep_urls(targets, values_for(who))[shard::SHARDS]
    failures = sweep(logged_in(user), urls)
    assert failures == [], f"{len(failures)} of {len(urls)} requests answered 5xx:\n" + "\n".join(failures[:80])
    assert [r.getMessage()[:200] for r in error_log.records] == []
    assert stored() == before


@pytest.mark.sqlite
def test_every_model_admin_on_the_site_is_hardened() -> None:
    # Django's and DRF's (users, groups, tokens) too: runs.admin registers them again, hardened.
    assert {type(a).__name__ for a in admin.site._registry.values()} >= {"UserAdmin", "GroupAdmin", "RunAdmin"}
    assert all(isinstance(model_admin, HardenedAdmin) for model_admin in admin.site._registry.values())


@pytest.mark.sqlite
def test_a_lookup_the_list_does_not_offer_is_an_invalid_filter(world: World, superuser: User) -> None:
    client = logged_in(superuser)
    for query in ("agent__regex=(", "created_at__year=99999999999", "input__contains=%00", "agent=%00"):
        response = client.get(f"/admin/runs/run/?{query}")
        assert (response.status_code, response["Location"]) == (302, "/admin/runs/run/?e=1"), query
    # The declared filters and the run page's child-runs link still narrow the list.
    for query in ("agent=demo", f"owner={world.run.owner_id}", f"parent={world.run.pk}", "q=owner-of"):
        assert client.get(f"/admin/runs/run/?{query}").status_code == 200, query


@pytest.mark.sqlite
def test_an_action_on_ids_that_cannot_exist_selects_nothing(world: World, superuser: User) -> None:
    before = stored()
    response = logged_in(superuser).post(
        "/admin/runs/run/", {"action": "cancel_selected", "_selected_action": ["abc", "\x00"], "post": "yes"}
    )
    assert response.status_code == 302
    assert stored() == before


# --- hostile bodies to the commands -------------------------------------------------------------

# Values each command form must refuse (a valid note or reason would be a valid command).
REFUSED_NOTES = ["\x00", "a\x00b", "x" * 5000]
REFUSED_REASONS = ["", " ", "\x00", "a\x00b", "x" * 5000]
# What every confirmed body carries besides its hostile field, so that neither the cancel form nor
# the stop form could take it: whatever the hostile field does, no command is valid.
REFUSED = {"post": "yes", "note": "\x00", "code": "nonsense", "reason": ""}

RAW_BODIES: list[tuple[str, bytes]] = [
    ("application/x-www-form-urlencoded", b"post=yes&note=%00&code=%zz&reason=%"),
    ("application/x-www-form-urlencoded", b"post=yes&note=%00&_selected_action=%00&action=cancel_selected"),
    ("application/x-www-form-urlencoded", b"\xff\xfe\x00garbage"),
    ("application/json", b'{"post": "yes", "note": "x"}'),
    ("multipart/form-data; boundary=nope", b"--nope\r\nContent-Disposition: form-data; name=post\r\n\r\nno"),
    ("multipart/form-data", b"no boundary at all"),
    ("text/plain", b"post=yes"),
]


def stored() -> tuple[Any, ...]:
    """What a refused command must leave as it was."""
    return (
        sorted(Run.objects.values_list("pk", "status", "end_code")),
        RunEvent.objects.count(),
        LogEntry.objects.count(),
        User.objects.count(),
        Group.objects.count(),
        ApiToken.objects.count(),
    )


def command_forms(actions: list[str], selected: str, values: list[str]) -> Iterator[dict[str, Any]]:
    """Bodies of the console's command and action forms, each with one field hostile and the
    others such that no command could take it."""
    for action in actions:
        for value in values:
            yield {**REFUSED, "action": action, "_selected_action": value, "index": "0"}
            yield {**REFUSED, "action": action, "_selected_action": selected, "select_across": value, "index": "0"}
            yield {**REFUSED, "action": action, "_selected_action": selected, "index": value}
        yield {**REFUSED, "action": action, "_selected_action": [selected, "²", "\x00"], "index": "0"}
        yield {"action": action, "_selected_action": selected, "index": "0"}  # the first step: a page
    for value in values:
        yield {**REFUSED, "action": value, "_selected_action": selected}
        yield {**REFUSED, "post": value}
        yield {**REFUSED, "code": value, "action": "stop_selected", "_selected_action": selected}
    for note in REFUSED_NOTES:
        yield {**REFUSED, "note": note, "action": "cancel_selected", "_selected_action": selected}
    for reason in REFUSED_REASONS:
        yield {**REFUSED, "code": "staff", "reason": reason, "action": "stop_selected", "_selected_action": selected}


@swept
def test_hostile_posts_to_the_commands_and_actions_answer_no_5xx_and_write_nothing(
    world: World, superuser: User, viewer: User, error_log: ErrorLog, who: str, shard: int
) -> None:
    client = logged_in(superuser if who == "superuser" else viewer)
    run = world.run
    changelists = [f"/admin/{m._meta.app_label}/{m._meta.model_name}/" for m in admin.site._registry]
    commands = [f"/admin/runs/run/{run.pk}/{name}/" for name in ("cancel", "stop")]
    # A bad id ends the request before its body is read: a few bodies each.
    missing = [f"/admin/runs/run/{_quoted(bad)}/{name}/" for bad in BAD_IDS for name in ("cancel", "stop")]
    actions = ["cancel_selected", "stop_selected", "delete_selected"]
    before = stored()
    failures = []
    for url in [*changelists, *commands, *missing][shard::SHARDS]:
        bodies = list(command_forms(actions, str(run.pk), values_for(who)))
        for body in bodies[:2] if url in missing else bodies:
            response = client.post(url, body)
            if response.status_code >= 500:
                failures.append(f"{response.status_code} POST {url} {str(body)[:150]}")
        for content_type, raw in RAW_BODIES:
            response = client.post(url, raw, content_type=content_type)
            if response.status_code >= 500:
                failures.append(f"{response.status_code} POST {url} {content_type} {raw[:60]!r}")
    assert failures == [], f"{len(failures)} answered 5xx:\n" + "\n".join(failures[:80])
    assert [r.getMessage()[:200] for r in error_log.records] == []
    assert stored() == before

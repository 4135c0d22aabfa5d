"""The public Python API for host code (docs/design/clients.md#python-api): its reference is whole and
current, `run_ended` is sent once per ended run and only after commit, and the how-to's views and
receiver (docs/how-to/host-code.md) work as the page shows them."""

import inspect
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core import mail
from django.db import transaction
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from runs import services
from runs.exceptions import InvalidTransition, TooManyRequests
from runs.models import Run
from runs.services.core import end, lock_run
from runs.signals import run_ended
from runs.transitions import FailCode, Status, StopCode
from tests.factories import queued_run, running_run, waiting_run
from tests.support.docs import generated_part, reference_renderer, titled
from tests.support.threads import race

HOW_TO = "how-to/host-code.md"


# --- the reference ---------------------------------------------------------------------------------


@pytest.mark.sqlite
@pytest.mark.timeout(30)
def test_every_public_function_takes_keyword_arguments_each_named_in_its_docstring() -> None:
    renderer = reference_renderer()
    public = renderer.public_api()
    assert {"run_create", "run_cancel", "run_stop", "run_pause", "run_resume", "run_rerun"} <= set(
        public["runs.services"]
    )
    assert {"run_get", "run_list"} <= set(public["runs.selectors"])
    assert set(public["runs.signals"]) == {"run_ended"}
    problems = []
    for module, names in public.items():
        for name, obj in names.items():
            where = obj.__module__ if inspect.isfunction(obj) or inspect.isclass(obj) else module
            _, _, doc = renderer.definition(where, name)
            if not doc:
                problems.append(f"{module}.{name}: no docstring")
                continue
            if not inspect.isfunction(obj):
                continue
            for param in inspect.signature(obj).parameters.values():
                if param.kind is not inspect.Parameter.KEYWORD_ONLY:
                    problems.append(f"{module}.{name}: {param.name} is not keyword-only")
                if f"`{param.name}`" not in doc:
                    problems.append(f"{module}.{name}: its docstring does not name `{param.name}`")
    assert problems == []


@pytest.mark.sqlite
@pytest.mark.timeout(30)
def test_the_python_reference_page_is_what_the_code_renders() -> None:
    assert generated_part("reference/python.md", "python") == reference_renderer().render("python")


# --- run_ended ---------------------------------------------------------------------------------------


@pytest.fixture
def ended() -> Iterator[list[tuple[Any, str, str, Any]]]:
    """What `run_ended` was sent with, in order: the sender, the run's id, status and end code (each
    read from the run the receiver got), from whichever thread sent it."""
    seen: list[tuple[Any, str, str, Any]] = []
    lock = threading.Lock()

    def receiver(sender: Any, run: Run, **kwargs: Any) -> None:
        with lock:
            seen.append((sender, run.status, run.end_code, run.pk))

    run_ended.connect(receiver, dispatch_uid="test-python-api")
    yield seen
    run_ended.disconnect(dispatch_uid="test-python-api")


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_run_ended_is_sent_once_for_every_run_that_ends_whoever_ends_it(
    alice: User, bob: User, ended: list[tuple[Any, str, str, Any]]
) -> None:
    completed = running_run(alice)
    services.run_complete(run_id=completed.pk, generation=completed.generation, output={"ok": True})
    failed = running_run(alice)
    services.run_fail(run_id=failed.pk, generation=failed.generation, code=FailCode.AGENT_ERROR, reason="boom")
    parent = running_run(alice)
    child = services.run_child_spawn(run_id=parent.pk, generation=parent.generation, input={"deltas": 1})
    services.run_cancel(run_id=parent.pk, actor=alice)
    stopped = waiting_run(bob)
    services.run_stop(run_id=stopped.pk, actor=None, code=StopCode.POLICY, reason="policy")
    late = queued_run(bob, deadline=timezone.now() + timedelta(hours=1))
    services.runs_sweep(as_of=timezone.now() + timedelta(hours=2))
    assert [(sender, status, code, pk) for sender, status, code, pk in ended] == [
        (Run, "completed", "", completed.pk),
        (Run, "failed", "agent_error", failed.pk),
        (Run, "cancelled", "cancelled_by_user", parent.pk),
        (Run, "cancelled", "parent_cancelled", child.pk),
        (Run, "stopped", "policy", stopped.pk),
        (Run, "stopped", "deadline_exceeded", late.pk),
    ]

    # Commands that end nothing send nothing: a repeat, a refusal, a pause, a resume.
    ended.clear()
    services.run_cancel(run_id=parent.pk, actor=alice)
    with pytest.raises(InvalidTransition):
        services.run_cancel(run_id=completed.pk, actor=alice)
    waiting = queued_run(alice)
    services.run_pause(run_id=waiting.pk)
    waiting.refresh_from_db()
    services.run_resume(run_id=waiting.pk, ticket=waiting.resume_ticket)
    assert ended == []


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_run_ended_is_not_sent_for_an_end_that_rolls_back(alice: User, ended: list[tuple[Any, str, str, Any]]) -> None:
    run = running_run(alice)

    class Rollback(Exception):
        pass

    # The ending core's whole transaction rolls back after the end was written…
    with pytest.raises(Rollback), transaction.atomic():
        end(lock_run(run.pk), Status.CANCELLED, code="cancelled_by_user", reason="", by="alice", now=timezone.now())
        raise Rollback
    # …or only the savepoint the end was written in, while the transaction around it commits.
    with transaction.atomic():
        locked = lock_run(run.pk)
        with pytest.raises(Rollback), transaction.atomic():
            end(locked, Status.STOPPED, code="staff", reason="no", by="alice", now=timezone.now())
            raise Rollback
    run.refresh_from_db()
    assert run.status == "running" and ended == []

    services.run_cancel(run_id=run.pk, actor=alice)
    assert [status for _, status, _, _ in ended] == ["cancelled"]


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_a_receiver_of_run_ended_reading_the_run_on_another_connection_finds_it_ended(alice: User) -> None:
    run = running_run(alice)
    read: list[str] = []

    def elsewhere() -> str:
        return Run.objects.get(pk=run.pk).status

    def receiver(sender: Any, run: Run, **kwargs: Any) -> None:
        # A thread of its own is a connection of its own: it sees only what was committed.
        read.extend(race(1, lambda _: elsewhere()))

    run_ended.connect(receiver, dispatch_uid="test-python-api-elsewhere")
    try:
        services.run_stop(run_id=run.pk, actor=alice, reason="enough")
    finally:
        run_ended.disconnect(dispatch_uid="test-python-api-elsewhere")
    assert read == ["stopped"]


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_a_receiver_that_raises_is_logged_and_neither_fails_the_command_nor_stops_the_other_receivers(
    alice: User, caplog: pytest.LogCaptureFixture
) -> None:
    run = running_run(alice)
    after: list[str] = []

    def broken(sender: Any, run: Run, **kwargs: Any) -> None:
        raise RuntimeError("the host's receiver is broken")

    def working(sender: Any, run: Run, **kwargs: Any) -> None:
        after.append(run.status)

    run_ended.connect(broken, dispatch_uid="test-python-api-broken")
    run_ended.connect(working, dispatch_uid="test-python-api-working")
    try:
        with caplog.at_level("ERROR", logger="django.dispatch"):
            result = services.run_cancel(run_id=run.pk, actor=alice)
    finally:
        run_ended.disconnect(dispatch_uid="test-python-api-broken")
        run_ended.disconnect(dispatch_uid="test-python-api-working")
    assert result.changed and after == ["cancelled"]
    assert Run.objects.get(pk=run.pk).status == "cancelled"
    assert [r.name for r in caplog.records if "the host's receiver is broken" in r.getMessage()] == ["django.dispatch"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(90)
def test_racing_commands_that_end_one_run_send_run_ended_once(
    alice: User, ended: list[tuple[Any, str, str, Any]]
) -> None:
    for _ in range(5):
        run = running_run(alice)
        ended.clear()

        def command(i: int, run: Run = run) -> Any:
            if i % 2:
                return services.run_cancel(run_id=run.pk, actor=alice)
            return services.run_stop(run_id=run.pk, actor=alice, reason="race")

        results = race(4, command)
        run.refresh_from_db()
        assert [(status, pk) for _, status, _, pk in ended] == [(run.status, run.pk)]
        changed = [r for r in results if not isinstance(r, BaseException) and r.changed]
        assert len(changed) == 1, results
        assert all(isinstance(r, InvalidTransition) for r in results if isinstance(r, BaseException)), results


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
@override_settings(RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER=1)
def test_a_run_host_code_creates_counts_against_its_owners_limits(alice: User) -> None:
    services.run_create(owner=alice, agent="demo", input={})
    with pytest.raises(TooManyRequests) as refused:
        services.run_create(owner=alice, agent="demo", input={})
    assert refused.value.detail == {"active_runs": 1, "limit": 1}
    assert Run.objects.filter(owner=alice).count() == 1


# --- the how-to's code -------------------------------------------------------------------------------


@pytest.fixture
def host_app(tmp_path: Path) -> Iterator[None]:
    """The how-to's app `reports` and its project's URLconf, written from the page's blocks into a
    folder on sys.path; the app installed and the URLconf the project's while the test runs."""
    blocks = titled(HOW_TO, "python")
    package = tmp_path / "reports"
    package.mkdir()
    (package / "__init__.py").write_text("")
    views = [text for title, text in blocks.items() if title.startswith("reports/views.py")]
    assert len(views) == 2, sorted(blocks)
    (package / "views.py").write_text("\n\n".join(views))
    for name in ("urls.py", "receivers.py", "apps.py"):
        (package / name).write_text(blocks[f"reports/{name}"])
    (tmp_path / "host_urls.py").write_text(blocks["urls.py"])
    sys.path.insert(0, str(tmp_path))
    try:
        with override_settings(INSTALLED_APPS=[*settings.INSTALLED_APPS, "reports"], ROOT_URLCONF="host_urls"):
            yield
    finally:
        # With its sender: the receiver was connected for Run, and the key is (uid, sender).
        assert run_ended.disconnect(sender=Run, dispatch_uid="reports-mail-the-owner")
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if name == "host_urls" or name.split(".")[0] == "reports"]:
            del sys.modules[name]


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_the_how_tos_view_starts_a_run_that_redirects_to_its_watch_page(host_app: None, alice: User) -> None:
    browser = Client()
    browser.force_login(alice)

    started = browser.post(reverse("reports:start"), follow=True)
    run = Run.objects.get(owner=alice)
    watch = reverse("runs:run-watch", kwargs={"run_id": run.pk})
    assert watch == f"/runledger/runs/{run.pk}/"
    assert started.redirect_chain == [(watch, 302)]
    assert started.status_code == 200 and str(run.pk) in started.content.decode()
    assert (run.agent, run.input, run.metadata, run.status) == ("demo", {"deltas": 20}, {"source": "reports"}, "queued")
    assert browser.get(reverse("reports:start")).status_code == 405  # a GET starts nothing


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_only_the_owner_cancels_through_the_how_tos_view_and_its_receiver_mails_them_once(
    host_app: None, alice: User, bob: User, make_user: Callable[..., User]
) -> None:
    alice.email = "alice@example.com"
    alice.save(update_fields=["email"])
    run = services.run_create(owner=alice, agent="demo", input={}, metadata={"source": "reports"})
    cancel = reverse("reports:cancel", kwargs={"run_id": run.pk})
    watch = reverse("runs:run-watch", kwargs={"run_id": run.pk})

    # Another user cannot see it (404); a user who sees every run but does not own it may not cancel (403).
    stranger = Client()
    stranger.force_login(bob)
    assert stranger.post(cancel).status_code == 404
    viewer = Client()
    viewer.force_login(make_user("carol", perms=("runs.view_run",)))
    assert viewer.post(cancel).status_code == 403
    run.refresh_from_db()
    assert run.status == "queued" and mail.outbox == []

    # The owner cancels; the receiver mails them once, after the commit.
    owner = Client()
    owner.force_login(alice)
    cancelled = owner.post(cancel, follow=True)
    assert cancelled.redirect_chain == [(watch, 302)] and cancelled.status_code == 200
    run.refresh_from_db()
    assert (run.status, run.end_code, run.ended_by) == ("cancelled", "cancelled_by_user", "alice")
    assert [(m.to, m.subject) for m in mail.outbox] == [(["alice@example.com"], "Your report cancelled")]
    assert watch in mail.outbox[0].body
    # Once ended, a second cancel changes nothing and sends nothing.
    assert owner.post(cancel).status_code == 302
    assert len(mail.outbox) == 1


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
@override_settings(RUNLEDGER_MAX_ACTIVE_RUNS_PER_USER=1)
def test_the_how_tos_view_answers_a_limit_with_its_status_and_starts_nothing(host_app: None, alice: User) -> None:
    browser = Client()
    browser.force_login(alice)
    assert browser.post(reverse("reports:start")).status_code == 302
    refused = browser.post(reverse("reports:start"))
    assert refused.status_code == 429 and b"active" in refused.content
    assert Run.objects.filter(owner=alice).count() == 1

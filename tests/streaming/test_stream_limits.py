"""Fair use of the streams a web process serves itself (docs/design/streaming.md#limits): a user
holds at most RUNLEDGER_MAX_STREAMS_PER_USER streams at once (beyond: 429), a stream ends cleanly
after RUNLEDGER_SSE_MAX_SECONDS (the client resumes with Last-Event-ID and loses nothing), and every
RUNLEDGER_SSE_RECHECK_SECONDS the open streams are checked again: a stream whose user, credential
or sight of the run is gone ends. Real uvicorn processes over real sockets; the watch page in
Debian's Chromium.
"""

import asyncio
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

import httpx
import pytest
from django.contrib.auth.models import Group, Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs import services
from runs.events import TERMINAL_EVENT_TYPES
from runs.models import ApiToken, Run
from runs.services.tokens import token_create
from runs.streaming.guard import _found
from tests.factories import queued_run, running_run
from tests.support.browser import give_password, site_login
from tests.support.db import token_for
from tests.support.procs import Proc, Procs, subprocess_env, wait_log_line
from tests.support.proxies import CuttableProxy
from tests.support.runs import assert_exact_log, fresh
from tests.support.sse import Event, Stream, auth_headers, request_once, stream_path
from tests.support.threads import in_thread
from tests.support.waiting import wait_until
from tests.support.workers import wait_status

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

# A short re-check, so that tests wait fractions of a second for it.
RECHECK = {"RUNLEDGER_SSE_RECHECK_SECONDS": "0.3"}


# The site's application (runs.asgi's wrapper) and Django's own handler, as a host's stock asgi.py
# serves the app: the cap and the slots' return must hold under both.
HANDLERS = pytest.mark.parametrize(
    "app", ["config.asgi:application", "tests.support.stock_asgi:application"], ids=["wrapped", "stock"]
)


def web_with(procs: Procs, app: str = "config.asgi:application", **env: str) -> Proc:
    return procs.uvicorn(env=subprocess_env(**env), app=app)


# A change made by a plain UPDATE sends no notification: a web process that holds the token in its
# token cache learns of it when the entry's age runs out (docs/design/api.md#token-cache).
UNANNOUNCED = {"RUNLEDGER_TOKEN_CACHE_SECONDS": "1"}


def refused_within_the_token_cache_age(web: Proc, run: Run, headers: dict[str, str]) -> None:
    wait_until(lambda: request_once(web.url, stream_path(run), headers).status == 401, 10, "the stream refused")


def session_cookie(user: User) -> tuple[Client, dict[str, str]]:
    """A browser's login (Django's test client) and the Cookie header its streams send."""
    browser = Client()
    browser.force_login(user)
    return browser, {"Cookie": f"sessionid={browser.cookies['sessionid'].value}"}


def statuses_at_once(web: Proc, path: str, headers: dict[str, str], n: int) -> list[int]:
    """The statuses of `n` streams opened together and held until all have answered, then closed."""

    async def go() -> list[int]:
        streams = [await Stream(web.url, path, headers).open() for _ in range(n)]
        for stream in streams:
            stream.close()
        return [stream.status for stream in streams]

    return asyncio.run(go())


def slots_free(web: Proc, run: Run, headers: dict[str, str], n: int) -> None:
    """Wait until the user can hold `n` streams at once again: every slot they had was given back."""
    wait_until(lambda: statuses_at_once(web, stream_path(run), headers, n) == [200] * n, what=f"{n} free stream slots")


def append_one(run: Run) -> int:
    """One more event on a running run: its seq."""
    run = fresh(run)
    return services.run_events_append(run_id=run.pk, generation=run.generation, events=[("output.delta", {})])[-1].seq


def assert_too_many(answer: Stream, cap: int) -> None:
    assert answer.status == 429, (answer.status, answer.body)
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["retry-after"] == "10"  # RUNLEDGER_LIMIT_RETRY_AFTER_SECONDS
    error = answer.json()["error"]
    assert error["code"] == "too_many_requests"
    assert error["detail"] == {"limit": cap}
    assert f"at most {cap} streams" in error["message"]


# --- the cap ------------------------------------------------------------------------------------


@HANDLERS
def test_a_user_holds_at_most_the_cap_of_streams_and_a_closed_one_frees_its_slot(
    procs: Procs, alice: User, bob: User, app: str
) -> None:
    web = web_with(procs, app, RUNLEDGER_MAX_STREAMS_PER_USER="2")
    run, bobs = running_run(alice), running_run(bob)
    token, bob_token = auth_headers(token_for(alice)), auth_headers(token_for(bob))
    _browser, cookie = session_cookie(alice)

    async def scenario() -> None:
        # The cap is the user's, whatever each stream authenticated with: a token and a session.
        held = [await Stream(web.url, stream_path(run), headers).open() for headers in (token, cookie)]
        assert [s.status for s in held] == [200, 200]
        for headers in (token, cookie):
            assert_too_many(await Stream(web.url, stream_path(run), headers).open(), cap=2)
        # Another user is not refused for it, on the same run or their own.
        others = [await Stream(web.url, stream_path(r), bob_token).open() for r in (run, bobs, bobs)]
        assert [s.status for s in others] == [404, 200, 200]  # alice's run is not bob's to see

        # A client that goes away frees its slot once the server noticed (never at once).
        held[0].abort()
        fresh_one = await asyncio.to_thread(
            wait_until,
            lambda: (answer := request_once(web.url, stream_path(run), token)).status == 200 and answer,
            what="the slot of the closed stream",
        )
        assert fresh_one.headers["content-type"] == "text/event-stream"
        for stream in [held[1], *others]:
            stream.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_the_cap_is_checked_after_authentication_visibility_and_cursor_and_refusals_never_hold_a_slot(
    procs: Procs, alice: User, bob: User
) -> None:
    web = web_with(procs, RUNLEDGER_MAX_STREAMS_PER_USER="2")
    run, bobs = running_run(alice), running_run(bob)
    done = running_run(alice)
    services.run_complete(run_id=done.pk, generation=done.generation, output=None)
    last = fresh(done).last_seq
    token = auth_headers(token_for(alice))
    at_its_end = auth_headers(token_for(alice), str(last))

    async def scenario() -> None:
        held = [await Stream(web.url, stream_path(run), token).open() for _ in range(2)]
        assert [s.status for s in held] == [200, 200]
        # At the cap, every earlier check still answers first (docs/design/api.md#check-order) ...
        refusals = {
            401: (stream_path(run), {}),
            404: (stream_path(bobs), token),
            400: (f"/api/runs/{run.pk}/stream/?after_seq=x", token),
            # ... and a finished run read to its end is a 204, not counted and not refused.
            204: (stream_path(done), at_its_end),
        }
        for status, (path, headers) in refusals.items():
            for _ in range(3):
                assert (await Stream(web.url, path, headers).open()).status == status, status
        assert_too_many(await Stream(web.url, stream_path(run), token).open(), cap=2)
        for stream in held:
            stream.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))
    # None of the refused requests took a slot: both come back, and no third.
    slots_free(web, run, token, 2)
    assert statuses_at_once(web, stream_path(run), token, 3)[2] == 429


@HANDLERS
def test_clients_that_leave_before_the_first_byte_give_their_slot_back(procs: Procs, alice: User, app: str) -> None:
    web = web_with(procs, app, RUNLEDGER_MAX_STREAMS_PER_USER="2")
    run = running_run(alice)
    token = auth_headers(token_for(alice))

    async def scenario() -> None:
        # Each client leaves at another moment of the server's work on its request: before it was
        # read, during the checks, between the view's answer and the first byte of the body (which
        # then never runs, so only the end of the request can give the slot back: under Django's
        # own handler, which may not say so, RUNLEDGER_SSE_START_SECONDS after it was taken), or later. A
        # stream's head takes the server about 5-20 ms here: the moments spread over 0-30 ms.
        for i in range(180):
            stream = await Stream(web.url, stream_path(run), token).send()
            await asyncio.sleep((i % 60) / 2000)  # choosing when to leave, not waiting for anything
            stream.abort()

    asyncio.run(asyncio.wait_for(scenario(), 60))
    slots_free(web, run, token, 2)


def test_the_default_cap_is_20_and_0_means_unlimited(procs: Procs, alice: User) -> None:
    run = running_run(alice)
    token = auth_headers(token_for(alice))
    default, unlimited = web_with(procs), web_with(procs, RUNLEDGER_MAX_STREAMS_PER_USER="0")
    assert statuses_at_once(default, stream_path(run), token, 21) == [200] * 20 + [429]
    assert statuses_at_once(unlimited, stream_path(run), token, 30) == [200] * 30


# --- the lifetime -------------------------------------------------------------------------------


def test_a_stream_ends_cleanly_at_its_lifetime_and_resumes_from_last_event_id_to_the_exact_log(
    procs: Procs, alice: User
) -> None:
    env = subprocess_env(RUNLEDGER_SSE_MAX_SECONDS="1")
    web = procs.uvicorn(env=env)
    procs.worker("lifetime", env=env)
    token = token_for(alice)
    run = services.run_create(owner=alice, agent="demo", input={"deltas": 60, "delay_ms": 60})

    async def follow() -> tuple[list[Event], list[float]]:
        got: list[Event] = []
        lifetime_ends: list[float] = []  # how long each connection the lifetime ended lasted
        last_id: str | None = None
        while not got or got[-1].event not in TERMINAL_EVENT_TYPES:
            stream = await Stream(web.url, stream_path(run), auth_headers(token, last_id)).open()
            assert stream.status == 200, (stream.status, stream.body)
            opened = time.monotonic()
            got.extend([event async for event in stream.events()])
            # The server ended the body (its last chunk came), between two whole frames.
            assert stream.finished and stream.parser.buffer == b""
            if not got or got[-1].event not in TERMINAL_EVENT_TYPES:
                lifetime_ends.append(time.monotonic() - opened)
            last_id = stream.parser.last_event_id or last_id
        return got, lifetime_ends

    events, lifetime_ends = asyncio.run(asyncio.wait_for(follow(), 60))
    run = wait_status(run, "completed")
    assert_exact_log(events, run)
    # The run outlived several streams, each ended by its lifetime, not sooner and not much later.
    assert len(lifetime_ends) >= 2, lifetime_ends
    assert all(0.9 <= seconds < 3 for seconds in lifetime_ends), lifetime_ends


@pytest.mark.browser
def test_the_watch_page_gets_every_event_once_across_stream_lifetime_ends(
    procs: Procs, browser_page: "Page", alice: User
) -> None:
    # A short `retry:`, which the page's client waits before it connects again after each end.
    env = subprocess_env(RUNLEDGER_SSE_MAX_SECONDS="1", RUNLEDGER_SSE_RETRY_MS="100")
    web = procs.uvicorn(env=env)
    procs.worker("lifetime-page", env=env)
    proxy = CuttableProxy(upstream_port=int(web.port or 0)).start()
    try:
        give_password(alice, "lifetime-pw")
        # Every seq the page renders, in order: the page sets #watch's data-last-seq once for each
        # event its client hands it, so an event shown twice or skipped shows here.
        browser_page.add_init_script(
            """
            window.rlOld = [];
            new MutationObserver((records) => { for (const r of records) window.rlOld.push(r.oldValue); })
              .observe(document,
                       {subtree: true, attributes: true, attributeOldValue: true, attributeFilter: ["data-last-seq"]});
            """
        )
        site_login(browser_page, proxy.url, "alice", "lifetime-pw")
        run = services.run_create(owner=alice, agent="demo", input={"deltas": 70, "delay_ms": 50})
        browser_page.goto(f"{proxy.url}/runs/{run.pk}/")
        browser_page.wait_for_function(
            "document.getElementById('watch').dataset.status === 'completed'", timeout=30_000
        )
        run = wait_status(run, "completed")
        old, last = browser_page.evaluate("[window.rlOld, document.getElementById('watch').dataset.lastSeq]")
        assert old[0] is None  # no event before the first
        assert [int(seq) for seq in [*old[1:], last]] == list(range(1, run.last_seq + 1))
        assert browser_page.locator("#output").text_content() == run.output["text"]
        # The page's stream ended by its lifetime several times, and resumed after what it held.
        resumed = [r for r in proxy.stream_requests() if "after_seq=0" not in r.path]
        assert len(resumed) >= 2, proxy.stream_requests()
    finally:
        proxy.stop()


# --- the re-check -------------------------------------------------------------------------------


def assert_some_end_and_others_go_on(
    web: Proc,
    *,
    ending: list[tuple[Run, dict[str, str]]],
    going: list[tuple[Run, dict[str, str]]],
    change: Callable[[], object],
) -> None:
    """Open every stream, make the `change`: the `ending` streams end cleanly (the server ends
    them), and the `going` ones, re-checked at the same time, still carry the next event."""

    async def scenario() -> None:
        ends = [await Stream(web.url, stream_path(run), headers).open() for run, headers in ending]
        stays = [await Stream(web.url, stream_path(run), headers).open() for run, headers in going]
        assert [s.status for s in ends + stays] == [200] * len(ends + stays)
        await asyncio.to_thread(in_thread(change))
        for stream in ends:
            async for _ in stream.events():
                pass
            assert stream.finished, "ended by the server, not dropped"
        for stream, (run, _) in zip(stays, going, strict=True):
            seq = await asyncio.to_thread(in_thread(lambda run=run: append_one(run)))
            async for event in stream.events():
                if event.seq == seq:
                    break
            else:
                raise AssertionError(f"a stream of run {run.pk} ended")
            stream.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_stream_ends_when_its_user_is_deactivated_and_other_users_streams_go_on(
    procs: Procs, alice: User, bob: User
) -> None:
    web = web_with(procs, **RECHECK, **UNANNOUNCED)
    token = auth_headers(token_for(alice))
    run, bobs = running_run(alice), running_run(bob)
    assert_some_end_and_others_go_on(
        web,
        ending=[(run, token)],
        going=[(bobs, auth_headers(token_for(bob)))],
        change=lambda: User.objects.filter(pk=alice.pk).update(is_active=False),
    )
    refused_within_the_token_cache_age(web, run, token)  # where its reconnect lands


def test_a_token_stream_ends_when_its_token_is_deleted_and_the_users_session_stream_goes_on(
    procs: Procs, alice: User
) -> None:
    web = web_with(procs, **RECHECK)
    token = auth_headers(token_for(alice))
    _browser, cookie = session_cookie(alice)
    run = running_run(alice)
    assert_some_end_and_others_go_on(
        web, ending=[(run, token)], going=[(run, cookie)], change=lambda: ApiToken.objects.filter(user=alice).delete()
    )


def test_a_token_stream_ends_when_its_holder_revokes_it_and_their_other_tokens_stream_goes_on(
    procs: Procs, alice: User
) -> None:
    web = web_with(procs, **RECHECK)
    laptop, phone = token_for(alice, name="laptop"), token_for(alice, name="phone")
    run = running_run(alice)

    def revoke() -> None:
        answer = httpx.delete(f"{web.url}/api/tokens/laptop/", headers=auth_headers(phone), timeout=10)
        assert answer.status_code == 204, answer.text

    assert_some_end_and_others_go_on(
        web, ending=[(run, auth_headers(laptop))], going=[(run, auth_headers(phone))], change=revoke
    )
    assert request_once(web.url, stream_path(run), auth_headers(laptop)).status == 401


def test_a_token_stream_ends_once_its_token_expires_and_an_unexpired_ones_goes_on(procs: Procs, alice: User) -> None:
    web = web_with(procs, **RECHECK, **UNANNOUNCED)
    later = timezone.now() + timedelta(hours=1)
    expiring, lasting = token_for(alice, name="expiring", expires_at=later), token_for(alice, name="lasting")
    run = running_run(alice)
    assert_some_end_and_others_go_on(
        web,
        ending=[(run, auth_headers(expiring))],
        going=[(run, auth_headers(lasting))],
        # Its expiry reached, as an hour's wait would: the re-check reads it as it is now.
        change=lambda: ApiToken.objects.filter(name="expiring").update(expires_at=timezone.now()),
    )
    refused_within_the_token_cache_age(web, run, auth_headers(expiring))


def test_a_session_stream_ends_at_logout_and_the_users_token_stream_goes_on(procs: Procs, alice: User) -> None:
    web = web_with(procs, **RECHECK)
    browser, cookie = session_cookie(alice)
    token = auth_headers(token_for(alice))
    run = running_run(alice)
    assert_some_end_and_others_go_on(web, ending=[(run, cookie)], going=[(run, token)], change=browser.logout)
    assert request_once(web.url, stream_path(run), cookie).status == 401


def test_a_stream_of_another_users_run_ends_when_the_permission_to_see_it_is_taken_away(
    procs: Procs, alice: User, make_user: Callable[..., User]
) -> None:
    web = web_with(procs, **RECHECK)
    run = running_run(alice)
    viewer = make_user("viewer", perms=("runs.view_run",))
    staff = make_user("staff")
    group = Group.objects.create(name="run-staff")
    group.permissions.add(Permission.objects.get(content_type__app_label="runs", codename="change_run"))
    staff.groups.add(group)
    viewer_token, staff_token = auth_headers(token_for(viewer)), auth_headers(token_for(staff))

    def take_away() -> None:
        viewer.user_permissions.clear()
        staff.groups.remove(group)

    assert_some_end_and_others_go_on(
        web,
        ending=[(run, viewer_token), (run, staff_token)],
        going=[(run, auth_headers(token_for(alice)))],  # the owner needs no permission
        change=take_away,
    )
    assert request_once(web.url, stream_path(run), viewer_token).status == 404


def test_deleting_a_user_ends_their_streams_and_others_streams_of_their_runs(
    procs: Procs, alice: User, bob: User, make_user: Callable[..., User]
) -> None:
    web = web_with(procs, **RECHECK)
    run, bobs = running_run(alice), running_run(bob)
    viewer = make_user("viewer", perms=("runs.view_run",))
    viewer_token = auth_headers(token_for(viewer))
    assert_some_end_and_others_go_on(
        web,
        ending=[(run, auth_headers(token_for(alice))), (run, viewer_token)],  # the run went with its owner
        going=[(bobs, viewer_token), (bobs, auth_headers(token_for(bob)))],
        change=lambda: User.objects.filter(pk=alice.pk).delete(),
    )


def test_a_failed_recheck_ends_no_stream(procs: Procs, alice: User) -> None:
    """The re-check's token query fails (its table renamed away for a moment): the stream stays,
    and once the table is back the next re-check sees the user's end again."""
    web = web_with(procs, **RECHECK)
    token = auth_headers(token_for(alice))
    run = running_run(alice)
    table = ApiToken._meta.db_table

    def rename(old: str, new: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f'ALTER TABLE "{old}" RENAME TO "{new}"')

    async def scenario() -> None:
        stream = await Stream(web.url, stream_path(run), token).open()
        assert stream.status == 200
        await asyncio.to_thread(in_thread(lambda: rename(table, f"{table}_away")))
        try:
            await asyncio.to_thread(wait_log_line, web, "re-checking 1 streams failed", 20)
        finally:
            await asyncio.to_thread(in_thread(lambda: rename(f"{table}_away", table)))
        seq = await asyncio.to_thread(in_thread(lambda: append_one(run)))
        async for event in stream.events():
            if event.seq == seq:
                break
        assert not stream.finished
        await asyncio.to_thread(in_thread(lambda: User.objects.filter(pk=alice.pk).update(is_active=False)))
        async for _ in stream.events():
            pass
        assert stream.finished

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_recheck_costs_the_same_few_queries_for_hundreds_of_streams_as_for_one(
    make_user: Callable[..., User],
) -> None:
    """Per process and interval, not per stream: users (with their permissions), tokens, sessions
    and runs, one query each, however many streams hold them."""

    def recheck_queries(n: int) -> int:
        users = [make_user() for _ in range(n)]
        runs = [queued_run(user) for user in users]
        tokens = {token_create(user=user, name="t")[0].pk: user.pk for user in users}
        sessions = {session_cookie(user)[0].session.session_key or "" for user in users}
        with CaptureQueriesContext(connection) as captured:
            found = _found({u.pk for u in users}, set(tokens), sessions, {str(r.pk) for r in runs})
        assert found.active_users == {user.pk: False for user in users}
        assert found.token_users == tokens
        assert found.sessions == sessions
        assert found.run_owners == {str(run.pk): run.owner_id for run in runs}
        return len(captured)

    assert recheck_queries(1) == recheck_queries(300) == 4

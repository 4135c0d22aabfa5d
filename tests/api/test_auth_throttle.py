"""Throttled sign-ins and token attempts (docs/design/fair-use.md#sign-in-throttle): failed ones are
counted per client address (and per username for sign-ins) in the database; beyond
RUNLEDGER_AUTH_FAILURES_MAX within the window, the next attempt is refused with 429 and Retry-After
before its credential is checked — for a blocked username, only from the addresses that failed for
it (no lockout by strangers).

In-process through Django's test client (REMOTE_ADDR chosen per request), and over real HTTP to
real web processes, where the address is the socket's and two processes share one count.
"""

import json
import re
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone

from runs.http.throttles import PURGE_BATCH
from runs.models import AuthFailure, Run
from tests.factories import running_run
from tests.support.api import assert_error
from tests.support.browser import give_password
from tests.support.db import token_for
from tests.support.procs import Procs, subprocess_env
from tests.support.raw_http import Answer, request
from tests.support.signin import sign_in_over_http, signed_in_over_http
from tests.support.threads import race

# Committed data: the stream checks its caller on a connection of its own.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite, pytest.mark.timeout(90)]

LIMIT = 3
BAD_TOKEN = "Token " + "0" * 40
PASSWORD = "pw-for-tests"  # conftest's make_user
REFUSED_SIGN_IN = re.compile(r"too many failed sign-ins; try again in (\d+) s", re.IGNORECASE)

limited = override_settings(RUNLEDGER_AUTH_FAILURES_MAX=LIMIT)


def token_get(path: str, authorization: str, address: str = "127.0.0.1") -> Any:
    return Client().get(path, HTTP_AUTHORIZATION=authorization, REMOTE_ADDR=address)


def retry_after(response: Any) -> int:
    seconds = int(response["Retry-After"])
    assert 1 <= seconds <= 300, seconds
    return seconds


def assert_refused(response: Any) -> int:
    """A 429 in the error shape, with its Retry-After; the seconds to wait."""
    assert_error(response, 429, "too_many_requests")
    return retry_after(response)


def sign_in(path: str, username: str, password: str, address: str = "127.0.0.1") -> tuple[Client, Any]:
    client = Client()
    return client, client.post(path, {"username": username, "password": password}, REMOTE_ADDR=address)


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@pytest.fixture
def run(alice: User) -> Run:
    return running_run(alice)


# --- token attempts -----------------------------------------------------------------------------


@limited
def test_wrong_tokens_are_401_up_to_the_limit_then_429_with_retry_after(run: Run) -> None:
    for _ in range(LIMIT):
        assert_error(token_get("/api/runs/", BAD_TOKEN), 401, "not_authenticated")
    wait = assert_refused(token_get("/api/runs/", BAD_TOKEN))
    assert f"try again in {wait} s" in json.loads(token_get("/api/runs/", BAD_TOKEN).content)["error"]["message"]
    # A malformed header is an attempt at a token too; refused attempts are not counted.
    assert_refused(token_get(f"/api/runs/{run.pk}/", "Token"))
    assert AuthFailure.objects.count() == LIMIT


@limited
def test_a_valid_token_from_a_blocked_address_is_refused_and_other_addresses_are_not(run: Run, alice: User) -> None:
    for _ in range(LIMIT):
        token_get("/api/runs/", BAD_TOKEN, address="10.0.0.66")
    good = f"Token {token_for(alice)}"
    assert_refused(token_get(f"/api/runs/{run.pk}/", good, address="10.0.0.66"))
    assert token_get(f"/api/runs/{run.pk}/", good, address="10.0.0.7").status_code == 200
    assert_error(token_get("/api/runs/", BAD_TOKEN, address="10.0.0.7"), 401, "not_authenticated")
    # Only token attempts are throttled: the same address with a session is no token attempt.
    browser = Client(REMOTE_ADDR="10.0.0.66")
    browser.force_login(alice)
    assert browser.get(f"/api/runs/{run.pk}/").status_code == 200


@limited
def test_successful_token_authentications_are_not_counted(run: Run, alice: User) -> None:
    good = f"Token {token_for(alice)}"
    for _ in range(LIMIT * 3):
        assert token_get(f"/api/runs/{run.pk}/", good).status_code == 200
    assert not AuthFailure.objects.exists()
    for _ in range(LIMIT):
        assert_error(token_get("/api/runs/", BAD_TOKEN), 401, "not_authenticated")


@limited
def test_the_stream_counts_and_refuses_wrong_tokens_with_the_api(run: Run, alice: User) -> None:
    stream = f"/api/runs/{run.pk}/stream/"
    assert_error(token_get(stream, BAD_TOKEN), 401, "not_authenticated")
    for _ in range(LIMIT - 1):
        assert_error(token_get("/api/runs/", BAD_TOKEN), 401, "not_authenticated")
    assert_refused(token_get(stream, BAD_TOKEN))
    assert_refused(token_get(stream, f"Token {token_for(alice)}"))
    assert AuthFailure.objects.count() == LIMIT


@limited
def test_a_token_attempt_is_one_select_with_the_key_and_a_failed_one_a_check_and_two_writes_more(
    run: Run, alice: User
) -> None:
    good = f"Token {token_for(alice)}"
    token_get(f"/api/runs/{run.pk}/", good)  # warm the content-type and permission caches

    def throttle_statements(authorization: str) -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            token_get(f"/api/runs/{run.pk}/", authorization)
        return [
            q["sql"].split()[0]
            + (" with the key" if "runs_apitoken" in q["sql"] else "")
            + (" pg_notify" if "pg_notify" in q["sql"] else "")
            for q in captured.captured_queries
            if "runs_authfailure" in q["sql"] or "runledger_credentials" in str(q["sql"])
        ]

    assert throttle_statements(good) == ["SELECT with the key"]
    # On PostgreSQL the failure is announced with it, for the web processes' token caches
    # (docs/design/api.md#token-cache): no process answers that address's keys from memory after it.
    announced = ["SELECT pg_notify"] if connection.vendor == "postgresql" else []
    assert throttle_statements(BAD_TOKEN) == ["SELECT with the key", "SELECT", "INSERT", *announced, "DELETE"]


@limited
def test_each_failure_deletes_expired_ones_as_it_goes() -> None:
    long_ago = timezone.now() - timedelta(seconds=301)
    AuthFailure.objects.bulk_create([AuthFailure(key=f"{i:064x}", failed_at=long_ago) for i in range(PURGE_BATCH + 50)])
    assert_error(token_get("/api/runs/", BAD_TOKEN), 401, "not_authenticated")
    assert AuthFailure.objects.filter(failed_at=long_ago).count() == 50
    assert AuthFailure.objects.exclude(failed_at=long_ago).count() == 1


@override_settings(RUNLEDGER_AUTH_FAILURES_MAX=0)
def test_zero_means_unlimited(alice: User) -> None:
    for _ in range(30):
        assert_error(token_get("/api/runs/", BAD_TOKEN), 401, "not_authenticated")
        assert sign_in("/accounts/login/", "alice", "wrong")[1].status_code == 200
    assert not AuthFailure.objects.exists()
    client, response = sign_in("/accounts/login/", "alice", PASSWORD)
    assert response.status_code == 302 and signed_in(client)


# --- sign-ins -----------------------------------------------------------------------------------


@limited
@pytest.mark.parametrize("path", ["/accounts/login/", "/admin/login/"])
def test_wrong_passwords_are_refused_then_throttled_even_with_the_right_one(
    make_user: Callable[..., User], path: str
) -> None:
    make_user("carol", is_staff=True)
    for _ in range(LIMIT):
        client, response = sign_in(path, "carol", "guess")
        assert response.status_code == 200 and not signed_in(client)
        assert b'name="password"' in response.content and not REFUSED_SIGN_IN.search(response.content.decode())
    client, response = sign_in(path, "carol", PASSWORD)
    assert response.status_code == 429
    found = REFUSED_SIGN_IN.search(response.content.decode())
    assert found is not None, response.content
    assert int(found.group(1)) == retry_after(response)
    assert not signed_in(client)
    # Refused unchecked, so not counted: the window's count is the LIMIT failures (address,
    # username, and the pair of both).
    assert AuthFailure.objects.count() == 3 * LIMIT


@limited
def test_a_blocked_username_refuses_only_the_addresses_that_failed_for_it_and_a_blocked_address_everyone(
    make_user: Callable[..., User],
) -> None:
    make_user("carol")
    make_user("dave")
    for _ in range(LIMIT):
        sign_in("/accounts/login/", "carol", "guess", address="10.0.0.66")
    assert sign_in("/accounts/login/", "carol", PASSWORD, address="10.0.0.66")[1].status_code == 429
    client, response = sign_in("/accounts/login/", "carol", PASSWORD, address="10.0.0.7")
    assert response.status_code == 302 and signed_in(client)
    assert sign_in("/accounts/login/", "dave", PASSWORD, address="10.0.0.66")[1].status_code == 429
    client, response = sign_in("/accounts/login/", "dave", PASSWORD, address="10.0.0.7")
    assert response.status_code == 302 and signed_in(client)
    # The sign-ins share no count with token attempts from the same address.
    assert_error(token_get("/api/runs/", BAD_TOKEN, address="10.0.0.66"), 401, "not_authenticated")


@limited
def test_failures_for_a_user_from_many_addresses_do_not_keep_her_out_from_another(
    make_user: Callable[..., User],
) -> None:
    """The lockout by strangers: wrong passwords for one user, each from an address of its own, on the
    login page, then on the console's (where each new address gets its one guess)."""
    make_user("carol", is_staff=True)
    for n, path in enumerate(["/accounts/login/", "/admin/login/"]):
        strangers = [f"10.1.{n}.{i}" for i in range(LIMIT)]
        for address in strangers:
            assert sign_in(path, "carol", "guess", address=address)[1].status_code == 200
        client, response = sign_in(path, "carol", PASSWORD, address=f"10.2.{n}.1")
        assert response.status_code == 302 and signed_in(client), path
        # The username is blocked for the addresses that failed for it, right password or not:
        # until their failure leaves the window, or the username's count drops below the limit.
        client, response = sign_in(path, "carol", PASSWORD, address=strangers[0])
        assert response.status_code == 429 and not signed_in(client)
        assert 1 <= retry_after(response) <= 300


@limited
def test_once_a_username_is_blocked_each_new_address_gets_one_guess(make_user: Callable[..., User]) -> None:
    """What the rule costs: an attacker with N addresses gets N guesses a window beyond the limit."""
    make_user("carol")
    for _ in range(LIMIT):
        sign_in("/accounts/login/", "carol", "guess", address="10.3.0.1")
    checked = []
    for i in range(4):
        address = f"10.3.1.{i}"
        checked += [sign_in("/accounts/login/", "carol", "guess", address=address)[1].status_code for _ in range(3)]
    assert checked == [200, 429, 429] * 4


@limited
def test_successful_sign_ins_and_right_passwords_refused_by_the_console_are_not_counted(
    make_user: Callable[..., User],
) -> None:
    make_user("erin")  # not staff: the console refuses her right password
    for _ in range(LIMIT + 1):
        client, response = sign_in("/admin/login/", "erin", PASSWORD)
        assert response.status_code == 200 and not signed_in(client)
        client, response = sign_in("/accounts/login/", "erin", PASSWORD)
        assert response.status_code == 302 and signed_in(client)
    assert not AuthFailure.objects.exists()


# Django's own hasher, whose check takes a good part of a second on purpose (and lets other threads
# run meanwhile): the time in which concurrent guesses could all pass a check-then-count throttle.
@override_settings(
    RUNLEDGER_AUTH_FAILURES_MAX=LIMIT, PASSWORD_HASHERS=["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
)
def test_concurrent_wrong_passwords_never_get_more_than_the_limit_checked() -> None:
    # Threads released together, from one address and under one username (an unknown one is
    # hashed all the same): only LIMIT of them in all may reach the password check (200).
    answers = race(12, lambda i: sign_in("/accounts/login/", "mallory", "guess")[1].status_code)
    assert set(answers) <= {200, 429}, answers
    assert answers.count(200) <= LIMIT
    assert AuthFailure.objects.count() == 3 * answers.count(200)


@override_settings(RUNLEDGER_AUTH_FAILURES_MAX=2, RUNLEDGER_AUTH_FAILURE_WINDOW_SECONDS=1)
def test_a_blocked_sign_in_succeeds_once_retry_after_has_passed(make_user: Callable[..., User]) -> None:
    make_user("carol")
    for _ in range(2):
        sign_in("/accounts/login/", "carol", "guess")
    client, response = sign_in("/accounts/login/", "carol", PASSWORD)
    assert response.status_code == 429
    time.sleep(retry_after(response))  # what a client is told to do: the behaviour under test
    client, response = sign_in("/accounts/login/", "carol", PASSWORD)
    assert response.status_code == 302 and signed_in(client)


# --- real web processes -------------------------------------------------------------------------


def raw_get(port: int | None, path: str, authorization: str, source: str) -> Answer:
    assert port is not None
    return request(("127.0.0.1", port), path, source=source, headers={"Authorization": authorization})


def assert_raw_refused(answer: Answer) -> int:
    assert answer.status == 429, answer
    assert json.loads(answer.body)["error"]["code"] == "too_many_requests"
    seconds = int(answer.headers["retry-after"])
    assert seconds >= 1
    return seconds


@pytest.mark.processes
def test_failures_spread_over_two_web_processes_hit_one_limit(procs: Procs, run: Run, alice: User) -> None:
    env = subprocess_env(RUNLEDGER_AUTH_FAILURES_MAX="4")
    webs = [procs.uvicorn(env=env), procs.uvicorn(env=env)]
    # Two failures on each: neither process alone has seen its limit.
    for i in range(4):
        answer = raw_get(webs[i % 2].port, "/api/runs/", BAD_TOKEN, source="127.0.0.2")
        assert answer.status == 401, answer
    good = f"Token {token_for(alice)}"
    for web in webs:
        assert_raw_refused(raw_get(web.port, "/api/runs/", BAD_TOKEN, source="127.0.0.2"))
        assert_raw_refused(raw_get(web.port, f"/api/runs/{run.pk}/", good, source="127.0.0.2"))
        assert_raw_refused(raw_get(web.port, f"/api/runs/{run.pk}/stream/", good, source="127.0.0.2"))
        # The address is the socket's: another client is served.
        assert raw_get(web.port, f"/api/runs/{run.pk}/", good, source="127.0.0.3").status == 200
        assert raw_get(web.port, "/api/runs/", BAD_TOKEN, source="127.0.0.3").status == 401


@pytest.mark.processes
def test_a_blocked_address_is_served_again_once_retry_after_has_passed(procs: Procs, run: Run, alice: User) -> None:
    web = procs.uvicorn(env=subprocess_env(RUNLEDGER_AUTH_FAILURES_MAX="2", RUNLEDGER_AUTH_FAILURE_WINDOW_SECONDS="1"))
    stream = f"/api/runs/{run.pk}/stream/"
    for _ in range(2):
        assert raw_get(web.port, stream, BAD_TOKEN, source="127.0.0.4").status == 401
    wait = assert_raw_refused(raw_get(web.port, stream, BAD_TOKEN, source="127.0.0.4"))
    time.sleep(wait)  # what a client is told to do: the behaviour under test
    assert raw_get(web.port, f"/api/runs/{run.pk}/", f"Token {token_for(alice)}", source="127.0.0.4").status == 200


@pytest.mark.processes
def test_ten_strangers_failures_keep_no_user_out_of_either_login_page_of_a_real_web_process(
    procs: Procs, make_user: Callable[..., User]
) -> None:
    """The attack as reported, on the default limit (10): ten wrong passwords for a staff user from
    ten addresses, then her right password from a fresh one, on both login pages."""
    web = procs.uvicorn(env=subprocess_env(RUNLEDGER_AUTH_FAILURES_MAX="10"))
    give_password(make_user("oncall", is_staff=True), PASSWORD)
    pages = ["/accounts/login/", "/admin/login/"]
    for i in range(10):
        answer = sign_in_over_http(web.url, pages[i % 2], "oncall", "guess", source=f"127.0.1.{i + 1}")
        assert answer.status_code == 200 and not signed_in_over_http(answer), answer
    for n, page in enumerate(pages):
        answer = sign_in_over_http(web.url, page, "oncall", PASSWORD, source=f"127.0.2.{n + 1}")
        assert signed_in_over_http(answer), (page, answer.status_code)
    # An address that failed for her is still refused, with her right password too.
    answer = sign_in_over_http(web.url, pages[0], "oncall", PASSWORD, source="127.0.1.1")
    assert answer.status_code == 429 and int(answer.headers["Retry-After"]) >= 1

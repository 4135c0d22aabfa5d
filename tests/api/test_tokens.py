"""API tokens (docs/design/api.md#tokens): a key is shown once, where it is issued — by
`POST /api/tokens/`, `manage.py create_token` or the admin — and stored as its digest; tokens are
named, listed without keys, revoked at once, expire, and count against their user's cap."""

import hashlib
import io
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from runs.models import ApiToken
from tests.support.api import assert_error
from tests.support.db import token_for
from tests.support.threads import race

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def keyed(key: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Token {key}")


def signed_in(user: User) -> Client:
    browser = Client()
    browser.force_login(user)
    return browser


def issue(client: Client, **body: Any) -> Any:
    return client.post("/api/tokens/", body, content_type="application/json")


def create_token(*args: str) -> tuple[str, str]:
    """`manage.py create_token ARGS`: (standard output, standard error)."""
    out, err = io.StringIO(), io.StringIO()
    call_command("create_token", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def works(key: str) -> bool:
    return keyed(key).get("/api/runs/").status_code == 200


def test_a_key_is_in_the_answer_that_issues_it_only_and_the_database_keeps_its_digest(alice: User) -> None:
    answer = issue(signed_in(alice), name="laptop", expires_in=3600)
    assert answer.status_code == 201, answer.content
    assert answer["Cache-Control"] == "no-store"
    body = answer.json()
    key = body["key"]
    assert key.startswith("rl_") and len(key) > 40
    assert body["name"] == "laptop" and body["last_used_at"] is None and body["issued_by"] is None
    expires = parse_datetime(body["expires_at"])
    assert expires is not None and abs(expires - (timezone.now() + timedelta(hours=1))) < timedelta(minutes=1)
    assert works(key)

    token = ApiToken.objects.get()
    assert token.digest == hashlib.sha256(key.encode()).hexdigest()
    assert key not in repr(list(ApiToken.objects.values()))

    listed = signed_in(alice).get("/api/tokens/")
    assert listed.status_code == 200 and listed["Cache-Control"] == "no-store"
    assert key.encode() not in listed.content
    [item] = listed.json()["results"]
    assert set(item) == {"name", "created_at", "expires_at", "last_used_at", "issued_by"}
    assert item["name"] == "laptop" and item["last_used_at"] is not None  # used above


def test_create_token_prints_the_key_as_its_last_line_alone_on_standard_output(alice: User) -> None:
    out, err = create_token("alice")
    [key] = out.splitlines()
    assert works(key)
    assert "'default'" in err and "no expiry" in err and key not in err
    assert ApiToken.objects.get(user=alice).expires_at is None

    out, _ = create_token("alice", "--name", "ci", "--expires", "30d")
    ci = ApiToken.objects.get(user=alice, name="ci")
    assert ci.expires_at is not None
    assert abs(ci.expires_at - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)
    assert works(out.splitlines()[-1])


def test_create_token_refuses_a_name_taken_unless_told_to_replace_it(alice: User) -> None:
    old = create_token("alice", "--name", "ci")[0].strip()
    with pytest.raises(CommandError, match="already holds a token named 'ci'"):
        create_token("alice", "--name", "ci")
    assert works(old)
    new = create_token("alice", "--name", "ci", "--replace")[0].strip()
    assert works(new) and not works(old)
    with pytest.raises(CommandError, match="no user 'nobody'"):
        create_token("nobody")
    for bad in ("30", "1y", "-1d", "0s", "99999999w"):
        with pytest.raises(CommandError, match="--expires"):
            create_token("alice", "--name", "x", "--expires", bad)
    assert ApiToken.objects.filter(user=alice).count() == 1


def test_an_expired_token_is_refused_and_counted_like_an_unknown_key(alice: User, settings: object) -> None:
    settings.RUNLEDGER_AUTH_FAILURES_MAX = 2  # type: ignore[attr-defined]
    key = token_for(alice, expires_at=timezone.now() + timedelta(hours=1))
    assert works(key)
    ApiToken.objects.filter(user=alice).update(expires_at=timezone.now() - timedelta(seconds=1))
    # From an address of its own: what other tests' servers on 127.0.0.1 count is not this one's.
    address = {"REMOTE_ADDR": "192.0.2.7"}
    expired = keyed(key).get("/api/runs/", **address)
    unknown = keyed("rl_" + "x" * 43).get("/api/runs/", **address)
    assert_error(expired, 401, "not_authenticated")
    assert expired.json() == unknown.json()
    # Both counted: the address's next try is refused before its key is looked at; another's is not.
    assert_error(keyed("rl_" + "y" * 43).get("/api/runs/", **address), 429, "too_many_requests")
    assert_error(keyed("rl_" + "y" * 43).get("/api/runs/", REMOTE_ADDR="192.0.2.8"), 401, "not_authenticated")


def test_delete_revokes_a_token_at_once_and_no_one_else_s(alice: User, bob: User) -> None:
    laptop, phone, bobs = token_for(alice, name="laptop"), token_for(alice, name="phone"), token_for(bob, name="laptop")
    deleted = keyed(phone).delete("/api/tokens/laptop/")
    assert deleted.status_code == 204 and deleted["Cache-Control"] == "no-store"
    assert_error(keyed(laptop).get("/api/runs/"), 401, "not_authenticated")
    assert works(phone) and works(bobs)
    assert_error(keyed(phone).delete("/api/tokens/laptop/"), 404, "not_found")
    assert_error(keyed(phone).delete("/api/tokens/%00/"), 404, "not_found")
    # A token may revoke itself: the next request with it is a 401.
    assert keyed(phone).delete("/api/tokens/phone/").status_code == 204
    assert_error(keyed(phone).get("/api/tokens/"), 401, "not_authenticated")
    assert list(ApiToken.objects.values_list("user__username", "name")) == [("bob", "laptop")]


def test_the_list_is_the_callers_own_even_for_staff(alice: User, make_user: Callable[..., User]) -> None:
    staff = make_user("staff", perms=("runs.view_run", "runs.change_run", "runs.view_apitoken"), is_staff=True)
    token_for(alice, name="alices")
    mine = token_for(staff, name="mine")
    assert [t["name"] for t in keyed(mine).get("/api/tokens/").json()["results"]] == ["mine"]
    assert_error(keyed(mine).delete("/api/tokens/alices/"), 404, "not_found")


def test_a_token_issues_tokens_that_expire_no_later_and_are_revoked_with_it(alice: User) -> None:
    until = timezone.now() + timedelta(days=1)
    parent = token_for(alice, name="parent", expires_at=until)
    child = issue(keyed(parent), name="child").json()
    assert child["issued_by"] == "parent" and parse_datetime(child["expires_at"]) == until
    later = (until + timedelta(seconds=1)).isoformat()
    body = assert_error(issue(keyed(parent), name="longer", expires_at=later), 400, "validation_error")
    assert "expires_at" in body["error"]["detail"]
    # A session (a signed-in browser) is not bounded so.
    assert issue(signed_in(alice), name="forever").json()["expires_at"] is None
    assert works(child["key"])
    assert keyed(parent).delete("/api/tokens/parent/").status_code == 204
    assert not works(child["key"])
    assert set(ApiToken.objects.values_list("name", flat=True)) == {"forever"}


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"name": ""},
        {"name": ".."},
        {"name": "a/b"},
        {"name": "x" * 65},
        {"name": "ok\x00"},
        {"name": 7},
        {"name": "ok", "expires_in": 59},
        {"name": "ok", "expires_in": 10**12},
        {"name": "ok", "expires_in": "soon"},
        {"name": "ok", "expires_at": "2001-01-01T00:00:00Z"},
        {"name": "ok", "expires_at": "9999-12-31T23:59:59-23:59"},
        {"name": "ok", "expires_at": "not a time"},
        {"name": "ok", "expires_in": 3600, "expires_at": "2999-01-01T00:00:00Z"},
    ],
)
def test_bad_input_is_a_400_that_stores_nothing(alice: User, body: dict[str, Any]) -> None:
    assert_error(issue(signed_in(alice), **body), 400, "validation_error")
    assert not ApiToken.objects.exists()


def test_a_name_held_already_is_a_400(alice: User) -> None:
    token_for(alice, name="ci")
    body = assert_error(issue(signed_in(alice), name="ci"), 400, "validation_error")
    assert "name" in body["error"]["detail"]
    assert ApiToken.objects.count() == 1


@override_settings(RUNLEDGER_MAX_TOKENS_PER_USER=2)
def test_tokens_count_against_their_users_cap_expired_ones_too(alice: User, bob: User) -> None:
    browser = signed_in(alice)
    assert issue(browser, name="one", expires_in=60).status_code == 201
    ApiToken.objects.filter(name="one").update(expires_at=timezone.now() - timedelta(days=1))
    assert issue(browser, name="two").status_code == 201
    refused = issue(browser, name="three")
    body = assert_error(refused, 429, "too_many_requests")
    assert body["error"]["detail"] == {"tokens": 2, "limit": 2} and int(refused["Retry-After"]) >= 1
    with pytest.raises(CommandError, match="RUNLEDGER_MAX_TOKENS_PER_USER"):
        create_token("alice", "--name", "four")
    assert issue(signed_in(bob), name="one").status_code == 201  # a cap per user
    assert browser.delete("/api/tokens/one/").status_code == 204
    assert issue(browser, name="three").status_code == 201


def test_a_good_key_is_one_statement_and_its_last_use_is_written_at_most_once_a_minute(alice: User) -> None:
    key = token_for(alice)

    def writes(requests: int) -> int:
        with CaptureQueriesContext(connection) as captured:
            for _ in range(requests):
                assert keyed(key).get("/api/agents/").status_code == 200
        token_reads = [q for q in captured.captured_queries if re.match(r"SELECT .*runs_apitoken", q["sql"])]
        assert len(token_reads) == requests  # the key, its user and its address's standing: one each
        return sum(q["sql"].startswith("UPDATE") and "runs_apitoken" in q["sql"] for q in captured.captured_queries)

    assert writes(5) == 1  # its first use
    first = ApiToken.objects.get().last_used_at
    assert first is not None
    assert writes(5) == 0  # within the minute
    ApiToken.objects.update(last_used_at=first - timedelta(seconds=61))
    assert writes(5) == 1
    last = ApiToken.objects.get().last_used_at
    assert last is not None and last >= first


@pytest.mark.django_db(transaction=True)
@override_settings(RUNLEDGER_MAX_TOKENS_PER_USER=3)
def test_racing_creates_never_pass_the_cap(alice: User) -> None:
    key = token_for(alice, name="issuer")  # one of the three
    answers = race(8, lambda i: issue(keyed(key), name=f"t{i}").status_code)
    assert sorted(answers) == [201] * 2 + [429] * 6, answers
    assert ApiToken.objects.filter(user=alice).count() == 3


@pytest.mark.django_db(transaction=True)
def test_racing_creates_of_one_name_make_one_token(alice: User) -> None:
    key = token_for(alice, name="issuer")
    answers = race(8, lambda i: issue(keyed(key), name="ci").status_code)
    assert sorted(answers) == [201] + [400] * 7, answers
    assert ApiToken.objects.filter(user=alice, name="ci").count() == 1

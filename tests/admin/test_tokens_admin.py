"""API tokens in the console (runs/admin/tokens.py, docs/security.md#credentials): no admin page
shows a key — to staff who may only view tokens, nor to a superuser — except the one answer to the
form that issues a token; issuing one for someone else is a superuser's alone; DRF's token admin,
which showed every key, is no more."""

import re
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.test import Client

from runs.models import ApiToken
from tests.support.db import token_for

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def staff_client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def issued_key(page: bytes) -> str | None:
    found = re.search(r'<code id="rl-token-key">([^<]+)</code>', page.decode())
    return found.group(1) if found else None


def test_staff_who_may_view_tokens_see_every_token_page_and_no_key(make_user: Callable[..., User], alice: User) -> None:
    root = User.objects.create_superuser("root", password="pw-for-tests")
    keys = [token_for(root, name="roots"), token_for(alice, name="alices")]
    viewer = make_user("viewer", perms=("runs.view_apitoken",), is_staff=True)
    client = staff_client(viewer)
    pages = {"/admin/runs/apitoken/": 200, "/admin/runs/apitoken/?q=root": 200, "/admin/runs/": 200, "/admin/": 200}
    for token in ApiToken.objects.all():
        pages |= {
            f"/admin/runs/apitoken/{token.pk}/change/": 200,
            f"/admin/runs/apitoken/{token.pk}/history/": 200,
            f"/admin/runs/apitoken/{token.pk}/delete/": 403,
        }
    pages["/admin/runs/apitoken/add/"] = 403
    answers = {url: client.get(url) for url in pages}
    assert {url: answer.status_code for url, answer in answers.items()} == pages
    listed = answers["/admin/runs/apitoken/"].content.decode()
    assert "roots" in listed and "alices" in listed  # the tokens are there, by name
    for url, answer in answers.items():
        for key in keys:
            assert key not in answer.content.decode(), f"{url} shows a key"
    # DRF's token admin, whose list showed every key, is gone with its app.
    assert client.get("/admin/authtoken/tokenproxy/").status_code == 404


def test_a_superuser_sees_a_key_only_in_the_answer_that_issues_it(alice: User) -> None:
    root = User.objects.create_superuser("root", password="pw-for-tests")
    client = staff_client(root)
    answer = client.post("/admin/runs/apitoken/add/", {"user": alice.pk, "name": "desk", "expires_at_0": ""})
    assert answer.status_code == 200 and "no-store" in answer["Cache-Control"]
    key = issued_key(answer.content)
    assert key is not None
    assert Client(HTTP_AUTHORIZATION=f"Token {key}").get("/api/runs/").status_code == 200
    token = ApiToken.objects.get(user=alice, name="desk")
    for url in ("/admin/runs/apitoken/", f"/admin/runs/apitoken/{token.pk}/change/", "/admin/", "/admin/runs/"):
        page = client.get(url)
        assert page.status_code == 200 and key not in page.content.decode(), url
    # The service's refusals are the form's errors, and nothing more is stored.
    again = client.post("/admin/runs/apitoken/add/", {"user": alice.pk, "name": "desk"})
    assert again.status_code == 200 and issued_key(again.content) is None and "errorlist" in again.content.decode()
    bad = client.post("/admin/runs/apitoken/add/", {"user": alice.pk, "name": "../etc"})
    assert (
        bad.status_code == 200 and issued_key(bad.content) is None and "starting with a letter" in bad.content.decode()
    )
    assert ApiToken.objects.count() == 1


def test_staff_may_issue_tokens_for_themselves_only(make_user: Callable[..., User], alice: User) -> None:
    clerk = make_user("clerk", perms=("runs.view_apitoken", "runs.add_apitoken"), is_staff=True)
    client = staff_client(clerk)
    refused = client.post("/admin/runs/apitoken/add/", {"user": alice.pk, "name": "as-alice"})
    assert refused.status_code == 200 and issued_key(refused.content) is None
    assert not ApiToken.objects.filter(user=alice).exists()
    own = client.post("/admin/runs/apitoken/add/", {"user": clerk.pk, "name": "mine"})
    assert issued_key(own.content) is not None
    assert list(ApiToken.objects.values_list("user__username", "name")) == [("clerk", "mine")]


def test_the_admin_revokes_a_token_at_once(make_user: Callable[..., User], alice: User) -> None:
    key = token_for(alice, name="lost-laptop")
    revoker = make_user("revoker", perms=("runs.view_apitoken", "runs.delete_apitoken"), is_staff=True)
    token = ApiToken.objects.get()
    answer = staff_client(revoker).post(f"/admin/runs/apitoken/{token.pk}/delete/", {"post": "yes"})
    assert answer.status_code == 302
    assert Client(HTTP_AUTHORIZATION=f"Token {key}").get("/api/runs/").status_code == 401

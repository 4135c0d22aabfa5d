"""The token cache's own rules (docs/design/api.md#token-cache), in this process with its listener
running as a web process's: an entry lives no longer than RUNLEDGER_TOKEN_CACHE_SECONDS, a token's
expiry is checked at every use, a read that news overtook is not kept, and every use gets objects
of its own. (Revocations across real processes: test_token_cache.py.)"""

import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from runs import notify
from runs.http.token_cache import TokenCache, cache
from runs.models import ApiToken, key_digest
from runs.selectors.credentials import token_with_failure
from tests.factories import queued_run
from tests.support.db import token_for
from tests.support.threads import race
from tests.support.token_cache import token_cache_listening
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def client(key: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return api


def delete_unannounced(key: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM runs_apitoken WHERE digest = %s", [key_digest(key)])


@override_settings(RUNLEDGER_TOKEN_CACHE_SECONDS=1)
def test_an_entry_is_read_again_once_older_than_the_setting(alice: User) -> None:
    path, key = f"/api/runs/{queued_run(alice).pk}/", token_for(alice)
    with token_cache_listening():
        assert client(key).get(path).status_code == 200
        kept = time.monotonic()
        delete_unannounced(key)
        assert client(key).get(path).status_code == 200  # from memory
        wait_until(lambda: time.monotonic() - kept > 1, 5, "the entry's age passing the setting")
        assert client(key).get(path).status_code == 401


def test_an_expiry_is_checked_at_every_use_of_an_entry(alice: User) -> None:
    path = f"/api/runs/{queued_run(alice).pk}/"
    expires_at = timezone.now() + timedelta(seconds=1)
    key = token_for(alice, expires_at=expires_at)
    with token_cache_listening():
        assert client(key).get(path).status_code == 200
        assert len(cache) == 1
        wait_until(lambda: timezone.now() > expires_at, 5, "the token's expiry")
        assert client(key).get(path).status_code == 401


def test_a_read_that_news_overtook_is_not_kept(alice: User) -> None:
    """A revocation that commits after the read and whose note arrives before the read is kept would
    otherwise be lost on it: kept, the revoked token would be answered until the maximum age."""
    key = token_for(alice)
    token, _ = token_with_failure(key=key, failures=None)
    assert token is not None
    for news in (
        lambda mine: mine.on_notify(*notify.credential_revoked(alice.pk)),
        lambda mine: mine.on_notify(*notify.user_changed(alice.pk)),
        lambda mine: mine.on_notify(*notify.token_failed("another address")),
        lambda mine: mine.on_notify(notify.CREDENTIALS, "not a payload"),
        lambda mine: (mine.on_disconnect(), mine.on_connect()),
    ):
        mine = TokenCache()
        mine.on_connect()
        epoch = mine.begin()
        news(mine)
        mine.keep(epoch, (key_digest(key), ""), token, read_at=time.monotonic())
        assert mine.get((key_digest(key), "")) is None
    mine = TokenCache()
    mine.keep(mine.begin(), (key_digest(key), ""), token, read_at=time.monotonic())
    assert mine.get((key_digest(key), "")) is None, "kept while not listening"


def test_each_use_gets_a_token_and_user_of_its_own(alice: User) -> None:
    """Django keeps a user's permissions on the user object: one shared between requests would keep
    them stale and carry one thread's state into another's."""
    key = token_for(alice)
    token, _ = token_with_failure(key=key, failures=None)
    assert token is not None
    mine = TokenCache()
    mine.on_connect()
    mine.keep(mine.begin(), (key_digest(key), "a"), token, read_at=time.monotonic())

    def use(_: int) -> User:
        found = mine.get((key_digest(key), "a"))
        assert found is not None and found.user.has_perm("runs.view_run") is False
        return found.user

    users = race(4, use)
    assert all(isinstance(user, User) for user in users), users
    assert len({id(user) for user in users}) == 4
    assert all(user.pk == alice.pk and user.is_active for user in users)
    assert ApiToken.objects.get(pk=token.pk).digest == key_digest(key)
    assert mine.get((key_digest(key), "b")) is None  # another address's standing was not read with it


def test_the_process_that_revokes_a_token_refuses_it_from_its_next_request_on(alice: User) -> None:
    """The revoking request's own process drops the user's entries at its commit, before it
    answers: its next request is refused even while the notification has not come back through its
    listener (none runs here: the cache is live as when one connects, and hears only this process)."""
    path = f"/api/runs/{queued_run(alice).pk}/"
    main, issued = token_for(alice, name="main"), token_for(alice, name="issued")
    cache.on_connect()
    try:
        assert client(issued).get(path).status_code == 200
        assert client(main).get(path).status_code == 200
        assert len(cache) == 2
        assert client(main).delete("/api/tokens/issued/").status_code == 204
        assert client(issued).get(path).status_code == 401
        # The user's every entry went (a revocation names the user): the key still valid is read
        # again, and kept again.
        assert len(cache) == 0
        assert client(main).get(path).status_code == 200
    finally:
        cache.on_disconnect()

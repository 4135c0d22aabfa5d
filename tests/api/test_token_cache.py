"""The web processes' token cache (docs/design/api.md#token-cache), in real web processes: a good key
is answered from memory, yet a revocation, a deactivation, a user's change or a blocked address is
refused in every process as soon as its notification arrives — never only once the cache's maximum
age (ten minutes here) has passed — and nothing is answered from memory while the process's
listener is lost, nor anything it kept before the loss once it is back.

"Served from memory" is shown by a witness: a token deleted behind the app's back (plain SQL, no
notification) that a process still accepts can only have been answered from its cache."""

import functools
import threading
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.db import connection

from runs.models import ApiToken, key_digest
from tests.factories import queued_run
from tests.support.db import listen_connections, token_for
from tests.support.procs import Proc, Procs, subprocess_env
from tests.support.raw_http import request
from tests.support.threads import race
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes, pytest.mark.timeout(120)]

# Only a notification can end an entry within a test.
CACHED = {"RUNLEDGER_TOKEN_CACHE_SECONDS": "600"}


def status(web: Proc, key: str, path: str, source: str = "127.0.0.1") -> int:
    assert web.port is not None
    return request(("127.0.0.1", web.port), path, source=source, headers={"Authorization": f"Token {key}"}).status


def deleted_unannounced(key: str) -> None:
    """The key's token deleted with no signal and no notification: only memory still knows it."""
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM runs_apitoken WHERE digest = %s", [key_digest(key)])
    assert not ApiToken.objects.filter(digest=key_digest(key)).exists()


def assert_answered_from_memory(webs: list[Proc], user: User, path: str, source: str = "127.0.0.1") -> None:
    witness = token_for(user)
    for web in webs:
        assert status(web, witness, path, source) == 200
    deleted_unannounced(witness)
    for web in webs:
        assert status(web, witness, path, source) == 200, "not answered from the token cache"


def refused_everywhere(webs: list[Proc], key: str, path: str, code: int, source: str = "127.0.0.1") -> None:
    for web in webs:
        refused = functools.partial(lambda web: status(web, key, path, source) == code, web)
        wait_until(refused, 10, f"a {code} from {web.port}")


def test_a_token_revoked_through_one_process_is_refused_by_the_other_as_its_note_arrives(
    procs: Procs, alice: User
) -> None:
    webs = [procs.uvicorn(env=subprocess_env(**CACHED)) for _ in range(2)]
    path = f"/api/runs/{queued_run(alice).pk}/"
    key, other = token_for(alice, name="revoked"), token_for(alice, name="other")
    for web in webs:
        assert status(web, key, path) == 200
    assert_answered_from_memory(webs, alice, path)
    # Requests race the revocation in the other process (each read kept while a note may be on its
    # way): once refused, never served again — no read the note overtook may have been kept.
    revoked = threading.Event()
    # Each refusal counts as a failed attempt: the address is soon blocked too, and a thread whose
    # first refusal comes after the others' may meet the block (a 429) before any 401.
    refused = {401, 429}

    def hammer() -> list[int]:
        seen = [status(webs[1], key, path)]
        while not (revoked.is_set() and seen[-1] in refused):
            seen.append(status(webs[1], key, path))
        return seen + [status(webs[1], key, path) for _ in range(5)]

    def revoke(i: int) -> list[int]:
        if i:
            return hammer()
        headers = {"Authorization": f"Token {other}"}
        try:
            answer = request(("127.0.0.1", webs[0].port or 0), "/api/tokens/revoked/", method="DELETE", headers=headers)
        finally:
            revoked.set()
        return [answer.status]

    done, *seen = race(4, revoke)
    assert done == [204]
    for statuses in seen:
        assert isinstance(statuses, list), statuses
        first = next(i for i, code in enumerate(statuses) if code in refused)
        assert 200 not in statuses[first:], statuses
    refused_everywhere(webs, key, path, 401, source="127.0.0.7")
    for web in webs:
        # Read again: a revocation drops the user's entries, not their other tokens.
        assert status(web, other, path, "127.0.0.7") == 200


def test_a_deactivated_user_is_refused_by_every_process_and_a_changed_one_read_again(
    procs: Procs, make_user: Callable[..., User]
) -> None:
    webs = [procs.uvicorn(env=subprocess_env(**CACHED)) for _ in range(2)]
    carol, root = make_user(), make_user()
    root.is_superuser = True
    root.save()
    path = f"/api/runs/{queued_run(carol).pk}/"
    key, roots = token_for(carol), token_for(root)
    for web in webs:
        assert status(web, key, path) == 200 and status(web, roots, path) == 200
    assert_answered_from_memory(webs, carol, path)
    assert_answered_from_memory(webs, root, path)
    carol.is_active = False
    carol.save()  # as the admin or a command saves it
    refused_everywhere(webs, key, path, 401)
    # A superuser no longer: carol's run is now a 404 to them, in every process, at once.
    root.is_superuser = False
    root.save()
    refused_everywhere(webs, roots, path, 404)


def test_an_address_blocked_through_one_process_is_refused_a_key_the_other_holds_in_memory(
    procs: Procs, make_user: Callable[..., User]
) -> None:
    webs = [procs.uvicorn(env=subprocess_env(RUNLEDGER_AUTH_FAILURES_MAX="3", **CACHED)) for _ in range(2)]
    dave = make_user()
    path = f"/api/runs/{queued_run(dave).pk}/"
    key = token_for(dave)
    assert status(webs[1], key, path, "127.0.0.5") == 200
    assert_answered_from_memory(webs[1:], dave, path, "127.0.0.5")
    for _ in range(3):
        assert status(webs[0], "rl_no-such-key", path, "127.0.0.5") == 401
    refused_everywhere(webs[1:], key, path, 429, "127.0.0.5")
    assert status(webs[1], key, path, "127.0.0.6") == 200  # another address is served


def _listener(web: Proc) -> list[int]:
    """The backend of the web process's token cache listener, if it has one (runs.http.token_cache)."""
    return [pid for name, pid in listen_connections("tokens") if name.endswith(f":{web.pid}")]


def test_nothing_is_answered_from_memory_while_the_listener_is_lost_nor_what_was_kept_before(
    procs: Procs, make_user: Callable[..., User]
) -> None:
    # Back 4 s after a loss: time to look at the process while it has none.
    web = procs.uvicorn(env=subprocess_env(RUNLEDGER_LISTEN_RECONNECT_SECONDS="4", **CACHED))
    erin = make_user()
    path = f"/api/runs/{queued_run(erin).pk}/"
    before, during = token_for(erin), token_for(erin)
    assert status(web, before, path) == 200 and status(web, during, path) == 200
    assert_answered_from_memory([web], erin, path)
    [listener] = wait_until(lambda: _listener(web), 10, "the listener")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [listener])
    deleted_unannounced(during)
    # Once the process has seen the loss, the key is read (and found gone), although it was kept ...
    wait_until(lambda: status(web, during, path) == 401, 3, "the key read from the database")
    # ... while the listener was still away.
    assert not _listener(web)
    deleted_unannounced(before)
    wait_until(lambda: _listener(web), 15, "the listener back")
    # In use again (a witness answered from memory) ...
    wait_until(lambda: _served_from_memory(web, erin, path), 10, "the cache in use again")
    # ... and what it kept before the loss is gone from it.
    assert status(web, before, path) == 401


def _served_from_memory(web: Proc, user: User, path: str) -> bool:
    witness = token_for(user)
    assert status(web, witness, path) == 200
    deleted_unannounced(witness)
    return status(web, witness, path) == 200


@pytest.mark.sqlite
def test_without_a_cache_every_request_reads_its_token(procs: Procs, make_user: Callable[..., User]) -> None:
    """On SQLite (no notifications) there is no cache at all; on PostgreSQL, none with the setting at 0."""
    off = {} if connection.vendor == "sqlite" else {"RUNLEDGER_TOKEN_CACHE_SECONDS": "0"}
    web = procs.uvicorn(env=subprocess_env(**off))
    frank = make_user()
    path, key = f"/api/runs/{queued_run(frank).pk}/", token_for(frank)
    assert status(web, key, path) == 200 and status(web, key, path) == 200
    deleted_unannounced(key)
    assert status(web, key, path) == 401
    if connection.vendor == "postgresql":
        assert not _listener(web)

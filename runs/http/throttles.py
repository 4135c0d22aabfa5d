"""Throttled sign-ins and token attempts (docs/design/fair-use.md#sign-in-throttle): the one count of
failed authentications every web entry shares (the API, the stream, /metrics/, the sign-in pages),
kept in the database (`AuthFailure`) so every web process counts against one limit
(docs/design/fair-use.md#throttle-counts says how).
"""

import hashlib
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.http import HttpRequest
from django.utils import timezone

from runs import notify
from runs.conf import conf
from runs.exceptions import TooManyRequests
from runs.http import token_cache
from runs.models import AuthFailure

# Expired failures one recorded failure deletes: more than it adds, so the table cannot outgrow
# one window of failures, and few enough that no request waits on a large delete.
PURGE_BATCH = 100

_TOKEN_ADDRESS = "token-address"
_LOGIN_ADDRESS = "login-address"
_LOGIN_USERNAME = "login-username"
_LOGIN_PAIR = "login-username-address"


@dataclass(frozen=True)
class LoginAttempt:
    """A sign-in being checked: its records, already counted as failures."""

    ids: tuple[int, ...]


def client_address(request: HttpRequest) -> str:
    """The client's address as the web process sees it (docs/how-to/deploy.md#front-door). Behind
    nginx uvicorn listens on a Unix socket only nginx's group may reach, and takes it from the
    X-Forwarded-For nginx sets ($remote_addr, never a client's); so REMOTE_ADDR is the client, never
    the proxy, and nobody can forge it. On a TCP port uvicorn trusts no forwarded header, or only
    a remote proxy's (--forwarded-allow-ips), since any local user reaches loopback; behind the edge
    the stream takes it from Pushpin's signed request (runs/streaming/views.py `edge_client`). A
    socket whose server trusts no header gives every client the key ""."""
    return str(request.META.get("REMOTE_ADDR") or "")


def _key(kind: str, value: str) -> str:
    return hashlib.sha256(f"{kind}\0{value}".encode("utf-8", "surrogatepass")).hexdigest()


def _window() -> timedelta:
    return timedelta(seconds=conf.AUTH_FAILURE_WINDOW_SECONDS)


def _wait(key: str, *, most: int, now: datetime, leave_out: tuple[int, ...] = ()) -> int | None:
    """Seconds (≥ 1) until `key` may try again (its `most`-th newest failure leaves the window), or
    None when it has fewer than `most` failures in the window. One range scan of the key's index."""
    recent = AuthFailure.objects.filter(key=key, failed_at__gt=now - _window())
    if leave_out:
        recent = recent.exclude(pk__in=leave_out)
    newest = list(recent.order_by("-failed_at").values_list("failed_at", flat=True)[:most])
    return _seconds_left(newest[-1] if len(newest) == most else None, now)


def _seconds_left(nth_newest: datetime | None, now: datetime) -> int | None:
    return None if nth_newest is None else max(1, math.ceil((nth_newest + _window() - now).total_seconds()))


def _purge_some(now: datetime) -> None:
    expired = AuthFailure.objects.filter(failed_at__lte=now - _window()).values("pk")[:PURGE_BATCH]
    AuthFailure.objects.filter(pk__in=expired).delete()


@dataclass(frozen=True)
class TokenBlock:
    """What decides whether a token attempt from an address is blocked, for a read made with the
    key's (runs.selectors.credentials.token_with_failure): its `most`-th newest failure after `since`."""

    key: str
    most: int
    since: datetime
    now: datetime

    @property
    def failures(self) -> tuple[str, int, datetime]:
        return self.key, self.most, self.since


def token_block(*, address: str) -> TokenBlock | None:
    """None when token attempts are unlimited."""
    most = conf.AUTH_FAILURES_MAX
    if most is None:
        return None
    now = timezone.now()
    return TokenBlock(key=_key(_TOKEN_ADDRESS, address), most=most, since=now - _window(), now=now)


def refuse_blocked(block: TokenBlock, nth_newest: datetime | None) -> None:
    """Refuse the attempt when its address's `most`-th newest failure is still in the window."""
    _refuse_token(_seconds_left(nth_newest, block.now))


def auth_token_check(*, address: str) -> None:
    """Refuse a token attempt from `address` while it is blocked."""
    if (block := token_block(address=address)) is not None:
        _refuse_token(_wait(block.key, most=block.most, now=block.now))


def _refuse_token(wait: int | None) -> None:
    if wait is not None:
        raise TooManyRequests(
            f"too many failed authentications from this address; try again in {wait} s", retry_after=wait
        )


def auth_token_failed(*, address: str) -> None:
    if conf.AUTH_FAILURES_MAX is None:
        return
    now = timezone.now()
    key = _key(_TOKEN_ADDRESS, address)
    if conf.TOKEN_CACHE_SECONDS and connection.vendor == "postgresql":
        # Announced in its own transaction: no process's token cache answers this address's keys
        # once the failure counts (runs.http.token_cache).
        with transaction.atomic():
            AuthFailure.objects.create(key=key, failed_at=now)
            token_cache.announce(notify.token_failed(key))
    else:
        AuthFailure.objects.create(key=key, failed_at=now)
    _purge_some(now)


def auth_login_begin(*, username: str, address: str) -> LoginAttempt | None:
    """Count a sign-in as failed before its password is checked; refuse it (taking the record
    back) when its address is blocked, or its username is blocked and this address failed for it
    within the window. None when sign-ins are unlimited."""
    most = conf.AUTH_FAILURES_MAX
    if most is None:
        return None
    now = timezone.now()
    by_address, by_username = _key(_LOGIN_ADDRESS, address), _key(_LOGIN_USERNAME, username)
    pair = _key(_LOGIN_PAIR, f"{username}\0{address}")
    keys = (by_address, by_username, pair)
    # One INSERT, committed before the counts below (autocommit): see the module's docstring. Of two
    # racing tries from one address at a blocked username, the later to count sees the other's pair.
    ids = tuple(row.pk for row in AuthFailure.objects.bulk_create([AuthFailure(key=k, failed_at=now) for k in keys]))
    waits = []
    if (wait := _wait(by_address, most=most, now=now, leave_out=ids)) is not None:
        waits.append(wait)
    # Open again once the username is, or once this address's last failure for it has left the window.
    if (wait := _wait(by_username, most=most, now=now, leave_out=ids)) is not None and (
        mine := _wait(pair, most=1, now=now, leave_out=ids)
    ) is not None:
        waits.append(min(wait, mine))
    if waits:
        AuthFailure.objects.filter(pk__in=ids).delete()
        raise TooManyRequests(f"too many failed sign-ins; try again in {max(waits)} s", retry_after=max(waits))
    return LoginAttempt(ids=ids)


def auth_login_end(attempt: LoginAttempt | None, *, failed: bool) -> None:
    """A failed sign-in keeps its record (the failure); any other takes it back."""
    if attempt is None:
        return
    if failed:
        _purge_some(timezone.now())
    else:
        AuthFailure.objects.filter(pk__in=attempt.ids).delete()


def auth_failures_purge() -> int:
    """Delete every failure past the window (`manage.py purge_runs`); the number deleted."""
    count, _ = AuthFailure.objects.filter(failed_at__lte=timezone.now() - _window()).delete()
    return count

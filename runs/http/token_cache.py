"""A web process's memory of the API tokens it authenticated (docs/design/api.md#token-cache): a
good key from an address whose standing was read with it is answered without a statement, while
this process listens for the notifications that end it — a revocation, a change of the user, a
failed token attempt from that address — and for at most RUNLEDGER_TOKEN_CACHE_SECONDS.

Used only while its own LISTEN connection is up (PostgreSQL, started with the web process by
runs.asgi); emptied whenever that connection is lost, and not used again until it is back. Each use
builds new objects from the kept row values: Django keeps a user's permissions on the user object,
which must never outlive its request nor be shared between threads.
"""

import asyncio
import contextlib
import functools
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, TypeVar

from django.contrib.auth import get_user_model
from django.db import connections, transaction
from django.db.models import Model

from runs import notify
from runs.conf import conf
from runs.models import ApiToken

# Entries one process keeps, the least recently used dropped first: a few MB at most.
SIZE = 10_000

# (key digest, the address's failure key — "" when token attempts are unlimited)
Key = tuple[str, str]
K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class _Entry:
    token: tuple[Any, ...]  # ApiToken's concrete fields' values, in their order
    user: tuple[Any, ...]  # the user's
    db: str
    read_at: float  # time.monotonic() of the statement that read them


def _values(instance: Model) -> tuple[Any, ...]:
    return tuple(getattr(instance, field.attname) for field in instance._meta.concrete_fields)


def _names(model: type[Model]) -> list[str]:
    return [field.attname for field in model._meta.concrete_fields]


class TokenCache:
    """Key → the token's and its user's row values. Called from request threads and, for its
    listener's news, the event loop: every access under one lock, never held across a query."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()
        self._by_user: dict[int, set[Key]] = {}
        self._by_address: dict[str, set[Key]] = {}
        self._live = False
        # Moves with everything that may make an entry stale (a note, a lost or new connection): a
        # read only becomes an entry if nothing did since it began (`begin`), or a note that came
        # between the read and the keeping would be lost on it.
        self._epoch = 0

    @property
    def live(self) -> bool:
        return self._live

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key) -> ApiToken | None:
        """A new token object, with a new user object, for `key`; None when not kept (or too old,
        or the listener is down)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or not self._live:
                return None
            if time.monotonic() - entry.read_at >= conf.TOKEN_CACHE_SECONDS:
                self._drop(key)
                return None
            self._entries.move_to_end(key)
        user_model = get_user_model()
        token = ApiToken.from_db(entry.db, _names(ApiToken), entry.token)
        token.user = user_model.from_db(entry.db, _names(user_model), entry.user)
        return token

    def begin(self) -> int | None:
        """The epoch to pass to `keep` for a read about to be made; None: the cache is not in use."""
        with self._lock:
            return self._epoch if self._live else None

    def keep(self, epoch: int | None, key: Key, token: ApiToken, *, read_at: float) -> None:
        """Keep `token` (and its user, which the read joined) as read at `read_at`, unless something
        that could make it stale arrived since `begin` gave `epoch`."""
        if epoch is None:
            return
        entry = _Entry(_values(token), _values(token.user), token._state.db or "default", read_at)
        with self._lock:
            if epoch != self._epoch or not self._live:
                return
            self._drop(key)
            self._entries[key] = entry
            self._by_user.setdefault(token.user_id, set()).add(key)
            self._by_address.setdefault(key[1], set()).add(key)
            while len(self._entries) > SIZE:
                self._drop(next(iter(self._entries)))

    def noted_use(self, key: Key, token: ApiToken) -> None:
        """The token's `last_used_at` was written: kept so, so this process writes it again only a
        minute later."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries[key] = _Entry(_values(token), entry.user, entry.db, entry.read_at)

    def _drop(self, key: Key) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        _unindex(self._by_user, entry.token[_USER_ID], key)
        _unindex(self._by_address, key[1], key)

    def _drop_all(self, keys: set[Key] | None) -> None:
        for key in list(keys or ()):
            self._drop(key)

    def on_notify(self, channel: str, payload: str) -> None:
        try:
            if channel == notify.REVOKED:
                kind, value = "user", str(notify.parse_revoked_payload(payload))
            else:
                kind, value = notify.parse_credentials_payload(payload)
            user_id = int(value) if kind == "user" else None
        except ValueError:
            # Unreadable: whatever it meant, nothing kept may be trusted.
            kind, user_id = "", None
        with self._lock:
            self._epoch += 1
            if user_id is not None:
                self._drop_all(self._by_user.get(user_id))
            elif kind == "failure":
                self._drop_all(self._by_address.get(value))
            else:
                self._clear()

    def on_connect(self) -> None:
        # What was announced while the connection was down reached nobody: start empty.
        with self._lock:
            self._epoch += 1
            self._clear()
            self._live = True

    def on_disconnect(self) -> None:
        with self._lock:
            self._epoch += 1
            self._live = False
            self._clear()

    def _clear(self) -> None:
        self._entries.clear()
        self._by_user.clear()
        self._by_address.clear()


def _unindex(index: dict[K, set[Key]], value: K, key: Key) -> None:
    keys = index.get(value)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del index[value]


_USER_ID = _names(ApiToken).index("user_id")

# This process's cache.
cache = TokenCache()


def listen(loop: asyncio.AbstractEventLoop) -> "asyncio.Task[None] | None":
    """Start the cache's listener on `loop`; None (and no cache) on SQLite or with
    RUNLEDGER_TOKEN_CACHE_SECONDS 0."""
    if not conf.TOKEN_CACHE_SECONDS or connections["default"].vendor != "postgresql":
        return None
    listener = notify.Listener(
        role="tokens",
        on_notify=cache.on_notify,
        on_connect=cache.on_connect,
        on_disconnect=cache.on_disconnect,
        channels=(notify.REVOKED, notify.CREDENTIALS),
    )
    return loop.create_task(listener.run(), name="runledger-token-cache")


_running: list["asyncio.Task[None]"] = []


def start() -> None:
    """Start the listener with the web process (its lifespan), on the running event loop."""
    if not _running and (task := listen(asyncio.get_running_loop())) is not None:
        _running.append(task)


async def stop() -> None:
    while _running:
        task = _running.pop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    cache.on_disconnect()


def announce(*notes: notify.Note) -> None:
    """Send `notes` (a revocation, a user's change, a failed key) in the open transaction, and apply
    them to this process's own cache once it commits, before its request answers: the process
    that revoked a token refuses it from its next request on, whatever the notification's way back
    through its listener (the others, as soon as theirs arrives)."""
    notify.send(*notes)
    for note in notes:
        transaction.on_commit(functools.partial(cache.on_notify, *note))


def user_saved(sender: Any, instance: Any, created: bool, update_fields: Any = None, **kwargs: Any) -> None:
    """A user's row changed: the caches drop their tokens. A deactivation says so on REVOKED
    (runs.streaming.edge.revocation), and a sign-in's `last_login` changes nothing they keep."""
    if created or not instance.is_active or (update_fields is not None and set(update_fields) == {"last_login"}):
        return
    if conf.TOKEN_CACHE_SECONDS:
        announce(notify.user_changed(instance.pk))


def connect() -> None:
    """Hook the user's changes (runs.apps, once)."""
    from django.db.models.signals import post_save

    post_save.connect(user_saved, sender=get_user_model(), dispatch_uid="runledger-token-cache-user-saved")

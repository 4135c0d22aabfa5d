"""One PostgreSQL LISTEN connection per process that reconnects by itself (docs/design/deployment.md#notifications).

Each (re)connect calls `on_connect`, so consumers re-read what they may have missed while it was
down; each loss `on_disconnect`, for consumers that must not trust what they know meanwhile. On SQLite there is nothing to listen to and `run()` returns at once.
"""

import asyncio
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connections

from runs.conf import conf
from runs.notify import channels as notify

log = logging.getLogger(__name__)

APPLICATION_NAME_PREFIX = "runledger-listen"


# libpq keywords of the database's OPTIONS that the listening connection takes over as well.
_CONNECTION_KEYWORDS = ("keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout")


def conninfo(alias: str = "default", *, application_name: str = "runledger") -> dict[str, Any]:
    """psycopg connection keywords for Django's database `alias`, outside Django's handling."""
    db = connections[alias].settings_dict
    params: dict[str, Any] = {
        "dbname": db["NAME"],
        "user": db["USER"] or None,
        "password": db["PASSWORD"] or None,
        "host": db["HOST"] or None,
        "port": db["PORT"] or None,
        "connect_timeout": db["OPTIONS"].get("connect_timeout", 3),
        "application_name": application_name,
    }
    params.update({k: db["OPTIONS"][k] for k in _CONNECTION_KEYWORDS if k in db["OPTIONS"]})
    return {k: v for k, v in params.items() if v is not None}


class Listener:
    def __init__(
        self,
        *,
        role: str,
        on_notify: Callable[[str, str], None],
        on_connect: Callable[[], None] = lambda: None,
        on_disconnect: Callable[[], None] = lambda: None,
        channels: Iterable[str] = notify.CHANNELS,
        alias: str = "default",
    ) -> None:
        self.role = role
        self.on_notify = on_notify
        self.on_connect = on_connect
        self.on_disconnect = on_disconnect
        self.channels = tuple(channels)
        self.alias = alias
        self.connected = asyncio.Event()
        self._stopping = False
        self.connects = 0

    @property
    def application_name(self) -> str:
        # Tests find (and kill) a process's listening connection by this name.
        return f"{APPLICATION_NAME_PREFIX}:{self.role}:{os.getpid()}"

    @property
    def enabled(self) -> bool:
        return connections[self.alias].vendor == "postgresql"

    def stop(self) -> None:
        self._stopping = True

    async def run(self) -> None:
        if not self.enabled:
            return
        # Here, not at the top: only PostgreSQL has something to listen to, and a SQLite install
        # has no psycopg (the `postgres` extra), yet its web processes and workers import this.
        import psycopg

        retry = conf.LISTEN_RECONNECT_SECONDS
        # A silent peer (a network cut without a FIN) is found by a liveness query this often.
        probe = max(conf.POLL_SECONDS, 0.5)
        while not self._stopping:
            try:
                async with await psycopg.AsyncConnection.connect(
                    **conninfo(self.alias, application_name=self.application_name), autocommit=True
                ) as conn:
                    for channel in self.channels:
                        await conn.execute(f'LISTEN "{channel}"')
                    self.connects += 1
                    self.connected.set()
                    self.on_connect()
                    while not self._stopping:
                        async for note in conn.notifies(timeout=probe):
                            self.on_notify(note.channel, note.payload)
                        # A probe left unanswered (a network cut: no error, just silence) counts
                        # as a lost connection too.
                        await asyncio.wait_for(conn.execute("SELECT 1"), timeout=max(2 * probe, 2.0))
            except (psycopg.Error, OSError, TimeoutError) as exc:
                self._lost()
                if self._stopping:
                    break
                log.warning(
                    "%s listener lost its connection (%s); reconnecting", self.role, str(exc) or type(exc).__name__
                )
                await asyncio.sleep(retry)
            finally:
                self._lost()

    def _lost(self) -> None:
        # Also when the task is cancelled or fails otherwise: a consumer must never go on trusting
        # a listener that is no longer listening.
        if self.connected.is_set():
            self.connected.clear()
            self.on_disconnect()

"""The edge's publisher: every committed event, from the events table to each Pushpin
(docs/design/edge.md#publishing).

Every web process with `RUNLEDGER_GRIP_URL` runs one, started with the process (runs.asgi) or by
its first stream request; the one holding an advisory lock leads: it reads what each NOTIFY names
from the table, publishes it in order (control.py), closes ended runs (endings.py), and syncs each
Pushpin it takes the lead of or gave up on (docs/design/edge.md#sync).
"""

import asyncio
import contextlib
import hashlib
import importlib.util
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from asgiref.sync import SyncToAsync, sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connection, connections
from django.utils import timezone

from runs import notify
from runs.conf import conf
from runs.models import LIVE_VALUES
from runs.notify.listener import conninfo
from runs.selectors.published import runs_events_after_heads
from runs.selectors.states import run_last_seqs_ended_since, run_last_seqs_live
from runs.streaming import hub
from runs.streaming.edge import grip
from runs.streaming.edge.endings import ENDED_TTL, Endings

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

APPLICATION_NAME_PREFIX = "runledger-edge"
# Events read together from one run are published as one item up to this many bytes. Pushpin's
# cost is per item and per stream it is sent to, hardly per byte: while it is busy sending one item
# to many streams, the next publish waits for it, the events committed meanwhile are read together,
# and go out as one item — the busier Pushpin, the fewer and larger the items.
GROUP_MAX = 64 * 1024
# Seconds between the starts of two reads: events committed within them go out in one read and one
# publish. Each read and publish costs the web process about a millisecond whatever it carries, and
# a hundred runs each emitting every two seconds would otherwise make fifty of them a second.
PUMP_GAP = 0.05
# Seconds the leader's probe of its connection may take before the connection counts as lost and
# the lead is given up: a loop busy with thousands of link fetches, or a saturated database, can
# take seconds to answer, and each change of leader costs a sync of every Pushpin.
PROBE_TIMEOUT = 10.0

T = TypeVar("T")
P = ParamSpec("P")

# What the edge needs beyond the core install (the `edge` extra). Every web process imports this
# module for its lifespan (start, stop), so these, and psycopg, are imported only where they are
# used, once an edge is configured: an install without the extras imports this module too.
EDGE_MODULES = ("jwt", "zmq")


def require_edge() -> None:
    """Refuse to start a web process that cannot run the edge it is configured for (what each edge
    setting must be, runs.conf checks)."""
    if not conf.GRIP_URL:
        return
    missing = [name for name in EDGE_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise ImproperlyConfigured(
            f"RUNLEDGER_GRIP_URL needs the edge extra (pip install 'django-runledger[edge]'): no {', '.join(missing)}"
        )
    if connections["default"].vendor != "postgresql":
        raise ImproperlyConfigured(
            "RUNLEDGER_GRIP_URL needs PostgreSQL: the edge's publisher is woken by LISTEN/NOTIFY "
            "(set DATABASE_URL, or unset RUNLEDGER_GRIP_URL)"
        )


def lock_key(urls: list[str]) -> int:
    """The advisory lock of the publishers of one set of Pushpins (a signed 64-bit key)."""
    digest = hashlib.sha256(("runledger-edge|" + "|".join(sorted(urls))).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@dataclass
class _Read:
    """What the table holds of one run after the head the leader had."""

    run_id: str
    frames: list[hub.Frame] = field(default_factory=list)
    # A run new to the leader that had already ended: its last seq (only its streams' close is sent).
    ended_at: int | None = None


# The leader's reads, one at a time, off the streams' own pools.
_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runledger-edge-read")


async def _in_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return await sync_to_async(fn, thread_sensitive=False, executor=_executor)(*args, **kwargs)


def _heads_sync() -> tuple[dict[str, int], dict[str, int]]:
    """The last seq of every live run, and of every run that ended in the last ENDED_TTL."""
    try:
        since = timezone.now() - timedelta(seconds=ENDED_TTL)
        return run_last_seqs_live(), run_last_seqs_ended_since(since=since)
    finally:
        connection.close()


def _read_sync(wanted: dict[str, int | None]) -> list[_Read]:
    """For each run, the events after its head (None: a run the leader has not seen), every run in
    one statement."""
    try:
        news = runs_events_after_heads(heads=wanted, limit=hub.PAGE)
        found = []
        for run_id, head in wanted.items():
            one = news.get(run_id)
            if one is None:
                continue  # deleted since
            if head is None and one.status not in LIVE_VALUES:
                found.append(_Read(run_id, ended_at=one.last_seq))
                continue
            found.append(_Read(run_id, frames=[hub.make_frame(*row) for row in one.rows]))
        return found
    finally:
        connection.close()


def _up_to_terminal(frames: list[hub.Frame]) -> list[hub.Frame]:
    for i, frame in enumerate(frames):
        if frame.terminal:
            return frames[: i + 1]
    return frames


def _groups(frames: list[hub.Frame]) -> list[list[hub.Frame]]:
    """Consecutive frames in groups of at most GROUP_MAX bytes (a larger frame alone), in order:
    what one read found of a run goes out as one item per group."""
    groups: list[list[hub.Frame]] = []
    size = 0
    for frame in frames:
        if not groups or size + len(frame.data) > GROUP_MAX:
            groups.append([])
            size = 0
        groups[-1].append(frame)
        size += len(frame.data)
    return groups


class Publisher:
    def __init__(self, urls: list[str]) -> None:
        from runs.streaming.edge import control

        self.pushpins = control.Pushpins(urls, timeout=conf.GRIP_PUBLISH_TIMEOUT_SECONDS, sync=self._sync_items)
        self.key = lock_key(urls)
        self.poll_seconds = conf.POLL_SECONDS
        self.retry_seconds = conf.LISTEN_RECONNECT_SECONDS
        # Run id -> seq of the last event published; only the pump changes it once leading.
        self.heads: dict[str, int] = {}
        # The runs that ended, and their closes due again.
        self.endings = Endings(again_after=conf.GRIP_CLOSE_AGAIN_SECONDS)
        # Run id -> the last seq a notification announced, not yet read.
        self.dirty: dict[str, int] = {}
        # Users whose edge streams are to be closed: a credential of theirs was revoked.
        self.revoked: set[int] = set()
        self._pumped_at = 0.0
        self.leading = asyncio.Event()
        self._wake = asyncio.Event()
        self._stopping = False

    @property
    def application_name(self) -> str:
        return f"{APPLICATION_NAME_PREFIX}:{os.getpid()}"

    def stop(self) -> None:
        self._stopping = True

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self.pushpins.close()

    async def _run(self) -> None:
        import psycopg

        while not self._stopping:
            try:
                async with await psycopg.AsyncConnection.connect(
                    **conninfo(application_name=self.application_name), autocommit=True
                ) as conn:
                    await self._lead(conn)
            except (psycopg.Error, OSError, TimeoutError, DatabaseError) as exc:
                if self._stopping:
                    break
                log.warning("edge publisher lost its connection (%s); reconnecting", str(exc) or type(exc).__name__)
                await asyncio.sleep(self.retry_seconds)
            finally:
                if self.leading.is_set():
                    log.info("edge publisher %s no longer leads", self.application_name)
                self.leading.clear()

    async def _lead(self, conn: "psycopg.AsyncConnection[Any]") -> None:
        # Waiting for the lock is also the probe of the connection: a lost one raises here.
        while True:
            row = await (await conn.execute("SELECT pg_try_advisory_lock(%s)", [self.key])).fetchone()
            if row is not None and row[0]:
                break
            await asyncio.sleep(self.poll_seconds)
        await conn.execute(f'LISTEN "{notify.EVENTS}"')
        await conn.execute(f'LISTEN "{notify.REVOKED}"')
        # After LISTEN: whatever commits from now on is announced, whatever committed before is here.
        self.heads, ended = await _in_thread(_heads_sync)
        self.endings.reset(ended)
        self.dirty.clear()
        self.revoked.clear()
        self.pushpins.lose_all()  # synced first: what the previous leader did not publish, Pushpin fetches
        self.leading.set()
        log.info(
            "edge publisher %s leads: %d live runs, publishing to %s",
            self.application_name,
            len(self.heads),
            ", ".join(self.pushpins.urls),
        )
        pump = hub.detached(asyncio.get_running_loop(), self._pump())
        probe = max(self.poll_seconds, 0.5)
        try:
            while not self._stopping:
                async for note in conn.notifies(timeout=probe):
                    if note.channel == notify.REVOKED:
                        self._on_revoked(note.payload)
                    else:
                        self._on_notify(note.payload)
                # A silent peer (a network cut) is found by a probe left unanswered.
                await asyncio.wait_for(conn.execute("SELECT 1"), timeout=max(2 * probe, PROBE_TIMEOUT))
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump

    def _on_notify(self, payload: str) -> None:
        try:
            run_id, last_seq = notify.parse_events_payload(payload)
        except ValueError:
            log.warning("ignoring malformed %s payload %r", notify.EVENTS, payload)
            return
        if run_id in self.endings:
            return
        head = self.heads.get(run_id)
        if head is not None and last_seq <= head:
            return
        self.dirty[run_id] = max(self.dirty.get(run_id, 0), last_seq)
        self._wake.set()

    def _on_revoked(self, payload: str) -> None:
        try:
            self.revoked.add(notify.parse_revoked_payload(payload))
        except ValueError:
            log.warning("ignoring malformed %s payload %r", notify.REVOKED, payload)
            return
        self._wake.set()

    async def _pump(self) -> None:
        while True:
            try:
                await self._pump_once()
            except Exception:
                # Whatever it was, the leader must not go on leading with a dead pump.
                log.exception("edge publisher failed; retrying")
                await asyncio.sleep(self.retry_seconds)
                self._wake.set()

    async def _pump_once(self) -> None:
        """Wait for a wake-up (or for the next try at a Pushpin that refused, or the next close due
        again), then read and publish."""
        await self.pushpins.catch_up()
        await self._wait()
        loop = asyncio.get_running_loop()
        if (gap := self._pumped_at + PUMP_GAP - loop.time()) > 0:
            await asyncio.sleep(gap)  # pacing: what commits meanwhile is read with it
        self._pumped_at = loop.time()
        self._wake.clear()
        if self.revoked:
            # Rare, and first: a revoked user's streams end before anything more reaches them.
            closes = [grip.close_user_item(user_id) for user_id in sorted(self.revoked)]
            self.revoked.clear()
            await self.pushpins.publish(closes)
        # Ended runs only, which no read below includes.
        items = [grip.close_again_item(grip.channel(run_id), last_seq) for run_id, last_seq in self.endings.due()]
        if self.dirty:
            items += await self._read_dirty()
        if items:
            await self.pushpins.publish(items)
        self.endings.forget_old()

    async def _wait(self) -> None:
        timeout = self.endings.due_in()
        if self.pushpins.behind:
            # Try again at the next poll, or sooner if something is committed meanwhile.
            timeout = self.poll_seconds if timeout is None else min(timeout, self.poll_seconds)
        if timeout is None:
            await self._wake.wait()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    async def _read_dirty(self) -> list[dict[str, Any]]:
        """The items of what the runs named since the last read committed."""
        dirty, self.dirty = self.dirty, {}
        try:
            reads = await _in_thread(_read_sync, {run_id: self.heads.get(run_id) for run_id in dirty})
        except DatabaseError as exc:
            log.warning("edge publisher could not read events (%s); retrying", exc)
            for run_id, last_seq in dirty.items():
                self.dirty[run_id] = max(self.dirty.get(run_id, 0), last_seq)
            await asyncio.sleep(self.retry_seconds)
            self._wake.set()
            return []
        return self._items(reads, dirty)

    def _items(self, reads: list[_Read], dirty: dict[str, int]) -> list[dict[str, Any]]:
        """The publish items of what was read; moves the heads and marks the runs that ended."""
        items: list[dict[str, Any]] = []
        for read in reads:
            name = grip.channel(read.run_id)
            if read.ended_at is not None:
                items.append(grip.close_item(name, read.ended_at))
                self._ended(read.run_id, read.ended_at)
                continue
            frames = _up_to_terminal(read.frames)
            items += [grip.item(name, group) for group in _groups(frames)]
            if frames and frames[-1].terminal:
                items.append(grip.close_item(name, frames[-1].seq))
                self._ended(read.run_id, frames[-1].seq)
                continue
            if frames:
                self.heads[read.run_id] = frames[-1].seq
            if self.heads.get(read.run_id, 0) < dirty[read.run_id]:
                # A page short of what was announced: read on.
                self.dirty[read.run_id] = max(self.dirty.get(read.run_id, 0), dirty[read.run_id])
                self._wake.set()
        return items

    def _ended(self, run_id: str, last_seq: int) -> None:
        self.heads.pop(run_id, None)
        self.endings.add(run_id, last_seq)

    def _sync_items(self) -> list[dict[str, Any]]:
        """Where every stream should be (`grip.sync_item`): at the head of each live run; and each
        run that ended within ENDED_TTL closed both ways (the second is never dropped as seen, and
        reaches a stream held after the first)."""
        items = [grip.sync_item(grip.channel(run_id), head) for run_id, head in self.heads.items()]
        for run_id, last_seq in self.endings.recent():
            name = grip.channel(run_id)
            items += [grip.close_item(name, last_seq), grip.close_again_item(name, last_seq)]
        return items


# This process's publisher, while it runs (runs.asgi starts and stops it with the process).
_running: list[tuple[Publisher, "asyncio.Task[None]"]] = []


def start() -> Publisher | None:
    """Start this process's publisher, if there is an edge; on the running event loop."""
    if not conf.GRIP_URL or _running:
        return None
    publisher = Publisher(list(conf.GRIP_URL))
    task = hub.detached(asyncio.get_running_loop(), publisher.run())
    _running.append((publisher, task))
    return publisher


def start_from_thread() -> None:
    """`start` from a synchronous view (the link fetch): under Django's own ASGI handler, whose
    request threads know the server's event loop, on that loop; under runs.asgi the lifespan has
    started it already."""
    if not conf.GRIP_URL or _running:
        return
    loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    if loop is not None and loop.is_running():
        loop.call_soon_threadsafe(start)


async def stop() -> None:
    while _running:
        publisher, task = _running.pop()
        publisher.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

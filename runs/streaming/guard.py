"""Fair use of the streams a web process serves (docs/design/streaming.md#limits): the per-user cap
(`StreamGuard.take_slot`, each slot given back once by `Watch.release`) and the periodic re-check of
who holds each open stream, those the edge holds for it included (`EdgeStreams`)
(docs/design/streaming.md#guard says how).
"""

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import TypeVar

from django.db import DatabaseError

from runs.conf import conf
from runs.exceptions import TooManyRequests
from runs.selectors import users_active
from runs.selectors.credentials import sessions_kept, sessions_open, token_users
from runs.selectors.states import run_ids_live, run_owners
from runs.streaming import hub, opening

log = logging.getLogger(__name__)

# Keys per query of a re-check: a process watching more runs (or with more users) reads in pages.
BATCH = 1000
# Seconds an edge stream still counts after the link fetch it was due: Pushpin fetches late when
# busy (at most a thousand streams a second) or when the web processes answer slowly.
EDGE_MARGIN = 10.0

# (user id, token id, session key, run id): who holds a stream of which run, with what.
Holder = tuple[int, int | None, str | None, str]

K = TypeVar("K")


@dataclass(eq=False, slots=True)  # eq=False: each is itself, in the guard's set
class Watch:
    """One admitted stream: its user's slot, what it authenticated with, and its end flag."""

    guard: "StreamGuard"
    user_id: int
    token_id: int | None
    session_key: str | None
    run_id: str
    # Set by the re-check; the stream ends at its next look.
    ended: bool = False
    # What the stream waits on while it waits (`wait`): resolved to wake it.
    wakeup: "asyncio.Future[None] | None" = None
    # Wakes the stream at its wait's bound; kept from wait to wait while it is early enough.
    alarm: asyncio.TimerHandle | None = None
    released: bool = False
    # Gives the slot back unless the body starts first.
    unstarted: asyncio.TimerHandle | None = None

    @property
    def holder(self) -> Holder:
        return (self.user_id, self.token_id, self.session_key, self.run_id)

    def end(self) -> None:
        self.ended = True
        self._wake()

    async def wait(self, wakeup: "asyncio.Future[None]", until: float) -> None:
        """Wait for `wakeup` (the feed resolves it when its run advances), the loop time `until`
        or `end`, whichever comes first; it may also return a little early (look again).

        One timer per stream, moved only when it would ring too late: with a thousand watchers of
        a run, a timeout armed and cancelled around every wait (asyncio.timeout_at) was a good
        share of each event's fan-out. So it rings at most once per keep-alive period, sometimes
        before the bound, when the bound moved on since it was set; the stream then looks again."""
        if self.alarm is None or self.alarm.when() > until:
            if self.alarm is not None:
                self.alarm.cancel()
            self.alarm = self.guard.loop.call_at(until, self._ring)
        self.wakeup = wakeup
        try:
            await wakeup
        finally:
            self.wakeup = None

    def _ring(self) -> None:
        self.alarm = None
        self._wake()

    def _wake(self) -> None:
        if self.wakeup is not None and not self.wakeup.done():
            self.wakeup.set_result(None)

    def start(self) -> bool:
        """The body has started: it gives the slot back itself from now on. False if its slot was
        already given back (the body started later than RUNLEDGER_SSE_START_SECONDS): it must end."""
        if self.unstarted is not None:
            self.unstarted.cancel()
            self.unstarted = None
        return not self.released

    def release(self) -> None:
        """Give the user's slot back; once, however many of the ways to end a stream call it."""
        if self.alarm is not None:
            self.alarm.cancel()
            self.alarm = None
        self.guard.release(self)


@dataclass(frozen=True)
class _Found:
    """What the database holds now of the keys of the open streams."""

    active_users: dict[int, bool]  # active user id -> sees every run
    token_users: dict[int, int]
    sessions: set[str] | None  # None: the session engine keeps no rows to look up
    run_owners: dict[str, int]

    def allows(self, holder: Holder) -> bool:
        user_id, token_id, session_key, run_id = holder
        sees_every_run = self.active_users.get(user_id)
        if sees_every_run is None:
            return False  # deactivated or deleted
        if token_id is not None and self.token_users.get(token_id) != user_id:
            return False
        if session_key is not None and self.sessions is not None and session_key not in self.sessions:
            return False
        owner = self.run_owners.get(run_id)
        return owner is not None and (owner == user_id or sees_every_run)


def _batches(keys: Collection[K]) -> Iterator[list[K]]:
    ordered = list(keys)
    for i in range(0, len(ordered), BATCH):
        yield ordered[i : i + BATCH]


def _found(user_ids: set[int], token_ids: set[int], session_keys: set[str], run_ids: set[str]) -> _Found:
    """One query per kind of key (per BATCH keys), for every stream of the process."""
    active: dict[int, bool] = {}
    for users in _batches(user_ids):
        active.update(users_active(user_ids=users))
    tokens: dict[int, int] = {}
    for ids in _batches(token_ids):
        tokens.update(token_users(ids=ids))
    sessions: set[str] | None = None
    if sessions_kept():
        sessions = set()
        for keys in _batches(session_keys):
            sessions.update(sessions_open(keys=keys))
    owners: dict[str, int] = {}
    for runs in _batches(run_ids):
        owners.update(run_owners(run_ids=runs))
    return _Found(active_users=active, token_users=tokens, sessions=sessions, run_owners=owners)


class StreamGuard:
    """The streams one event loop (one web process) holds: counted per user, re-checked together."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.counts: dict[int, int] = {}
        self.watches: set[Watch] = set()
        self.recheck_seconds = conf.SSE_RECHECK_SECONDS
        self._task: asyncio.Task[None] | None = None

    def take_slot(self, *, user_id: int, token_id: int | None, session_key: str | None, run_id: str) -> Watch | None:
        """Count a new stream of the user, or None when the user already holds the cap."""
        if not self.has_room(user_id):
            return None
        self.counts[user_id] = self.counts.get(user_id, 0) + 1
        watch = Watch(guard=self, user_id=user_id, token_id=token_id, session_key=session_key, run_id=run_id)
        self.watches.add(watch)
        watch.unstarted = self.loop.call_later(conf.SSE_START_SECONDS, self._unstarted, watch)
        self._ensure_task()
        return watch

    def has_room(self, user_id: int) -> bool:
        """Whether the user holds fewer streams than the cap; from another thread, a hint (the
        event loop's `take_slot` decides)."""
        cap = conf.MAX_STREAMS_PER_USER
        return cap is None or self.counts.get(user_id, 0) + edge_streams.live(user_id) < cap

    def _unstarted(self, watch: Watch) -> None:
        watch.unstarted = None
        if not watch.released:
            log.info("run %s: a stream of user %s never started; its slot is given back", watch.run_id, watch.user_id)
            self.release(watch)

    def release(self, watch: Watch) -> None:
        if watch.released:
            return
        watch.released = True
        if watch.unstarted is not None:
            watch.unstarted.cancel()
            watch.unstarted = None
        self.watches.discard(watch)
        left = self.counts[watch.user_id] - 1
        if left:
            self.counts[watch.user_id] = left
        else:
            del self.counts[watch.user_id]

    def _ensure_task(self) -> None:
        if self._task is None or self._task.done():
            # An empty context, as the hub's tasks: it outlives the request that started it.
            self._task = self.loop.create_task(self._recheck_loop(), context=contextvars.Context())

    async def _recheck_loop(self) -> None:
        while True:
            await asyncio.sleep(self.recheck_seconds)
            try:
                await self.recheck()
            except Exception:
                # Whatever it was, the task goes on: the next interval tries again.
                log.exception("re-checking the open streams failed")

    async def recheck(self) -> None:
        """End the open streams whose holder may no longer hold them."""
        watches = [watch for watch in self.watches if not watch.ended]
        if not watches:
            return
        try:
            # On the stream-opening pool: these are the opening checks again, and the live reads
            # must not wait behind them.
            found = await opening.call(
                _found,
                {w.user_id for w in watches},
                {w.token_id for w in watches if w.token_id is not None},
                {w.session_key for w in watches if w.session_key is not None},
                {w.run_id for w in watches},
            )
        except (DatabaseError, TimeoutError) as exc:
            log.warning("re-checking %d streams failed (%s); they stay open until the next try", len(watches), exc)
            return
        for watch in watches:
            if not watch.ended and not found.allows(watch.holder):
                log.info("run %s: ending a stream of user %s, who may no longer hold it", watch.run_id, watch.user_id)
                watch.end()


def too_many_streams() -> TooManyRequests:
    """The refusal of a stream over the user's cap (a 429), with the edge or without."""
    cap = conf.MAX_STREAMS_PER_USER
    return TooManyRequests(
        f"at most {cap} streams at once per user on this server; close one or retry later",
        retry_after=conf.LIMIT_RETRY_AFTER_SECONDS,
        detail={"limit": cap},
    )


@dataclass(slots=True)
class _Held:
    run_id: str
    until: float  # time.monotonic() after which it no longer counts


class EdgeStreams:
    """The streams the edge holds whose connect or last link fetch this process answered, by user
    and link, and the re-checks of their links. Called from the stream-opening threads, so it
    keeps its own lock (never held across a query)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, dict[str, _Held]] = {}
        self._checked: dict[Holder, tuple[bool, float]] = {}
        self._calls = 0

    def live(self, user_id: int) -> int:
        now = time.monotonic()
        with self._lock:
            held = self._held.get(user_id, {})
            for link in [link for link, found in held.items() if found.until <= now]:
                del held[link]
            return len(held)

    def take_slot(self, *, user_id: int, link: str, run_id: str, until: float, plain: int) -> bool:
        """Count a new edge stream of the user, unless the user already holds the cap together
        with `plain`, the streams this process serves them itself. At the cap, the streams of runs
        that have ended since are let go first (their streams ended with them): one query, only then."""
        cap = conf.MAX_STREAMS_PER_USER
        if cap is None:
            return True  # nothing to count
        if plain + self.live(user_id) >= cap:
            with self._lock:
                runs = {found.run_id for found in self._held.get(user_id, {}).values()}
            live = run_ids_live(run_ids=runs)
            with self._lock:
                held = self._held.get(user_id, {})
                for gone in [link for link, found in held.items() if found.run_id not in live]:
                    del held[gone]
            if plain + self.live(user_id) >= cap:
                return False
        self.seen(user_id=user_id, link=link, run_id=run_id, until=until)
        return True

    def seen(self, *, user_id: int, link: str, run_id: str, until: float) -> None:
        """The link was fetched (or minted): its stream counts until `until`."""
        if conf.MAX_STREAMS_PER_USER is None:
            return
        with self._lock:
            self._held.setdefault(user_id, {})[link] = _Held(run_id=run_id, until=until)
            self._tick()

    def drop(self, *, user_id: int, link: str) -> None:
        with self._lock:
            self._held.get(user_id, {}).pop(link, None)

    def allowed(self, holder: Holder) -> bool:
        """Whether the holder may still hold a stream of the run: `StreamGuard.recheck`'s rule, on
        the caller's thread and connection."""
        now = time.monotonic()
        with self._lock:
            cached = self._checked.get(holder)
        if cached is not None and cached[1] > now:
            return cached[0]
        user_id, token_id, session_key, run_id = holder
        tokens = {token_id} if token_id is not None else set()
        sessions = {session_key} if session_key is not None else set()
        allowed = _found({user_id}, tokens, sessions, {run_id}).allows(holder)
        with self._lock:
            self._checked[holder] = (allowed, now + conf.SSE_RECHECK_SECONDS)
            self._tick()
        return allowed

    def _tick(self) -> None:
        # Now and then, what users who never came back left behind (under the lock).
        self._calls += 1
        if self._calls % BATCH == 0:
            self._forget(time.monotonic())

    def _forget(self, now: float) -> None:
        for holder in [holder for holder, (_, until) in self._checked.items() if until <= now]:
            del self._checked[holder]
        for user_id in list(self._held):
            held = self._held[user_id]
            for link in [link for link, found in held.items() if found.until <= now]:
                del held[link]
            if not held:
                del self._held[user_id]


# This process's guard, and the edge's streams it answered for.
get_guard = hub.loop_local(StreamGuard)
edge_streams = EdgeStreams()

"""The per-process hub that feeds SSE streams (docs/design/streaming.md#hub): one feed per watched run,
one shared read per wake-up, the events encoded once as frames, and a poll backstop
(docs/design/streaming.md#hub-reads says how).
"""

import asyncio
import contextvars
import logging
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connection, connections

from runs import notify
from runs.conf import conf
from runs.events import TERMINAL_EVENT_TYPES
from runs.notify.listener import Listener
from runs.selectors.states import run_last_seqs
from runs.selectors.wire import (
    EventsRead,
    carried_events_rows,
    run_events_frames,
    run_events_json_bounded,
    sse_frame,
)
from runs.streaming.recent import RecentNotes

log = logging.getLogger(__name__)

# Rows per read, and at most RUNLEDGER_MAX_PAGE_BYTES of them; a longer backlog is read page by page.
PAGE = 500
# Recent frames a feed keeps for its watchers, and at most so many bytes of them (trimmed at twice
# that): one further behind reads the table itself. The bytes bound the memory a watched run holds
# in a process whatever its events hold — 2,000 frames of 250 kB events would be 500 MB.
BUFFER = 2000
BUFFER_BYTES = 1_000_000

# Reads are short and never hold their connection, so a few threads serve any number of streams.
_read_executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="runledger-sse-read")
T = TypeVar("T")
P = ParamSpec("P")


@dataclass(frozen=True, slots=True)
class Frame:
    """One event encoded once as its SSE frame and shared by every watcher — or a page of events
    read from the table for watchers behind the buffer, their frames in one string: `seq` is then
    the page's last event, and `terminal` says whether that one ends the run."""

    seq: int
    data: bytes
    terminal: bool
    type: str = ""  # the event's ("" for a page), for the watchers that chose types and for waits


def make_frame(seq: int, type_: str, body: str) -> Frame:
    """The frame of the event `seq` of type `type_` whose JSON (`event_json`) is `body`."""
    return Frame(seq, sse_frame(seq, type_, body).encode(), type_ in TERMINAL_EVENT_TYPES, type_)


@dataclass(frozen=True, slots=True)
class Read:
    """Frames read from the table after a cursor."""

    frames: list[Frame]
    # The read stopped at one of its bounds (rows or bytes): more may follow.
    full: bool


def read_frames_now(run_id: str, after_seq: int, rows: int = PAGE) -> Read:
    """`read_frames` on the calling thread, which it leaves without a connection."""
    return _read_sync(run_id, after_seq, rows)


def frames_of(read: EventsRead, rows: int) -> Read:
    """The frames of `read`, a read of at most `rows` events."""
    return Read(frames=[make_frame(*row) for row in read.rows], full=read.cut or len(read.rows) >= rows)


def _read_sync(run_id: str, after_seq: int, rows: int) -> Read:
    try:
        read = run_events_json_bounded(run_id=run_id, after_seq=after_seq, limit=rows, max_bytes=conf.MAX_PAGE_BYTES)
        return frames_of(read, rows)
    finally:
        # The connection belongs to this pool thread; closing it is what keeps idle streams free of
        # database connections (a pooled backend would return it here instead).
        connection.close()


def _page_sync(run_id: str, after_seq: int, rows: int) -> Read:
    try:
        page = run_events_frames(run_id=run_id, after_seq=after_seq, limit=rows, max_bytes=conf.MAX_PAGE_BYTES)
    finally:
        connection.close()
    if page.last_seq is None:
        return Read(frames=[], full=False)
    frame = Frame(seq=page.last_seq, data=page.text.encode(), terminal=page.terminal)
    return Read(frames=[frame], full=page.cut or page.count >= rows)


def _last_seqs_sync(run_ids: list[str]) -> dict[str, int]:
    try:
        found: dict[str, int] = {}
        for i in range(0, len(run_ids), 1000):
            found.update(run_last_seqs(run_ids=run_ids[i : i + 1000]))
        return found
    finally:
        connection.close()


async def _run_sync(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return await sync_to_async(fn, thread_sensitive=False, executor=_read_executor)(*args, **kwargs)


async def read_frames(run_id: str, after_seq: int, rows: int = PAGE) -> Read:
    """Stored events with seq > after_seq as frames, at most `rows` and RUNLEDGER_MAX_PAGE_BYTES of
    them (one at least), read on the pool (not the request's thread)."""
    return await _run_sync(_read_sync, run_id, after_seq, rows)


async def read_page(run_id: str, after_seq: int, rows: int = PAGE) -> Read:
    """`read_frames` as one frame of the whole page (runs.selectors.wire), for a watcher
    behind the buffer, which only sends it on: one object a page instead of one an event."""
    return await _run_sync(_page_sync, run_id, after_seq, rows)


def detached(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> "asyncio.Task[T]":
    # An empty context: a task started while serving a request must not inherit that request's
    # ThreadSensitiveContext, which is torn down when the request ends while the task lives on.
    return loop.create_task(coro, context=contextvars.Context())


class RunFeed:
    """The watchers of one run in this process, its recent frames, and the pump that reads them."""

    def __init__(self, hub: "Hub", run_id: str, *, head: int, ended: bool) -> None:
        self.hub = hub
        self.run_id = run_id
        # Every event with seq <= head is committed; frames holds a contiguous tail of them, the
        # last BUFFER unless they pass BUFFER_BYTES, the last one always (a list trimmed now and
        # then: readers slice it, O(what they take)); `buffered` is the bytes of its frames.
        self.head = head
        self.frames: list[Frame] = []
        self.buffered = 0
        self.ended = ended
        self.watchers = 0
        # Advances with head; a shared read is only joined by watchers of the same version.
        self.version = 0
        self._reads: dict[tuple[int, int], asyncio.Task[Read]] = {}
        self._wake = asyncio.Event()  # set by the hub at once if what the caller read may be behind
        # Resolved at the next advance of head (a dict: a watcher woken otherwise takes its own out).
        self._waiters: dict[asyncio.Future[None], None] = {}
        self._pump_task: asyncio.Task[None] | None = None

    def waiter(self) -> "asyncio.Future[None]":
        """A future resolved at the next advance of head. Take it with no await since looking at
        frames (so no advance can fall between), and `drop` it if woken otherwise."""
        waiter = self.hub.loop.create_future()
        self._waiters[waiter] = None
        return waiter

    def drop(self, waiter: "asyncio.Future[None]") -> None:
        self._waiters.pop(waiter, None)

    def wake(self) -> None:
        self._wake.set()

    def frames_after(self, cursor: int) -> list[Frame] | None:
        """Buffered frames with seq > cursor; [] when caught up; None when not buffered (read them)."""
        if cursor >= self.head:
            return []
        if not self.frames or self.frames[0].seq > cursor + 1:
            return None
        return self.frames[cursor + 1 - self.frames[0].seq :]

    async def read(self, after_seq: int) -> list[Frame]:
        """A page of frames after `after_seq` from the table, for a watcher the buffer cannot serve.

        Watchers at the same cursor share one query — if it started since head last advanced: an
        older read might not reach head, and a watcher behind head would then wait for nothing.
        """
        key = (after_seq, self.version)
        task = self._reads.get(key)
        if task is None:
            task = self._reads[key] = detached(self.hub.loop, read_page(self.run_id, after_seq))

            def forget(done: "asyncio.Task[Read]") -> None:
                if self._reads.get(key) is done:
                    del self._reads[key]
                if not done.cancelled():
                    done.exception()  # retrieved here, so an unawaited failure is not logged twice

            task.add_done_callback(forget)
        # Shielded: a watcher that disconnects mid-read must not cancel the others' read.
        return (await asyncio.shield(task)).frames

    def start(self) -> None:
        if not self.ended:
            self._pump_task = detached(self.hub.loop, self._pump())

    def stop(self) -> None:
        if self._pump_task is not None:
            self._pump_task.cancel()
            self._pump_task = None

    def carried(self, frames: list[Frame]) -> None:
        """The frames a notification carried: published if they reach head (`_publish` drops those
        it has), else read."""
        if frames[0].seq <= self.head + 1:
            self._publish(frames)
        else:
            self.wake()

    def _publish(self, frames: list[Frame]) -> None:
        # A read in flight as a notification's events were published may bring some of them again.
        if frames[0].seq <= self.head:
            frames = [frame for frame in frames if frame.seq > self.head]
            if not frames:
                return
        if frames[0].seq != self.head + 1:
            # Cannot happen with a gap-free log; if it ever does, stop serving the buffer rather
            # than splice a hole into it — watchers then read the table themselves.
            log.error("run %s: read from %s started at %s", self.run_id, self.head, frames[0].seq)
            self.frames.clear()
            self.buffered = 0
        self.frames.extend(frames)
        self.buffered += sum(len(frame.data) for frame in frames)
        if len(self.frames) > 2 * BUFFER or self.buffered > 2 * BUFFER_BYTES:
            self._trim()
        self.head = frames[-1].seq
        self.version += 1
        self.ended = self.ended or frames[-1].terminal
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _trim(self) -> None:
        """Drop the oldest frames down to the last BUFFER and BUFFER_BYTES, keeping the newest."""
        drop, kept = 0, self.buffered
        surplus = len(self.frames) - BUFFER
        while drop < len(self.frames) - 1 and (drop < surplus or kept > BUFFER_BYTES):
            kept -= len(self.frames[drop].data)
            drop += 1
        del self.frames[:drop]
        self.buffered = kept

    async def _pump(self) -> None:
        while not self.ended:
            # Woken by a notification, the listener's (re)connect or the hub's poll tick.
            await self._wake.wait()
            # Cleared before reading: a notification arriving during the read causes another one.
            self._wake.clear()
            try:
                # Never a read joined in flight: it must start after what woke the pump.
                read = await read_frames(self.run_id, self.head)
            except DatabaseError as exc:
                # The next tick wakes it again.
                log.warning("run %s: reading events failed (%s); retrying", self.run_id, exc)
                continue
            except Exception:
                # Whatever it was, the watchers must not be left waiting on a dead pump.
                log.exception("run %s: reading events failed; retrying", self.run_id)
                continue
            if read.frames:
                self._publish(read.frames)
                if read.full:
                    self._wake.set()


class Hub:
    """Everything one event loop (one web process) knows about the streams it serves."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.feeds: dict[str, RunFeed] = {}
        self.recent = RecentNotes()
        self.listener: Listener | None = None
        self._listener_task: asyncio.Task[None] | None = None
        self._tick_task: asyncio.Task[None] | None = None
        self.postgresql = connections["default"].vendor == "postgresql"
        self.poll_seconds = conf.POLL_SECONDS if self.postgresql else conf.SQLITE_POLL_SECONDS

    def subscribe(self, run_id: str, *, head: int, ended: bool, mark: int | None = None) -> RunFeed:
        """Join (or create) the run's feed; `head` and `ended` are what the caller just read, and
        `mark` where the recent notes stood before that read (`RecentNotes.mark`), if it read the
        table. A new feed then takes what committed since from the notes heard since, else it reads
        at once."""
        self._ensure_listener()
        self._ensure_tick()
        feed = self.feeds.get(run_id)
        if feed is None:
            feed = self.feeds[run_id] = RunFeed(self, run_id, head=head, ended=ended)
            feed.start()
            heard = self.recent.after(run_id, head, mark)
            if heard is None:
                feed.wake()
            for seq, payload in heard or ():
                self._heard(feed, seq, payload)
        feed.watchers += 1
        return feed

    def unsubscribe(self, feed: RunFeed) -> None:
        feed.watchers -= 1
        if feed.watchers <= 0 and self.feeds.get(feed.run_id) is feed:
            del self.feeds[feed.run_id]
            feed.stop()

    def _ensure_listener(self) -> None:
        if not self.postgresql:
            return
        if self._listener_task is not None and not self._listener_task.done():
            return
        self.listener = Listener(
            role="web",
            on_notify=self._on_notify,
            on_connect=self._on_connect,
            on_disconnect=self.recent.disconnected,
            channels=(notify.EVENTS,),
        )
        self._listener_task = detached(self.loop, self.listener.run())
        self._listener_task.add_done_callback(_log_task_end)

    def _ensure_tick(self) -> None:
        if self._tick_task is None or self._tick_task.done():
            self._tick_task = detached(self.loop, self._tick())
            self._tick_task.add_done_callback(_log_task_end)

    async def _tick(self) -> None:
        """The backstop for lost notifications (and the only wake-up on SQLite)."""
        while True:
            await asyncio.sleep(self.poll_seconds)
            heads = {run_id: feed.head for run_id, feed in self.feeds.items() if not feed.ended}
            if not heads:
                continue
            try:
                last_seqs = await _run_sync(_last_seqs_sync, list(heads))
            except DatabaseError as exc:
                log.warning("SSE poll failed (%s); retrying", exc)
                continue
            for run_id, last_seq in last_seqs.items():
                feed = self.feeds.get(run_id)
                if feed is not None and last_seq > feed.head:
                    feed.wake()

    def _on_notify(self, channel: str, payload: str) -> None:
        if channel != notify.EVENTS:
            return
        try:
            run_id, seq = notify.parse_events_payload(payload)
        except ValueError:
            log.warning("ignoring malformed %s payload %r", channel, payload)
            return
        self.recent.add(run_id, seq, payload)
        feed = self.feeds.get(run_id)
        if feed is not None:
            self._heard(feed, seq, payload)

    def _heard(self, feed: RunFeed, seq: int, payload: str) -> None:
        """The note of `feed`'s run that the run got to `seq`, with the events it carries if any."""
        if seq <= feed.head or feed.ended:
            return
        carried = notify.carried_events(payload)
        if carried is None:
            feed.wake()
            return
        try:
            frames = [make_frame(*row) for row in carried_events_rows(carried)]
        except ValueError:
            log.warning("ignoring the malformed events of %s payload %r", notify.EVENTS, payload[:200])
            feed.wake()
            return
        if frames and frames[-1].seq == seq:
            feed.carried(frames)
        else:
            feed.wake()

    def _on_connect(self) -> None:
        # Whatever was committed while the connection was down was announced to nobody.
        self.recent.connected()
        for feed in self.feeds.values():
            feed.wake()


def _log_task_end(task: "asyncio.Task[None]") -> None:
    if not task.cancelled() and task.exception() is not None:
        # The next stream that subscribes starts a new one.
        log.error("SSE background task stopped", exc_info=task.exception())


def loop_local(make: Callable[[asyncio.AbstractEventLoop], T]) -> Callable[[], T]:
    """A getter of this process's one `make(loop)`, bound to the running event loop (a new loop
    gets a new one)."""
    current: list[tuple[asyncio.AbstractEventLoop, T]] = []

    def get() -> T:
        loop = asyncio.get_running_loop()
        if not current or current[0][0] is not loop:
            current[:] = [(loop, make(loop))]
        return current[0][1]

    return get


# This process's hub.
get_hub = loop_local(Hub)

"""A new feed takes what committed after its opening's read from the notes the hub heard since,
with no read, only when those notes are vouched for (runs.streaming.recent); else it reads at once.
On a real listener and real commits."""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from runs import services
from runs.models import Run
from runs.selectors.wire import run_events_json_after
from runs.streaming.hub import Hub, RunFeed, make_frame
from runs.streaming.recent import RecentNotes
from tests.factories import running_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def test_the_notes_vouch_only_for_marks_read_while_listening_since_and_nothing_dropped() -> None:
    notes = RecentNotes(notes=3, size=10_000)
    assert notes.mark() is None  # not listening yet
    notes.connected()
    mark = notes.mark()
    notes.add("a", 2, "a:2")
    notes.add("b", 7, "b:7")
    notes.add("a", 4, "a:4")
    assert notes.after("a", 2, mark) == [(4, "a:4")]  # only past the seq the reader got to
    assert notes.after("c", 0, mark) == []  # nothing heard for it: nothing committed since
    assert notes.after("a", 0, notes.mark()) == []  # heard before the mark: the read saw it
    notes.add("b", 8, "b:8")  # the fourth: a:2 dropped
    assert notes.after("a", 2, mark) is None
    later = notes.mark()
    assert notes.after("a", 0, later) == []
    notes.disconnected()
    assert notes.mark() is None and notes.after("a", 0, later) is None
    notes.connected()  # what was sent meanwhile is lost: no mark from before vouches
    assert notes.after("a", 0, later) is None and notes.after("a", 0, notes.mark()) == []
    by_size = RecentNotes(notes=100, size=10)
    by_size.connected()
    mark = by_size.mark()
    by_size.add("a", 1, "a:1")
    by_size.add("a", 2, "x" * 10)
    assert by_size.after("a", 0, mark) is None


def _append(run: Run, data: dict[str, Any]) -> None:
    try:
        services.run_events_append(run_id=run.pk, generation=run.generation, events=[("output.delta", data)])
    finally:
        connection.close()


def _last_seq(run: Run) -> int:
    try:
        return Run.objects.values_list("last_seq", flat=True).get(pk=run.pk)
    finally:
        connection.close()


async def _until(done: Callable[[], bool]) -> None:
    async with asyncio.timeout(15):
        while not done():
            await asyncio.sleep(0.005)


async def _listening(hub: Hub) -> None:
    hub._ensure_listener()
    assert hub.listener is not None
    await asyncio.wait_for(hub.listener.connected.wait(), 15)


async def _close(hub: Hub, feed: RunFeed) -> None:
    hub.unsubscribe(feed)
    for task in (hub._listener_task, hub._tick_task):
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


Step = Callable[[Hub, Run], Awaitable[None]] | None


def _opened(
    run: Run, data: dict[str, Any], before: Step = None, after: Step = None, hub_notes: int = 2000
) -> tuple[int, bool, list[bytes], int, list[bytes]]:
    """Mark, read the run's head, commit an event, hear its note, then start the run's feed: its
    head and whether it was woken to read as it started, its frames then, and after its pump.
    `before` and `after`: what else happens before the event commits, and once its note is heard."""

    async def main() -> tuple[int, bool, list[bytes], int, list[bytes]]:
        hub = Hub(asyncio.get_running_loop())
        hub.recent = RecentNotes(notes=hub_notes)
        await _listening(hub)
        mark = hub.recent.mark()
        head = await asyncio.to_thread(_last_seq, run)
        if before is not None:
            await before(hub, run)
        heard = hub.recent.heard
        await asyncio.to_thread(_append, run, data)
        await _until(lambda: hub.recent.heard > heard)
        if after is not None:
            await after(hub, run)
        feed = hub.subscribe(str(run.pk), head=head, ended=False, mark=mark)
        started = feed.head, feed._wake.is_set(), [frame.data for frame in feed.frames]
        await _until(lambda: feed.head > head)
        pumped = feed.head, [frame.data for frame in feed.frames]
        await _close(hub, feed)
        return *started, *pumped

    return asyncio.run(main())


def _frames_after(run: Run, seq: int) -> list[bytes]:
    return [make_frame(*row).data for row in run_events_json_after(run_id=run.pk, after_seq=seq, limit=10)]


def test_a_new_feed_takes_what_committed_after_its_read_from_the_notes_heard_since_without_a_read(
    alice: User,
) -> None:
    run = running_run(alice)  # run.created, run.started
    head, woken, frames, *_ = _opened(run, {"text": "hi"})
    # There as it starts, before any await: from the note, not from a read.
    assert (head, woken) == (3, False)
    assert frames == _frames_after(run, 2)


def _running(owner_id: int) -> Run:
    try:
        return running_run(User.objects.get(pk=owner_id))
    finally:
        connection.close()


async def _reconnect(hub: Hub, run: Run) -> None:
    assert hub.listener is not None
    connects = hub.listener.connects
    await asyncio.to_thread(_terminate, hub.listener.application_name)
    await _until(lambda: hub.listener is not None and hub.listener.connects > connects)


def _terminate(application_name: str) -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", [application_name]
            )
    finally:
        connection.close()


async def _others(hub: Hub, run: Run) -> None:
    other = await asyncio.to_thread(_running, run.owner_id)
    heard = hub.recent.heard
    await asyncio.to_thread(_append, other, {"text": "elsewhere"})
    await _until(lambda: hub.recent.heard > heard)


@pytest.mark.parametrize(
    "why, data, before, after",
    [
        # Heard nothing meanwhile: only the reconnect tells the mark from one that vouches.
        ("the listener reconnected since the mark: notes may have been lost", {"text": "hi"}, _reconnect, None),
        ("the run's note was dropped for newer ones", {"text": "hi"}, None, _others),
        ("the note carries no events: they did not fit", {"text": "x" * 8000}, None, None),
    ],
)
def test_a_new_feed_reads_at_once_when_the_notes_cannot_say_and_gets_the_same_events(
    alice: User, why: str, data: dict[str, Any], before: Step, after: Step
) -> None:
    run = running_run(alice)
    head, woken, frames, read_head, read = _opened(run, data, before, after, hub_notes=2)
    assert (head, woken, frames) == (2, True, []), why
    assert (read_head, read) == (3, _frames_after(run, 2)), why

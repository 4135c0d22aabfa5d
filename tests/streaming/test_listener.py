import asyncio
import queue
import threading
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.db import connection

from runs import notify, services
from runs.notify.listener import Listener
from runs.selectors.wire import carried_events_rows, run_events_json_after
from runs.streaming.hub import Hub, RunFeed, make_frame
from tests.factories import queued_run, running_run

pytestmark = pytest.mark.django_db(transaction=True)


class ListenerThread:
    def __init__(self) -> None:
        self.notes: queue.Queue[tuple[str, str]] = queue.Queue()
        self.connects: queue.Queue[int] = queue.Queue()
        self.unread: list[tuple[str, str]] = []
        self.listener = Listener(
            role="test",
            on_notify=lambda channel, payload: self.notes.put((channel, payload)),
            on_connect=lambda: self.connects.put(1),
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self.listener.run(),))

    def next_note(self, channel: str) -> str:
        """The oldest unread note on `channel`; notes on other channels stay for later reads."""
        while True:
            for i, (got_channel, payload) in enumerate(self.unread):
                if got_channel == channel:
                    del self.unread[i]
                    return payload
            self.unread.append(self.notes.get(timeout=10))

    def stop(self) -> None:
        self.listener.stop()
        self.thread.join(timeout=15)
        self.loop.close()


@pytest.fixture
def listening() -> Iterator[ListenerThread]:
    lt = ListenerThread()
    lt.thread.start()
    lt.connects.get(timeout=10)
    yield lt
    lt.stop()


def test_commits_are_heard_and_rollbacks_are_not(listening: ListenerThread, alice: User) -> None:
    run = queued_run(alice)
    assert listening.next_note(notify.QUEUE) == str(run.pk)
    assert notify.parse_events_payload(listening.next_note(notify.EVENTS)) == (str(run.pk), 1)
    services.run_cancel(run_id=run.pk, actor=alice)
    assert listening.next_note(notify.CONTROL) == f"{run.pk}:cancelled"

    with pytest.raises(RuntimeError):
        from django.db import transaction

        with transaction.atomic():
            notify.send(notify.control_changed(run.pk, "cancelled"))
            raise RuntimeError("rolled back")
    marker = queued_run(alice)
    # The next control-channel note after the rollback is not the rolled-back one.
    services.run_cancel(run_id=marker.pk, actor=alice)
    assert listening.next_note(notify.CONTROL) == f"{marker.pk}:cancelled"


def test_the_listener_reconnects_after_its_connection_is_killed(listening: ListenerThread, alice: User) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            [listening.listener.application_name],
        )
        assert cursor.fetchone() == (True,)
    listening.connects.get(timeout=15)  # on_connect runs again: consumers re-read what they missed
    run = queued_run(alice)
    assert listening.next_note(notify.QUEUE) == str(run.pk)


def test_an_events_note_carries_the_events_as_a_read_gives_them_unless_they_do_not_fit(
    listening: ListenerThread, alice: User
) -> None:
    """The events a write inserts go in its notification when they fit (runs.selectors.wire
    `carried_events_sql`): the rows, and so the bytes, a read of the table gives, whatever their
    data — strings PostgreSQL prints otherwise, numbers, nesting, other scripts. Too big, the note
    says only how far the run got, and its readers read."""
    run = running_run(alice)  # run.created, run.started
    odd = [{"text": "a, b: c"}, {"n": 1.5, "big": 10**20, "s": 'é ✓ "q"\n', "nested": {"b": [1, {"a": None}]}}, {}]
    services.run_events_append(run_id=run.pk, generation=1, events=[("output.delta", data) for data in odd])
    services.run_events_append(run_id=run.pk, generation=1, events=[("output.delta", {"text": "x" * 8000})])
    notes: list[str] = []
    while not notes or notify.parse_events_payload(notes[-1])[1] < 6:
        notes.append(listening.next_note(notify.EVENTS))
    carried = [notify.carried_events(note) for note in notes]
    assert carried[-1] is None and notify.parse_events_payload(notes[-1]) == (str(run.pk), 6)
    rows = [row for events in carried[:-1] if events is not None for row in carried_events_rows(events)]
    assert rows == run_events_json_after(run_id=run.pk, after_seq=0, limit=5)
    assert [seq for seq, _, _ in rows] == [1, 2, 3, 4, 5]


def test_a_feed_publishes_the_events_a_note_carries_without_a_read_and_reads_past_a_gap(
    listening: ListenerThread, alice: User
) -> None:
    """A feed at the run's head before a note takes its events as they are (docs/design/streaming.md#hub);
    one further behind is woken to read, as by a note that carries none."""
    run = running_run(alice)
    services.run_events_append(run_id=run.pk, generation=1, events=[("output.delta", {"text": "hi"})])
    note = ""
    while notify.parse_events_payload(note or "x:0")[1] < 3:
        note = listening.next_note(notify.EVENTS)

    async def heard_at(head: int) -> tuple[int, list[bytes], bool]:
        hub = Hub(asyncio.get_running_loop())
        # Not started: no pump, so nothing here reads the table.
        feed = hub.feeds[str(run.pk)] = RunFeed(hub, str(run.pk), head=head, ended=False)
        feed._wake.clear()
        hub._on_notify(notify.EVENTS, note)
        return feed.head, [frame.data for frame in feed.frames], feed._wake.is_set()

    read = [make_frame(*row).data for row in run_events_json_after(run_id=run.pk, after_seq=2, limit=1)]
    assert asyncio.run(heard_at(2)) == (3, read, False)
    assert asyncio.run(heard_at(1)) == (1, [], True)

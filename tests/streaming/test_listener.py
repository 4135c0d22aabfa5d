import asyncio
import queue
import threading
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.db import connection

from runs import notify, services
from runs.notify.listener import Listener
from tests.factories import queued_run

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
    assert listening.next_note(notify.EVENTS) == f"{run.pk}:1"
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

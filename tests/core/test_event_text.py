"""The events as the hot path sends them — their JSON made compact by PostgreSQL where it can
(runs.selectors.wire.run_events_json_bounded), pages of them joined (runs/selectors/wire.py) — are
byte for byte what Python writes of each event (`event_json` of the model, the SSE frame), whatever
the events hold: strings with the separators jsonb prints, escapes, any character, numbers with
fractions; and pages stop where `run_events_json_bounded` stops."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runs import services
from runs.events import TERMINAL_EVENT_TYPES
from runs.models import Run, RunEvent
from runs.selectors.wire import event_json, run_events_frames, run_events_items, run_events_json_bounded, sse_frame
from tests.factories import running_run
from tests.support.sse import SSEParser

pytestmark = [pytest.mark.sqlite, pytest.mark.timeout(120)]

AWKWARD: list[Any] = [
    {},
    {"empty": [], "also": {}},
    {"text": "plain"},
    {"text": "a, b: c"},
    {"a, b": "x", "c: d": [", ", ": ", ",", ":"]},
    {"text": 'quote " and \\ backslash, then: \\", "'},
    {"text": "\n\r\t\b\f\x01\x1f\x7f é ü 𝄞 \u2028 中文"},
    {"nested": {"deeper": [{"k": None}, True, False, 0, -1, 12345678901234567890]}},
    {"float": 1.5, "small": 1e-05, "tiny": 5e-324, "big": 1e16, "neg": -0.0, "third": 1 / 3},
    {"in_text_only": "1.5 and 0.00001"},
    {"a, b": "a string, with: separators", "n": 3.25, "none": None},
    {"long": "x, " * 5000},
]


def written_by_python(run: Run, after: int) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run=run, seq__gt=after).order_by("seq"))


def assert_pages_match(run: Run, after: int = 0, *, limit: int = 1000, max_bytes: int | None = None) -> None:
    run.refresh_from_db()
    events = written_by_python(run, after)
    frames = run_events_frames(run_id=run.pk, after_seq=after, limit=limit, max_bytes=max_bytes)
    items = run_events_items(run_id=run.pk, after_seq=after, limit=limit, max_bytes=max_bytes)
    rows = run_events_json_bounded(run_id=run.pk, after_seq=after, limit=limit, max_bytes=max_bytes)
    taken = events[: len(rows.rows)]
    assert frames.text == "".join(sse_frame(e.seq, e.type, event_json(e)) for e in taken)
    assert items.text == ",".join(event_json(e) for e in taken)
    for page in (frames, items):
        assert (page.count, page.cut) == (len(rows.rows), rows.cut)
        assert page.last_seq == (taken[-1].seq if taken else None)
        assert page.terminal == (bool(taken) and taken[-1].type in TERMINAL_EVENT_TYPES)
        # Read with the events where the backend can (PostgreSQL, a page not empty).
        assert page.run_state in (None, (run.status, run.last_seq))


@pytest.mark.django_db
def test_awkward_data_is_written_as_python_writes_it(alice: User) -> None:
    run = running_run(alice)
    services.run_events_append(run_id=run.pk, generation=1, events=[("output.delta", value) for value in AWKWARD])
    services.run_complete(run_id=run.pk, generation=1, output={"done": "yes, really: 1.5"})
    run.refresh_from_db()
    for after in range(run.last_seq + 1):
        assert_pages_match(run, after)
    ended = run_events_frames(run_id=run.pk, after_seq=run.last_seq - 1, limit=10, max_bytes=None)
    assert ended.terminal and ended.count == 1


@pytest.mark.django_db
def test_pages_stop_where_the_row_and_byte_bounds_stop_them(alice: User) -> None:
    run = running_run(alice)
    services.run_events_append(
        run_id=run.pk, generation=1, events=[("output.delta", {"text": "y, " * (100 * i)}) for i in range(30)]
    )
    run.refresh_from_db()
    for limit in (1, 2, 7, 1000):
        for max_bytes in (None, 1, 600, 5000, 50_000):
            assert_pages_match(run, 0, limit=limit, max_bytes=max_bytes)
            assert_pages_match(run, 5, limit=limit, max_bytes=max_bytes)


# Any character PostgreSQL text can hold: no NUL, no lone surrogate.
storable_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | storable_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(storable_text, children, max_size=4),
    max_leaves=12,
)


@pytest.mark.django_db
@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(json_values, min_size=1, max_size=5))
def test_any_stored_data_is_written_as_python_writes_it(alice: User, values: list[Any]) -> None:
    run = Run.objects.filter(owner=alice, status="running").first() or running_run(alice)
    run.refresh_from_db()
    after = run.last_seq
    services.run_events_append(run_id=run.pk, generation=1, events=[("output.delta", {"v": v}) for v in values])
    assert_pages_match(run, after)


def resumed_after_cut(text: bytes, cut: int, *, id_at_parse: bool) -> list[int]:
    """The seqs a client delivers when its stream of `text` is cut after `cut` bytes and it resumes
    from its last event id with the rest of the log, as the server replays it."""
    parser = SSEParser(id_at_parse=id_at_parse)
    delivered = [event.seq for event in parser.feed(text[:cut])]
    resume_at = int(parser.last_event_id or 0)
    rest = SSEParser().feed(text)
    return delivered + [event.seq for event in rest if event.seq > resume_at]


@pytest.mark.django_db
def test_a_client_that_takes_ids_as_it_parses_them_loses_an_event_only_to_a_cut_in_its_frames_last_byte(
    alice: User,
) -> None:
    # docs/design/streaming.md#frames: `id:` is every frame's last field.
    run = running_run(alice)
    deltas = [("output.delta", {"text": f"d{n}"}) for n in range(3)]
    services.run_events_append(run_id=run.pk, generation=run.generation, events=deltas)
    run.refresh_from_db()
    text = run_events_frames(run_id=run.pk, after_seq=0, limit=100, max_bytes=None).text.encode()
    every = [event.seq for event in SSEParser().feed(text)]
    assert every == list(range(1, run.last_seq + 1))
    # The offsets between a frame's `id:` line and the blank line that dispatches it.
    last_bytes = {index + 1 for index in range(len(text) - 1) if text[index : index + 2] == b"\n\n"}
    for cut in range(len(text) + 1):
        assert resumed_after_cut(text, cut, id_at_parse=False) == every, cut  # EventSource: exact
        taken_at_parse = resumed_after_cut(text, cut, id_at_parse=True)
        if cut in last_bytes:
            (lost,) = set(every) - set(taken_at_parse)  # that frame's event, and only it
            assert text[:cut].endswith(f"id: {lost}\n".encode()), cut
        else:
            assert taken_at_parse == every, cut

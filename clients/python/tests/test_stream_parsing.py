"""The pure parts of a stream: the event-stream decoder and the reconnect state machine."""

import json

import httpx
import pytest

from runledger_client import NotAuthenticated, NotFound, PermissionDenied, Retry, TransportError, ValidationError
from runledger_client._stream import Frame, SSEDecoder, StreamState


def frame(seq: int, type_: str = "output.delta", **data: object) -> bytes:
    body = json.dumps({"seq": seq, "type": type_, "data": data, "created_at": "2026-01-01T00:00:00Z", "attempt": 1})
    return f"id: {seq}\nevent: {type_}\ndata: {body}\n\n".encode()


STREAM = (
    b"retry: 2000\n\n" + b": keep-alive\n\n" + frame(1, text="a") + frame(2, text="b\u00e9") + frame(3, "run.completed")
)


def test_decoder_dispatches_the_same_frames_however_the_bytes_are_split() -> None:
    whole = SSEDecoder().feed(STREAM)
    assert [f.id for f in whole] == ["1", "2", "3"]
    for size in (1, 2, 3, 7, 64):
        decoder = SSEDecoder()
        got: list[Frame] = []
        for i in range(0, len(STREAM), size):
            got += decoder.feed(STREAM[i : i + size])
        assert got == whole, size
        assert decoder.retry == 2000


def test_decoder_reads_crlf_and_cr_line_ends_and_multi_line_data() -> None:
    text = b"id: 7\r\nevent: x.y\r\ndata: one\r\ndata: two\r\n\r\nid: 8\rdata: three\r\r"
    for size in (1, len(text)):
        decoder = SSEDecoder()
        got: list[Frame] = []
        for i in range(0, len(text), size):
            got += decoder.feed(text[i : i + size])
        assert got == [Frame("7", "x.y", "one\ntwo"), Frame("8", "message", "three")]


def test_a_frame_without_its_blank_line_is_never_dispatched() -> None:
    decoder = SSEDecoder()
    cut = frame(1)[:-1]  # everything but the blank line that ends it
    assert decoder.feed(cut) == []
    assert StreamState("r", 0, Retry()).feed(cut) == []


def completed_state(after_seq: int = 0) -> StreamState:
    state = StreamState("run-1", after_seq, Retry(base=0.01, cap=1.0, stream_attempts=3))
    state.connect_headers()
    return state


def test_state_yields_each_seq_once_in_order_and_finishes_at_the_terminal_event() -> None:
    state = completed_state()
    assert [e.seq for e in state.feed(frame(1) + frame(2))] == [1, 2]
    headers = state.connect_headers()  # a reconnect
    assert headers["Last-Event-ID"] == "2"
    # The server replays what the client already has (e.g. after_seq on a fresh request): dropped.
    assert [e.seq for e in state.feed(frame(1) + frame(2) + frame(3) + frame(4, "run.failed"))] == [3, 4]
    assert state.finished and state.cursor == 4


def test_state_sends_after_seq_first_and_last_event_id_only_after_progress() -> None:
    state = StreamState("run-1", 5, Retry())
    assert state.params == {"after_seq": "5"}
    assert "Last-Event-ID" not in state.connect_headers()
    state.feed(frame(6))
    assert state.connect_headers()["Last-Event-ID"] == "6"


def error(status: int, code: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": code, "detail": None}}, headers=headers)


@pytest.mark.parametrize(
    ("status", "code", "exception"),
    [
        (401, "not_authenticated", NotAuthenticated),
        (403, "permission_denied", PermissionDenied),
        (404, "not_found", NotFound),
        (400, "validation_error", ValidationError),
    ],
)
def test_state_stops_on_a_refusal_with_its_typed_error(status: int, code: str, exception: type[Exception]) -> None:
    with pytest.raises(exception):
        completed_state().opened(error(status, code))


def test_state_ends_on_204() -> None:
    state = completed_state()
    assert state.opened(httpx.Response(204)) is False
    assert state.finished


def test_state_honours_retry_after_a_stream_it_read_and_backs_off_after_refused_connects() -> None:
    state = completed_state()
    assert state.opened(httpx.Response(200))
    state.feed(b"retry: 40\n\n" + frame(1))
    assert 0.040 <= state.next_delay() <= 0.060  # the server's retry, with jitter upward only
    state.connect_headers()
    assert not state.opened(error(503, "database_unavailable", {"Retry-After": "0.2"}))
    assert state.next_delay() >= 0.2  # never sooner than Retry-After
    state.connect_headers()
    state.lost(httpx.ConnectError("refused"))
    assert state.next_delay() >= 0.04 * 2  # doubling from the server's retry
    state.connect_headers()
    state.lost(httpx.ConnectError("refused"))
    with pytest.raises(TransportError):
        state.next_delay()  # three connects in a row refused: stream_attempts=3


def test_an_accepted_connect_resets_the_failures() -> None:
    state = completed_state()
    for _ in range(2):
        state.connect_headers()
        state.lost(httpx.ConnectError("refused"))
        state.next_delay()
    state.connect_headers()
    state.opened(httpx.Response(200))
    state.next_delay()
    assert state.failures == 0

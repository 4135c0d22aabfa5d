"""The edge's protocol in this process (docs/design/edge.md): Grip-Last, publish items and their size,
the publisher's one statement, holds and links, the control folder; and without an edge, a valid
signature changes nothing."""

import base64
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.conf import conf
from runs.events import EventType
from runs.selectors.published import runs_events_after_heads
from runs.selectors.wire import run_events_json_after
from runs.setting_kinds import socket_path
from runs.streaming.edge import grip
from runs.streaming.edge.control import (
    bodies,
    folder_problem,
    parse_tnetstring,
    private_folder,
    tnetstring,
)
from runs.streaming.edge.link import Link, mint, read
from runs.streaming.edge.publisher import _groups, lock_key
from runs.streaming.hub import make_frame
from tests.factories import running_run
from tests.support.edge import signed
from tests.support.procs import Procs, subprocess_env, uvicorn_refusal
from tests.support.runs import fresh
from tests.support.sse import request_once, stream_path

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_grip_last_is_read_for_the_runs_channel_only() -> None:
    factory = RequestFactory()
    one = factory.get("/", HTTP_GRIP_LAST="run-a; last-id=7")
    assert grip.last_id(one, "run-a") == "7"
    assert grip.last_id(one, "run-b") is None
    several = factory.get("/", HTTP_GRIP_LAST="run-b; last-id=3, run-a ;last-id=9")
    assert grip.last_id(several, "run-a") == "9"
    assert grip.last_id(factory.get("/"), "run-a") is None


def test_publish_items_carry_string_ids_and_bodies_stay_under_the_limit() -> None:
    first = grip.item("run-x", [make_frame(1, EventType.RUN_CREATED, "{}")])
    assert (first["id"], first["prev-id"]) == ("1", "0")
    # Events read together go out as one item: the chain of items is the chain of seqs, and each
    # frame keeps its own id line.
    several = grip.item("run-x", [make_frame(n, EventType.OUTPUT_DELTA, "{}") for n in (4, 5, 6)])
    assert (several["id"], several["prev-id"]) == ("6", "3")
    content = several["formats"]["http-stream"]["content"]
    assert [line for line in content.splitlines() if line.startswith("id: ")] == ["id: 4", "id: 5", "id: 6"]
    # The close follows the terminal event, with an id no hold can have (Pushpin keeps the channel's
    # last id); sent again, it carries none (Pushpin would drop an id it saw) and skips the sequencer.
    assert grip.close_item("run-x", 9) == {
        "channel": "run-x",
        "id": "9-end",
        "prev-id": "9",
        "formats": {"http-stream": {"action": "close"}},
    }
    assert grip.close_again_item("run-x", 9) == {
        "channel": "run-x",
        "prev-id": "9",
        "no-seq": True,
        "formats": {"http-stream": {"action": "close"}},
    }
    assert tnetstring(grip.close_again_item("run-x", 9)).count(b"4:true!") == 1
    frames = [make_frame(n, EventType.OUTPUT_DELTA, '"' + "x" * 100_000 + '"') for n in range(1, 21)]
    groups = _groups(frames)
    assert [f.seq for group in groups for f in group] == list(range(1, 21))
    found = bodies([grip.item("run-x", group) for group in groups])
    assert len(found) > 1 and all(len(body) <= 512 * 1024 for body in found)
    # ZRPC's encoding (tnetstring): the items come back as they were, text as bytes.
    items = [i for body in found for i in parse_tnetstring(body)[0]["items"]]
    assert [(i["prev-id"], i["id"]) for i in items] == [(str(n - 1).encode(), str(n).encode()) for n in range(1, 21)]
    assert parse_tnetstring(tnetstring({"a": [1, True, None, "é"]})) == ({"a": [1, True, None, "é".encode()]}, b"")
    small = _groups([make_frame(n, EventType.OUTPUT_DELTA, "{}") for n in range(1, 101)])
    assert len(small) == 1
    # The publishers of one set of Pushpins share a lock, whatever order the set is given in.
    assert lock_key(["ipc:///a", "ipc:///b"]) == lock_key(["ipc:///b", "ipc:///a"]) != lock_key(["ipc:///a"])


@pytest.mark.sqlite
def test_the_publisher_reads_every_run_named_in_one_statement(alice: User) -> None:
    first, second, ended = running_run(alice), running_run(alice), running_run(alice)
    for run, n in ((first, 3), (second, 2)):
        deltas = [(EventType.OUTPUT_DELTA, {"text": str(i)}) for i in range(n)]
        services.run_events_append(run_id=run.pk, generation=fresh(run).generation, events=deltas)
    services.run_complete(run_id=ended.pk, generation=fresh(ended).generation, output="done")
    last = fresh(first).last_seq
    heads: dict[str, int | None] = {str(first.pk): last - 2, str(second.pk): None, str(ended.pk): None}
    heads[str(uuid.uuid4())] = 0  # a run deleted since it was named
    with CaptureQueriesContext(connection) as queries:
        news = runs_events_after_heads(heads=heads, limit=2)
    if connection.vendor == "postgresql":
        assert len(queries) == 1
    assert set(news) == {str(first.pk), str(second.pk), str(ended.pk)}
    # After the head, at most `limit`, in seq order, the bytes every stream sends.
    assert [row[0] for row in news[str(first.pk)].rows] == [last - 1, last]
    assert news[str(first.pk)].rows == run_events_json_after(run_id=first.pk, after_seq=last - 2, limit=2)
    # A run not seen yet: from its first event while live; only its state once ended.
    assert [row[0] for row in news[str(second.pk)].rows] == [1, 2]
    assert news[str(ended.pk)].rows == [] and news[str(ended.pk)].status == "completed"
    assert news[str(ended.pk)].last_seq == fresh(ended).last_seq


def test_the_first_link_fetch_comes_sooner_and_every_hold_is_on_its_users_channel(settings: Any) -> None:
    settings.RUNLEDGER_GRIP_LINK_SECONDS = 600
    settings.RUNLEDGER_GRIP_LINK_FIRST_SECONDS = 120
    settings.RUNLEDGER_MAX_STREAMS_PER_USER = 20
    first = {grip.link_timeout(seconds_left=None, first=True) for _ in range(300)}
    later = {grip.link_timeout(seconds_left=None, first=False) for _ in range(300)}
    # Spread over four values, not one a second: Pushpin keeps a timer per link path and timeout.
    assert first <= {120, 140, 160, 180} and later <= {600, 700, 800, 900} and len(later) > 1
    # Sooner only for the cap's sake: with streams uncapped, nothing counts until a fetch.
    settings.RUNLEDGER_MAX_STREAMS_PER_USER = 0
    assert {grip.link_timeout(seconds_left=None, first=True) for _ in range(300)} <= {600, 700, 800, 900}
    settings.RUNLEDGER_MAX_STREAMS_PER_USER = 20
    assert grip.link_timeout(seconds_left=30.5, first=False) == 31  # never past the link's expiry
    settings.RUNLEDGER_GRIP_LINK_SECONDS = 2  # the first is never later than the others
    assert {grip.link_timeout(seconds_left=None, first=True) for _ in range(50)} <= {2, 3}
    headers = grip.hold_headers(name="run-x", prev_id=4, user_id=7, link="/l/", token="t", timeout=9)
    assert headers["Grip-Channel"] == "run-x; prev-id=4, runledger-link; prev-id=t, runledger-user-7"
    # A revocation closes that channel, with no id: every stream on it ends, wherever it is.
    assert grip.close_user_item(7) == {"channel": "runledger-user-7", "formats": {"http-stream": {"action": "close"}}}


def test_a_link_is_sealed_for_its_run_and_carries_its_credential_unreadable() -> None:
    for token_id, session_key in ((123_456_789, None), (None, "s" * 32)):
        minted = Link(run_id="r1", user_id=7, token_id=token_id, session_key=session_key, expires=1_900_000_000)
        token = mint(minted)
        assert read(run_id="r1", token=token) == minted
        assert token != mint(minted)  # a new nonce each time
        raw = base64.urlsafe_b64decode(token + "==")
        assert str(token_id or session_key).encode()[:8] not in raw
        # Another run, a changed byte, a cut: not a token.
        assert read(run_id="r2", token=token) is None
        changed = token[:20] + ("A" if token[20] != "A" else "B") + token[21:]
        assert read(run_id="r1", token=changed) is None
        assert read(run_id="r1", token=token[:-4]) is None
    assert read(run_id="r1", token="!!") is None


def test_the_control_folder_must_be_this_users_alone(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private_folder(private)
    assert stat.S_IMODE(private.stat().st_mode) == 0o700 and folder_problem(private) is None
    open_one = tmp_path / "open"
    open_one.mkdir()
    open_one.chmod(0o755)
    with pytest.raises(PermissionError, match="other users may reach it"):
        private_folder(open_one)
    link = tmp_path / "link"
    link.symlink_to(private)
    assert "is a symbolic link" in str(folder_problem(link))
    with pytest.raises(ValueError, match="ipc://"):
        socket_path("http://127.0.0.1:5561")
    with pytest.raises(ValueError, match="longer"):
        socket_path("ipc:///" + "x" * 200)


def test_a_web_process_with_an_http_control_port_refuses_to_start() -> None:
    refused = uvicorn_refusal(subprocess_env(RUNLEDGER_GRIP_URL="http://127.0.0.1:5561"))
    assert "RUNLEDGER_GRIP_URL must be a list of ipc:///PATH URLs" in refused.stderr


@pytest.mark.processes
def test_without_an_edge_a_valid_signature_changes_nothing(procs: Procs, alice: User) -> None:
    # No RUNLEDGER_GRIP_URL (the default): the stream view never looks at Grip-* headers.
    web = procs.uvicorn(env=subprocess_env())
    run = running_run(alice)
    claimed = {"Grip-Sig": signed(conf.GRIP_KEY), "Grip-Last": f"{grip.channel(str(run.pk))}; last-id=0"}
    assert request_once(web.url, stream_path(run), claimed).status == 401

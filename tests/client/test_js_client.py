"""The TypeScript client (clients/js, @runledger/client) against the real thing: its own node tests
(`node --test`) run against a uvicorn web process and a worker (one pair for the module,
tests/support/live.py), straight or through a CuttableProxy that cuts every stream connection
anywhere in a frame; what they report is compared with the database here. Also the real
@microsoft/fetch-event-source through the same cuts, and what `npm pack` would publish.

The cut offsets are seeded; the seed is printed (shown with a failure) and can be replayed with
RUNLEDGER_TEST_SEED=<seed>.
"""

import json
import random
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from runs.models import RunEvent
from tests.support.db import token_for
from tests.support.live import Live, assert_is_the_stored_log, cut_budgets, mid_frame
from tests.support.node import built, node_tests, npm, passed
from tests.support.proxies import CuttableProxy
from tests.support.seed import SEED

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def package() -> Path:
    return built()


@pytest.fixture
def env(package: Path, live: Live, proxy: CuttableProxy, alice: User, make_user: Any, tmp_path: Path) -> dict[str, str]:
    """What the node tests read: the server, straight and through the proxy, a user's token and a
    token that may stop runs and read /metrics/, and where to write their report."""
    staff = make_user(perms=("runs.stop_run", "runs.view_run"))
    return {
        "RUNLEDGER_URL": live.web.url,
        "RUNLEDGER_PROXY_URL": proxy.url,
        "RUNLEDGER_TOKEN": token_for(alice),
        "RUNLEDGER_STAFF_TOKEN": token_for(staff),
        "RUNLEDGER_REPORT": str(tmp_path / "report.json"),
    }


def read_report(env: dict[str, str]) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(Path(env["RUNLEDGER_REPORT"]).read_text())
    return report


def stored_seqs(run_id: str, types: list[str] | None = None) -> list[int]:
    events = RunEvent.objects.filter(run_id=run_id).order_by("seq")
    if types is not None:
        events = events.filter(type__in=types)
    return list(events.values_list("seq", flat=True))


def test_every_method_typed_error_and_stream_behaviour_of_the_client_against_a_live_server(
    env: dict[str, str],
) -> None:
    """test/api.test.ts (every method of runs and agents, every error class, refused streams)
    and test/stream.test.ts (chosen types, the 204, an AbortSignal that ends the stream while the
    run goes on, gaps, replays and silences from a stand-in)."""
    assert passed(node_tests(["api", "stream"], env))


def test_streams_are_the_stored_log_through_200_cuts_anywhere_in_a_frame(
    env: dict[str, str], proxy: CuttableProxy
) -> None:
    """Rounds of five runs streamed live while a worker executes them (one with chosen types),
    every stream connection cut after a random number of bytes, until 200 cuts fell."""
    print(f"seed {SEED}")
    proxy.cut_streams_after(cut_budgets(SEED))
    rounds = 0
    while proxy.cuts < 200 and rounds < 8:
        assert passed(node_tests(["cuts"], env | {"RUNLEDGER_ROUND": str(rounds)})), f"seed {SEED}"
        rounds += 1
    streams = [stream for streamed in read_report(env).values() for stream in streamed]
    assert len(streams) == 5 * rounds
    for stream in streams:
        if stream["types"] is None:
            assert_is_the_stored_log(stream["events"], stream["runId"])
        else:
            assert [e["seq"] for e in stream["events"]] == stored_seqs(
                stream["runId"], stream["types"] + ["run.completed"]
            )
    mid = sum(mid_frame(tail) for tail in proxy.cut_tails)
    print(f"{rounds} rounds, {proxy.cuts} cuts ({mid} mid-frame), {len(proxy.stream_requests())} stream requests")
    assert proxy.cuts >= 200, f"seed {SEED}"
    assert mid >= 100, f"seed {SEED}"


def after_an_id_line(tail: bytes) -> bool:
    """A cut that let `tail` through last fell between a frame's `id:` line and the blank line
    ending the frame: the only line of a frame that ends with a digit (not the `retry: 20` line
    that opens each stream)."""
    # \Z, not $: `$` also matches before a last newline, so a whole frame ("id: 5\n\n") would count.
    return re.search(rb"\d\n\Z", tail) is not None and not tail.endswith(b"y: 20\n")


ID_LINE = re.compile(rb"\nid: \d+\n")


def half_after_an_id_line(seed: int) -> Callable[[], Callable[[bytes], int | None]]:
    """For each stream connection, where the proxy cuts it: half of them right after their k-th
    `id:` line (k from 1 to 6), in that frame's last byte; the others after a random number of
    bytes, anywhere (cut_budgets)."""
    rng = random.Random(seed)
    budgets = cut_budgets(seed)

    def chooser() -> Callable[[bytes], int | None]:
        if rng.random() < 0.5:
            wanted, seen = rng.randint(1, 6), 0

            def at_an_id_line(data: bytes) -> int | None:
                nonlocal seen
                for match in ID_LINE.finditer(data):
                    seen += 1
                    if seen == wanted:
                        return match.end()
                return None

            return at_an_id_line
        left = budgets()

        def after_bytes(data: bytes) -> int | None:
            nonlocal left
            if len(data) > left:
                return left
            left -= len(data)
            return None

        return after_bytes

    return chooser


def test_fetch_event_source_loses_an_event_only_to_a_cut_in_its_frames_last_byte_and_ours_none(
    env: dict[str, str], proxy: CuttableProxy
) -> None:
    """docs/design/streaming.md#frames: the real fetch-event-source takes an event's id as it parses
    the `id:` line; with `id:` last, each event it loses is one whose frame a cut split right
    there, and it repeats none. Through the same cuts, half of them right there, the package's
    client loses nothing."""
    print(f"seed {SEED}")
    proxy.cut_streams_where(half_after_an_id_line(SEED))
    assert passed(node_tests(["fetch-event-source"], env)), f"seed {SEED}"
    delivered: dict[str, list[int]] = read_report(env)["fetch-event-source"]
    stored = {run_id: stored_seqs(run_id) for run_id in delivered}
    lost = sum(len(set(stored[run_id]) - set(seqs)) for run_id, seqs in delivered.items())
    total = sum(len(seqs) for seqs in stored.values())
    cuts = proxy.cuts
    in_last_byte = sum(after_an_id_line(tail) for tail in proxy.cut_tails)
    for run_id, seqs in delivered.items():
        assert set(seqs) <= set(stored[run_id]) and len(seqs) == len(set(seqs))
    assert in_last_byte >= 10, f"seed {SEED}"
    assert lost == in_last_byte, f"seed {SEED}"

    assert passed(node_tests(["cuts"], env | {"RUNLEDGER_ROUND": "ours"})), f"seed {SEED}"
    streams = read_report(env)["round-ours"]
    for stream in streams:
        if stream["types"] is None:
            assert_is_the_stored_log(stream["events"], stream["runId"])
    ours = sum(len(stream["events"]) for stream in streams)
    ours_in_last_byte = sum(after_an_id_line(tail) for tail in proxy.cut_tails[cuts:])
    print(
        f"fetch-event-source: {lost} of {total} events lost to {cuts} cuts, {in_last_byte} of them in a frame's last"
        f" byte; @runledger/client: none of {ours} lost to {proxy.cuts - cuts} cuts, {ours_in_last_byte} there"
    )
    assert ours_in_last_byte >= 10, f"seed {SEED}"


def test_the_react_hook_rebuilds_a_run_from_its_log_once_per_event_in_strict_mode(env: dict[str, str]) -> None:
    """test/react.test.ts: the reducer (events → text and status), and useRun rendered by React
    DOM in StrictMode (one stream, every event once), remounted as after a reload, its commands."""
    assert passed(node_tests(["react"], env))


def test_npm_pack_holds_the_esm_entries_their_types_the_browser_bundle_and_the_licence_and_no_test(
    package: Path,
) -> None:
    [packed] = json.loads(npm("pack", "--dry-run", "--json"))
    files = {entry["path"] for entry in packed["files"]}
    for entry in ("index", "react/index"):
        assert {f"dist/{entry}.js", f"dist/{entry}.d.ts"} <= files
    assert {"dist/browser/runledger.js", "dist/browser/runledger.mjs", "LICENSE", "README.md", "package.json"} <= files
    assert not [f for f in files if not f.startswith("dist/") and f not in ("LICENSE", "README.md", "package.json")]
    assert not [
        f for f in files if "test" in f or f.endswith(".map") or (f.endswith(".ts") and not f.endswith(".d.ts"))
    ]
    assert (package / "LICENSE").read_text() == (package.parents[1] / "LICENSE").read_text()

    manifest = json.loads((package / "package.json").read_text())
    assert (manifest["name"], manifest["version"], manifest["type"], manifest["license"]) == (
        "@runledger/client",
        "0.1.0",
        "module",
        "MIT",
    )
    assert manifest["exports"]["."]["types"] == "./dist/index.d.ts"
    assert manifest["exports"]["./react"]["types"] == "./dist/react/index.d.ts"
    assert manifest["peerDependenciesMeta"]["react"]["optional"] is True
    assert (manifest["sideEffects"], manifest["engines"]["node"], manifest.get("dependencies")) == (False, ">=20", None)

    # The core entry and the browser bundle hold no React; the bundle defines the global Runledger.
    core = (package / "dist" / "index.js").read_text() + (package / "dist" / "browser" / "runledger.js").read_text()
    assert 'from "react"' not in core and "useSyncExternalStore" not in core
    script = (
        "const vm = require('node:vm'); const page = {};"
        "vm.runInNewContext(require('node:fs').readFileSync('dist/browser/runledger.js', 'utf-8'), page);"
        "console.log(Object.keys(page.Runledger).sort().join(' '))"
    )
    exported = subprocess.run(["node", "-e", script], cwd=package, capture_output=True, text=True, timeout=30)
    assert exported.returncode == 0, exported.stderr
    assert {"Client", "RunStream", "NotFound", "Conflict", "csrfTokenFromCookie"} <= set(exported.stdout.split())

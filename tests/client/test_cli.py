"""The `runledger` command (clients/python) as a real subprocess, against the live server of
tests/support/live.py through a CuttableProxy: what it prints, and its exit status."""

import json
import os
import pty
import shutil
import subprocess
import threading
import time
import uuid
import venv
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from runledger_client.cli import main as cli_main
from runs import services
from runs.agents.demo import demo_text
from runs.models import Run, RunEvent
from tests.support.cli import NO_CONFIG, drain, run_cli
from tests.support.db import token_for
from tests.support.live import assert_is_the_stored_log, cut_budgets
from tests.support.procs import ROOT, free_port
from tests.support.proxies import CuttableProxy
from tests.support.runs import status_of
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def runledger(
    proxy: CuttableProxy | None, token: str | None, *args: str, stderr: int | None = subprocess.PIPE
) -> subprocess.CompletedProcess[str]:
    """The command, configured through its environment, to its exit (killed after 60 s)."""
    return run_cli(proxy.url if proxy else None, token, *args, stderr=stderr)


def created(proxy: CuttableProxy, token: str, input: dict[str, Any]) -> str:
    done = runledger(proxy, token, "create", "demo", json.dumps(input))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_watch_jsonl_through_server_side_cuts_prints_exactly_the_stored_log(proxy: CuttableProxy, alice: User) -> None:
    token = token_for(alice)
    run_id = created(proxy, token, {"deltas": 150, "delay_ms": 2})
    proxy.cut_streams_after(cut_budgets(7))
    done = runledger(proxy, token, "watch", run_id, "--jsonl")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # not a terminal: no status line
    assert_is_the_stored_log([json.loads(line) for line in done.stdout.splitlines()], run_id)
    assert proxy.cuts >= 20


def test_watch_prints_the_text_and_a_status_line_only_on_a_terminal(proxy: CuttableProxy, alice: User) -> None:
    token = token_for(alice)
    run_id = created(proxy, token, {"deltas": 12, "delay_ms": 0})
    plain = runledger(proxy, token, "watch", run_id)
    assert (plain.returncode, plain.stdout, plain.stderr) == (0, demo_text(12) + "\n", "")

    # stderr on a terminal: the live status line is there, and stdout still holds only the text.
    master, replica = pty.openpty()
    seen: list[bytes] = []
    reader = threading.Thread(target=drain, args=(master, seen))
    reader.start()
    try:
        on_tty = runledger(proxy, token, "watch", run_id, "--after-seq", "3", stderr=replica)
    finally:
        os.close(replica)
        reader.join(timeout=10)
        os.close(master)
    status_line = b"".join(seen).decode()
    assert (on_tty.returncode, on_tty.stdout) == (0, demo_text(12)[len("chunk 0 ") :] + "\n")
    assert "seq 4  output.delta" in status_line and "run.completed: stream ended" in status_line

    # Read to its end already: the server answers 204 and watch ends at once.
    last_seq = json.loads(runledger(proxy, token, "show", run_id, "-o", "json").stdout)["last_seq"]
    at_end = runledger(proxy, token, "watch", run_id, "--after-seq", str(last_seq), "--jsonl")
    assert (at_end.returncode, at_end.stdout) == (0, "")


def test_cancel_twice_exits_0_and_a_cancel_that_lost_to_completion_exits_1_saying_completed(
    proxy: CuttableProxy, alice: User
) -> None:
    token = token_for(alice)
    long = created(proxy, token, {"deltas": 1000, "delay_ms": 50})
    for _ in range(2):
        done = runledger(proxy, token, "cancel", long, "--note", "enough")
        assert (done.returncode, done.stdout) == (0, "cancelled\n"), done.stderr

    short = created(proxy, token, {"deltas": 1, "delay_ms": 0})
    assert runledger(proxy, token, "watch", short).returncode == 0
    lost = runledger(proxy, token, "cancel", short)
    assert (lost.returncode, lost.stdout) == (1, "completed\n")
    assert "invalid_transition" in lost.stderr


def test_show_list_resume_pause_and_refusals(proxy: CuttableProxy, alice: User) -> None:
    token = token_for(alice)
    asked = created(proxy, token, {"deltas": 2, "delay_ms": 0, "ask": "name?"})
    wait_until(lambda: status_of(Run.objects.get(pk=asked)) == "waiting", 30, "the run asks")
    shown = json.loads(runledger(proxy, token, "show", asked, "-o", "json").stdout)
    assert shown["status"] == "waiting"
    resumed = runledger(proxy, token, "resume", asked, "--ticket", shown["resume_ticket"], "--input", '{"n": 1}')
    assert (resumed.returncode, resumed.stdout) == (0, "queued\n"), resumed.stderr
    assert runledger(proxy, token, "watch", asked).returncode == 0
    listed = runledger(proxy, token, "list").stdout.splitlines()
    assert len(listed) == 1 and listed[0].split()[:3] == [asked, "completed", "demo"]
    assert json.loads(runledger(proxy, token, "list", "--jsonl").stdout)["output"]["answer"] == {"n": 1}

    long = created(proxy, token, {"deltas": 1000, "delay_ms": 50})
    paused = runledger(proxy, token, "pause", long)
    # Queued: waiting at once; running: the worker parks it at its next boundary (202).
    assert paused.returncode == 0 and paused.stdout in ("waiting\n", "running\n"), paused.stderr
    refused = runledger(proxy, token, "stop", long, "--reason", "policy")
    assert (refused.returncode, refused.stdout) == (1, "") and "permission_denied" in refused.stderr
    assert runledger(proxy, token, "cancel", long).stdout == "cancelled\n"
    missing = runledger(proxy, token, "show", str(uuid.uuid4()))
    assert missing.returncode == 1 and "not_found" in missing.stderr
    stranger = runledger(proxy, "wrong-token", "list")
    assert stranger.returncode == 1 and "not_authenticated" in stranger.stderr


def test_create_with_metadata_and_list_where_it_matches(proxy: CuttableProxy, alice: User) -> None:
    token = token_for(alice)
    labelled = runledger(proxy, token, "create", "demo", '{"deltas": 1000}', "--meta", "customer=42", "--meta", "q=a=b")
    assert labelled.returncode == 0, labelled.stderr
    run_id = labelled.stdout.strip()
    assert Run.objects.get(pk=run_id).metadata == {"customer": "42", "q": "a=b"}
    created(proxy, token, {"deltas": 1000})
    where = runledger(proxy, token, "list", "--where", "customer=42", "--where", "q=a=b", "--status", "queued,running")
    assert [line.split()[0] for line in where.stdout.splitlines()] == [run_id], where.stderr
    assert runledger(proxy, token, "list", "--where", "customer=7").stdout == ""
    refused = runledger(proxy, token, "list", "--status", "queued,bogus")
    assert refused.returncode == 2 and "bogus: not a status" in refused.stderr


def test_rerun_prints_the_new_runs_id_and_a_fork_continues_the_text(proxy: CuttableProxy, alice: User) -> None:
    token = token_for(alice)
    original = created(proxy, token, {"deltas": 4, "delay_ms": 0})
    assert runledger(proxy, token, "watch", original).stdout == "chunk 0 chunk 1 chunk 2 chunk 3 \n"
    second = RunEvent.objects.filter(run_id=original, type="output.delta").order_by("seq")[1].seq

    forked = runledger(proxy, token, "rerun", original, "--from-seq", str(second))

    assert forked.returncode == 0, forked.stderr
    fork = forked.stdout.strip()
    assert Run.objects.get(pk=fork).rerun_of_id == uuid.UUID(original)
    assert runledger(proxy, token, "watch", fork).stdout == "chunk 0 chunk 1 chunk 2 chunk 3 \n"
    refused = runledger(proxy, token, "rerun", original, "--from-seq", "999")
    assert refused.returncode == 1 and "validation_error" in refused.stderr and "from_seq" in refused.stderr


def test_usage_errors_exit_2(proxy: CuttableProxy, alice: User) -> None:
    token = token_for(alice)
    for args, where in [
        ((), "required: COMMAND"),
        (("frobnicate",), "invalid choice"),
        (("create", "demo", "{not json"), "not JSON"),
        (("create", "demo", "[1]"), "JSON object"),
        (("watch",), "id"),
        (("watch", "x", "--after-seq", "-1"), "integer"),
        (("stop", "x"), "--reason"),
        (("resume", "x"), "--ticket"),
        (("create", "demo", "--meta", "no-equals"), "KEY=VALUE"),
        (("list", "--where", "=v"), "KEY=VALUE"),
    ]:
        done = runledger(proxy, token, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert where in done.stderr, (args, done.stderr)
    unconfigured = runledger(None, None, "list")
    assert unconfigured.returncode == 2 and "RUNLEDGER_URL" in unconfigured.stderr
    assert proxy.requests == []  # none of these reached the server


@pytest.mark.timeout(300)
def test_the_client_installs_in_a_fresh_virtualenv_without_django(tmp_path: Path) -> None:
    """`pip install ./clients/python` into a new virtualenv brings httpx and not Django."""
    # From a copy: pip builds in the source folder, and the work tree stays as it was.
    source = shutil.copytree(
        ROOT / "clients" / "python", tmp_path / "source", ignore=shutil.ignore_patterns("build", "*.egg-info")
    )
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(source)]
    subprocess.run(pip, check=True, timeout=240, capture_output=True)
    probe = (
        "import importlib.util as u, pathlib, runledger_client as rl; "
        "print(u.find_spec('django') is None, rl.__version__, pathlib.Path(rl.__file__).with_name('py.typed').exists())"
    )
    imported = subprocess.run([python, "-c", probe], check=True, timeout=30, capture_output=True, text=True)
    assert imported.stdout.split() == ["True", "0.2.0", "True"]  # no Django; typed
    helped = subprocess.run([str(env_dir / "bin" / "runledger"), "--help"], timeout=30, capture_output=True, text=True)
    assert helped.returncode == 0 and "watch" in helped.stdout


def test_create_with_a_priority_and_a_start_time(proxy: CuttableProxy, alice: User) -> None:
    token = token_for(alice)
    done = runledger(proxy, token, "create", "demo", "--priority", "-5", "--start-after", "2031-01-02T03:04:05Z")
    assert done.returncode == 0, done.stderr
    run = Run.objects.get(pk=done.stdout.strip())
    assert (run.priority, run.start_after.isoformat(), run.status) == (-5, "2031-01-02T03:04:05+00:00", "queued")
    refused = runledger(proxy, token, "create", "demo", "--priority", "500")
    assert refused.returncode == 1 and "priority" in refused.stderr


def test_cancel_where_asks_unless_yes_and_never_does_more_than_confirmed(proxy: CuttableProxy, alice: User) -> None:
    token = token_for(alice)
    ours = [created(proxy, token, {"deltas": 1000, "delay_ms": 50}) for _ in range(2)]
    for run_id in ours:
        runledger(proxy, token, "cancel", run_id)  # ended: matched, reported, not touched
    labelled = runledger(proxy, token, "create", "demo", '{"deltas": 1000, "delay_ms": 50}', "--meta", "customer=42")
    run_id = labelled.stdout.strip()
    live = ("queued", "running")
    unasked = runledger(proxy, token, "cancel", "--where", "customer=42")  # stdin is no terminal: no "y"
    assert unasked.returncode == 1 and "1 runs match" in unasked.stderr and "nothing done" in unasked.stderr
    assert status_of(Run.objects.get(pk=run_id)) in live
    over = runledger(proxy, token, "cancel", "--status", "queued,running,cancelled", "--max", "2", "--yes")
    assert over.returncode == 1 and "too_many_matches" in over.stderr
    assert status_of(Run.objects.get(pk=run_id)) in live
    done = runledger(proxy, token, "cancel", "--where", "customer=42", "--yes", "--note", "left")
    assert done.returncode == 0, done.stderr
    assert "cancelled 1" in done.stdout.splitlines() and "already_ended 0" in done.stdout.splitlines()
    assert Run.objects.get(pk=run_id).end_reason == "left"
    stop = runledger(proxy, token, "stop", "--where", "customer=42", "--reason", "r", "--yes")
    assert stop.returncode == 0 and "forbidden 1" in stop.stdout.splitlines(), stop.stdout
    both = runledger(proxy, token, "cancel", run_id, "--where", "customer=42")
    assert both.returncode == 2 and "not both" in both.stderr
    neither = runledger(proxy, token, "cancel")
    assert neither.returncode == 2 and "--where" in neither.stderr


@pytest.fixture
def cli(proxy: CuttableProxy, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The command's `main()` in this process (the subprocess tests above cover the console
    script; a process start each would cost a second or two), configured through the environment,
    against the live server: (exit status, stdout, stderr)."""
    for name in ("RUNLEDGER_TOKEN_FILE", "RUNLEDGER_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RUNLEDGER_URL", proxy.url)
    monkeypatch.setenv("XDG_CONFIG_HOME", NO_CONFIG["XDG_CONFIG_HOME"])

    def run(token: str, *args: str) -> tuple[int, str, str]:
        monkeypatch.setenv("RUNLEDGER_TOKEN", token)
        status = cli_main(list(args))
        out, err = capsys.readouterr()
        return status, out, err

    return run


def test_each_exit_status_for_real(proxy: CuttableProxy, alice: User, make_user: Any, cli: Any) -> None:
    token = token_for(alice)
    started = time.monotonic()
    dead = run_cli(f"http://127.0.0.1:{free_port()}", token, "show", str(uuid.uuid4()))
    assert dead.returncode == 3 and "cannot reach" in dead.stderr and time.monotonic() - started < 10

    # Failed while the live worker executes it: the worker's next write is fenced off.
    failing = created(proxy, token, {"deltas": 1000, "delay_ms": 50})
    failed = wait_until(lambda: (r := Run.objects.get(pk=failing)).status == "running" and r, 30, "it runs")
    services.run_fail(run_id=failed.pk, generation=failed.generation, code="agent_error", reason="boom")
    watched = runledger(proxy, token, "watch", failing, "--exit-status")
    assert watched.returncode == 4, watched.stderr
    assert cli(token, "watch", failing)[0] == 0  # without the flag: the run ended

    completed = cli(token, "create", "demo", '{"deltas": 2, "delay_ms": 0}')[1].strip()
    assert cli(token, "wait", completed, "--exit-status")[:2] == (0, "completed\n")
    cancelled = cli(token, "create", "demo", '{"deltas": 1000, "delay_ms": 50}')[1].strip()
    cli(token, "cancel", cancelled)
    assert cli(token, "wait", cancelled, "--exit-status")[:2] == (5, "cancelled\n")
    assert cli(token, "watch", cancelled, "--exit-status", "-o", "jsonl")[0] == 5
    stopper = token_for(make_user(perms=("runs.stop_run",)))
    stopped = cli(stopper, "create", "demo", '{"deltas": 1000, "delay_ms": 50}')[1].strip()
    assert cli(stopper, "stop", stopped, "--reason", "r")[:2] == (0, "stopped\n")
    assert cli(stopper, "watch", stopped, "--exit-status")[0] == 6
    refused = cli(token, "show", stopped)  # not hers
    assert refused[0] == 1 and "not_found" in refused[2]
    with pytest.raises(SystemExit) as usage:
        cli(token, "show")
    assert usage.value.code == 2


def test_o_json_for_every_command_is_the_apis_json(alice: User, cli: Any) -> None:
    token = token_for(alice)

    def as_json(*args: str) -> Any:
        status, out, err = cli(token, *args, "-o", "json")
        assert status == 0, (args, err)
        return json.loads(out)

    run = as_json("create", "demo", '{"deltas": 3, "delay_ms": 0}', "--meta", "k=v")
    assert run["status"] == "queued" and run["metadata"] == {"k": "v"}
    done = as_json("wait", run["id"])
    assert done["status"] == "completed"
    assert as_json("show", run["id"])["output"]["text"] == demo_text(3)
    assert [e["seq"] for e in as_json("watch", run["id"])] == list(range(1, done["last_seq"] + 1))
    assert [e["type"] for e in as_json("events", run["id"])][-1] == "run.completed"
    assert [r["id"] for r in as_json("list")] == [run["id"]]
    assert "demo" in [a["name"] for a in as_json("agents")]
    assert as_json("rerun", run["id"])["rerun_of"] == run["id"]
    lost, committed, why = cli(token, "cancel", run["id"], "-o", "json")  # refused: the committed run
    assert (lost, json.loads(committed)["status"]) == (1, "completed") and "invalid_transition" in why
    asked = as_json("create", "demo", '{"deltas": 2, "delay_ms": 0, "ask": "q"}')
    wait_until(lambda: status_of(Run.objects.get(pk=asked["id"])) == "waiting", 30, "the run asks")
    ticket = as_json("show", asked["id"])["resume_ticket"]
    assert as_json("resume", asked["id"], "--ticket", ticket)["status"] == "queued"
    long = as_json("create", "demo", '{"deltas": 1000, "delay_ms": 50}', "--meta", "k=long")
    assert as_json("pause", long["id"])["status"] in ("waiting", "running")
    assert as_json("cancel", long["id"])["status"] == "cancelled"
    bulk = as_json("cancel", "--where", "k=long", "--yes")
    assert bulk["matched"] == 1 and bulk["ids"]["already_ended"] == [long["id"]]
    status, jsonl, _ = cli(token, "list", "-o", "jsonl")
    assert status == 0 and len(jsonl.splitlines()) == 4 and all(json.loads(line)["id"] for line in jsonl.splitlines())
    assert "k=v" in cli(token, "show", run["id"])[1]  # text: for people


def test_webhooks_commands_answer_the_apis_json_and_another_users_endpoint_is_refused(
    alice: User, bob: User, cli: Any
) -> None:
    token = token_for(alice)
    url = f"http://127.0.0.1:{free_port()}/in"  # nothing listens: the delivery stays pending

    def as_json(*args: str) -> Any:
        status, out, err = cli(token, "webhooks", *args, "-o", "json")
        assert status == 0, (args, err)
        return json.loads(out)

    hook = as_json("create", url, "--events", "run.completed", "--events", "run.failed", "--where", "k=v")
    assert hook["secret"].startswith("whsec_") and hook["events"] == ["run.completed", "run.failed"]
    assert hook["metadata"] == {"k": "v"} and hook["enabled"] is True
    assert [h["id"] for h in as_json("list")] == [hook["id"]]
    assert as_json("show", hook["id"])["url"] == url and "secret" not in as_json("show", hook["id"])
    off = as_json("update", hook["id"], "--events", "run.cancelled", "--disable")
    assert (off["events"], off["enabled"], off["metadata"]) == (["run.cancelled"], False, {"k": "v"})
    assert as_json("update", hook["id"], "--enable", "--endpoint-url", url + "2")["url"] == url + "2"
    assert as_json("rotate-secret", hook["id"])["secret"] not in ("", hook["secret"])

    long = json.loads(
        cli(token, "create", "demo", '{"deltas": 1000, "delay_ms": 50}', "--meta", "k=v", "-o", "json")[1]
    )
    assert cli(token, "cancel", long["id"])[0] == 0
    [delivery] = as_json("deliveries", hook["id"])
    assert (delivery["run_id"], delivery["event_type"], delivery["status"]) == (long["id"], "run.cancelled", "pending")
    status, text, _ = cli(token, "webhooks", "show", hook["id"])
    assert status == 0 and "events:      run.cancelled" in text.splitlines() and "secret" not in text
    status, lines, _ = cli(token, "webhooks", "deliveries", hook["id"], "-o", "jsonl")
    assert status == 0 and [json.loads(line)["id"] for line in lines.splitlines()] == [delivery["id"]]

    for command in ("show", "delete", "rotate-secret"):  # hers, not bob's: a 404 to him
        refused = cli(token_for(bob), "webhooks", command, hook["id"])
        assert (refused[0], refused[1]) == (1, "") and "not_found" in refused[2], command
    assert as_json("delete", hook["id"]) == {"id": hook["id"], "deleted": True}
    assert cli(token, "webhooks", "show", hook["id"])[0] == 1
    bad = cli(token, "webhooks", "create", "ftp://example.test/", "--events", "run.failed")
    assert bad[0] == 1 and "url" in bad[2]
    for usage in (
        ["create", url],
        ["create", url, "--events", "run.created"],
        ["update", "ID", "--enable", "--disable"],
    ):
        with pytest.raises(SystemExit) as exited:
            cli(token, "webhooks", *usage)
        assert exited.value.code == 2, usage


def test_tokens_commands_issue_list_and_revoke_and_a_key_is_printed_alone(alice: User, cli: Any) -> None:
    token = token_for(alice, name="main")
    status, key, err = cli(token, "tokens", "create", "ci", "--expires", "12h")
    key = key.strip()
    assert (status, err) == (0, "") and key.startswith("rl_") and "\n" not in key  # KEY=$(runledger tokens create ci)
    status, listed, _ = cli(key, "tokens", "list", "-o", "json")
    tokens = json.loads(listed)
    assert status == 0 and [t["name"] for t in tokens] == ["main", "ci"] and all("key" not in t for t in tokens)
    assert tokens[1]["issued_by"] == "main" and tokens[1]["expires_at"] is not None
    status, text, _ = cli(token, "tokens", "list")
    assert status == 0 and key not in text and text.splitlines()[1].startswith("ci ")
    assert cli(token, "tokens", "delete", "ci", "-o", "json")[:2] == (0, '{\n  "name": "ci",\n  "deleted": true\n}\n')
    refused = cli(key, "tokens", "list")
    assert refused[0] == 1 and "not_authenticated" in refused[2]
    assert cli(token, "tokens", "create", "../x")[0] == 1
    with pytest.raises(SystemExit) as exited:
        cli(token, "tokens", "create", "ci", "--expires", "soon")
    assert exited.value.code == 2


def test_schedules_commands_answer_the_apis_json_and_another_users_schedule_is_refused(
    alice: User, bob: User, cli: Any
) -> None:
    token = token_for(alice)

    def as_json(*args: str) -> Any:
        status, out, err = cli(token, "schedules", *args, "-o", "json")
        assert status == 0, (args, err)
        return json.loads(out)

    nightly = as_json(
        "create", "demo", '{"deltas": 1, "delay_ms": 0}', "--cron", "0 9 * * 1-5", "--timezone", "Europe/Paris"
    )
    assert (nightly["cron"], nightly["timezone"], nightly["paused"]) == ("0 9 * * 1-5", "Europe/Paris", False)
    hourly = as_json(
        "create",
        "demo",
        '{"deltas": 1000, "delay_ms": 50}',
        "--every",
        "1h",
        "--start-at",
        "2020-01-01T00:00:00Z",
        "--meta",
        "k=v",
        "--overlap",
        "skip",
    )
    assert (hourly["every_seconds"], hourly["metadata"], hourly["cron"]) == (3600, {"k": "v"}, "")
    assert [s["id"] for s in as_json("list")] == [hourly["id"], nightly["id"]]
    assert as_json("show", nightly["id"]) == nightly
    assert as_json("pause", nightly["id"])["paused"] is True
    status, text, _ = cli(token, "schedules", "show", nightly["id"])
    assert (
        status == 0
        and "state:       paused" in text.splitlines()
        and "timing:      cron 0 9 * * 1-5 (Europe/Paris)" in text
    )
    assert as_json("resume", nightly["id"])["paused"] is False

    status, run_id, _ = cli(token, "schedules", "trigger", hourly["id"])
    run_id = run_id.strip()
    assert status == 0 and as_json("show", hourly["id"])["last_run"]["id"] == run_id
    lost, committed, why = cli(token, "schedules", "trigger", hourly["id"])  # skip: the long run is live
    assert (lost, committed.strip() in ("queued", "running")) == (1, True)  # the live run's committed status
    assert "schedule_overlap" in why
    ran = as_json(
        "backfill", hourly["id"], "--from", "2020-01-01T00:00:00Z", "--until", "2020-01-01T05:00:00Z", "--max", "2"
    )
    assert [r["schedule"]["due_at"][:19] for r in ran] == ["2020-01-01T00:00:00", "2020-01-01T01:00:00"]
    status, listed, _ = cli(token, "list", "--schedule", hourly["id"], "-o", "json")
    assert status == 0 and {r["id"] for r in json.loads(listed)} == {run_id, *(r["id"] for r in ran)}
    status, bulk, _ = cli(token, "cancel", "--schedule", hourly["id"], "--yes", "-o", "json")
    assert status == 0 and json.loads(bulk)["matched"] == 3  # the trigger's run and the two backfilled

    for command in ("show", "pause", "resume", "trigger", "delete"):  # hers, not bob's: a 404 to him
        refused = cli(token_for(bob), "schedules", command, nightly["id"])
        assert (refused[0], refused[1]) == (1, "") and "not_found" in refused[2], command
    assert as_json("delete", nightly["id"]) == {"id": nightly["id"], "deleted": True}
    assert cli(token, "schedules", "show", nightly["id"])[0] == 1
    for bad, field in (
        (["--every", "5"], "every_seconds"),
        (["--cron", "0 9 * * *", "--timezone", "Mars/Base"], "timezone"),
    ):
        refused = cli(token, "schedules", "create", "demo", *bad)
        assert refused[0] == 1 and field in refused[2], bad
    for usage in (
        ["create", "demo"],  # neither --cron nor --every
        ["create", "demo", "--cron", "@daily", "--every", "60"],
        ["create", "demo", "--every", "soon"],
        ["create", "demo", "--every", "60", "--overlap", "queue"],
        ["backfill", "ID", "--from", "2020-01-01T00:00:00Z"],
    ):
        with pytest.raises(SystemExit) as exited:
            cli(token, "schedules", *usage)
        assert exited.value.code == 2, usage

"""The `runledger` command and the person at its terminal, against a real web process
with no worker (the runs' events are written through the services, as a worker would): an agent's
text reaches the terminal without control sequences, and the token comes from a file or a prompt,
never only from the command line that `ps` shows."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from runs import services
from runs.events import EventType
from runs.models import Run
from tests.factories import running_run
from tests.support.cli import run_cli, run_cli_on_terminal
from tests.support.db import token_for
from tests.support.procs import Proc, Procs

pytestmark = [pytest.mark.processes, pytest.mark.sqlite, pytest.mark.django_db(transaction=True)]

ESC = "\x1b"
# What a hostile agent (or a model it relays) could write: colours, a title, a hyperlink, a cursor
# move and screen clear, carriage-return overwrites, an 8-bit CSI and OSC (C1).
HOSTILE = [
    f"{ESC}[31mred{ESC}[0m ",
    f"{ESC}]0;you have been owned{ESC}\\{ESC}]8;;https://evil.example/{ESC}\\click{ESC}]8;;{ESC}\\ ",
    f"{ESC}[2J{ESC}[Hwiped\rover\x08 \x9b2J\x9d0;t\x9c\n\tnext line",
]
SHOWN = "red click wipedover 2J0;t\n\tnext line\n"


@pytest.fixture
def web(procs: Procs) -> Proc:
    return procs.uvicorn()


@pytest.fixture
def token_file(alice: User, tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "token"
    path.write_text(token_for(alice) + "\n")
    path.chmod(0o600)
    yield path


def hostile_run(owner: User) -> Run:
    run = running_run(owner)
    events = [(EventType.OUTPUT_DELTA, {"text": text}) for text in HOSTILE]
    services.run_events_append(run_id=run.pk, generation=run.generation, events=events)
    return services.run_complete(run_id=run.pk, generation=run.generation, output={"text": "".join(HOSTILE)})


@pytest.mark.timeout(60)
def test_watch_shows_an_agents_text_without_its_control_sequences(web: Proc, alice: User, token_file: Path) -> None:
    run = hostile_run(alice)
    text = run_cli(web.url, None, "watch", str(run.pk), RUNLEDGER_TOKEN_FILE=str(token_file))
    assert (text.returncode, text.stdout, text.stderr) == (0, SHOWN, "")
    # --jsonl: the same events, as JSON values, with nothing raw a terminal would obey.
    jsonl = run_cli(web.url, None, "watch", str(run.pk), "--jsonl", RUNLEDGER_TOKEN_FILE=str(token_file))
    assert jsonl.returncode == 0, jsonl.stderr
    assert not [c for c in jsonl.stdout if (c < " " and c != "\n") or "\x7f" <= c <= "\x9f"]
    deltas = [e["data"]["text"] for e in map(json.loads, jsonl.stdout.splitlines()) if e["type"] == "output.delta"]
    assert deltas == HOSTILE


@pytest.mark.timeout(60)
def test_the_token_comes_from_a_file_or_is_asked_for_on_the_terminal(web: Proc, alice: User, token_file: Path) -> None:
    run = running_run(alice)
    by_flag = run_cli(web.url, None, "show", str(run.pk), "-o", "json", "--token-file", str(token_file))
    by_env = run_cli(web.url, None, "show", str(run.pk), "-o", "json", RUNLEDGER_TOKEN_FILE=str(token_file))
    for done in (by_flag, by_env):
        assert done.returncode == 0 and json.loads(done.stdout)["id"] == str(run.pk), done.stderr
        assert done.stderr == ""  # a 0600 file, a server on this machine: nothing to warn about

    asked, terminal = run_cli_on_terminal(web.url, "show", str(run.pk), "-o", "json", answer=token_for(alice))
    assert asked.returncode == 0 and json.loads(asked.stdout)["id"] == str(run.pk), asked.stderr
    assert "Runledger API token:" in terminal and token_for(alice) not in terminal  # asked, not echoed

    # Without a terminal to ask on, and no token anywhere: a usage error, at once.
    unconfigured = run_cli(web.url, None, "show", str(run.pk))
    assert unconfigured.returncode == 2 and "--token-file" in unconfigured.stderr
    missing = run_cli(web.url, None, "show", str(run.pk), "--token-file", str(token_file.with_name("nowhere")))
    assert missing.returncode == 2 and "cannot read the token file" in missing.stderr

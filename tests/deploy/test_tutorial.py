"""The tutorial (docs/tutorial.md) as a reader follows it, against real processes: its `curl`
steps, read from the page itself, in one shell session as the reader types them, and its Python
client script, run in that session with what it exported; each answer is the one the page says the
reader sees.

`bin/run` itself is not run (it installs the checkout and starts on the embedded SQLite file):
the test starts what it starts — one uvicorn web process and one worker — and makes the local
`admin` account the way it does (`manage.py ensure_admin`).
"""

import contextlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.docs import Shell, block, titled
from tests.support.procs import ROOT, Proc, Procs, subprocess_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite, pytest.mark.timeout(240)]

PAGE = "tutorial.md"
# Where the tutorial's server answers: bin/run's default.
PAGE_URL = "http://127.0.0.1:8000"
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@pytest.fixture
def server(procs: Procs) -> Proc:
    """What `bin/run` starts, and its admin account: the password is printed once, as the page says."""
    env = subprocess_env()
    made = subprocess.run(
        [sys.executable, "manage.py", "ensure_admin"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert made.returncode == 0, made.stderr
    assert "Created the local admin account: username 'admin', password '" in made.stdout
    web = procs.uvicorn(env=env)
    procs.worker("tutorial", concurrency=4, env=env)
    return web


# What the page's blocks set, and where the client looks for a server and a token: none of it comes
# from the test's own environment or the machine's config file.
PAGE_VARIABLES = ("RUN", "TICKET", "LAST")
CLIENT_VARIABLES = ("RUNLEDGER_URL", "RUNLEDGER_TOKEN", "RUNLEDGER_TOKEN_FILE", "RUNLEDGER_PROFILE")


class Terminal:
    """The reader's second terminal, in the checkout, knowing nothing of the server's address or
    token until the page's blocks tell it."""

    def __init__(self, server: Proc, home: Path) -> None:
        env = {k: v for k, v in subprocess_env().items() if k not in PAGE_VARIABLES + CLIENT_VARIABLES}
        env["XDG_CONFIG_HOME"] = str(home)  # no runledger/config.toml there
        self.session = Shell(env)
        self.server = server
        self.blocks = titled(PAGE, "sh")

    def step(self, title: str) -> str:
        """Run the page's shell block titled `title`; what it printed."""
        assert title in self.blocks, f"docs/{PAGE} has no sh block titled {title!r}"
        return self.session.run(self.blocks[title].replace(PAGE_URL, self.server.url), timeout=60)

    def value(self, name: str) -> str:
        """A shell variable the page's blocks set."""
        return self.session.run(f'echo "${name}"').strip()

    def close(self) -> None:
        self.session.close()


@pytest.fixture
def terminal(server: Proc, tmp_path: Path) -> Iterator[Terminal]:
    home = tmp_path / "config"
    home.mkdir()
    with contextlib.closing(Terminal(server, home)) as made:
        yield made


def test_the_tutorials_curl_steps_create_stream_pause_resume_and_cancel_a_run(terminal: Terminal) -> None:
    # Every titled shell block of the page is a step run here, in the page's order (the last one by
    # the test of the Python script, below).
    assert list(titled(PAGE, "sh")) == [
        "Set up your shell",
        "Create a run",
        "Read it",
        "Follow the stream",
        "Ask for what comes after the end",
        "Read events as JSON",
        "Start a long run and pause it",
        "See it waiting",
        "Resume it with its ticket",
        "Cancel it",
        "Read how it ended",
        "Run tutorial.py",
    ]
    # The command's note (standard error) to the reader; its key (standard output) into the token's variable alone.
    assert terminal.step("Set up your shell").startswith("Issued the API token 'tutorial' of admin")
    assert re.fullmatch(r"rl_[A-Za-z0-9_-]{43}", terminal.value("RUNLEDGER_TOKEN")), "the token the page exports"
    assert terminal.value("RUNLEDGER_URL") == terminal.server.url

    run_id = terminal.step("Create a run").strip()
    assert UUID.match(run_id), run_id
    assert terminal.step("Read it") in ("queued\n", "running\n", "completed\n")

    # The stream: every event from 1, in order, ending by itself after run.completed.
    streamed = terminal.step("Follow the stream")
    assert streamed.startswith("retry: 2000\n")
    ids = [int(i) for i in re.findall(r"^id: (\d+)$", streamed, re.MULTILINE)]
    types = re.findall(r"^event: (\S+)$", streamed, re.MULTILINE)
    assert ids == list(range(1, 24)), streamed
    assert types[:3] == ["run.created", "run.started", "output.delta"] and types[-1] == "run.completed"
    last = json.loads(re.findall(r"^data: (.*)$", streamed, re.MULTILINE)[-1])
    assert last["data"]["output"]["text"] == "".join(f"chunk {i} " for i in range(20))

    assert terminal.step("Ask for what comes after the end") == "204\n"
    page = json.loads(terminal.step("Read events as JSON"))
    assert [e["seq"] for e in page["results"]] == [3, 4]
    assert (page["next_after_seq"], page["last_seq"], page["run_status"], page["end_of_stream"]) == (
        4,
        23,
        "completed",
        False,
    )

    # Pause: 202 with the run still running (or, still queued, waiting at once); then waiting.
    assert terminal.step("Start a long run and pause it") in ("running\n", "waiting\n")
    long_run = terminal.value("RUN")
    assert UUID.match(long_run) and long_run != run_id
    # "Ask again": the reader repeats the read until the worker has parked the run.
    wait_until(
        lambda: terminal.step("See it waiting") == "waiting\n", timeout=30, what="the run's parking", interval=0.2
    )
    assert terminal.step("Resume it with its ticket") == "queued\n"
    assert re.fullmatch(r"[0-9a-f]{48}", terminal.value("TICKET")), "the ticket the waiting run carried"

    assert terminal.step("Cancel it") == "cancelled\n"
    assert terminal.step("Cancel it") == "cancelled\n"  # again: the same answer, nothing written
    assert terminal.step("Read how it ended") == "cancelled_by_user\nrun.cancelled\n"


def test_the_tutorials_python_script_prints_what_the_page_shows(terminal: Terminal, tmp_path: Path) -> None:
    # Run in the shell the curl steps set up: the client finds the server and the token only in
    # what the page exported, under the names it reads (RUNLEDGER_URL, RUNLEDGER_TOKEN).
    terminal.step("Set up your shell")
    script = tmp_path / "tutorial.py"
    script.write_text(block(PAGE, "python", "tutorial.py"))
    # The page's command, with the script where the test saved it rather than in the checkout.
    command = terminal.blocks["Run tutorial.py"]
    assert command.strip().endswith(" tutorial.py"), command
    printed = terminal.session.run(command.replace(" tutorial.py", f" {script}") + "\necho status=$?", timeout=120)
    *lines, status = printed.splitlines()
    assert status == "status=0", printed
    # The output the page shows, line for line (the text's trailing space aside).
    shown = block(PAGE, "text", "What it prints").splitlines()
    assert [line.rstrip() for line in lines] == shown

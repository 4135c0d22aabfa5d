"""The `runledger` command of the installed client (clients/python), run as a real subprocess with
nothing of the suite's RUNLEDGER_* environment, and a terminal for it to ask on."""

import fcntl
import os
import pty
import subprocess
import sys
import termios
import threading
from pathlib import Path

from tests.support.waiting import wait_until

RUNLEDGER = str(Path(sys.executable).parent / "runledger")  # the console script of the installed client
# No profile of the machine's user reaches a test: the config file is looked for where there is none.
NO_CONFIG = {"XDG_CONFIG_HOME": "/nonexistent/runledger-tests"}


def run_cli(
    url: str | None, token: str | None, *args: str, stderr: int | None = subprocess.PIPE, **env: str
) -> subprocess.CompletedProcess[str]:
    """The command, configured through its environment (`env` adds to it), to its exit (killed
    after 60 s). Its stdin is no terminal: it never waits to be asked for a token."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("RUNLEDGER_")} | NO_CONFIG
    full |= {"RUNLEDGER_URL": url} if url else {}
    full |= {"RUNLEDGER_TOKEN": token} if token else {}
    full |= env
    return subprocess.run(
        [RUNLEDGER, *args],
        env=full,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        timeout=60,
    )


def drain(fd: int, into: list[bytes]) -> None:
    """Read a pty's master end until the last holder of its other end closes it."""
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:  # EIO once the replica's last holder closed it
            return
        if not data:
            return
        into.append(data)


def _take_terminal() -> None:
    # In the child, a session leader by now (start_new_session): its stdin becomes its terminal, the
    # /dev/tty a password prompt opens.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def run_cli_on_terminal(url: str, *args: str, answer: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """The command with a terminal of its own as stdin and controlling terminal, with no token
    configured: `answer` is typed once the terminal shows the prompt. Its result, and what the
    terminal showed."""
    master, replica = pty.openpty()
    shown: list[bytes] = []
    reader = threading.Thread(target=drain, args=(master, shown))
    reader.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLEDGER_")} | NO_CONFIG | {"RUNLEDGER_URL": url}
    try:
        process = subprocess.Popen(
            [RUNLEDGER, *args],
            env=env,
            stdin=replica,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=_take_terminal,
        )
        try:
            wait_until(lambda: b"token:" in b"".join(shown), timeout=30, what="the token prompt")
            os.write(master, answer.encode() + b"\n")
            stdout, stderr = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
    finally:
        os.close(replica)
        reader.join(timeout=10)
        os.close(master)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), b"".join(shown).decode()

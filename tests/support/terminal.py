"""A command run on a pseudo-terminal of its own, answering its prompts as a person at a keyboard
would: for the interactive commands a guide tells a reader to type (`manage.py createsuperuser`
creates no user without a terminal, and asks for its password through /dev/tty, not stdin).

    done = answer_prompts(["bash", "-c", "python manage.py createsuperuser"], [("Username", "admin"), ...])
"""

import fcntl
import os
import select
import signal
import subprocess
import termios
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Answered:
    returncode: int
    # Everything it wrote to the terminal, the prompts included (a password is not echoed).
    output: str


def _take_the_terminal() -> None:
    # In the child, after setsid (start_new_session): its stdin, the terminal, becomes its
    # controlling terminal, which is what /dev/tty opens.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def answer_prompts(
    args: list[str], answers: list[tuple[str, str]], *, cwd: Path, env: dict[str, str], timeout: float = 60
) -> Answered:
    """Run `args` on a new terminal; each time the next prompt of `answers` (text it contains) has
    appeared since the last answer, type its answer and Enter. Once all are answered, wait for the
    command to end. A prompt that does not come within `timeout` stops it (killed by its PID's
    process group) and raises, with what it wrote."""
    leader, follower = os.openpty()
    try:
        process = subprocess.Popen(
            args,
            stdin=follower,
            stdout=follower,
            stderr=follower,
            cwd=cwd,
            env=env,
            start_new_session=True,
            preexec_fn=_take_the_terminal,
        )
    finally:
        os.close(follower)
    written = b""
    deadline = time.monotonic() + timeout
    pending = list(answers)
    answered_at = 0  # what the command wrote before the last answer is not a prompt for the next
    try:
        while True:
            if pending and pending[0][0].encode() in written[answered_at:]:
                answered_at = len(written)
                os.write(leader, pending.pop(0)[1].encode() + b"\r")
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                waiting_for = repr(pending[0][0]) if pending else "its end"
                raise TimeoutError(f"{args}: no {waiting_for} within {timeout}s:\n{written.decode(errors='replace')}")
            readable, _, _ = select.select([leader], [], [], left)
            if not readable:
                continue
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: every holder of the terminal's other end has closed it
                chunk = b""
            if not chunk:
                break
            written += chunk
        return Answered(process.wait(timeout=max(1.0, deadline - time.monotonic())), written.decode(errors="replace"))
    finally:
        os.close(leader)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

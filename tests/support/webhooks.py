"""Receivers of webhooks, each a process of its own, as the tests and benchmarks start them: the
verifying receiver (webhook_receiver.py) and the hostile one (hostile_receiver.py)."""

import json
import sys
from pathlib import Path

from tests.support.hostile_receiver import ended
from tests.support.procs import Proc, Procs, free_port, subprocess_env, wait_log_line
from tests.support.webhook_receiver import received


class Receiver:
    """The verifying receiver: `start` it with the secrets it trusts; `got` is its log."""

    def __init__(self, procs: Procs, tmp: Path, port: int | None = None) -> None:
        self.procs, self.port = procs, port or free_port()
        self.secrets, self.log = tmp / "secrets.json", tmp / "received.jsonl"
        self.proc: Proc | None = None

    def start(self, secrets: list[str], *args: str) -> "Receiver":
        self.trust(secrets)
        cmd = [sys.executable, "-m", "tests.support.webhook_receiver", str(self.port), str(self.secrets)]
        self.proc = self.procs.start("receiver", [*cmd, str(self.log), *args], subprocess_env())
        wait_log_line(self.proc, "receiver ready", timeout=20)
        return self

    def trust(self, secrets: list[str]) -> None:
        self.secrets.write_text(json.dumps(secrets))

    def url(self, path: str = "/in") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def got(self) -> list[dict[str, object]]:
        return received(self.log)


class Hostile:
    """A receiver that hangs (`hang`) or drips its answer (`drip`) on every request."""

    def __init__(self, procs: Procs, tmp: Path, mode: str) -> None:
        self.port, self.log = free_port(), tmp / f"{mode}.jsonl"
        cmd = [sys.executable, "-m", "tests.support.hostile_receiver", str(self.port), mode, str(self.log)]
        self.proc = procs.start(f"hostile-{mode}", cmd, subprocess_env())
        wait_log_line(self.proc, "hostile receiver ready", timeout=20)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def ended(self) -> list[dict[str, object]]:
        return ended(self.log)

"""A webhook receiver in its own process, as a user's service would be one: it verifies every
request with the `standardwebhooks` package and appends what it got to a JSON-lines log.

    python -m tests.support.webhook_receiver PORT SECRETS LOG [--fail-every N] [--hold-first]

SECRETS is a file of a JSON list of `whsec_` secrets, read at each request (a test rotates one and
writes it); a request verifies if any of them verifies it. `--fail-every N` answers 500 to every
Nth request; `--hold-first` holds each id's first request open, unanswered, until the receiver stops
(for a worker killed mid-delivery). `/redirect` answers 302 to `/in`. Each log line:
{"id", "path", "status", "verified", "type", "run_id", "run_status", "at"}.
"""

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("secrets", type=Path)
    parser.add_argument("log", type=Path)
    parser.add_argument("--fail-every", type=int, default=0)
    parser.add_argument("--hold-first", action="store_true")
    args = parser.parse_args()
    lock = threading.Lock()
    state = {"count": 0, "seen": set()}
    never = threading.Event()  # what a held request waits for: the receiver's end (its threads are daemons)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            webhook_id = self.headers.get("webhook-id", "")
            with lock:
                state["count"] += 1
                number = state["count"]
                first = webhook_id not in state["seen"]
                state["seen"].add(webhook_id)  # type: ignore[attr-defined]
            if args.hold_first and first:
                self._log({"id": webhook_id, "path": self.path, "status": None, "held": True})
                never.wait()  # the worker that sent it is killed meanwhile
            if self.path == "/redirect":
                self._answer(302, {"Location": "/in"})
                self._log({"id": webhook_id, "path": self.path, "status": 302})
                return
            verified: dict[str, Any] | None = None
            headers = {k.lower(): v for k, v in self.headers.items()}
            for secret in json.loads(args.secrets.read_text()):
                try:
                    verified = Webhook(secret).verify(body, headers)
                    break
                except WebhookVerificationError:
                    continue
            status = 500 if args.fail_every and number % args.fail_every == 0 else (204 if verified else 401)
            self._answer(status)
            run = (verified or {}).get("data", {}).get("run", {})
            self._log(
                {
                    "id": webhook_id,
                    "path": self.path,
                    "status": status,
                    "verified": verified is not None,
                    "type": (verified or {}).get("type"),
                    "run_id": run.get("id"),
                    "run_status": run.get("status"),
                    "at": time.time(),
                }
            )

        def _answer(self, status: int, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("content-length", "0")
            self.end_headers()

        def _log(self, line: dict[str, Any]) -> None:
            with lock, args.log.open("a") as log:
                log.write(json.dumps(line) + "\n")

        def log_message(self, format: str, *items: Any) -> None:
            pass

    # A listen backlog for a worker's whole batch at once: at the default of 5, the connections past
    # it wait for a SYN retransmission, a second each.
    ThreadingHTTPServer.request_queue_size = 128
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print("receiver ready", flush=True)
    server.serve_forever()


def received(log: Path) -> list[dict[str, Any]]:
    """The receiver's log so far."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.endswith("}")]


if __name__ == "__main__":
    main()

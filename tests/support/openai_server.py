"""An OpenAI-compatible Chat Completions server in a process of its own, standing in for a model
server (OpenAI, vLLM, Ollama) in tests and benchmarks: real HTTP/1.1, real SSE (`data: {chunk
JSON}` frames ending with `data: [DONE]`), the usage in a last chunk when the request asks for it.

    python -m tests.support.openai_server --port P --log FILE

The model name chooses the behaviour (`Behaviour`); the answer depends on nothing else, as from a
deterministic model. Each connection, request, chunk sent and end of a response is one JSON line in
the log file; a client that goes away mid-stream is seen between two chunks and logged
(`disconnect`) at once. `ModelServer` starts it and reads that log for a test.
"""

import argparse
import itertools
import json
import os
import re
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.support.procs import Proc, Procs

DEFAULT_WORDS = 12
# The key processes started against this server send (it accepts any).
API_KEY = "sk-test-runledger"
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
REASONS = {400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 429: "Too Many Requests"}


def answer_words(words: int) -> list[str]:
    """The chunks of the answer of a `words-N` model: one word each."""
    return [f"w{i} " for i in range(words)]


def answer_text(words: int = DEFAULT_WORDS) -> str:
    return "".join(answer_words(words))


@dataclass(frozen=True)
class Behaviour:
    """What a model name asks for, words joined by "+" (e.g. "test+words-200+slow-50ms"):

        words-N       the answer has N words (default 12), one chunk each: "w0 ", "w1 ", ...
        slow-Nms      N ms between two chunks (default 0)
        wait-Nms      N ms before the response starts (a model slow to its first token)
        drop-after-N  the connection is closed after N content chunks, the response left unfinished
        status-N      an HTTP N answer with an OpenAI error body instead of a stream
        busy-N        the first N requests naming this very model are answered 429 with
                      `Retry-After: 1` (busy-N-retry-S: S seconds), the next ones as the rest of
                      the name says
        cut-N         the first N requests naming this very model have their connection closed
                      before any answer
        usage-each    the usage so far in every chunk too (vLLM's `continuous_usage_stats`), so that
                      a client that closes the stream mid-way knows what it used up to its close

    vLLM's `continue_final_message` (with `add_generation_prompt` false) takes the final assistant
    message as the start of the answer and streams only the rest."""

    words: int = DEFAULT_WORDS
    pace: float = 0.0
    drop_after: int | None = None
    status: int | None = None
    busy: int = 0
    retry_after: int = 1
    cut: int = 0
    wait: float = 0.0
    usage_each: bool = False

    @classmethod
    def of(cls, model: str) -> "Behaviour":
        found: dict[str, Any] = {}
        for word in model.split("+"):
            if m := re.fullmatch(r"words-(\d+)", word):
                found["words"] = int(m[1])
            elif m := re.fullmatch(r"slow-(\d+)ms", word):
                found["pace"] = int(m[1]) / 1000
            elif m := re.fullmatch(r"wait-(\d+)ms", word):
                found["wait"] = int(m[1]) / 1000
            elif m := re.fullmatch(r"drop-after-(\d+)", word):
                found["drop_after"] = int(m[1])
            elif m := re.fullmatch(r"status-(\d+)", word):
                found["status"] = int(m[1])
            elif m := re.fullmatch(r"busy-(\d+)(?:-retry-(\d+))?", word):
                found["busy"] = int(m[1])
                found["retry_after"] = int(m[2] or 1)
            elif m := re.fullmatch(r"cut-(\d+)", word):
                found["cut"] = int(m[1])
            elif word == "usage-each":
                found["usage_each"] = True
        return cls(**found)


class Asked:
    """How many requests named each model, across the server's connections."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, model: str) -> int:
        with self._lock:
            self._counts[model] = self._counts.get(model, 0) + 1
            return self._counts[model]


ASKED = Asked()


class Log:
    def __init__(self, path: Path) -> None:
        self._file = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "at": time.time(), **fields})
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()


class Gone(Exception):
    """The client closed its end of the connection."""


class Connection:
    def __init__(self, conn: socket.socket, number: int, log: Log, requests: "itertools.count[int]") -> None:
        self.conn = conn
        self.number = number
        self.log = log
        self.requests = requests
        self.buffer = b""

    def serve(self) -> None:
        self.log.write("connect", conn=self.number)
        with self.conn:
            try:
                while True:  # keep-alive: one request after another
                    request = self.read_request()
                    if request is None:
                        self.log.write("close", conn=self.number)
                        return
                    if not self.answer(*request):
                        return
            except (Gone, OSError):
                self.log.write("close", conn=self.number)

    def read_request(self) -> tuple[str, dict[str, str], bytes] | None:
        while b"\r\n\r\n" not in self.buffer:
            data = self.conn.recv(65536)
            if not data:
                return None
            self.buffer += data
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            data = self.conn.recv(65536)
            if not data:
                return None
            self.buffer += data
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return lines[0], headers, body

    def answer(self, request_line: str, headers: dict[str, str], raw: bytes) -> bool:
        """Answer one request; False when the connection is finished with."""
        number = next(self.requests)
        method, path = request_line.split(" ")[:2]
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"unparsed": raw.decode(errors="replace")}
        self.log.write(
            "request",
            conn=self.number,
            request=number,
            method=method,
            path=path,
            authorization=headers.get("authorization"),
            body=body,
        )
        if (method, path) != ("POST", "/v1/chat/completions"):
            return self.error(number, 404, f"no route {method} {path}")
        behaviour = Behaviour.of(str(body.get("model", "")))
        asked = ASKED.count(str(body["model"]))
        if asked <= behaviour.cut:
            self.log.write("drop", conn=self.number, request=number, chunks=0)
            self.conn.shutdown(socket.SHUT_RDWR)
            return False
        if asked <= behaviour.busy:
            return self.error(number, 429, "test server: busy", retry_after=behaviour.retry_after)
        if behaviour.status is not None:
            return self.error(number, behaviour.status, f"test server: status {behaviour.status}")
        if body.get("stream") is not True:
            return self.error(number, 400, "this test server only streams")
        prefix, problem = self.continued(body)
        if problem:
            return self.error(number, 400, problem)
        return self.stream(number, body, behaviour, prefix)

    @staticmethod
    def continued(body: dict[str, Any]) -> tuple[str, str | None]:
        """The start of the answer the request gives (vLLM's continue_final_message), or a problem."""
        if not body.get("continue_final_message"):
            return "", None
        messages = body.get("messages") or [{}]
        if messages[-1].get("role") != "assistant":
            return "", "continue_final_message requires the final message to be from the assistant"
        if body.get("add_generation_prompt", True):
            return "", "cannot set both continue_final_message and add_generation_prompt"
        return str(messages[-1].get("content", "")), None

    def error(self, number: int, status: int, message: str, *, retry_after: int | None = None) -> bool:
        payload = json.dumps({"error": {"message": message, "type": "test_error", "code": status}}).encode()
        reason = REASONS.get(status, "Server Error")
        extra = "" if retry_after is None else f"Retry-After: {retry_after}\r\n"
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(payload)}\r\n\r\n"
        )
        self.conn.sendall(head.encode() + payload)
        self.log.write("end", conn=self.number, request=number, status=status, chunks=0)
        return True

    def stream(self, number: int, body: dict[str, Any], behaviour: Behaviour, prefix: str) -> bool:
        model = body["model"]
        full = answer_text(behaviour.words)
        # A prefix the model would not have written is carried on from as it is.
        rest = full[len(prefix) :] if full.startswith(prefix) else full
        words = re.findall(r"\S*\s*", rest)[:-1] if rest else []
        limit = body.get("max_tokens")
        finish = "length" if isinstance(limit, int) and limit < len(words) else "stop"
        words = words[:limit] if isinstance(limit, int) else words
        base = {"id": f"chatcmpl-test-{number}", "object": "chat.completion.chunk", "created": int(time.time())}
        base["model"] = model

        def choice(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

        prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))

        def usage(completion: int) -> dict[str, int]:
            return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

        sent = 0

        def gone() -> bool:
            self.log.write("disconnect", conn=self.number, request=number, chunks=sent)
            return False

        if behaviour.wait and self.client_gone(behaviour.wait):
            return gone()
        try:
            self.conn.sendall(STREAM_HEAD)
            self.send_event(choice({"role": "assistant", "content": ""}))
            for text in words:
                if behaviour.drop_after is not None and sent >= behaviour.drop_after:
                    self.log.write("drop", conn=self.number, request=number, chunks=sent)
                    self.conn.shutdown(socket.SHUT_RDWR)
                    return False
                if self.client_gone(behaviour.pace):
                    return gone()
                each = {"usage": usage(sent + 1)} if behaviour.usage_each else {}
                self.send_event({**choice({"content": text}), **each})
                self.log.write("chunk", conn=self.number, request=number, index=sent, text=text)
                sent += 1
            self.send_event(choice({}, finish))
            if (body.get("stream_options") or {}).get("include_usage"):
                self.send_event({**base, "choices": [], "usage": usage(sent)})
            self.send_frame(b"data: [DONE]\n\n")
            self.conn.sendall(b"0\r\n\r\n")
        except OSError:  # reset or broken pipe: the client went away while a send was under way
            return gone()
        self.log.write("end", conn=self.number, request=number, status=200, chunks=sent, finish_reason=finish)
        return True

    def client_gone(self, wait: float) -> bool:
        """Wait up to `wait` s for the client to close its end: a closed socket turns readable (EOF)."""
        readable, _, _ = select.select([self.conn], [], [], wait)
        if not readable:
            return False
        try:
            return not self.conn.recv(65536)
        except OSError:  # reset
            return True

    def send_event(self, data: dict[str, Any]) -> None:
        self.send_frame(b"data: " + json.dumps(data).encode() + b"\n\n")

    def send_frame(self, frame: bytes) -> None:
        self.conn.sendall(b"%x\r\n%s\r\n" % (len(frame), frame))


def serve(port: int, log_path: Path) -> None:
    log = Log(log_path)
    requests = itertools.count(1)
    listener = socket.create_server(("127.0.0.1", port))
    print(f"openai_server ready on 127.0.0.1:{port}", flush=True)
    for number in itertools.count(1):
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handler = Connection(conn, number, log, requests)
        threading.Thread(target=handler.serve, name=f"conn-{number}", daemon=True).start()


# --- the test side -----------------------------------------------------------------------------


class ModelServer:
    """The server started as a process of `procs`, and what its log says."""

    def __init__(self, procs: "Procs", log_dir: Path) -> None:
        from tests.support.procs import free_port, wait_log_line

        self.port = free_port()
        self.log_path = log_dir / f"openai-server-{self.port}.jsonl"
        args = [sys.executable, "-m", __name__, "--port", str(self.port), "--log", str(self.log_path)]
        self.proc: Proc = procs.start("openai-server", args, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        wait_log_line(self.proc, "openai_server ready")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def env(self, **extra: str) -> dict[str, str]:
        """What a web or worker process needs to run `openai_chat` against this server."""
        from tests.support.procs import subprocess_env

        return subprocess_env(**self.settings(), **extra)

    def settings(self) -> dict[str, str]:
        return {
            "RUNLEDGER_AGENTS": "runs.agents.demo,runs.agents.openai_chat",
            "RUNLEDGER_OPENAI_BASE_URL": self.url,
            "RUNLEDGER_OPENAI_API_KEY": API_KEY,
        }

    def records(self, event: str | None = None, request: int | None = None) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        found = []
        for line in self.log_path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # a line being written just now
                continue
            if (event is None or record["event"] == event) and (request is None or record.get("request") == request):
                found.append(record)
        return found

    def requests(self) -> list[dict[str, Any]]:
        return self.records("request")

    def sent(self, request: int) -> list[str]:
        """The texts of the chunks sent in answer to `request`, in order."""
        return [r["text"] for r in self.records("chunk", request)]

    def ended(self, request: int) -> dict[str, Any] | None:
        """How the answer to `request` ended: `end`, `drop` or `disconnect` (the client went away)."""
        ends = [r for r in self.records(request=request) if r["event"] in ("end", "drop", "disconnect")]
        return ends[0] if ends else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True, help="the JSON-lines log of what the server did")
    args = parser.parse_args()
    serve(args.port, args.log)


if __name__ == "__main__":
    main()

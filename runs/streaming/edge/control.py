"""The publisher's side of each Pushpin's control socket (docs/design/edge.md#control): publish in
order, send again what was refused, and sync a Pushpin given up on.
"""

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from runs.private_paths import directory_problem
from runs.setting_kinds import socket_path  # the form of RUNLEDGER_GRIP_URL's items

log = logging.getLogger(__name__)

# Items per request stay around this many bytes: one huge request would hold up every other
# Pushpin's turn and the handler's loop (an event larger than this goes alone).
BODY_MAX = 512 * 1024
# Publish timeouts' worth of refusals after which a Pushpin's backlog is dropped and it is synced.
GIVE_UP_AFTER = 6


# --- tnetstring, the encoding of ZRPC -------------------------------------------------------------


def tnetstring(value: Any) -> bytes:
    """`value` (dict, list, str, bytes, int, bool, None) as a tnetstring; text as UTF-8 bytes."""
    if isinstance(value, bool):
        body, tag = (b"true" if value else b"false"), b"!"
    elif isinstance(value, int):
        body, tag = str(value).encode(), b"#"
    elif isinstance(value, str):
        body, tag = value.encode(), b","
    elif isinstance(value, bytes):
        body, tag = value, b","
    elif value is None:
        body, tag = b"", b"~"
    elif isinstance(value, dict):
        body, tag = b"".join(tnetstring(str(k)) + tnetstring(v) for k, v in value.items()), b"}"
    elif isinstance(value, list):
        body, tag = b"".join(tnetstring(v) for v in value), b"]"
    else:
        raise TypeError(f"no tnetstring for {type(value).__name__}")
    return b"%d:%s%s" % (len(body), body, tag)


def parse_tnetstring(data: bytes) -> tuple[Any, bytes]:
    """The first value of `data` (strings as bytes) and what follows it; ValueError if malformed."""
    size, colon, rest = data.partition(b":")
    if not colon or not size.isdigit() or len(rest) <= int(size):
        raise ValueError("malformed tnetstring")
    body, tag, after = rest[: int(size)], rest[int(size) : int(size) + 1], rest[int(size) + 1 :]
    if tag == b",":
        return body, after
    if tag == b"#":
        return int(body), after
    if tag == b"!":
        return body == b"true", after
    if tag == b"~":
        return None, after
    items = []
    while body:
        item, body = parse_tnetstring(body)
        items.append(item)
    if tag == b"]":
        return items, after
    if tag == b"}" and len(items) % 2 == 0:
        return {items[i].decode(): items[i + 1] for i in range(0, len(items), 2)}, after
    raise ValueError("malformed tnetstring")


# --- the control socket ---------------------------------------------------------------------------


def folder_problem(folder: Path) -> str | None:
    """Why `folder` cannot hold the control socket: it must be a real folder (not a link) of this
    process's user that nobody else may enter or change (runs.private_paths). None when it can."""
    try:
        problem = directory_problem(str(folder))
    except FileNotFoundError:
        return f"{folder} does not exist"
    return None if problem is None else f"{folder}: {problem}"


def private_folder(folder: Path) -> None:
    """Make `folder` (mode 700) if it does not exist; refuse one that is not private (OSError)."""
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    problem = folder_problem(folder)
    if problem is not None:
        raise PermissionError(f"the edge's control folder is not private: {problem}")


def _request(method: str, args: bytes | None = None) -> tuple[bytes, bytes]:
    """A ZRPC request with a new id: (id, message). `args` is an already encoded dict."""
    request_id = uuid.uuid4().hex.encode()
    fields = tnetstring("id") + tnetstring(request_id) + tnetstring("method") + tnetstring(method)
    if args is not None:
        fields += tnetstring("args") + args
    return request_id, b"%d:%s}" % (len(fields), fields)


def _failure(request_id: bytes, answer: bytes) -> str | None:
    """None when `answer` is the success of the request `request_id`; else what it says. An
    answer to another request (one given up on earlier) is KeyError: not this one's."""
    found, _ = parse_tnetstring(answer)
    if not isinstance(found, dict) or found.get("id") != request_id:
        raise KeyError("not the answer to this request")
    if found.get("success") is True:
        return None
    return f"refused: {found.get('condition', b'?')!r} {found.get('value', b'')!r}"


def publish_args(items: list[dict[str, Any]]) -> bytes:
    return tnetstring({"items": items})


def bodies(items: list[dict[str, Any]]) -> list[bytes]:
    """The items as encoded `publish` arguments of about BODY_MAX bytes each (a larger item alone),
    in order."""
    found: list[bytes] = []
    batch: list[dict[str, Any]] = []
    size = 0
    for one in items:
        one_size = len(tnetstring(one))
        if batch and size + one_size > BODY_MAX:
            found.append(publish_args(batch))
            batch, size = [], 0
        batch.append(one)
        size += one_size
    if batch:
        found.append(publish_args(batch))
    return found


def call(url: str, method: str, *, timeout: float) -> str | None:
    """One ZRPC call to a control socket, from a plain thread (bin/edge's readiness, the tests):
    None when it succeeded, else why not."""
    problem = folder_problem(socket_path(url).parent)
    if problem is not None:
        return problem
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    try:
        sock.connect(url)
        request_id, message = _request(method)
        deadline = time.monotonic() + timeout
        if not sock.poll(round(timeout * 1000), zmq.POLLOUT):
            return "no answer"
        sock.send_multipart([b"", message])
        while (left := deadline - time.monotonic()) > 0 and sock.poll(round(left * 1000), zmq.POLLIN):
            try:
                return _failure(request_id, sock.recv_multipart()[-1])
            except KeyError:
                continue
        return "no answer"
    finally:
        sock.close()
        context.term()


@dataclass
class Target:
    """One Pushpin's control socket."""

    url: str
    # Given up on (or not yet synced by this leader): a sync comes before any publish.
    lost: bool = True
    # Encoded publish arguments not yet taken, in order, and since when they have been refused.
    backlog: list[bytes] = field(default_factory=list)
    failing_since: float | None = None
    sock: zmq.asyncio.Socket | None = None


class Pushpins:
    """Every Pushpin the publisher publishes to, each on its own: one that refuses holds up no other."""

    def __init__(self, urls: list[str], *, timeout: float, sync: Callable[[], list[dict[str, Any]]]) -> None:
        self.targets = [Target(url) for url in urls]
        self.timeout = timeout
        # The items that tell a Pushpin where every stream should be (the publisher's, at the time).
        self.sync = sync
        self.context = zmq.asyncio.Context()

    @property
    def urls(self) -> list[str]:
        return [target.url for target in self.targets]

    @property
    def behind(self) -> bool:
        """Whether some Pushpin waits for a sync or a publish sent again: try again soon."""
        return any(target.lost or target.backlog for target in self.targets)

    def lose_all(self) -> None:
        for target in self.targets:
            target.lost = True
            target.backlog.clear()
            target.failing_since = None

    def close(self) -> None:
        for target in self.targets:
            self._disconnect(target)
        self.context.term()

    async def publish(self, items: list[dict[str, Any]]) -> None:
        found = bodies(items)
        for target in self.targets:
            if not target.lost:
                target.backlog += found
        await self._drain_all()

    async def catch_up(self) -> None:
        """Sync what was given up on, and send again what was refused."""
        for target in self.targets:
            if target.lost:
                items = self.sync()
                if await self._send_all(target, bodies(items)):
                    target.lost = False
                    log.info("edge publisher synced %s (%d items)", target.url, len(items))
        await self._drain_all()

    async def _send_all(self, target: Target, found: list[bytes]) -> bool:
        """Publish `found` to `target` in order; False at the first refusal (all are sent again)."""
        for body in found:
            if await self._call(target, "publish", body) is not None:
                return False
        return True

    async def _drain_all(self) -> None:
        await asyncio.gather(*(self._drain(target) for target in self.targets if target.backlog))

    async def _drain(self, target: Target) -> None:
        """Send `target` its backlog, in order, until it refuses one."""
        while target.backlog:
            failure = await self._call(target, "publish", target.backlog[0])
            if failure is None:
                target.backlog.pop(0)
                target.failing_since = None
                continue
            now = time.monotonic()
            if target.failing_since is None:
                target.failing_since = now
                log.warning("edge publish to %s failed (%s); trying again", target.url, failure)
            if now - target.failing_since >= GIVE_UP_AFTER * self.timeout:
                log.warning(
                    "edge publish to %s refused for %.0f s (%s); syncing it",
                    target.url,
                    now - target.failing_since,
                    failure,
                )
                target.backlog.clear()
                target.failing_since = None
                target.lost = True
            return

    async def _call(self, target: Target, method: str, args: bytes | None = None) -> str | None:
        """One request to `target`: None when it succeeded, else why not. After a failure the
        socket is dropped, with whatever it still queued, and the next call connects anew."""
        problem = folder_problem(socket_path(target.url).parent)
        if problem is not None:
            # Never connect where another user could be listening in Pushpin's place.
            self._disconnect(target)
            return problem
        if target.sock is None:
            target.sock = self.context.socket(zmq.DEALER)
            target.sock.setsockopt(zmq.LINGER, 0)
            # Queue nothing for a Pushpin not (yet) there: a send waits for it, up to the timeout.
            target.sock.setsockopt(zmq.IMMEDIATE, 1)
            target.sock.connect(target.url)
        request_id, message = _request(method, args)
        try:
            async with asyncio.timeout(self.timeout):
                await target.sock.send_multipart([b"", message])
                while True:
                    try:
                        return _failure(request_id, (await target.sock.recv_multipart())[-1])
                    except KeyError:
                        continue  # the late answer of a request given up on
        except (TimeoutError, zmq.ZMQError, ValueError) as exc:
            self._disconnect(target)
            return "no answer" if isinstance(exc, TimeoutError) else str(exc)

    def _disconnect(self, target: Target) -> None:
        if target.sock is not None:
            target.sock.close(linger=0)
            target.sock = None

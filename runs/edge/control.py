"""The publisher's side of each Pushpin's control port: publish bodies in order, send again what
was refused, and recover a Pushpin given up on (runs.edge.publisher says when).

A refused publish (Pushpin down or busy, an error answer, a timeout) is sent again at the next
try, not given up on at once: a Pushpin busy sending one item to ten thousand streams can take
longer than the timeout to answer the next publish, and recovering it would have every stream it
holds ask the web processes again, a thousand a second. A publish it took after all comes again
with an id it has seen, and it drops it. Only after `GIVE_UP_AFTER` publish timeouts of refusals
is the backlog dropped and the Pushpin recovered (`POST /recover/`) once it answers: every stream
it holds then fetches what it missed.
"""

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from runs.edge import grip

log = logging.getLogger(__name__)

# A publish body stays under Pushpin's default limit of 1 MB (bin/edge raises it, for the one
# event larger than this, which is published alone).
BODY_MAX = 512 * 1024
# Publish timeouts' worth of refusals after which a Pushpin's backlog is dropped and it is recovered.
GIVE_UP_AFTER = 6


@dataclass
class Target:
    """One Pushpin's control port."""

    url: str
    # Given up on (or not yet recovered by this leader): a /recover/ comes before any publish.
    lost: bool = True
    # Publish bodies not yet taken, in order, and since when they have been refused.
    backlog: list[bytes] = field(default_factory=list)
    failing_since: float | None = None

    @property
    def publish_url(self) -> str:
        return self.url.rstrip("/") + "/publish/"

    @property
    def recover_url(self) -> str:
        return self.url.rstrip("/") + "/recover/"


def bodies(items: list[dict[str, Any]]) -> list[bytes]:
    """The items in publish bodies of at most BODY_MAX bytes each (a larger item alone), in order."""
    found: list[bytes] = []
    batch: list[dict[str, Any]] = []
    size = 0
    for one in items:
        one_size = len(grip.publish_body([one]))
        if batch and size + one_size > BODY_MAX:
            found.append(grip.publish_body(batch))
            batch, size = [], 0
        batch.append(one)
        size += one_size
    if batch:
        found.append(grip.publish_body(batch))
    return found


class Pushpins:
    """Every Pushpin the publisher publishes to, each on its own: one that refuses holds up no other."""

    def __init__(self, urls: list[str], *, timeout: float) -> None:
        self.targets = [Target(url) for url in urls]
        self.timeout = timeout

    @property
    def urls(self) -> list[str]:
        return [target.url for target in self.targets]

    @property
    def behind(self) -> bool:
        """Whether some Pushpin waits for a recover or a publish sent again: try again soon."""
        return any(target.lost or target.backlog for target in self.targets)

    def lose_all(self) -> None:
        for target in self.targets:
            target.lost = True
            target.backlog.clear()
            target.failing_since = None

    async def publish(self, http: httpx.AsyncClient, items: list[dict[str, Any]]) -> None:
        found = bodies(items)
        for target in self.targets:
            if not target.lost:
                target.backlog += found
        await self._drain_all(http)

    async def catch_up(self, http: httpx.AsyncClient) -> None:
        """Recover what was given up on, and send again what was refused."""
        for target in self.targets:
            if target.lost:
                await self._recover(http, target)
        await self._drain_all(http)

    async def _drain_all(self, http: httpx.AsyncClient) -> None:
        await asyncio.gather(*(self._drain(http, target) for target in self.targets if target.backlog))

    async def _drain(self, http: httpx.AsyncClient, target: Target) -> None:
        """Send `target` its backlog, in order, until it refuses one."""
        while target.backlog:
            try:
                answer = await http.post(
                    target.publish_url, content=target.backlog[0], headers={"Content-Type": "application/json"}
                )
                failure = None if answer.is_success else f"HTTP {answer.status_code}: {answer.text.strip()[:200]}"
            except httpx.HTTPError as exc:
                failure = str(exc) or type(exc).__name__
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
                    "edge publish to %s refused for %.0f s (%s); recovering it",
                    target.url,
                    now - target.failing_since,
                    failure,
                )
                target.backlog.clear()
                target.failing_since = None
                target.lost = True
            return

    async def _recover(self, http: httpx.AsyncClient, target: Target) -> None:
        try:
            answer = await http.post(target.recover_url)
        except httpx.HTTPError:
            return
        if answer.is_success:
            target.lost = False
            log.info("edge publisher recovered %s", target.url)

"""Webhook delivery inside the worker (docs/design/webhooks.md#delivery): claim due notifications,
POST each, signed as Standard Webhooks says, and record the outcome.

The loop waits on *a notification OR the next delivery's due time OR the poll interval*, like the
claim loop. Requests run outside any transaction: the claim is a lease (runs.services.webhooks),
so a worker killed mid-request, or a database restarted under it, delays a notification, never
loses it. On SQLite (one worker) the claim takes no SKIP LOCKED: its transactions queue.
"""

import asyncio
import base64
import contextlib
import hashlib
import hmac
import logging
import time
from collections.abc import Sequence

import httpx
from django.db import DatabaseError
from django.utils import timezone

from runs.conf import conf
from runs.http.outbound import RefusedAddress, client
from runs.metrics import series
from runs.services.webhooks import Claimed, Outcome, deliveries_claim, deliveries_record
from runs.worker.db import DbLane

log = logging.getLogger(__name__)

# What a delivery reads of an answer, and keeps in its log: receivers answer briefly, and a
# hostile one cannot make the worker read more.
RESPONSE_HEAD_BYTES = 1024
USER_AGENT = "Runledger-Webhooks/1"


def sign(secrets: Sequence[str], webhook_id: str, timestamp: int, body: str) -> str:
    """The `webhook-signature` header: `v1,<base64 HMAC-SHA256 of id.timestamp.body>` with each
    secret (during a rotation, the new one and the old), space-separated."""
    signed = f"{webhook_id}.{timestamp}.{body}".encode()
    signatures = []
    for secret in secrets:
        key = base64.b64decode(secret.removeprefix("whsec_"))
        digest = hmac.new(key, signed, hashlib.sha256).digest()
        signatures.append("v1," + base64.b64encode(digest).decode())
    return " ".join(signatures)


async def post(http: httpx.AsyncClient, claimed: Claimed, *, timeout: float) -> Outcome:
    started_at = timezone.now()
    began = time.monotonic()
    timestamp = int(time.time())
    headers = {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": claimed.webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(claimed.secrets, claimed.webhook_id, timestamp, claimed.body),
    }

    def done(**said: object) -> Outcome:
        return Outcome(started_at=started_at, duration_ms=int((time.monotonic() - began) * 1000), **said)  # type: ignore[arg-type]

    try:
        async with asyncio.timeout(timeout):
            async with http.stream("POST", claimed.url, content=claimed.body.encode(), headers=headers) as answer:
                head = b""
                async for chunk in answer.aiter_raw():
                    head += chunk
                    if len(head) >= RESPONSE_HEAD_BYTES:
                        break
                text = head[:RESPONSE_HEAD_BYTES].decode("utf-8", "replace")
                if answer.is_redirect:
                    said = f"a redirect to {answer.headers.get('location', '?')!r}, not followed"
                    return done(status_code=answer.status_code, response_head=text, error=said)
                return done(status_code=answer.status_code, response_head=text)
    except RefusedAddress as exc:
        return done(error=f"refused: {exc}")
    except TimeoutError:
        return done(error=f"no answer within {timeout}s")
    except (httpx.HTTPError, OSError) as exc:
        return done(error=f"{type(exc).__name__}: {exc}"[:500])


class Deliverer:
    """The worker's delivery loop; `wake()` when a notification says rows were written."""

    def __init__(self, *, lane: DbLane, worker_id: str, poll_seconds: float) -> None:
        self.lane = lane
        self.worker_id = worker_id
        self.poll_seconds = poll_seconds
        self.delivered = 0
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        timeout = conf.WEBHOOKS_TIMEOUT_SECONDS
        async with client(timeout=timeout) as http:
            while True:
                self._wake.clear()
                try:
                    claimed, next_in = await self.lane.call(deliveries_claim, limit=conf.WEBHOOKS_BATCH)
                except DatabaseError as exc:
                    log.warning("could not claim webhook deliveries (%s); retrying later", exc)
                    claimed, next_in = [], None
                if claimed:
                    await self._deliver(http, claimed, timeout)
                    if next_in is None or next_in <= 0:
                        continue  # a full batch: there may be more due
                wait = self.poll_seconds if next_in is None else min(self.poll_seconds, next_in + 0.01)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=wait)

    async def _deliver(self, http: httpx.AsyncClient, claimed: list[Claimed], timeout: float) -> None:
        outcomes = await asyncio.gather(*(post(http, one, timeout=timeout) for one in claimed))
        for outcome in outcomes:
            series.webhook_delivered("success" if outcome.ok else "failure")
        try:
            await self.lane.call(
                deliveries_record, outcomes=list(zip(claimed, outcomes, strict=True)), worker=self.worker_id
            )
        except DatabaseError as exc:
            # The claims' lease lapses and the deliveries come due again, with the same ids.
            log.warning("could not record %d webhook deliveries (%s); they will be sent again", len(claimed), exc)
            return
        self.delivered += sum(1 for outcome in outcomes if outcome.ok)

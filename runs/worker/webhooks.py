"""Webhook delivery inside the worker (docs/design/webhooks.md#delivery): claim due notifications,
POST each on a client of its own, signed as Standard Webhooks says, and record each outcome.

The loop waits on *a notification OR the next delivery's due time OR the poll interval*, like the
claim loop. Requests run outside any transaction: the claim is a lease (runs.services.webhooks),
so a worker killed mid-request, or a database restarted under it, delays a notification, never
loses it. On SQLite (one worker) the claim takes no SKIP LOCKED: its transactions queue.
"""

import asyncio
import base64
import hashlib
import hmac
import logging
import time
from collections import Counter
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
# How long the loop waits, once an attempt has ended, for others to end with it: a burst's outcomes
# go in one record and one claim. Small beside the bound a delivery is held to (the timeout + 5 s).
GATHER_SECONDS = 0.02


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


async def post(claimed: Claimed, *, timeout: float) -> Outcome:
    """One attempt, on a client of its own, within `timeout` in all: resolving, connecting,
    sending, and reading the answer's head. A receiver that answers a byte at a time is cut there
    as one that never answers is."""
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
        # The client's one connection is closed with it, inside the deadline: nothing a cut request
        # leaves half done outlives its attempt.
        async with (
            asyncio.timeout(timeout),
            client(timeout=timeout) as http,
            http.stream("POST", claimed.url, content=claimed.body.encode(), headers=headers) as answer,
        ):
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
    except Exception as exc:  # anything else is this attempt's failure, never the delivery loop's end
        log.exception("webhook attempt %s failed unexpectedly", claimed.webhook_id)
        return done(error=f"{type(exc).__name__}: {exc}"[:500])


class Deliverer:
    """The worker's delivery loop; `wake()` when a notification says rows were written.

    Up to RUNLEDGER_WEBHOOKS_BATCH attempts are in flight at once, each a task of its own: a freed
    slot is claimed again at once, fairly (the claim ranks owners by what they have in flight
    here), and each outcome is recorded as soon as it is known, with whatever others ended with it,
    never held for a slower one (docs/design/webhooks.md#delivery)."""

    def __init__(self, *, lane: DbLane, worker_id: str, poll_seconds: float) -> None:
        self.lane = lane
        self.worker_id = worker_id
        self.poll_seconds = poll_seconds
        self.delivered = 0
        self._wake = asyncio.Event()
        self._flying: dict[asyncio.Task[Outcome], Claimed] = {}

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        timeout = conf.WEBHOOKS_TIMEOUT_SECONDS
        slots = conf.WEBHOOKS_BATCH
        try:
            while True:
                self._wake.clear()
                next_in: float | None = None
                if len(self._flying) < slots:
                    claimed, next_in = await self._claim(slots - len(self._flying))
                    for one in claimed:
                        self._flying[asyncio.create_task(post(one, timeout=timeout))] = one
                # Slots full, or nothing due: an attempt's end or a notification wakes the loop first.
                wait = self.poll_seconds if next_in is None else min(self.poll_seconds, next_in + 0.01)
                await self._wait(wait)
                await self._record_ended()
        finally:
            # A request cut here is sent again once its claim's lease lapses (runs.services.webhooks).
            for task in self._flying:
                task.cancel()

    async def _claim(self, limit: int) -> tuple[list[Claimed], float | None]:
        busy = Counter(claimed.owner_id for claimed in self._flying.values())
        try:
            return await self.lane.call(deliveries_claim, limit=limit, busy=busy)
        except DatabaseError as exc:
            log.warning("could not claim webhook deliveries (%s); retrying later", exc)
            return [], None

    async def _wait(self, seconds: float) -> None:
        """Until an attempt ends, a notification wakes the loop, or `seconds` pass; after an end,
        GATHER_SECONDS more for the attempts ending with it, so that a burst's outcomes are
        recorded and their slots claimed again in a few transactions, not one each."""
        waking = asyncio.ensure_future(self._wake.wait())
        try:
            done, _ = await asyncio.wait([waking, *self._flying], timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
            if done - {waking}:
                await asyncio.wait(list(self._flying), timeout=GATHER_SECONDS)
        finally:
            waking.cancel()

    async def _record_ended(self) -> None:
        ended = [(self._flying.pop(task), task.result()) for task in [t for t in self._flying if t.done()]]
        if not ended:
            return
        for _, outcome in ended:
            series.webhook_delivered("success" if outcome.ok else "failure")
        try:
            await self.lane.call(deliveries_record, outcomes=ended, worker=self.worker_id)
        except DatabaseError as exc:
            # The claims' lease lapses and the deliveries come due again, with the same ids.
            log.warning("could not record %d webhook deliveries (%s); they will be sent again", len(ended), exc)
            return
        self.delivered += sum(1 for _, outcome in ended if outcome.ok)

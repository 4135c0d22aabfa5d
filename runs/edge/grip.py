"""GRIP, the little of it Runledger speaks with Pushpin: the request signature, the hold
instructions of an answer, and the items of a publish.

Written here rather than taken from gripcontrol/django-grip: what is needed is four headers, one
JWT check and one POST, and those libraries drop an id of 0, send ids as numbers (which Pushpin
refuses), publish without a timeout, and accept a bare Grip-Sig header as proof of proxying when a
proxy has no key (shared/research/edge-metrics-proxy.md §A6).
"""

import json
import random
from typing import Any

import jwt
from django.conf import settings
from django.http import HttpRequest

from runs.streams import Frame

# Pushpin's `sig_iss`, which bin/edge's configuration leaves at its default.
ISSUER = "pushpin"


def channel(run_id: str) -> str:
    return f"run-{run_id}"


def signed_by_pushpin(request: HttpRequest) -> bool:
    """Whether the request came through a Pushpin that holds our key: it strips any Grip-Sig a
    client sent and signs every request it passes on (a JWT, HS256, issuer "pushpin", an hour
    long), so only it can have made a valid one."""
    token = request.headers.get("Grip-Sig")
    if not token:
        return False
    try:
        jwt.decode(
            token,
            settings.RUNLEDGER_GRIP_KEY,
            algorithms=["HS256"],
            issuer=ISSUER,
            options={"require": ["exp", "iss"]},
        )
    except jwt.InvalidTokenError:
        return False
    return True


def is_recovery(request: HttpRequest) -> bool:
    """A signed request that names the last id it has: Pushpin's own GET of the next link (after a
    gap, a timeout or a recover). A client cannot send Grip-Last through Pushpin, which strips
    every Grip-* header of a client's request."""
    return "Grip-Last" in request.headers


def last_id(request: HttpRequest, name: str) -> str | None:
    """The last id Pushpin's recovery request gives for channel `name` (`Grip-Last: run-…;
    last-id=17`, one such value per channel, comma-joined when there are several)."""
    for value in request.headers.get("Grip-Last", "").split(","):
        channel_name, _, params = value.strip().partition(";")
        if channel_name.strip() != name:
            continue
        for param in params.split(";"):
            key, _, found = param.strip().partition("=")
            if key == "last-id":
                return found.strip()
    return None


def hold_headers(*, name: str, prev_id: int, link: str) -> dict[str, str]:
    """Hold the client's stream on channel `name`, whose last event it has is `prev_id`.

    Pushpin then sends it each item published with that previous id (and the next, and so on), and
    on any other — a publish lost, or made before this hold — GETs `link` itself with Grip-Last to
    fetch what is missing; it does the same after `RUNLEDGER_GRIP_LINK_SECONDS` (to half as long
    again) without a publish.
    """
    keepalive = max(1, round(float(settings.RUNLEDGER_SSE_KEEPALIVE_SECONDS)))
    link_seconds = max(1, int(settings.RUNLEDGER_GRIP_LINK_SECONDS))
    # Spread over half as long again: Pushpin times the streams of one link and one timeout
    # together, so ten thousand watchers of a run held with the same timeout would all ask the
    # web processes again in the same second.
    link_seconds += random.randrange(link_seconds // 2 + 1)
    return {
        "Grip-Hold": "stream",
        "Grip-Channel": f"{name}; prev-id={prev_id}",
        # The comment the streams a web process holds send too, as a C string (a header holds no line break).
        "Grip-Keep-Alive": f": keep-alive\\n\\n; format=cstring; timeout={keepalive}",
        "Grip-Link": f"<{link}>; rel=next; timeout={link_seconds}",
    }


def item(name: str, frames: list[Frame]) -> dict[str, Any]:
    """The publish of consecutive events, as one item: its id is the last one's seq, its previous
    id the seq before the first, so the chain of items is the chain of seqs. Ids are strings
    (Pushpin refuses numbers), and the previous id is always given, 0 included: it is how Pushpin
    finds a gap. Each frame keeps its own `id:` line, so a client's Last-Event-ID is exact."""
    return {
        "channel": name,
        "id": str(frames[-1].seq),
        "prev-id": str(frames[0].seq - 1),
        "formats": {"http-stream": {"content": b"".join(frame.data for frame in frames).decode()}},
    }


def close_item(name: str, last_seq: int) -> dict[str, Any]:
    """End the streams held on `name` once they have the terminal event `last_seq`: a stream
    without it sees a gap and fetches it from the web processes, which then end it."""
    return {"channel": name, "prev-id": str(last_seq), "formats": {"http-stream": {"action": "close"}}}


def publish_body(items: list[dict[str, Any]]) -> bytes:
    return json.dumps({"items": items}, separators=(",", ":")).encode()

"""GRIP, the little of it Runledger speaks with Pushpin: the request signature, the hold
instructions of an answer, and the items of a publish (sent by control.py).

Written here rather than taken from gripcontrol/django-grip: what is needed is four headers, one
JWT check and one publish call, and those libraries drop an id of 0, send ids as numbers (which Pushpin
refuses), publish without a timeout, and accept a bare Grip-Sig header as proof of proxying when a
proxy has no key (read in pubcontrol 3.5, gripcontrol 4.4 and django-grip 3.5).
"""

import math
import random
from typing import Any

from django.http import HttpRequest

from runs.conf import conf
from runs.streaming.hub import Frame

# Pushpin's `sig_iss`, which bin/edge's configuration leaves at its default.
ISSUER = "pushpin"
# A second channel every held stream is on, never published to, whose previous id is the stream's
# link token (link.py): Pushpin sends it back in Grip-Last with each fetch of the link. Not
# in the link's URL: Pushpin paces those fetches at ten batches a second, each batch the streams of
# one URL, so a URL per stream would pace them at ten streams a second. And never published to:
# Pushpin puts off a stream's link timeout while every channel it holds receives items
# (httpsession.cpp), so with the run's channel alone a busy run's streams would never be
# re-checked nor reach their lifetime; with this one idle, the link is fetched every timeout.
LINK_CHANNEL = "runledger-link"


# The link timeouts a stream can get: 1, 1⅙, 1⅓ and 1½ times the interval (link_timeout).
LINK_TIMEOUT_STEPS = 4


def channel(run_id: str) -> str:
    return f"run-{run_id}"


def user_channel(user_id: int) -> str:
    """A third channel every held stream is on, with no id: the publisher closes it when a
    credential of the user is revoked (docs/design/edge.md#revocation). Published to only then, so
    it puts off no link timeout either."""
    return f"runledger-user-{user_id}"


def signed_by_pushpin(request: HttpRequest) -> bool:
    """Whether the request came through a Pushpin that holds our key: it strips any Grip-Sig a
    client sent and signs every request it passes on (a JWT, HS256, issuer "pushpin", an hour
    long), so only it can have made a valid one."""
    token = request.headers.get("Grip-Sig")
    if not token:
        return False
    # Here, not at the top: the stream view imports this module on every install, and PyJWT comes
    # with the `edge` extra; a signature is looked at only with RUNLEDGER_GRIP_URL set.
    import jwt

    try:
        jwt.decode(
            token,
            conf.GRIP_KEY,
            algorithms=["HS256"],
            issuer=ISSUER,
            options={"require": ["exp", "iss"]},
        )
    except jwt.InvalidTokenError:
        return False
    return True


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


def link_timeout(*, seconds_left: float | None, first: bool) -> int:
    """Seconds until Pushpin fetches a held stream's link again: `RUNLEDGER_GRIP_LINK_SECONDS`, or
    after a connect (`first`) `RUNLEDGER_GRIP_LINK_FIRST_SECONDS` if shorter and streams are
    capped, spread (`spread`), and no later than the link's expiry (`seconds_left`), so the stream
    ends at its lifetime.

    The first fetch comes sooner because until it the stream counts against its user's cap
    whether or not its client is still there (guard.EdgeStreams): a client that leaves soon after
    connecting — one that reconnects often — stops counting as soon as with a short interval, and
    only a stream that stayed past its first fetch waits the long one. Without a cap nothing
    counts, and the first fetch would only cost: each costs Pushpin about as much as ten
    deliveries, and the web process and the database more (docs/benchmarks.md)."""
    link_seconds = max(1, conf.GRIP_LINK_SECONDS)
    if first and conf.MAX_STREAMS_PER_USER is not None:
        link_seconds = min(link_seconds, max(1, conf.GRIP_LINK_FIRST_SECONDS))
    link_seconds = spread(link_seconds)
    if seconds_left is not None:
        link_seconds = min(link_seconds, max(1, math.ceil(seconds_left)))
    return link_seconds


def spread(seconds: int) -> int:
    """`seconds` to half as long again, in one of LINK_TIMEOUT_STEPS values.

    Spread: streams connected together (a reconnect storm after a restart) would otherwise all ask
    the web processes again in the same second, and every one after that. Over a few values only:
    Pushpin (1.36) keeps a Qt timer per link path and timeout, and each restart of any timer of
    its own (a stream's keep-alive, at every delivery) walks the list of them, so a value per
    second made one per stream and, at 10,000 streams, doubled its cost per delivery."""
    return seconds + random.randrange(LINK_TIMEOUT_STEPS) * (seconds // 2) // (LINK_TIMEOUT_STEPS - 1)


def hold_headers(*, name: str, prev_id: int, user_id: int, link: str, token: str, timeout: int) -> dict[str, str]:
    """Hold the client's stream on channel `name`, whose last event it has is `prev_id`, and on the
    channel of its user (`user_channel`).

    Pushpin then sends it each item published with that previous id (and the next, and so on), and
    on any other — a publish lost, or made before this hold — GETs `link` itself with Grip-Last to
    fetch what is missing; it does the same every `timeout` seconds, busy or not (LINK_CHANNEL):
    each such GET carries `token` and re-checks the stream's user (hold.py).
    """
    keepalive = max(1, round(conf.SSE_KEEPALIVE_SECONDS))
    return {
        "Grip-Hold": "stream",
        "Grip-Channel": f"{name}; prev-id={prev_id}, {LINK_CHANNEL}; prev-id={token}, {user_channel(user_id)}",
        # The comment the streams a web process holds send too, as a C string (a header holds no line break).
        "Grip-Keep-Alive": f": keep-alive\\n\\n; format=cstring; timeout={keepalive}",
        "Grip-Link": f"<{link}>; rel=next; timeout={timeout}",
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


def sync_item(name: str, seq: int) -> dict[str, Any]:
    """Where the streams of `name` should be: at `seq`. A stream there gets a comment (what a
    keep-alive sends); one behind sees a previous id it does not have and fetches what it missed
    from the web processes; any other is not there. What a new leader (or one that gave a Pushpin's
    backlog up) sends each run instead of Pushpin's `recover`, after which every stream it holds
    fetches its link at once (publisher.py).

    Its id is `seq` too, so a stream's position stays the seq it has; Pushpin drops an id it saw
    in the last `id_cache_ttl` seconds, which costs nothing: it then had that publish."""
    return {
        "channel": name,
        "id": str(seq),
        "prev-id": str(seq),
        "formats": {"http-stream": {"content": ": sync\n\n"}},
    }


def close_user_item(user_id: int) -> dict[str, Any]:
    """End every stream of the user, wherever it is: their reconnects are checked as new connects."""
    return {"channel": user_channel(user_id), "formats": {"http-stream": {"action": "close"}}}


def close_item(name: str, last_seq: int) -> dict[str, Any]:
    """End the streams held on `name` once they have the terminal event `last_seq`: a stream
    without it sees a gap and fetches it from the web processes, which then end it.

    Its id is no seq (`…-end`), so Pushpin remembers the channel ended where no hold can be: a hold
    that reaches it afterwards at an older position conflicts at once and fetches what it missed.
    Without an id Pushpin would forget the channel's last id, and such a hold would wait for the
    next item, of which there is none (docs/design/edge.md#late-holds)."""
    return {
        "channel": name,
        "id": f"{last_seq}-end",
        "prev-id": str(last_seq),
        "formats": {"http-stream": {"action": "close"}},
    }


def close_again_item(name: str, last_seq: int) -> dict[str, Any]:
    """`close_item` once more, for the streams held on `name` since: each one at an older position
    sees a gap and fetches the rest of the run, which ends it (docs/design/edge.md#late-holds).

    Without an id, which Pushpin would drop as seen, and outside its sequencer (`no-seq`), which
    would otherwise hold it a second for the item it seems to follow; delivered at once to every
    stream on the channel."""
    return {
        "channel": name,
        "prev-id": str(last_seq),
        "no-seq": True,
        "formats": {"http-stream": {"action": "close"}},
    }

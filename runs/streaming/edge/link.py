"""The link token of a stream the edge holds (docs/design/edge.md#link-token): what Pushpin sends back
with each fetch of the stream's link, sealed for one run, one user and the credential they
connected with, until an expiry.
"""

import base64
import binascii
import hashlib
import hmac
import os
import struct
from dataclasses import dataclass

from django.conf import settings

# 2: an API token is named by its id (1 carried its key): a link of 1 is refused, and its stream
# reconnects as a new one.
VERSION = 2
NONCE = 12
TAG = 16
# version, user id, expiry (Unix seconds, 0 = never), nonce; then the sealed credential, then the tag.
_HEAD = struct.Struct(">BQQ12s")
_KINDS = {b"t": "token", b"s": "session"}


@dataclass(frozen=True)
class Link:
    """Whose stream of which run a link is for, with what credential, until when."""

    run_id: str
    user_id: int
    token_id: int | None
    session_key: str | None
    expires: int  # Unix seconds; 0: never (RUNLEDGER_SSE_MAX_SECONDS = 0)

    @property
    def holder(self) -> tuple[int, int | None, str | None, str]:
        """What the re-check looks at: the same for every link of one user's credential and run."""
        return (self.user_id, self.token_id, self.session_key, self.run_id)


def _key(label: bytes) -> bytes:
    return hmac.new(settings.SECRET_KEY.encode(), b"runledger.grip-link." + label, hashlib.sha256).digest()


def _keystream(nonce: bytes, size: int) -> bytes:
    key = _key(b"cipher")
    blocks = (hmac.new(key, nonce + struct.pack(">I", i), hashlib.sha256).digest() for i in range((size + 31) // 32))
    return b"".join(blocks)[:size]


def _tag(run_id: str, sealed: bytes) -> bytes:
    return hmac.new(_key(b"mac"), run_id.encode() + b"|" + sealed, hashlib.sha256).digest()[:TAG]


def mint(link: Link) -> str:
    """The token (URL-safe base64), new at each call (its nonce)."""
    if link.token_id is not None:
        credential = b"t" + str(link.token_id).encode()
    else:
        credential = b"s" + (link.session_key or "").encode()
    nonce = os.urandom(NONCE)
    cipher = bytes(a ^ b for a, b in zip(credential, _keystream(nonce, len(credential)), strict=True))
    sealed = _HEAD.pack(VERSION, link.user_id, link.expires, nonce) + cipher
    return base64.urlsafe_b64encode(sealed + _tag(link.run_id, sealed)).rstrip(b"=").decode()


def read(*, run_id: str, token: str) -> Link | None:
    """The link `token` stands for, if it is sound and was minted for `run_id`; None otherwise
    (expired or not: the caller looks at `expires`)."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        return None
    sealed, tag = raw[:-TAG], raw[-TAG:]
    if len(sealed) <= _HEAD.size or not hmac.compare_digest(tag, _tag(run_id, sealed)):
        return None
    version, user_id, expires, nonce = _HEAD.unpack_from(sealed)
    if version != VERSION:
        return None
    cipher = sealed[_HEAD.size :]
    credential = bytes(a ^ b for a, b in zip(cipher, _keystream(nonce, len(cipher)), strict=True))
    kind, key = _KINDS.get(credential[:1]), credential[1:].decode("ascii", errors="replace")
    if kind is None or (kind == "token" and not key.isdigit()):
        return None
    return Link(
        run_id=run_id,
        user_id=user_id,
        token_id=int(key) if kind == "token" else None,
        session_key=key if kind == "session" else None,
        expires=expires,
    )

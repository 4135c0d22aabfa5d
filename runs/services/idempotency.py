"""Retry-safe creates: at most one run per (owner, Idempotency-Key), and the first answer again
for every retry within RUNLEDGER_IDEMPOTENCY_TTL_SECONDS (docs/design/api.md#idempotency-keys).
And retry-safe bulk commands (`answer_once`), whose keys are scoped to their endpoint.

What a create answers is the caller's business (the API's 201 and the run's JSON): the caller
hands `answer`, and this module keeps whatever it returns. It must be made inside the transaction
that inserts the run, so that a concurrent retry, which waits for that transaction, always finds
the answer stored with the key.
"""

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from runs.access import User
from runs.conf import conf
from runs.exceptions import IdempotencyMismatch, ValidationFailed
from runs.models import IdempotencyRecord, Run
from runs.selectors import run_parentable
from runs.services.creation import RunSpec, insert_run
from runs.services.statements import holding
from runs.storable import same_json

# IdempotencyRecord.key's length.
KEY_CHARS = 255


@dataclass(frozen=True)
class Answer:
    """What a create answered: a status and a JSON body, kept with its key for the retries."""

    status: int
    body: Any


@dataclass(frozen=True)
class Created:
    answer: Answer
    # True when `answer` is the stored answer to an earlier request with the same key.
    replayed: bool = False


def run_create_idempotent(
    *, owner: User, spec: RunSpec, key: str | None, request_body: Any, answer: Callable[[Run], Answer]
) -> Created:
    """Create the run of `spec` for `owner` and answer with `answer(run)`; with a key, at most
    once per (owner, key).

    The record and the run commit in one transaction, so a failed create leaves no record (and is
    not replayed), and a concurrent retry with the same key waits on the record's unique index
    until the first commits (PostgreSQL), or at BEGIN IMMEDIATE (SQLite), then replays it.
    """
    spec.check()
    spec.check_owner(owner)
    # Only the owner, or a holder of runs.change_run, may hang runs under a run
    # (docs/design/api.md#access): seeing it is not enough. Anyone else's parent is refused as bad
    # input, never revealed as a 404 or 409.
    if spec.parent_id is not None and not run_parentable(user=owner).filter(pk=spec.parent_id).exists():
        raise ValidationFailed("parent run not found", detail={"parent": [f"no run {spec.parent_id} visible to you"]})
    if key is None:
        with transaction.atomic(durable=True), holding():
            run = insert_run(spec, owner=owner)
        return Created(answer=answer(run))
    for _ in range(2):
        replay = _replay(owner=owner, key=key, request_body=request_body)
        if replay is not None:
            return Created(answer=replay, replayed=True)
        try:
            with transaction.atomic(durable=True):
                # Inserted first: a concurrent request with the same key blocks here until we end.
                record = IdempotencyRecord.objects.create(
                    user_id=owner.pk, key=key, request_body=request_body, created_at=timezone.now()
                )
                run = insert_run(spec, owner=owner)
                first = answer(run)
                record.response_status = first.status
                record.response_body = first.body
                record.run = run
                record.save(update_fields=["response_status", "response_body", "run"])
            return Created(answer=first)
        except IntegrityError:
            # The key was committed by a request that got there first: replay it on the next turn.
            continue
    raise RuntimeError(f"idempotency key {key!r} of user {owner.pk} neither replays nor inserts")


def _replay(*, owner: User, key: str, request_body: Any) -> Answer | None:
    record = IdempotencyRecord.objects.filter(user_id=owner.pk, key=key).first()
    if record is None:
        return None
    if record.created_at <= timezone.now() - timedelta(seconds=conf.IDEMPOTENCY_TTL_SECONDS):
        # Expired: the key is free again. Deleting by (pk, created_at) leaves a fresh record alone.
        IdempotencyRecord.objects.filter(pk=record.pk, created_at=record.created_at).delete()
        return None
    if not same_json(record.request_body, request_body):
        raise IdempotencyMismatch(
            "this Idempotency-Key was already used with a different request body",
            detail={"idempotency_key": key},
        )
    assert record.response_status is not None  # stored in the transaction that inserted the record
    return Answer(status=record.response_status, body=record.response_body)


def answer_once(*, owner: User, scope: str, key: str | None, request_body: Any, work: Callable[[], Answer]) -> Created:
    """`work()`'s answer, or with a key the first answer stored for (owner, `scope`, key) again.

    For commands over many runs (runs.services.bulk), which are many transactions, not one: the
    answer is stored after the work, when it succeeded. A failure stores nothing, so a retry does
    the work again — each run's command finds the runs already done ended and leaves them. Two
    concurrent requests with one key both work (each run's lock orders them; the second finds the
    first's runs ended) and both answer the first answer stored.
    """
    if key is None:
        return Created(answer=work())
    stored_key = scoped_key(scope, key)
    replay = _replay(owner=owner, key=stored_key, request_body=request_body)
    if replay is not None:
        return Created(answer=replay, replayed=True)
    first = work()
    try:
        with transaction.atomic(durable=True):
            IdempotencyRecord.objects.create(
                user_id=owner.pk,
                key=stored_key,
                request_body=request_body,
                response_status=first.status,
                response_body=first.body,
                created_at=timezone.now(),
            )
    except IntegrityError:
        # A concurrent request with the key stored its answer first: that one is the first.
        replay = _replay(owner=owner, key=stored_key, request_body=request_body)
        if replay is not None:
            return Created(answer=replay, replayed=True)
    return Created(answer=first)


def scoped_key(scope: str, key: str) -> str:
    """The stored form of a key given to `scope`'s endpoint: never the key a create stores (a
    client's key has no space, this one does), nor another scope's. A key too long for the column
    with its scope is stored as its SHA-256, after two spaces: no plain scoped key has them."""
    plain = f"{scope} {key}"
    if len(plain) <= KEY_CHARS:
        return plain
    return f"{scope}  sha256:{hashlib.sha256(key.encode()).hexdigest()}"

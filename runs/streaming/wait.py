"""A server-side wait (docs/design/streaming.md#wait): `GET /api/runs/{id}/wait/?timeout=S` answers
the run's JSON plus `wait_result` once the run has ended or waits, else after S seconds. It waits
as a stream does, on the hub's wake-ups, with the same checks, cap and re-check
(docs/design/streaming.md#wait-answer says how it answers).
"""

import asyncio
import json
import math
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from runs.access import can_see_ticket
from runs.events import EventType
from runs.http.asgi import Unanswered
from runs.http.errors import error_response, error_response_for
from runs.http.request_end import at_request_end
from runs.models import Run
from runs.selectors.run_json import run_json, run_with_current_attempt
from runs.streaming import hub, opening
from runs.streaming.checks import read_checks
from runs.streaming.guard import Watch, get_guard, too_many_streams
from runs.streaming.responses import WatchedResponse, served_under_wsgi
from runs.transitions import Status, is_terminal

# The longest wait one request may ask for, and the wait when it asks for none: a client that
# needs longer asks again (proxies commonly cut idle requests after 60 s).
MAX_SECONDS = 60.0
DEFAULT_SECONDS = 30.0


class WaitResult(StrEnum):
    ENDED = "ended"
    WAITING = "waiting"
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class Answer:
    """The run as one read saw it: its JSON without the resume ticket, which only some callers see."""

    data: dict[str, Any]
    ticket: str | None
    status: str
    last_seq: int
    # Its bytes by (ticket shown, result): the waiters an advance wakes encode it once.
    encoded: dict[tuple[bool, WaitResult], bytes] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class _Admitted:
    answer: Answer
    timeout: float
    sees_ticket: bool
    user_id: int
    token_id: int | None
    session_key: str | None


def _answer_of(run: Run) -> Answer:
    # Without the ticket; the caller adds it if theirs to see.
    data = run_json(run)
    return Answer(data=data, ticket=run.resume_ticket or None, status=run.status, last_seq=run.last_seq)


def _timeout(value: str | None) -> float | HttpResponse:
    if value is None:
        return DEFAULT_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_SECONDS:  # NaN fails both
        message = f"timeout must be a number of seconds, more than 0 and at most {MAX_SECONDS:g}"
        return error_response(400, "validation_error", message, {"timeout": [f"{value!r}: {message}"]})
    return seconds


def _checks(request: HttpRequest, run_id: str) -> _Admitted | HttpResponse:
    reader = read_checks(request, run_id)
    if isinstance(reader, HttpResponse):
        return reader
    timeout = _timeout(request.GET.get("timeout"))
    if isinstance(timeout, HttpResponse):
        return timeout
    return _Admitted(
        answer=_answer_of(reader.run),
        timeout=timeout,
        sees_ticket=can_see_ticket(reader.user, reader.run),
        user_id=int(reader.user.pk),
        token_id=reader.token_id,
        session_key=reader.session_key,
    )


def _read_answer(run_id: str) -> Answer | None:
    run = run_with_current_attempt(runs=Run.objects.select_related("owner").filter(pk=run_id)).first()
    return None if run is None else _answer_of(run)


def _result(status: str) -> WaitResult | None:
    if is_terminal(status):
        return WaitResult.ENDED
    return WaitResult.WAITING if status == Status.WAITING else None


def _settled(feed: hub.RunFeed) -> bool:
    """The feed says the run ended or waits: worth reading it again."""
    return feed.ended or (bool(feed.frames) and feed.frames[-1].type == EventType.RUN_WAITING)


# Reads of a run in flight by (run id, its feed's version): the waiters an advance wakes together
# read it once.
_reads = hub.loop_local(lambda loop: dict[tuple[str, int], "asyncio.Task[Answer | None]"]())


async def _shared_answer(feed: hub.RunFeed) -> Answer | None:
    reads = _reads()
    key = (feed.run_id, feed.version)
    task = reads.get(key)
    if task is None:
        task = reads[key] = hub.detached(feed.hub.loop, opening.call(_read_answer, feed.run_id))
        task.add_done_callback(lambda done: reads.pop(key, None) if reads.get(key) is done else None)
    return await asyncio.shield(task)


def _answer_bytes(admitted: _Admitted, answer: Answer, result: WaitResult) -> bytes:
    key = (admitted.sees_ticket, result)
    if key not in answer.encoded:
        data = dict(answer.data)
        if admitted.sees_ticket:
            data["resume_ticket"] = answer.ticket
        data["wait_result"] = result.value
        answer.encoded[key] = json.dumps(data, cls=DjangoJSONEncoder).encode()
    return answer.encoded[key]


# Read-only whatever the method, as the stream: CSRF protects nothing here.
@csrf_exempt
@served_under_wsgi
async def run_wait(request: HttpRequest, run_id: str) -> HttpResponseBase:
    admitted = await opening.answer(_checks, request, run_id)
    if isinstance(admitted, HttpResponse):
        return admitted
    result = _result(admitted.answer.status)
    if result is not None:
        return _no_store(
            HttpResponse(_answer_bytes(admitted, admitted.answer, result), content_type="application/json")
        )
    watch = get_guard().take_slot(
        user_id=admitted.user_id, token_id=admitted.token_id, session_key=admitted.session_key, run_id=run_id
    )
    if watch is None:
        return error_response_for(too_many_streams())
    # As a stream's: the body gives the slot back when it ends, the request's end if it never ran.
    at_request_end(request, watch.release)
    # The head now, the body when the wait ends: the middleware chain runs at admission, not when
    # the waiters of a run all answer at once (each of its steps a hop to one shared thread).
    return _no_store(WatchedResponse(watch, _body(admitted, watch), content_type="application/json"))


def _no_store(response: HttpResponseBase) -> HttpResponseBase:
    # The run's JSON, which may carry its resume ticket (docs/design/api.md#run-json); the head of
    # a wait that must wait goes before anyone knows whether its body will.
    response["Cache-Control"] = "no-store"
    return response


async def _body(admitted: _Admitted, watch: Watch) -> AsyncGenerator[bytes, None]:
    if not watch.start():
        raise Unanswered("the wait's slot was given back before it began")
    try:
        yield await _wait(admitted, watch)
    except (DatabaseError, TimeoutError) as exc:
        raise Unanswered(f"the database failed the wait ({exc})") from exc
    finally:
        watch.release()


async def _wait(admitted: _Admitted, watch: Watch) -> bytes:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + admitted.timeout
    runs = hub.get_hub()
    run_id = str(admitted.answer.data["id"])
    feed = runs.subscribe(run_id, head=admitted.answer.last_seq, ended=False)
    try:
        read_at = -1  # the feed's version when the run was last read
        while not watch.ended:
            timed_out = loop.time() >= deadline
            if timed_out or (_settled(feed) and feed.version != read_at):
                read_at = feed.version
                answer = await _shared_answer(feed)
                if answer is None:
                    raise Unanswered(f"run {run_id} was deleted")
                result = _result(answer.status)
                if result is not None or timed_out:
                    return _answer_bytes(admitted, answer, result or WaitResult.TIMEOUT)
                continue  # the read awaited: look at the feed again before waiting on it
            # No await since looking at the feed: an advance cannot have fallen between.
            waiter = feed.waiter()
            try:
                await watch.wait(waiter, deadline)
            finally:
                feed.drop(waiter)
    finally:
        runs.unsubscribe(feed)
    raise Unanswered(f"run {run_id}: the re-check ended the wait (guard.py)")

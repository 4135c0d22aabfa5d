"""The `openai_chat` agent (docs/how-to/agents.md): streams an answer from any OpenAI-compatible
Chat Completions endpoint over the attempt's own HTTP stream (`ctx.http_stream`), which a cancel
closes whatever the agent does — why it speaks the protocol rather than use the SDK:
docs/design/execution.md#agents. Registered when RUNLEDGER_AGENTS names this module."""

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from runs.agents.base import AgentContext, Complete, Directive, Emit, Fail, Step, register
from runs.agents.retry import Retry, RetryableError
from runs.conf import conf
from runs.events import USAGE_INCOMPLETE, EventType

log = logging.getLogger(__name__)

ROLES = ("system", "developer", "user", "assistant")
INPUT_KEYS = ("model", "messages", "max_tokens", "temperature", "continue")
# vLLM's request parameters that make the model go on with the final (assistant) message.
CONTINUE_FINAL_MESSAGE = {"continue_final_message": True, "add_generation_prompt": False}
# The official SDK's: a model may think for minutes before a chunk, but a server that does not take
# the connection within seconds is down.
TIMEOUT = httpx.Timeout(600.0, connect=5.0)
# Of an error answer, what is read and kept in the run's `error`.
ERROR_BODY_BYTES = 64 * 1024
DONE = "[DONE]"
# A request refused for the moment (429, 5xx) or whose connection failed before the first token is
# sent again (docs/design/execution.md#agents); once a token has arrived, never: watchers saw it.
MODEL_RETRY = Retry(attempts=4, backoff=1.0, max_backoff=30.0)
# The longest Retry-After honoured: a server asking for longer is answered by failing the run.
RETRY_AFTER_MAX = 60.0


@dataclass(frozen=True)
class ChatInput:
    model: str
    messages: list[dict[str, str]]
    max_tokens: int | None
    temperature: float | None
    continue_: bool


def _messages_problem(messages: Any) -> str | None:
    if not isinstance(messages, list) or not messages:
        return 'must be a non-empty list of {"role": ..., "content": ...} objects'
    for i, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or set(message) != {"role", "content"}
            or message["role"] not in ROLES
            or not isinstance(message["content"], str)
        ):
            return f"item {i} must be an object with exactly a role ({', '.join(ROLES)}) and a string content"
    return None


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_input(input: dict[str, Any]) -> dict[str, str]:
    """What is wrong with a run's input, by key: a create with anything here is a 400."""
    problems = {
        key: f"is not an input of openai_chat; its keys are {', '.join(INPUT_KEYS)}"
        for key in sorted(set(input) - set(INPUT_KEYS))
    }
    model = input.get("model")
    if not isinstance(model, str) or not model.strip():
        problems["model"] = "must be a non-empty string"
    messages = _messages_problem(input.get("messages"))
    if messages is not None:
        problems["messages"] = messages
    max_tokens = input.get("max_tokens")
    most = conf.OPENAI_MAX_TOKENS
    if max_tokens is not None and (not _whole(max_tokens) or max_tokens < 1 or (most and max_tokens > most)):
        problems["max_tokens"] = f"must be a whole number from 1 to {most}" if most else "must be a whole number ≥ 1"
    temperature = input.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 <= temperature <= 2
    ):
        problems["temperature"] = "must be a number from 0 to 2"
    if "continue" in input and not isinstance(input["continue"], bool):
        problems["continue"] = "must be true or false"
    return problems


def parse_input(input: dict[str, Any]) -> ChatInput:
    """The run's input, checked before anything is sent; ValueError names what is wrong."""
    problems = check_input(input)
    if problems:
        raise ValueError("; ".join(f"{key} {problem}" for key, problem in sorted(problems.items())))
    temperature = input.get("temperature")
    return ChatInput(
        model=input["model"],
        messages=input["messages"],
        max_tokens=input.get("max_tokens"),
        temperature=None if temperature is None else float(temperature),
        continue_=input.get("continue", conf.OPENAI_CONTINUE),
    )


class Answer:
    """The answer as stored: what earlier attempts stored, then what this attempt streams.

    Asked again (no `continue`), the server starts the answer over: the first `len(stored)`
    characters it sends stand for the stored text and are not stored again."""

    def __init__(self, stored: str, *, starts_over: bool) -> None:
        self.stored = stored
        self.text = stored
        self._skip = len(stored) if starts_over else 0
        self._skipped = ""
        self.chunks = 0

    def take(self, content: Any) -> str:
        """The part of a chunk's `content` to store."""
        if not isinstance(content, str) or not content:
            return ""
        self.chunks += 1
        if self._skip:
            head, content = content[: self._skip], content[self._skip :]
            self._skip -= len(head)
            self._skipped += head
            if not self._skip and self._skipped != self.stored:
                log.warning("asked again, the model answered otherwise than the stored text; the rest is spliced on")
        self.text += content
        return content


def _request(chat: ChatInput, answer: Answer) -> dict[str, Any]:
    messages = list(chat.messages)
    body: dict[str, Any] = {"model": chat.model, "messages": messages, "stream": True}
    # The usage comes in a last chunk of its own, only when asked for.
    body["stream_options"] = {"include_usage": True}
    # Never unbounded on the operator's key: a run that names no bound gets the operator's.
    max_tokens = chat.max_tokens or conf.OPENAI_MAX_TOKENS
    if max_tokens:
        body["max_tokens"] = max_tokens
    if chat.temperature is not None:
        body["temperature"] = chat.temperature
    if chat.continue_ and answer.stored:
        messages.append({"role": "assistant", "content": answer.stored})
        body.update(CONTINUE_FINAL_MESSAGE)
    return body


async def _server_events(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The data of each server-sent event: its `data:` lines joined; a blank line ends an event.
    The other fields and comments say nothing a chat completion needs."""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
            data = []
        elif line.startswith("data:"):
            data.append(line[6:] if line.startswith("data: ") else line[5:])


def _no_constant(name: str) -> Any:
    # json.loads takes NaN and ±Infinity, which no run can store (runs/storable.py).
    raise ValueError(f"{name} is not a JSON value")


def _json(data: str | bytes) -> Any:
    return json.loads(data, parse_constant=_no_constant)


async def _error_body(response: httpx.Response) -> Any:
    """An error answer's body as the SDK reports it: the `error` object of an OpenAI-shaped JSON
    body, the JSON otherwise, else its text — read only so far."""
    raw = b""
    async for part in response.aiter_bytes():
        raw += part
        if len(raw) >= ERROR_BODY_BYTES:
            break
    try:
        body = _json(raw[:ERROR_BODY_BYTES])
    except ValueError:
        return raw[:ERROR_BODY_BYTES].decode("utf-8", "replace").replace("\x00", "\ufffd")
    return body.get("error", body) if isinstance(body, dict) else body


def _refused(response: httpx.Response, body: Any) -> Fail:
    said = body.get("message") if isinstance(body, dict) else None
    reason = said if isinstance(said, str) and said else response.reason_phrase
    return Fail(f"the model server answered HTTP {response.status_code}: {reason}", {"body": body})


def _retry_after(response: httpx.Response) -> float | None:
    """The response's Retry-After in seconds (a number, or an HTTP date), or None."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds()
        except (TypeError, ValueError):
            return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _busy(response: httpx.Response) -> RetryableError | None:
    """The error to retry a refused request with, or None when it is refused for good."""
    if response.status_code != 429 and response.status_code < 500:
        return None
    retry_after = _retry_after(response)
    if retry_after is not None and retry_after > RETRY_AFTER_MAX:
        return None
    return RetryableError(f"HTTP {response.status_code} {response.reason_phrase}", retry_after=retry_after)


def _usage_counters(usage: dict[str, Any] | None) -> dict[str, Any]:
    """The data of `usage.reported` for what the server said the request used (its usage object,
    or None when it said nothing): the tokens in and out, or `incomplete` for what it left out."""
    usage = usage or {}
    counters = {
        ours: usage[theirs]
        for ours, theirs in (("input_tokens", "prompt_tokens"), ("output_tokens", "completion_tokens"))
        if isinstance(usage.get(theirs), int) and not isinstance(usage[theirs], bool) and usage[theirs] >= 0
    }
    return counters if len(counters) == 2 else {**counters, USAGE_INCOMPLETE: True}


class _Stream:
    """What the chunks said so far, beside the answer's text."""

    def __init__(self) -> None:
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None

    def read(self, data: str, answer: Answer) -> str:
        """The text of one chunk to store; ValueError if it is not a chunk, or an error event."""
        try:
            chunk = _json(data)
        except ValueError as exc:
            raise ValueError(f"a chunk is not JSON ({exc}): {data[:200]!r}") from exc
        if not isinstance(chunk, dict):
            raise ValueError(f"a chunk is not a JSON object: {data[:200]!r}")
        error = chunk.get("error")
        if error is not None:
            said = error.get("message") if isinstance(error, dict) else error
            raise ValueError(f"the server sent an error: {said}")
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        # One answer is asked for (no `n`): its choice is the first.
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta")
        return answer.take(delta.get("content") if isinstance(delta, dict) else None)


@register("openai_chat", check_input=check_input)
async def openai_chat(ctx: AgentContext) -> AsyncIterator[Directive]:
    try:
        chat = parse_input(ctx.input)
    except ValueError as exc:
        yield Fail(f"bad input: {exc}", {"input": ctx.input})
        return
    stored = "".join(e.data.get("text", "") for e in ctx.events if e.type == EventType.OUTPUT_DELTA)
    answer = Answer(stored, starts_over=not chat.continue_)
    if not stored:  # a turn an earlier attempt began (its deltas are stored) is counted once
        yield Step("model")
    url = f"{conf.OPENAI_BASE_URL.rstrip('/')}/chat/completions"
    key = conf.OPENAI_API_KEY
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    stream = _Stream()
    refused: Fail | None = None
    call = 1
    while True:
        busy: RetryableError | None = None
        try:
            # The attempt's own stream: when the run is cancelled or stopped, the attempt closes it —
            # response and connection, so the server stops generating — even if this agent is stuck.
            request = _request(chat, answer)
            async with ctx.http_stream("POST", url, json=request, headers=headers, timeout=TIMEOUT) as response:
                if not response.is_success:
                    busy = _busy(response) if call < MODEL_RETRY.attempts else None
                    if busy is None:
                        refused = _refused(response, await _error_body(response))
                else:
                    async for data in _server_events(response.aiter_lines()):
                        if data == DONE:
                            break
                        text = stream.read(data, answer)
                        if text:
                            yield Emit(EventType.OUTPUT_DELTA, {"text": text})
        except (asyncio.CancelledError, GeneratorExit):
            if ctx.token.tripped:
                # Cancelled or stopped under it, the run takes no more events: the usage the server
                # sent so far goes with the attempt's release.
                ctx.report_usage_at_stop(_usage_counters(stream.usage))
            raise
        except httpx.HTTPError as exc:
            if ctx.token.tripped:  # the attempt closed the stream: see above
                ctx.report_usage_at_stop(_usage_counters(stream.usage))
                return
            why = f"{type(exc).__name__}: {exc}"
            if answer.chunks:
                # Tokens arrived: asked again, the model would repeat what the watchers saw.
                yield Emit(EventType.USAGE_REPORTED, _usage_counters(stream.usage))
                yield Fail(f"the model stream ended early, after {answer.chunks} chunks: {why}")
                return
            if not isinstance(exc, httpx.TransportError) or call >= MODEL_RETRY.attempts:
                yield Fail(f"the model request to {url} failed: {why}")
                return
            busy = RetryableError(why)
        except ValueError as exc:
            yield Emit(EventType.USAGE_REPORTED, _usage_counters(stream.usage))
            yield Fail(f"the model stream ended early, after {answer.chunks} chunks: {exc}")
            return
        if busy is None:
            break
        await ctx.retry_wait("model", busy, call=call, retry=MODEL_RETRY)
        call += 1
    if refused is not None:
        yield refused
        return
    yield Emit(EventType.USAGE_REPORTED, _usage_counters(stream.usage))
    if stream.finish_reason is None:
        yield Fail(f"the model stream ended early, after {answer.chunks} chunks: it closed without a finish_reason")
        return
    yield Complete({"text": answer.text, "usage": stream.usage, "finish_reason": stream.finish_reason})

"""The `openai_chat` agent: streams an answer from any OpenAI-compatible Chat Completions endpoint
(OpenAI, vLLM, Ollama, …) through the official SDK. It is in the optional extra `openai`
(`pip install -e '.[openai]'`) and registered when `runs.agents.openai_chat` is in RUNLEDGER_AGENTS;
the endpoint is RUNLEDGER_OPENAI_BASE_URL with RUNLEDGER_OPENAI_API_KEY.

Input: {"model": "...", "messages": [{"role": "...", "content": "..."}, ...]}, optionally
`max_tokens`, `temperature` and `continue` (see below). Each streamed chunk's text is an
`output.delta`; the request is one model turn (`Step("model")`); the run completes with
{"text": the whole answer, "usage": what the server reported, "finish_reason": ...}. The stored
text (the deltas, in order) is always exactly `text`.

A requeued attempt (its worker died) does not store again what is already stored. With `continue`
(input, default RUNLEDGER_OPENAI_CONTINUE) it sends the stored text as a final assistant message
for the server to go on from — vLLM's `continue_final_message`; OpenAI's API cannot continue a
partial message. Otherwise it asks again and stores only what goes beyond the stored text.
"""

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

from django.conf import settings

from runs.agents.base import AgentContext, Complete, Directive, Emit, Fail, Step, register
from runs.events import EventType

try:
    import httpx2
    import openai
    from openai.types.chat import ChatCompletionMessageParam
except ImportError as exc:  # the message the process stops with names the cure
    raise ImportError(
        "runs.agents.openai_chat needs the OpenAI SDK, which comes with Runledger's `openai` extra: "
        f"pip install -e '.[openai]' ({exc})"
    ) from exc

log = logging.getLogger(__name__)

ROLES = ("system", "developer", "user", "assistant")
INPUT_KEYS = ("model", "messages", "max_tokens", "temperature", "continue")
# vLLM's request parameters that make the model go on with the final (assistant) message.
CONTINUE_FINAL_MESSAGE = {"continue_final_message": True, "add_generation_prompt": False}
# The SDK refuses to start without a key; servers that need none (vLLM, Ollama) ignore it.
PLACEHOLDER_KEY = "none"
# The system's CA certificates, loaded once per process: each run has a client of its own, and
# loading them for each would hold the worker's event loop (every run it executes) ~100 ms a run.
TLS = httpx2.create_ssl_context()


@dataclass(frozen=True)
class ChatInput:
    model: str
    messages: list[dict[str, str]]
    max_tokens: int | None
    temperature: float | None
    continue_: bool


def parse_input(input: dict[str, Any]) -> ChatInput:
    """The run's input, checked before anything is sent; ValueError names what is wrong."""
    unknown = sorted(set(input) - set(INPUT_KEYS))
    if unknown:
        raise ValueError(f"unknown input keys {unknown}; the keys are {', '.join(INPUT_KEYS)}")
    model = input.get("model")
    if not isinstance(model, str) or not model.strip():
        raise ValueError("model must be a non-empty string")
    messages = input.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError('messages must be a non-empty list of {"role": ..., "content": ...} objects')
    for i, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or set(message) != {"role", "content"}
            or message["role"] not in ROLES
            or not isinstance(message["content"], str)
        ):
            raise ValueError(
                f"messages[{i}] must be an object with exactly a role ({', '.join(ROLES)}) and a string content"
            )
    max_tokens = input.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError("max_tokens must be a whole number ≥ 1")
    temperature = input.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 <= temperature <= 2
    ):
        raise ValueError("temperature must be a number from 0 to 2")
    continue_ = input.get("continue", settings.RUNLEDGER_OPENAI_CONTINUE)
    if not isinstance(continue_, bool):
        raise ValueError("continue must be true or false")
    return ChatInput(model, messages, max_tokens, None if temperature is None else float(temperature), continue_)


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

    def take(self, content: str | None) -> str:
        """The part of a chunk's `content` to store."""
        if not content:
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


def _messages(chat: ChatInput, answer: Answer) -> list[ChatCompletionMessageParam]:
    messages = list(chat.messages)
    if chat.continue_ and answer.stored:
        messages.append({"role": "assistant", "content": answer.stored})
    # Checked by parse_input: each is a {"role", "content"} of a role the API knows.
    return cast(list[ChatCompletionMessageParam], messages)


def _why(exc: openai.APIError) -> str:
    cause = exc.__cause__
    return exc.message + (f" ({type(cause).__name__}: {cause})" if cause is not None else "")


@register("openai_chat")
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
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    try:
        # Retries off: the platform's requeue is the retry, so no request is sent twice unseen.
        # The client is closed on the way out — the worker cancelling this task on a cancel or
        # stop included — and with it the stream's connection, so the server stops generating.
        async with openai.AsyncOpenAI(
            base_url=settings.RUNLEDGER_OPENAI_BASE_URL,
            api_key=settings.RUNLEDGER_OPENAI_API_KEY or PLACEHOLDER_KEY,
            max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(verify=TLS),
        ) as client:
            stream = await client.chat.completions.create(
                model=chat.model,
                messages=_messages(chat, answer),
                max_tokens=openai.omit if chat.max_tokens is None else chat.max_tokens,
                temperature=openai.omit if chat.temperature is None else chat.temperature,
                stream=True,
                stream_options={"include_usage": True},
                extra_body=CONTINUE_FINAL_MESSAGE if chat.continue_ and answer.stored else None,
            )
            async with stream:
                async for chunk in stream:
                    if chunk.usage is not None:
                        usage = chunk.usage.model_dump(mode="json", exclude_unset=True)
                    for choice in chunk.choices[:1]:
                        finish_reason = choice.finish_reason or finish_reason
                        text = answer.take(choice.delta.content)
                        if text:
                            yield Emit(EventType.OUTPUT_DELTA, {"text": text})
    except openai.APIStatusError as exc:
        # The SDK hands over the error object of an OpenAI-shaped body; its message says it best.
        said = exc.body.get("message") if isinstance(exc.body, dict) else None
        yield Fail(f"the model server answered HTTP {exc.status_code}: {said or exc.message}", {"body": exc.body})
        return
    except openai.APIError as exc:
        if answer.chunks:
            yield Fail(f"the model stream ended early, after {answer.chunks} chunks: {_why(exc)}")
        else:
            yield Fail(f"the model request to {settings.RUNLEDGER_OPENAI_BASE_URL} failed: {_why(exc)}")
        return
    if finish_reason is None:
        yield Fail(f"the model stream ended early, after {answer.chunks} chunks: it closed without a finish_reason")
        return
    yield Complete({"text": answer.text, "usage": usage, "finish_reason": finish_reason})

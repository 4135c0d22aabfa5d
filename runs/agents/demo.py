"""The built-in `demo` agent (docs/design/execution.md#agents): every execution path — a model
stream, a tool step of each kind a cancel must stop, a question, child runs — visible and testable
without a network. Each attempt continues from the stored events, so after a requeue or resume the
stored text is exactly what one uninterrupted run produces (`demo_text(deltas)`)."""

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from runs.agents.base import AgentContext, Complete, Directive, Emit, Fail, Step, StoredEvent, Wait, register
from runs.agents.retry import Retry, RetryableError
from runs.events import EventType, ToolStatus, WaitReason

TOOL_CALL_ID = "call-1"
TOOLS = ("slow", "stubborn", "process", "blocking")

# The "process" tool: sleeps, with a grandchild that sleeps as long, both in the child's process
# group — the whole group must go when the run is cancelled.
PROCESS_SCRIPT = """
import subprocess, sys, time
seconds = float(sys.argv[1])
sleep = "import sys, time; time.sleep(float(sys.argv[1]))"
grandchild = subprocess.Popen([sys.executable, "-c", sleep, sys.argv[1]], stdout=subprocess.DEVNULL)
time.sleep(seconds)
grandchild.wait()
print(f"slept {round(seconds * 1000)} ms")
"""


def delta_text(i: int) -> str:
    return f"chunk {i} "


def demo_text(deltas: int) -> str:
    """The text one uninterrupted demo run with `deltas` chunks produces."""
    return "".join(delta_text(i) for i in range(deltas))


async def slow_tool(ctx: AgentContext, seconds: float) -> dict[str, Any]:
    # Honours cancellation: it races its wait against the token, as a well-behaved client would.
    await ctx.token.race(asyncio.sleep(seconds))
    return {"slept_ms": round(seconds * 1000)}


async def stubborn_tool(seconds: float) -> dict[str, Any]:
    # Ignores cancellation on purpose, as a blocking client library or a careless tool does: it
    # swallows CancelledError and goes on until its work is done. The worker must abandon it.
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while (left := end - loop.time()) > 0:
        try:
            await asyncio.sleep(left)
        except asyncio.CancelledError:
            continue
    return {"slept_ms": round(seconds * 1000), "ignored_cancellation": True}


async def process_result(process: asyncio.subprocess.Process, seconds: float) -> tuple[ToolStatus, dict[str, Any]]:
    stdout, _ = await process.communicate()
    result = {
        "slept_ms": round(seconds * 1000),
        "returncode": process.returncode,
        "stdout": stdout.decode(errors="replace").strip(),
    }
    return (ToolStatus.OK if process.returncode == 0 else ToolStatus.ERROR), result


def blocking_sleep(seconds: float) -> dict[str, Any]:
    # Synchronous, as a blocking client library is: nothing can interrupt it.
    time.sleep(seconds)
    return {"slept_ms": round(seconds * 1000)}


def _int(input: dict[str, Any], key: str, default: int) -> int:
    value = input.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{key} must be a non-negative number")
    return int(value)


# The largest value of each number in the input a create accepts
# (docs/design/fair-use.md#input-checks): what one run may ask of the workers. Unknown keys are
# accepted and ignored.
INPUT_BOUNDS = {"deltas": 100_000, "delay_ms": 60_000, "tool_ms": 600_000, "children": 10, "flaky": 10}


def check_input(input: dict[str, Any]) -> dict[str, str]:
    problems = {}
    for key, most in INPUT_BOUNDS.items():
        value = input.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= most:
            problems[key] = f"must be a number from 0 to {most}, not {value!r}"
    tool = input.get("tool")
    if tool is not None and tool not in TOOLS:
        problems["tool"] = f"must be one of {', '.join(TOOLS)} (or null), not {tool!r}"
    if input.get("child_input") is not None and not isinstance(input["child_input"], dict):
        problems["child_input"] = "must be an object"
    if "steps" in input and not isinstance(input["steps"], bool):
        problems["steps"] = "must be true or false"
    return problems


class _Stored:
    """What earlier attempts of this run already stored."""

    def __init__(self, events: Sequence[StoredEvent]) -> None:
        self.deltas = sum(1 for e in events if e.type == EventType.OUTPUT_DELTA)
        self.children = [e.data.get("run_id") for e in events if e.type == EventType.CHILD_SPAWNED]
        # The call as its last event left it: open (started, not finished), finished, or neither —
        # never started, or sealed `interrupted` by a pause, after which it starts anew.
        call = [
            e
            for e in events
            if e.type in (EventType.TOOL_STARTED, EventType.TOOL_FINISHED) and e.data.get("call_id") == TOOL_CALL_ID
        ]
        last = call[-1] if call else None
        self.tool_started = last is not None and last.type == EventType.TOOL_STARTED
        self.tool_finished = (
            last is not None
            and last.type == EventType.TOOL_FINISHED
            and last.data.get("status") != ToolStatus.INTERRUPTED
        )
        self.tool_result: Any = last.data.get("result") if last is not None and self.tool_finished else None
        # The answer to our question: the input of the first resume after an input_required wait.
        self.asked = False
        self.answered = False
        self.answer: Any = None
        for e in events:
            if e.type == EventType.RUN_WAITING and e.data.get("reason") == WaitReason.INPUT_REQUIRED:
                self.asked = True
            elif e.type == EventType.RUN_RESUMED and self.asked and not self.answered:
                self.answered = True
                self.answer = e.data.get("input")


@register("demo", check_input=check_input)
async def demo(ctx: AgentContext) -> AsyncIterator[Directive]:
    try:
        deltas = _int(ctx.input, "deltas", 40)
        delay = _int(ctx.input, "delay_ms", 100) / 1000
        tool_seconds = _int(ctx.input, "tool_ms", 5000) / 1000
        children = 0 if ctx.is_child else _int(ctx.input, "children", 0)
        flaky = _int(ctx.input, "flaky", 0)
    except ValueError as exc:
        yield Fail(str(exc), {"input": ctx.input})
        return
    tool = ctx.input.get("tool")
    if tool is not None and tool not in TOOLS:
        yield Fail(f"unknown tool {tool!r}", {"tools": list(TOOLS)})
        return
    ask = ctx.input.get("ask")
    stored = _Stored(ctx.events)
    tool_result = stored.tool_result

    overrides = ctx.input.get("child_input") or {}
    if not isinstance(overrides, dict):
        yield Fail("child_input must be an object", {"input": ctx.input})
        return
    child_ids = list(stored.children)
    for _ in range(len(child_ids), children):
        child_input = {k: v for k, v in ctx.input.items() if k != "child_input"} | overrides | {"children": 0}
        child_ids.append(str(await ctx.spawn_child(child_input)))

    if ctx.input.get("steps") is True:
        async for directive in _durably(ctx, deltas, delay, tool, tool_seconds, flaky, stored, child_ids):
            yield directive
        return

    half = deltas // 2
    # One model turn before the halfway point and one after it; a turn already under way in an
    # earlier attempt (some of its deltas are stored) is not counted again.
    if stored.deltas == 0 and half > 0:
        yield Step("model")
    for i in range(deltas):
        if i == half:
            if tool is not None and not stored.tool_finished:
                call = {"call_id": TOOL_CALL_ID, "name": tool}
                if not stored.tool_started:
                    yield Step("tool")
                process = None
                if tool == "process":
                    # Started before `tool.started`, which names its pid.
                    process = await ctx.start_process(
                        sys.executable, "-c", PROCESS_SCRIPT, str(tool_seconds), stdout=asyncio.subprocess.PIPE
                    )
                if not stored.tool_started:
                    started = call | {"arguments": {"seconds": tool_seconds}}
                    yield Emit(EventType.TOOL_STARTED, started if process is None else started | {"pid": process.pid})
                status = ToolStatus.OK
                if tool == "slow":
                    tool_result = await slow_tool(ctx, tool_seconds)
                elif tool == "stubborn":
                    tool_result = await stubborn_tool(tool_seconds)
                elif process is not None:
                    status, tool_result = await process_result(process, tool_seconds)
                else:
                    tool_result = await ctx.to_thread(blocking_sleep, tool_seconds)
                yield Emit(EventType.TOOL_FINISHED, call | {"status": status, "result": tool_result})
            if ask is not None and not stored.asked:
                yield Wait(WaitReason.INPUT_REQUIRED, str(ask))
                return
            if stored.deltas <= i:
                yield Step("model")
        if i < stored.deltas:
            continue
        await asyncio.sleep(delay)
        yield Emit(EventType.OUTPUT_DELTA, {"text": delta_text(i)})

    yield Complete(_output(deltas, tool, tool_result, ask, stored.answer, child_ids))


def _output(
    deltas: int, tool: str | None, tool_result: Any, ask: Any, answer: Any, children: list[Any]
) -> dict[str, Any]:
    output: dict[str, Any] = {"text": demo_text(deltas), "deltas": deltas}
    if tool is not None:
        output["tool_result"] = tool_result
    if ask is not None:
        output["answer"] = answer
    if children:
        output["children"] = children
    return output


async def _turn(first: int, last: int, delay: float) -> list[str]:
    """A model turn of the durable mode: the deltas `first` to `last` - 1, as slow as the others."""
    await asyncio.sleep(delay * (last - first))
    return [delta_text(i) for i in range(first, last)]


async def _tool_call(ctx: AgentContext, tool: str, seconds: float, busy: list[int]) -> Any:
    """The tool as a durable step's work: busy (retried) while `busy` says so, then each kind as above."""
    if busy[0] > 0:
        busy[0] -= 1
        raise RetryableError(f"the {tool} tool is busy")
    if tool == "slow":
        return await slow_tool(ctx, seconds)
    if tool == "stubborn":
        return await stubborn_tool(seconds)
    if tool == "process":
        process = await ctx.start_process(
            sys.executable, "-c", PROCESS_SCRIPT, str(seconds), stdout=asyncio.subprocess.PIPE
        )
        status, result = await process_result(process, seconds)
        return {**result, "status": status}
    return await ctx.to_thread(blocking_sleep, seconds)


async def _durably(
    ctx: AgentContext,
    deltas: int,
    delay: float,
    tool: str | None,
    tool_seconds: float,
    flaky: int,
    stored: _Stored,
    children: list[Any],
) -> AsyncIterator[Directive]:
    """`"steps": true`: the same run on durable steps (docs/design/execution.md#steps) — each model
    turn and the tool call a step, whose deltas are emitted once it is stored; with `flaky`, the
    tool is busy that many times first, each a `step.retrying`. A new attempt runs it from the top
    and the platform replays (docs/design/execution.md#determinism)."""
    half = deltas // 2
    for text in await ctx.step("model", _turn, 0, half, delay) if half else []:
        yield Emit(EventType.OUTPUT_DELTA, {"text": text})
    tool_result = None
    if tool is not None:
        retry = Retry(attempts=flaky + 1, backoff=0.2, max_backoff=1)
        tool_result = await ctx.step("tool", _tool_call, ctx, tool, tool_seconds, [flaky], retry=retry)
    ask = ctx.input.get("ask")
    # Asked once: an attempt after the answer finds it in the log, whatever its place (see Replay).
    if ask is not None and not stored.asked:
        yield Wait(WaitReason.INPUT_REQUIRED, str(ask))
        return
    for text in await ctx.step("model", _turn, half, deltas, delay):
        yield Emit(EventType.OUTPUT_DELTA, {"text": text})
    yield Complete(_output(deltas, tool, tool_result, ask, stored.answer, children))

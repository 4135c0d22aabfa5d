"""Agents of the tests' own, in a module outside the project as a user's would be: web and worker
processes load it through RUNLEDGER_AGENTS (`AGENTS_ENV`), the test process by importing it.

Beside the planner, agents that each take one kind of step the attempt must stop when the run is
cancelled (docs/design/execution.md#step-kinds), in a way a test can watch from outside the
worker, one that reports its usage as it is cancelled, and one on durable steps whose tool counts
its calls in a file (docs/design/execution.md#steps)."""

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from runs.agents import AgentContext, Complete, Directive, Emit, Retry, RetryableError, Step, register
from runs.agents.demo import stubborn_tool
from runs.agents.openai_chat import openai_chat
from runs.events import EventType, ToolStatus

# The environment that makes a web or worker process load these agents beside the demo.
AGENTS_ENV = {"RUNLEDGER_AGENTS": f"runs.agents.demo,{__name__}"}

PLAN_UPDATED = "plan.updated"
NOTE = "test.note"


@register("planner", event_types=[PLAN_UPDATED])
async def planner(ctx: AgentContext) -> AsyncIterator[Directive]:
    """Announces its plan in a type of its own, then answers."""
    yield Emit(PLAN_UPDATED, {"steps": ["think", "answer"]})
    yield Emit(EventType.OUTPUT_DELTA, {"text": "planned"})
    yield Complete({"text": "planned"})


# A child process that ignores SIGTERM — and so does the grandchild it starts in its process
# group, since an ignored signal stays ignored across fork and exec — so only the SIGKILL after
# the grace ends them. It prints the grandchild's pid once both ignore SIGTERM.
DEAF_TO_SIGTERM = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
sleep = "import time; time.sleep(120)"
grandchild = subprocess.Popen([sys.executable, "-c", sleep], stdout=subprocess.DEVNULL)
print(grandchild.pid, flush=True)
time.sleep(120)
"""


@register("test-process")
async def process_agent(ctx: AgentContext) -> AsyncIterator[Directive]:
    """Runs DEAF_TO_SIGTERM; names the child's and the grandchild's pids in `tool.started`.
    With `ignore_cancel`, the agent ignores the cancellation too, and is abandoned."""
    yield Step("tool")
    process = await ctx.start_process(sys.executable, "-c", DEAF_TO_SIGTERM, stdout=asyncio.subprocess.PIPE)
    assert process.stdout is not None
    grandchild = int(await process.stdout.readline())
    call = {"call_id": "call-1", "name": "deaf-process"}
    yield Emit(EventType.TOOL_STARTED, call | {"arguments": {}, "pid": process.pid, "grandchild_pid": grandchild})
    try:
        returncode = await process.wait()
    except asyncio.CancelledError:
        if ctx.input.get("ignore_cancel"):
            await stubborn_tool(60)
        raise
    yield Emit(EventType.TOOL_FINISHED, call | {"status": ToolStatus.OK, "result": {"returncode": returncode}})


@register("test-tool-env")
async def tool_env_agent(ctx: AgentContext) -> AsyncIterator[Directive]:
    """Starts a tool process that prints the environment it got — with `input["env"]` as its
    `env=` when given — and completes with it."""
    yield Step("tool")
    given = {"env": ctx.input["env"]} if "env" in ctx.input else {}
    printer = "import json, os; print(json.dumps(dict(os.environ)))"
    process = await ctx.start_process(sys.executable, "-c", printer, stdout=asyncio.subprocess.PIPE, **given)
    printed, _ = await process.communicate()
    yield Complete({"env": json.loads(printed)})


@register("test-http-stream")
async def http_stream_agent(ctx: AgentContext) -> AsyncIterator[Directive]:
    """Streams `input["url"]`: its first line becomes an `output.delta`, the rest is read without
    yielding, so a cancellation finds the agent inside the stream. With `ignore_cancel`, the agent
    stops reading after the first line and ignores the cancellation, holding the stream open:
    only the attempt can close it then (a read that is cancelled closes its connection itself)."""
    yield Step("model")
    async with ctx.http_stream("GET", ctx.input["url"], timeout=30) as response:
        lines = response.aiter_lines()
        yield Emit(EventType.OUTPUT_DELTA, {"text": await anext(lines)})
        if ctx.input.get("ignore_cancel"):
            await stubborn_tool(60)
        read = 1
        async for _ in lines:
            read += 1
    yield Complete({"lines": read})


@register("test-usage-at-stop")
async def usage_at_stop_agent(ctx: AgentContext) -> AsyncIterator[Directive]:
    """Streams one delta, then waits for the cancel and, unwinding, reports `input["at_stop"]` as
    its usage at stop — with `input["digits"]`, an `output_tokens` of that many digits besides (no
    request could carry it: its input would be refused)."""
    yield Emit(EventType.OUTPUT_DELTA, {"text": "working"})
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        counters = dict(ctx.input.get("at_stop", {}))
        if "digits" in ctx.input:
            counters["output_tokens"] = 10 ** (int(ctx.input["digits"]) - 1)
        ctx.report_usage_at_stop(counters)
        raise
    yield Complete(None)


@register("test-stubborn-chat")
async def stubborn_chat(ctx: AgentContext) -> AsyncIterator[Directive]:
    """`openai_chat` under an agent of one's own that ignores cancellation: after the first delta it
    waits on work that swallows CancelledError, while `openai_chat`, paused at its `yield`, holds
    the model stream open — only the attempt can close it then."""
    async for directive in openai_chat(ctx):
        yield directive
        if isinstance(directive, Emit):
            await stubborn_tool(60)


def count_call(path: str, name: str, key: str | None) -> dict[str, Any]:
    """A tool's side effect outside the database: one line per call in the file at `path`."""
    with open(path, "a") as calls:
        calls.write(f"{name} {key}\n")
    return {"name": name, "key": key}


@register("test-steps", event_types=[NOTE])
async def steps_agent(ctx: AgentContext) -> AsyncIterator[Directive]:
    """Durable steps (docs/design/execution.md#steps): for each name of `input["steps"]`, a note,
    then a step counted in the file `input["calls"]` (blocking code, in a thread). With
    `input["hold"]`, it waits after the first step until that file exists; with `input["fail"]`,
    the step of that name raises RetryableError the first `input["fail_times"]` calls
    (`input["backoff"]` seconds apart); with `input["nan"]`, the step of that name returns NaN."""
    calls = ctx.input["calls"]
    results = []
    for i, name in enumerate(ctx.input.get("steps", ["one", "two"])):
        yield Emit(NOTE, {"before": name})

        async def call(name: str = name) -> Any:
            if name == ctx.input.get("nan"):
                return {"score": float("nan")}
            if name == ctx.input.get("fail") and _failures(calls, name) < ctx.input.get("fail_times", 2):
                await ctx.to_thread(count_call, f"{calls}.failed", name, ctx.step_key)
                raise RetryableError(f"{name} is busy", retry_after=ctx.input.get("retry_after"))
            return await ctx.to_thread(count_call, calls, name, ctx.step_key)

        retry = Retry(attempts=ctx.input.get("attempts", 3), backoff=ctx.input.get("backoff", 0.01))
        results.append(await ctx.step(name, call, retry=retry))
        if i == 0 and ctx.input.get("hold"):
            await ctx.token.race(_exists(ctx.input["hold"]))
    yield Emit(EventType.OUTPUT_DELTA, {"text": "done"})
    yield Complete({"results": results})


def _failures(calls: str, name: str) -> int:
    path = Path(f"{calls}.failed")
    return path.read_text().split().count(name) if path.exists() else 0


async def _exists(path: str) -> None:
    # The agent's own wait for the test's go-ahead (the test waits on the run, never on this).
    while not Path(path).exists():
        await asyncio.sleep(0.05)

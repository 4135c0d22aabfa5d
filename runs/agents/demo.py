"""The built-in `demo` agent: makes every execution path visible without network access.

Input (defaults): {"deltas": 40, "delay_ms": 100, "tool": null, "ask": null, "children": 0}.
"""

from collections.abc import AsyncIterator

from runs.agents.base import AgentContext, Complete, Directive, Emit, register


@register("demo")
async def demo(ctx: AgentContext) -> AsyncIterator[Directive]:
    # The full behaviour (pacing, tools, input, children, continuation) arrives with the worker.
    deltas = int(ctx.input.get("deltas", 40))
    done = sum(1 for e in ctx.events if e.type == "output.delta")
    for i in range(done, deltas):
        yield Emit("output.delta", {"text": f"chunk {i} "})
    yield Complete({"deltas": deltas})

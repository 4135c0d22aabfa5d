"""Agents of the tests' own, in a module outside the project as a user's would be: web and worker
processes load it through RUNLEDGER_AGENTS (`AGENTS_ENV`), the test process by importing it."""

from collections.abc import AsyncIterator

from runs.agents import AgentContext, Complete, Directive, Emit, register
from runs.events import EventType

# The environment that makes a web or worker process load these agents beside the demo.
AGENTS_ENV = {"RUNLEDGER_AGENTS": f"runs.agents.demo,{__name__}"}

PLAN_UPDATED = "plan.updated"


@register("planner", event_types=[PLAN_UPDATED])
async def planner(ctx: AgentContext) -> AsyncIterator[Directive]:
    """Announces its plan in a type of its own, then answers."""
    yield Emit(PLAN_UPDATED, {"steps": ["think", "answer"]})
    yield Emit(EventType.OUTPUT_DELTA, {"text": "planned"})
    yield Complete({"text": "planned"})

"""Agents are registered by name; a run names its agent and an unknown name is refused at create."""

# Importing the built-in agents registers them.
from runs.agents import demo  # noqa: F401
from runs.agents.base import (
    Agent,
    AgentContext,
    CancellationToken,
    Complete,
    Emit,
    Fail,
    Step,
    Wait,
    get_agent,
    is_registered,
    register,
    registered_names,
)

__all__ = [
    "Agent",
    "AgentContext",
    "CancellationToken",
    "Complete",
    "Emit",
    "Fail",
    "Step",
    "Wait",
    "get_agent",
    "is_registered",
    "register",
    "registered_names",
]

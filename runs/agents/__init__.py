"""The public agent API (docs/design/execution.md#agents): register an agent by name, with the event
types of its own it emits, and write it as an async generator of directives. The modules named in
`RUNLEDGER_AGENTS` (default: the built-in `demo`) are imported by every process at start, which
fills the registry.
"""

# Modules (docs/hooks/reference.py --write keeps this index):
#
#     base.py         The agent interface: the directives an agent yields, its context and the
#                     registry of agents by name
#     demo.py         The built-in `demo` agent
#     loading.py      Loading the agents a deployment names in `RUNLEDGER_AGENTS`
#     openai_chat.py  The `openai_chat` agent: streams an answer from any OpenAI-compatible Chat
#                     Completions endpoint over the attempt's own HTTP stream, which a cancel closes
#                     whatever the agent does — why it speaks the protocol rather than use the SDK
#     retry.py        Retry policies of durable steps

from runs.agents.base import (
    TEXT_OF_DELTAS,
    Agent,
    AgentContext,
    CancellationToken,
    Cancelled,
    Complete,
    Directive,
    Emit,
    Fail,
    InputCheck,
    PartialOutput,
    Registered,
    Step,
    StoredEvent,
    Wait,
    declared_types,
    get_agent,
    input_problems,
    is_registered,
    partial_output_rule,
    partial_output_types,
    register,
    registered,
    registered_names,
)
from runs.agents.retry import NO_RETRY, Retry, RetryableError, StepFailed

__all__ = [
    "NO_RETRY",
    "TEXT_OF_DELTAS",
    "Agent",
    "AgentContext",
    "CancellationToken",
    "Cancelled",
    "Complete",
    "Directive",
    "Emit",
    "Fail",
    "InputCheck",
    "PartialOutput",
    "Registered",
    "Retry",
    "RetryableError",
    "Step",
    "StepFailed",
    "StoredEvent",
    "Wait",
    "declared_types",
    "get_agent",
    "input_problems",
    "is_registered",
    "partial_output_rule",
    "partial_output_types",
    "register",
    "registered",
    "registered_names",
]

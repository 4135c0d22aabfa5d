"""Output shapes shared by several API operations: the run (docs/design/api.md#run-json), its
attempt, an event (docs/design/events.md#event-object) and the error shape; what several inputs
share. Operation-specific inputs live with their API class. A run's JSON itself is `runs.selectors.run_json`'s: these
serializers declare its schema and answer with it."""

from typing import Any

from rest_framework import serializers

from runs.access import can_see_ticket
from runs.models import PRIORITY_MAX, PRIORITY_MIN, URGENT_MAX, Run, RunAttempt
from runs.selectors.run_json import LIST_CUT_FIELDS, run_json, run_list_item_json
from runs.transitions import Status

# One choice set, one schema enum (SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"]).
RUN_STATUSES = [s.value for s in Status]

PRIORITY_HELP = (
    f"default 0; {PRIORITY_MIN}..{PRIORITY_MAX} orders your own queued runs, higher first; up to {URGENT_MAX} "
    "with runs.prioritize_run, claimed before fair share (docs/design/fair-use.md#priority)"
)
START_AFTER_HELP = "not started before this time (ISO 8601); cancel it meanwhile as any queued run"


class PartialInput(serializers.Serializer[Any]):
    """A change's body, mixed in before the serializer of the object's fields: each one optional."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, partial=True, **kwargs)


class QueueInputSerializer(serializers.Serializer[Any]):
    """When a new run may start and how it ranks in the queue (docs/design/fair-use.md#priority)."""

    priority = serializers.IntegerField(required=False, help_text=PRIORITY_HELP)
    start_after = serializers.DateTimeField(required=False, allow_null=True, help_text=START_AFTER_HELP)


class AttemptOutputSerializer(serializers.Serializer[RunAttempt]):
    generation = serializers.IntegerField()
    worker = serializers.CharField()
    claimed_at = serializers.DateTimeField()
    heartbeat_at = serializers.DateTimeField()
    lease_expires_at = serializers.DateTimeField(
        help_text="renewed by the worker's heartbeats; once past with no release, the worker is gone"
    )
    released_at = serializers.DateTimeField(
        allow_null=True,
        help_text="when the worker stopped executing it; for a lost attempt, when its lease lapsed",
    )
    outcome = serializers.CharField(
        allow_null=True, help_text="null while the attempt holds the run; then how it left its hands"
    )


class UsageSerializer(serializers.Serializer[Any]):
    """What a run used (docs/design/events.md#usage): the platform's counts, then the agent's own
    counters (any number of them, e.g. `input_tokens`, `output_tokens`), each summed over the run."""

    steps = serializers.IntegerField(help_text="its steps_used")
    events = serializers.IntegerField(help_text="its events_used")
    incomplete = serializers.BooleanField(
        required=False, help_text="present, true, when its agent could not learn all it used"
    )
    saturated = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="present when a counter's sum would have passed the largest finite number (1.8e308): "
        "the counters held at that number",
    )


class RunScheduleSerializer(serializers.Serializer[Any]):
    """The schedule that created a run, and the due time it fired for (docs/design/schedules.md#json)."""

    id = serializers.UUIDField()
    due_at = serializers.DateTimeField()


class RunOutputSerializer(serializers.Serializer[Run]):
    id = serializers.UUIDField()
    agent = serializers.CharField()
    input = serializers.DictField()
    metadata = serializers.DictField(child=serializers.CharField(allow_blank=True), help_text="your labels, as created")
    owner = serializers.CharField(source="owner.username")
    status = serializers.ChoiceField(choices=RUN_STATUSES)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    end_code = serializers.CharField(allow_blank=True, help_text="empty unless the run is terminal (and completed)")
    end_reason = serializers.CharField(allow_blank=True)
    ended_by = serializers.CharField(allow_blank=True, help_text="a username, or `system`")
    output = serializers.JSONField(allow_null=True)
    partial_output = serializers.DictField(
        child=serializers.CharField(),
        allow_null=True,
        read_only=True,
        help_text="a failed, cancelled or stopped run's: what its agent's output was when it ended, by the rule "
        'its agent declares (default: {"text": the text of its output.delta events}); null when there is none, '
        "and for a completed run, whose `output` is its result (docs/design/execution.md#partial-output)",
    )
    usage = UsageSerializer(
        read_only=True,
        help_text="what the run used: its `steps` and `events` (steps_used, events_used) and the counters its agent "
        "reported (usage.reported, summed; `incomplete` true when the agent could not learn them all)",
    )
    error = serializers.JSONField(allow_null=True)
    last_seq = serializers.IntegerField()
    max_steps = serializers.IntegerField(allow_null=True)
    steps_used = serializers.IntegerField(help_text="the agent's steps (model turns, tool calls) so far, all attempts")
    max_events = serializers.IntegerField(allow_null=True)
    events_used = serializers.IntegerField(
        help_text="events counted against max_events, all attempts: the agent's, and those a pause, resume, "
        "cancel or stop writes (a cancel or stop may pass the budget)"
    )
    deadline = serializers.DateTimeField(allow_null=True)
    priority = serializers.IntegerField(help_text=PRIORITY_HELP)
    start_after = serializers.DateTimeField(allow_null=True, help_text=START_AFTER_HELP)
    max_attempts = serializers.IntegerField()
    lost_attempts = serializers.IntegerField()
    parent = serializers.UUIDField(source="parent_id", allow_null=True)  # type: ignore[assignment]  # DRF pops declared fields
    rerun_of = serializers.UUIDField(
        source="rerun_of_id", allow_null=True, help_text="the run this one runs again (`POST …/rerun/`), or null"
    )
    schedule = RunScheduleSerializer(
        allow_null=True,
        read_only=True,
        help_text="the schedule that created it and the due time it fired for (`GET /api/runs/?schedule=ID` "
        "lists them), or null",
    )
    resume_ticket = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="present only for the owner and holders of runs.change_run; null unless waiting",
    )
    attempt = AttemptOutputSerializer(allow_null=True, read_only=True)

    def to_representation(self, instance: Run) -> dict[str, Any]:
        return run_json(instance, ticket=_sees_ticket(self, instance))


def _sees_ticket(serializer: serializers.Serializer[Any], run: Run) -> bool:
    request = serializer.context.get("request")
    return request is not None and can_see_ticket(request.user, run)


class RunListItemSerializer(RunOutputSerializer):
    """A run in a list (`runs.selectors.run_list_values`): its facts, with its input, output and
    error only when each is at most RUNLEDGER_MAX_LIST_VALUE_BYTES of JSON (else null) and its
    end_reason cut to that many bytes' worth of characters, so that a page stays a few MB whatever
    the runs hold; `truncated` names what was left out or cut. The run's own page has them whole."""

    input = serializers.DictField(
        source="listed_input", allow_null=True, help_text="null when `truncated` names it: read the run itself"
    )
    output = serializers.JSONField(
        source="listed_output", allow_null=True, help_text="null when `truncated` names it: read the run itself"
    )
    error = serializers.JSONField(
        source="listed_error", allow_null=True, help_text="null when `truncated` names it: read the run itself"
    )
    end_reason = serializers.CharField(
        source="listed_end_reason", allow_blank=True, help_text="its beginning only when `truncated` names it"
    )
    # Read with the run itself (an aggregate over its events): a page of runs does not carry it.
    partial_output = None  # type: ignore[assignment]
    truncated = serializers.ListField(
        child=serializers.ChoiceField(choices=LIST_CUT_FIELDS),
        read_only=True,
        help_text="the fields this item leaves out (null here) or cuts (end_reason); read the run itself for them",
    )

    def to_representation(self, instance: Run) -> dict[str, Any]:
        return run_list_item_json(instance, ticket=_sees_ticket(self, instance))


class EventOutputSerializer(serializers.Serializer[Any]):
    """The event object (docs/design/events.md#event-object), the same as `RunEvent.as_dict()` and
    SSE `data:`."""

    seq = serializers.IntegerField()
    type = serializers.CharField()
    data = serializers.DictField()  # type: ignore[assignment]  # DRF pops declared fields
    created_at = serializers.DateTimeField()
    attempt = serializers.IntegerField(allow_null=True)


class ErrorDetailSerializer(serializers.Serializer[Any]):
    code = serializers.CharField()
    message = serializers.CharField()
    detail = serializers.JSONField(allow_null=True, help_text="per-field messages for validation errors, or null")


class ErrorSerializer(serializers.Serializer[Any]):
    """The error shape: {"error": {"code", "message", "detail"}}."""

    error = ErrorDetailSerializer()


class ConflictSerializer(serializers.Serializer[Any]):
    """A 409 carries the committed state of the run it is about, so the client converges to it."""

    error = ErrorDetailSerializer()
    run = RunOutputSerializer()

"""Output shapes shared by several API operations: the run (DESIGN §6), its attempt, an event
(DESIGN §2) and the error shape. Operation-specific inputs live with their API class."""

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from runs.access import can_see_ticket
from runs.models import Run, RunAttempt
from runs.selectors import run_current_attempt
from runs.transitions import Status

# One choice set, one schema enum (SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"]).
RUN_STATUSES = [s.value for s in Status]


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

    def to_representation(self, instance: RunAttempt) -> dict[str, Any]:
        data = super().to_representation(instance)
        data["outcome"] = instance.outcome or None
        return data


class RunOutputSerializer(serializers.Serializer[Run]):
    id = serializers.UUIDField()
    agent = serializers.CharField()
    input = serializers.DictField()
    owner = serializers.CharField(source="owner.username")
    status = serializers.ChoiceField(choices=RUN_STATUSES)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    end_code = serializers.CharField(allow_blank=True, help_text="empty unless the run is terminal (and completed)")
    end_reason = serializers.CharField(allow_blank=True)
    ended_by = serializers.CharField(allow_blank=True, help_text="a username, or `system`")
    output = serializers.JSONField(allow_null=True)
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
    max_attempts = serializers.IntegerField()
    lost_attempts = serializers.IntegerField()
    parent = serializers.UUIDField(source="parent_id", allow_null=True)  # type: ignore[assignment]  # DRF pops declared fields
    resume_ticket = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="present only for the owner and holders of runs.change_run; null unless waiting",
    )
    attempt = serializers.SerializerMethodField()

    @extend_schema_field(AttemptOutputSerializer(allow_null=True))
    def get_attempt(self, run: Run) -> dict[str, Any] | None:
        # The list prefetches the current attempt (`current_attempts`); a single run reads it.
        prefetched = getattr(run, "current_attempts", None)
        attempt = (prefetched[0] if prefetched else None) if prefetched is not None else run_current_attempt(run=run)
        return None if attempt is None else AttemptOutputSerializer(attempt).data

    def to_representation(self, instance: Run) -> dict[str, Any]:
        data = super().to_representation(instance)
        request = self.context.get("request")
        if request is not None and can_see_ticket(request.user, instance):
            data["resume_ticket"] = instance.resume_ticket or None
        else:
            data.pop("resume_ticket", None)
        return data


class EventOutputSerializer(serializers.Serializer[Any]):
    """The event object of DESIGN §2, the same as `RunEvent.as_dict()` and SSE `data:`."""

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

"""`/api/schedules/`: the caller's schedules — created, listed, read, changed, deleted, paused,
resumed, fired now and backfilled (docs/design/schedules.md#commands, docs/design/api.md#urls)."""

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from runs import services
from runs.api.apis import MAX_INT, RunApi, _caller, _caller_and_body, _page_of, _run_data, _valid
from runs.api.filters import page_filter
from runs.api.objects import Operations, object_urls
from runs.api.schema import documented, responses
from runs.api.serializers import PRIORITY_HELP, RUN_STATUSES, ConflictSerializer, PartialInput, RunOutputSerializer
from runs.exceptions import ScheduleOverlap
from runs.models import Overlap, Schedule
from runs.selectors.schedules import schedule_get, schedule_json, schedule_list
from runs.services.schedules import BACKFILL_MAX, CATCHUP_WINDOW_MAX

SCHEDULE_ID = OpenApiParameter(
    "schedule_id",
    OpenApiTypes.UUID,
    OpenApiParameter.PATH,
    description="the schedule's id; another user's, or a malformed id, is a 404",
)
OVERLAP_HELP = (
    "what a due time does while the last run is live: `skip` (default) creates none, `buffer_one` creates one "
    "when the live one ends (at most one waiting), `allow_all` creates it, `cancel_other` cancels the live one"
)
CRON_HELP = "five fields (`*/5 * * * *`) or a macro (`@hourly`, `@daily`, …), read in `timezone`; or `every_seconds`"
EVERY_HELP = "a fixed interval: due times are `start_at` (or the creation time) + k·N; or `cron`"
TIMEZONE_HELP = "an IANA zone (`Europe/Paris`) the cron is read in, daylight-saving changes included; default UTC"
CATCHUP_HELP = (
    "after downtime, the missed due times within this many seconds of now are fired, in order; default 0: only "
    "the latest missed one"
)


@extend_schema_serializer(component_name="ScheduleLastRun")
class LastRunSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=RUN_STATUSES)


@extend_schema_serializer(component_name="Schedule")
class ScheduleOutputSerializer(serializers.Serializer[Schedule]):
    id = serializers.UUIDField()
    agent = serializers.CharField()
    input = serializers.DictField(help_text="each run's input")
    metadata = serializers.DictField(child=serializers.CharField(allow_blank=True), help_text="each run's labels")
    priority = serializers.IntegerField(help_text=PRIORITY_HELP)
    cron = serializers.CharField(allow_blank=True, help_text="empty for an interval")
    every_seconds = serializers.IntegerField(allow_null=True, help_text="null for a cron")
    timezone = serializers.CharField()
    overlap = serializers.ChoiceField(choices=Overlap.values, help_text=OVERLAP_HELP)
    catchup_window_seconds = serializers.IntegerField(help_text=CATCHUP_HELP)
    start_at = serializers.DateTimeField(allow_null=True)
    end_at = serializers.DateTimeField(allow_null=True)
    paused = serializers.BooleanField()
    next_due_at = serializers.DateTimeField(
        allow_null=True, help_text="the next due time not yet fired; null once past `end_at`"
    )
    last_run = LastRunSerializer(allow_null=True, help_text="the last run it created, or null")
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def to_representation(self, instance: Schedule) -> dict[str, Any]:
        # The one JSON of a schedule, which the webhooks' bodies carry too.
        return schedule_json(instance)


SchedulePageSerializer = _page_of(ScheduleOutputSerializer, "SchedulePage", "schedules")


def _out(schedule: Schedule) -> dict[str, Any]:
    return schedule_json(schedule)


class _ChangeSerializer(serializers.Serializer[Any]):
    """A schedule's fields as a create or a change takes them: their types here; the rules that
    read the registry, the clock or the caller's permissions (an agent, a cron, a zone, the
    shortest interval, the priority) in the service, each refusal naming its field."""

    agent = serializers.CharField(max_length=64, help_text="a registered agent name, e.g. `demo`")
    input = serializers.DictField(default=dict, help_text="each run's input, a JSON object; default {}")
    metadata = serializers.DictField(required=False, help_text="each run's labels, as a run's `metadata`")
    priority = serializers.IntegerField(required=False, help_text=PRIORITY_HELP)
    cron = serializers.CharField(required=False, allow_blank=True, max_length=128, help_text=CRON_HELP)
    every_seconds = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_INT, help_text=EVERY_HELP
    )
    timezone = serializers.CharField(required=False, max_length=64, help_text=TIMEZONE_HELP)
    overlap = serializers.ChoiceField(choices=Overlap.values, required=False, help_text=OVERLAP_HELP)
    catchup_window_seconds = serializers.IntegerField(
        required=False, min_value=0, max_value=CATCHUP_WINDOW_MAX, help_text=CATCHUP_HELP
    )
    start_at = serializers.DateTimeField(required=False, allow_null=True, help_text="no due time before it")
    end_at = serializers.DateTimeField(required=False, allow_null=True, help_text="no due time after it")


@extend_schema_serializer(component_name="ScheduleCreateInput")
class CreateInput(_ChangeSerializer):
    """A new schedule: `agent`, and `cron` or `every_seconds`."""


@extend_schema_serializer(component_name="ScheduleUpdateInput")
class UpdateInput(PartialInput, _ChangeSerializer):
    """Any of the fields, each optional."""


@extend_schema_serializer(component_name="ScheduleBackfillInput")
class BackfillInput(serializers.Serializer[Any]):
    """The due times from `from` to `to` (both included, `to` not after now) that have no run yet, the oldest
    first."""

    # `from` is a keyword: the field is named in the class's namespace (DRF reads declared fields
    # from it).
    locals()["from"] = serializers.DateTimeField(help_text="the range's start (ISO 8601)")
    to = serializers.DateTimeField(help_text="the range's end (ISO 8601)")
    max = serializers.IntegerField(min_value=1, max_value=BACKFILL_MAX, help_text="at most this many runs")


@extend_schema_serializer(component_name="ScheduleBackfilled")
class BackfilledSerializer(serializers.Serializer[Any]):
    runs = RunOutputSerializer(many=True, help_text="the runs created, in due-time order")


CREATE_DOC = (
    "201 with the schedule: its `id`, `next_due_at` and `paused`. Each due time creates exactly one run of "
    "`agent` with `input`, `metadata` and `priority`, as a create would — counted against the owner's limits. "
    "An unknown agent, a bad cron, an unknown zone, both or neither of `cron` and `every_seconds`, an interval "
    "(or a cron) more often than RUNLEDGER_MIN_SCHEDULE_SECONDS without runs.schedule_often, or `end_at` before "
    "`start_at`, or a priority above 100 without runs.prioritize_run (as for a run) is a 400 naming the field. A "
    "user with RUNLEDGER_MAX_SCHEDULES_PER_USER schedules is refused another: 429."
)
OVERLAP_409 = OpenApiResponse(
    ConflictSerializer,
    description="`schedule_overlap`: the overlap policy took this fire — skipped (`skip`), or left for when the live "
    "run ends (`buffer_one`); no run was created now; `run` is the live run",
)


_operation = Operations(
    "schedules", SCHEDULE_ID, page_filter("SchedulePageFilter", "A page of the caller's schedules.")
)


# A schedule carries its runs' input: as a run's JSON, no cache keeps it (RunApi).
class ScheduleCollectionApi(RunApi):
    get = _operation.list(
        "List your schedules",
        "Newest first, paged by cursor.",
        SchedulePageSerializer,
        schedule_list,
        ["-created_at", "-id"],
    )

    @_operation.create("Create a schedule", ScheduleOutputSerializer, request=CreateInput, description=CREATE_DOC)
    def post(self, request: Request) -> Response:
        schedule = services.schedule_create(owner=_caller(request), **_valid(CreateInput, request.data))
        return Response(_out(schedule), status=201)


class ScheduleDetailApi(RunApi):
    @_operation("retrieve", "Read a schedule", {200: ScheduleOutputSerializer}, 404)
    def get(self, request: Request, schedule_id: str) -> Response:
        return Response(_out(schedule_get(user=_caller(request), schedule_id=schedule_id)))

    @_operation(
        "update",
        "Change a schedule",
        {200: ScheduleOutputSerializer},
        400,
        404,
        413,
        415,
        description="Any of the fields, checked as a create's; `start_at` or `end_at` null clears it. The next due "
        "time follows from the new timing.",
        request=UpdateInput,
    )
    def patch(self, request: Request, schedule_id: str) -> Response:
        user, changes = _caller_and_body(request, UpdateInput, schedule_get, schedule_id=schedule_id)
        return Response(_out(services.schedule_update(schedule_id=schedule_id, actor=user, **changes)))

    @_operation.destroy("Delete a schedule", "Nothing fires any more; the runs it created stay.")
    def delete(self, request: Request, schedule_id: str) -> Response:
        services.schedule_delete(schedule_id=schedule_id, actor=_caller(request))
        return Response(status=204)


class SchedulePauseApi(RunApi):
    @_operation(
        "pause",
        "Pause a schedule",
        {200: ScheduleOutputSerializer},
        404,
        description="Nothing fires until it is resumed; a run it created goes on. Already paused: 200, no change.",
        request=None,
    )
    def post(self, request: Request, schedule_id: str) -> Response:
        return Response(_out(services.schedule_pause(schedule_id=schedule_id, actor=_caller(request))))


class ScheduleResumeApi(RunApi):
    @_operation(
        "resume",
        "Resume a schedule",
        {200: ScheduleOutputSerializer},
        404,
        description="It fires again from its next due time after now: what fell due while it was paused is not "
        "fired. Already active: 200, no change.",
        request=None,
    )
    def post(self, request: Request, schedule_id: str) -> Response:
        return Response(_out(services.schedule_resume(schedule_id=schedule_id, actor=_caller(request))))


class ScheduleTriggerApi(RunApi):
    @documented(
        operation_id="schedules_trigger",
        summary="Fire a schedule now",
        description="201 with the run it created now, as a due time would (its `schedule.due_at` is now), its "
        "overlap policy applied: a fire the policy skips (`skip`) or leaves for when the live run ends "
        "(`buffer_one`) is a 409 `schedule_overlap`, and no run is created now. A paused schedule fires too; its "
        "next due time stays. Past the owner's run caps, a 429.",
        parameters=[SCHEDULE_ID],
        request=None,
        responses={**responses({201: RunOutputSerializer}, 404, 429), 409: OVERLAP_409},
    )
    def post(self, request: Request, schedule_id: str) -> Response:
        user = _caller(request)
        run = services.schedule_trigger(schedule_id=schedule_id, actor=user)
        if run is None:
            live = schedule_get(user=user, schedule_id=schedule_id).last_run
            raise ScheduleOverlap(run=live)
        return Response(_run_data(run, request), status=201)


class ScheduleBackfillApi(RunApi):
    @_operation(
        "backfill",
        "Backfill a schedule",
        {200: BackfilledSerializer},
        400,
        404,
        413,
        415,
        429,
        description="Creates a run for each due time from `from` to `to` (both included) that has none yet, the "
        "oldest first, at most `max` of them — whatever the overlap policy: each is a due time of its own, so a "
        "retried backfill creates nothing twice. A `to` after now, or not after `from`, is a 400. All or nothing: "
        "past the owner's run caps, a 429.",
        request=BackfillInput,
    )
    def post(self, request: Request, schedule_id: str) -> Response:
        user, data = _caller_and_body(request, BackfillInput, schedule_get, schedule_id=schedule_id)
        runs = services.schedule_backfill(
            schedule_id=schedule_id, actor=user, start=data["from"], end=data["to"], max=data["max"]
        )
        return Response({"runs": [_run_data(run, request) for run in runs]})


# Mounted at /api/schedules/ (runs/api/urls.py).
urlpatterns = object_urls(
    "schedule",
    ScheduleCollectionApi,
    ScheduleDetailApi,
    {
        "pause": SchedulePauseApi,
        "resume": ScheduleResumeApi,
        "trigger": ScheduleTriggerApi,
        "backfill": ScheduleBackfillApi,
    },
)

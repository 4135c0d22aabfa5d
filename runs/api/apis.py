"""The REST API (docs/design/commands.md, docs/design/api.md): one class per operation (per URL
where one URL carries two methods), each validating its input, calling one service or selector, and
serialising the result.

Checks run in the order of docs/design/api.md#check-order: authentication (401, `IsAuthenticated`),
visibility (404) and permission (403) by `runs.access` (the class's `rule`), input (400), then state
(200/202/409, from the service). A command has the service check its caller on the row it locks
(`caller=`), so it reads the run once; only a refused body reads it first.
"""

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from django.contrib.auth.models import AbstractUser
from django.http import HttpResponse, QueryDict
from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from runs import access
from runs.agents import declared_types, registered
from runs.api.base import ApiView
from runs.api.filters import (
    METADATA_PARAMETER,
    QuerySerializer,
    RunListFilterSerializer,
    StrictIntegerField,
    metadata_filter,
    page_filter,
    run_filters,
)
from runs.api.pagination import page_size, paged_response, queryset_response, sequence_page
from runs.api.plain import Plain
from runs.api.schema import IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, RUN_ID, documented, responses
from runs.api.serializers import (
    RUN_STATUSES,
    EventOutputSerializer,
    QueueInputSerializer,
    RunListItemSerializer,
    RunOutputSerializer,
)
from runs.conf import conf
from runs.events import TYPES_HELP, type_selection
from runs.models import Run
from runs.selectors import RUN_LIST_ORDER, run_get, run_list, run_list_values
from runs.selectors.run_json import run_json, run_with_current_attempt
from runs.selectors.wire import EVENTS_PAGE_LIMIT, EVENTS_PAGE_MAX_LIMIT, run_events_page
from runs.services import Answer, RunSpec, run_cancel, run_create_idempotent, run_pause, run_resume, run_stop
from runs.transitions import CALLER_STOP_CODES, StopCode

F = TypeVar("F", bound=Callable[..., Any])

# PositiveIntegerField's range on every backend.
MAX_INT = 2_147_483_647


def _caller(request: Request) -> AbstractUser:
    user = request.user
    # IsAuthenticated has run: this is a real user.
    assert isinstance(user, AbstractUser)
    return user


def _valid(serializer_class: type[serializers.Serializer[Any]], data: Any) -> dict[str, Any]:
    """`data` as `serializer_class` validates it; anything it refuses is a 400."""
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def _caller_and_body(
    request: Request, serializer_class: type[serializers.Serializer[Any]], read: Callable[..., object], **ids: str
) -> tuple[AbstractUser, dict[str, Any]]:
    """The caller and the body as `serializer_class` validates it, once `read(user=caller, **ids)` has
    found the object: one the caller may not see is a 404 before a bad body's 400."""
    user = _caller(request)
    read(user=user, **ids)
    return user, _valid(serializer_class, request.data)


def _run_data(run: Run, request: Request) -> dict[str, Any]:
    return dict(RunOutputSerializer(run, context={"request": request}).data)


class PageSerializer(serializers.Serializer[Any]):
    """A page of `item`s, as `_page_of` makes one."""

    item: ClassVar[type[serializers.Serializer[Any]]]


def _page_of(item: type[serializers.Serializer[Any]], component_name: str, noun: str) -> type[PageSerializer]:
    @extend_schema_serializer(component_name=component_name)
    class PageOf(PageSerializer):
        __doc__ = f"A page of {noun} (`runs.api.pagination`): follow `next` until it is null."

        next = serializers.URLField(allow_null=True, help_text="the next page (an opaque `cursor`), or null")
        previous = serializers.URLField(allow_null=True, help_text="the page before, or null on the first")
        results = item(many=True)

    PageOf.item = item
    return PageOf


RunPageSerializer = _page_of(RunListItemSerializer, "RunPage", "runs")


@extend_schema_serializer(component_name="Agent")
class AgentOutputSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    event_types = serializers.ListField(
        child=serializers.CharField(), help_text="the event types of its own it may emit, besides the platform's"
    )


class AgentListApi(ApiView):
    FilterSerializer = page_filter("AgentListFilter")

    @documented(
        operation_id="agents_list",
        summary="List the registered agents",
        description="Every agent a run may name (`RUNLEDGER_AGENTS`), by name, with the event types of its "
        "own each declared, so a client knows every type a stream can carry.",
        parameters=[FilterSerializer],
        responses=responses({200: _page_of(AgentOutputSerializer, "AgentPage", "agents")}, 400),
    )
    def get(self, request: Request) -> Response:
        data = _valid(self.FilterSerializer, request.query_params)
        agents = sorted(({"name": a.name, "event_types": sorted(a.event_types)} for a in registered()), key=_name)
        page = sequence_page(agents, key=_name, cursor=data.get("cursor"), size=page_size(data.get("page_size")))
        return paged_response(page, serializer_class=AgentOutputSerializer, request=request)


def _name(agent: dict[str, Any]) -> tuple[str]:
    return (agent["name"],)


# One URL, two operations: each method has its own input serializer and schema.
class RunApi(ApiView):
    """Base of the operations that answer runs. A run's JSON is live state and may carry its
    resume ticket (docs/design/api.md#run-json): no cache may keep any of these answers, errors (a
    409's run) included."""

    answer_headers = {"Cache-Control": "no-store"}

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)
        for name, value in self.answer_headers.items():
            response[name] = value
        return response


class RunCollectionApi(Plain, RunApi):
    FilterSerializer = RunListFilterSerializer

    @extend_schema_serializer(component_name="RunCreateInput")
    class InputSerializer(QueueInputSerializer):
        agent = serializers.CharField(max_length=64, help_text="a registered agent name, e.g. `demo`")
        input = serializers.DictField(help_text="the agent's input, a JSON object")
        parent = serializers.UUIDField(  # type: ignore[assignment]  # DRF pops declared fields
            required=False, allow_null=True, help_text="a run visible to the caller"
        )
        max_steps = serializers.IntegerField(min_value=1, max_value=MAX_INT, required=False, allow_null=True)
        max_events = serializers.IntegerField(min_value=1, max_value=MAX_INT, required=False, allow_null=True)
        max_attempts = serializers.IntegerField(min_value=1, max_value=MAX_INT, required=False, allow_null=True)
        deadline = serializers.DateTimeField(required=False, allow_null=True, help_text="absolute time (ISO 8601)")
        metadata = serializers.DictField(
            required=False,
            help_text="your labels: at most 50 keys of at most 40 characters, each value a string of at most "
            "500; copied to the run's children",
        )

    @extend_schema_serializer(component_name="RunCreateHeaders")
    class HeaderSerializer(serializers.Serializer[Any]):
        idempotency_key = serializers.RegexField(r"^[\x21-\x7e]{1,255}$", required=False)

    body = InputSerializer
    whole = True

    @documented(
        operation_id="runs_list",
        summary="List the runs you can see",
        description="Newest first, 50 a page (`page_size` up to 500), paged by cursor: follow `next` (null on "
        "the last page); each run that was in the list when you started, and still matches, comes once. Your own "
        "runs; all runs with `runs.view_run`. Filters combine (all must hold); `status` and `end_code` take a "
        "comma list; `metadata.<key>=<value>` is repeatable. A malformed filter or cursor is a 400. Each item "
        "carries the run's `input`, `output` and `error` only when each is at most RUNLEDGER_MAX_LIST_VALUE_BYTES "
        "(default 1,000) bytes of JSON, and its `end_reason` cut to as much; `truncated` names what was left out "
        "(null) or cut. The run's own page (`GET /api/runs/{id}/`) has them whole.",
        parameters=[FilterSerializer, METADATA_PARAMETER],
        responses=responses({200: RunPageSerializer}, 400),
    )
    def get(self, request: Request) -> Response:
        data = _valid(self.FilterSerializer, request.query_params)
        runs = run_list(user=_caller(request), metadata=metadata_filter(request.query_params), **run_filters(data))
        listed = run_with_current_attempt(runs=run_list_values(runs=runs, max_bytes=conf.MAX_LIST_VALUE_BYTES))
        return queryset_response(listed, RUN_LIST_ORDER, data, RunListItemSerializer, request)

    @documented(
        operation_id="runs_create",
        summary="Create a run",
        description="201 with the run. An unknown agent or a parent you cannot see is a 400; a terminal "
        "parent is a 409 with the parent as `run`. With `Idempotency-Key`, retries replay the first success. "
        "Past one of your limits (active runs, runs kept, bytes stored) a 429 `too_many_requests` with "
        "`Retry-After`, and nothing is written.",
        request=InputSerializer,
        parameters=[IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED],
        responses=responses({201: RunOutputSerializer}, 400, 409, 413, 415, 422, 429),
    )
    def post(self, request: Request) -> Response:
        return self.answer(_caller(request), _valid(self.InputSerializer, request.data), request.data, request.headers)

    @classmethod
    def answer(cls, user: AbstractUser, data: dict[str, Any], sent: Any, headers: Any) -> Response:
        key = headers.get("Idempotency-Key")
        # Without the header there is nothing to validate (its field is optional).
        header = {} if key is None else _valid(cls.HeaderSerializer, {"idempotency_key": key})
        spec = RunSpec(
            agent=data["agent"],
            input=data["input"],
            parent_id=data.get("parent"),
            max_steps=data.get("max_steps"),
            max_events=data.get("max_events"),
            max_attempts=data.get("max_attempts"),
            deadline=data.get("deadline"),
            metadata=data.get("metadata", {}),
            priority=data.get("priority", 0),
            start_after=data.get("start_after"),
        )
        created = run_create_idempotent(
            owner=user,
            spec=spec,
            key=header.get("idempotency_key"),
            request_body=sent,
            answer=lambda run: Answer(status=201, body=run_json(run, ticket=access.can_see_ticket(user, run))),
        )
        replayed = {"Idempotent-Replayed": "true"} if created.replayed else None
        return Response(created.answer.body, status=created.answer.status, headers=replayed)


def _command_schema(
    *,
    operation_id: str,
    summary: str,
    description: str,
    request: Any,
    success: dict[int, Any] | None = None,
    errors: tuple[int, ...] = (400, 403, 404, 409, 413, 415),
) -> Callable[[F], F]:
    """The documentation of a command on one run: it answers the run, or the error shape."""
    return documented(
        operation_id=operation_id,
        summary=summary,
        description=description,
        parameters=[RUN_ID],
        request=request,
        responses=responses(success or {200: RunOutputSerializer}, *errors),
    )


# Base of the operations on one run: visibility (404), then the class's `rule` (403).
class RunObjectApi(RunApi):
    # What the operation does to the run, by its rule in runs.access; None: it only reads it.
    rule: access.Rule | None = None

    def get_run(self, request: Request, run_id: str, only: tuple[str, ...] = ()) -> Run:
        user = _caller(request)
        run = run_get(run_id=run_id, user=user, only=only)
        if self.rule is not None:
            access.require(user, run, self.rule, run_id=run_id)
        return run

    def valid_input(
        self, serializer_class: type[serializers.Serializer[Any]], request: Request, run_id: str
    ) -> dict[str, Any]:
        """The body as `serializer_class` validates it. A refused body (unparsable, or invalid)
        checks the run first: an invisible run stays a 404 and a forbidden one a 403, whatever
        came with it."""
        try:
            serializer = serializer_class(data=request.data)
            if serializer.is_valid():
                return dict(serializer.validated_data)
        except Exception:
            self.get_run(request, run_id)
            raise
        self.get_run(request, run_id)
        raise serializers.ValidationError(serializer.errors)


class PlainApi(Plain, RunObjectApi):
    """An operation on one run whose common requests `Plain` answers."""


class RunDetailApi(PlainApi):
    @staticmethod
    def answer(user: AbstractUser, run_id: str) -> dict[str, Any]:
        run = run_get(run_id=run_id, user=user, for_json=True)
        return run_json(run, ticket=access.can_see_ticket(user, run))

    @documented(
        operation_id="runs_retrieve",
        summary="Read a run",
        description="The run's facts and its current attempt (null before the first claim).",
        parameters=[RUN_ID],
        responses=responses({200: RunOutputSerializer}, 404),
    )
    def get(self, request: Request, run_id: str) -> Response:
        return Response(self.answer(_caller(request), run_id))


class RunEventsApi(PlainApi):
    query = True

    @extend_schema_serializer(component_name="RunEventsFilter")
    class FilterSerializer(QuerySerializer):
        after_seq = StrictIntegerField(min_value=0, required=False, default=0, help_text="at most the run's last_seq")
        limit = StrictIntegerField(
            min_value=1, max_value=EVENTS_PAGE_MAX_LIMIT, required=False, default=EVENTS_PAGE_LIMIT
        )
        types = serializers.CharField(required=False, help_text=TYPES_HELP)

    @extend_schema_serializer(component_name="RunEventsPage")
    class OutputSerializer(serializers.Serializer[Any]):
        results = EventOutputSerializer(many=True, source="events")
        next_after_seq = serializers.IntegerField(help_text="the last seq returned, or after_seq on an empty page")
        last_seq = serializers.IntegerField()
        run_status = serializers.ChoiceField(choices=RUN_STATUSES)
        end_of_stream = serializers.BooleanField(help_text="the run is terminal and this page reaches its last event")

    @documented(
        operation_id="runs_events",
        summary="Read a page of a run's events",
        description="Events with `seq > after_seq`, in order, at most `limit` (default 100, at most 1000) and at "
        "most RUNLEDGER_MAX_PAGE_BYTES (default 4 MB) of them — always one at least, however big: a page of "
        "big events is shorter than `limit` though more follow. A cursor past `last_seq` is a 400. Continue "
        "from `next_after_seq` until `end_of_stream`. With `types`, only the events of those types (and the "
        "terminal one), the first `limit` of them after the cursor.",
        parameters=[RUN_ID, FilterSerializer],
        responses=responses({200: OutputSerializer}, 400, 404),
    )
    def get(self, request: Request, run_id: str) -> HttpResponse:
        return self.answer(_caller(request), request.query_params, run_id)

    @classmethod
    def answer(cls, user: AbstractUser, query: QueryDict, run_id: str) -> HttpResponse:
        run = run_get(run_id=run_id, user=user, only=("agent", "last_seq"))
        filters = _valid(cls.FilterSerializer, query)
        types = filters.get("types")  # left out when empty: every event
        chosen = None if not types else type_selection(types, declared_types(run.agent))
        page = run_events_page(run=run, after_seq=filters["after_seq"], limit=filters["limit"], types=chosen)
        # The shape of OutputSerializer, written directly (EventsPage.json).
        return HttpResponse(page.json(), content_type="application/json")


class RunCancelApi(PlainApi):
    rule = access.CANCEL

    @extend_schema_serializer(component_name="RunCancelInput")
    class InputSerializer(serializers.Serializer[Any]):
        note = serializers.CharField(required=False, allow_blank=True, default="", max_length=10_000)

    body = InputSerializer

    @_command_schema(
        operation_id="runs_cancel",
        summary="Cancel a run",
        request=InputSerializer,
        description="Cancel a queued, running or waiting run (committed at once). Already cancelled: 200, "
        "nothing written. Ended otherwise: 409 with the run.",
    )
    def post(self, request: Request, run_id: str) -> Response:
        return Response(self.answer(_caller(request), self.valid_input(self.InputSerializer, request, run_id), run_id))

    @staticmethod
    def answer(user: AbstractUser, data: dict[str, Any], run_id: str) -> dict[str, Any]:
        run = run_cancel(run_id=run_id, actor=user, note=data["note"], caller=user).run
        return run_json(run, ticket=access.can_see_ticket(user, run))


class RunStopApi(RunObjectApi):
    rule = access.STOP

    @extend_schema_serializer(component_name="RunStopInput")
    class InputSerializer(serializers.Serializer[Any]):
        code = serializers.ChoiceField(choices=sorted(CALLER_STOP_CODES), required=False, default=StopCode.STAFF.value)
        reason = serializers.CharField(max_length=10_000)

    @_command_schema(
        operation_id="runs_stop",
        summary="Stop a run",
        request=InputSerializer,
        description="Stop a run (needs runs.stop_run). Already stopped: 200, nothing written. Ended otherwise: "
        "409 with the run.",
    )
    def post(self, request: Request, run_id: str) -> Response:
        data = self.valid_input(self.InputSerializer, request, run_id)
        user = _caller(request)
        result = run_stop(run_id=run_id, actor=user, code=data["code"], reason=data["reason"], caller=user)
        return Response(_run_data(result.run, request))


class RunPauseApi(RunObjectApi):
    rule = access.PAUSE_RESUME

    @_command_schema(
        operation_id="runs_pause",
        summary="Pause a run",
        request=None,
        success={200: RunOutputSerializer, 202: RunOutputSerializer},
        errors=(403, 404, 409),
        description="Queued: parked as waiting at once (200). Running: the pause is recorded and the worker "
        "parks the run at its next safe boundary (202, also on a repeat). Waiting: 200, no change. "
        "Terminal: 409. A pause whose events (`run.waiting`, and a seal for each open tool call) would pass "
        "`max_events`: 409 `budget_exhausted`, nothing written.",
    )
    def post(self, request: Request, run_id: str) -> Response:
        result = run_pause(run_id=run_id, caller=_caller(request))
        return Response(_run_data(result.run, request), status=202 if result.pending else 200)


class RunResumeApi(RunObjectApi):
    rule = access.PAUSE_RESUME

    @extend_schema_serializer(component_name="RunResumeInput")
    class InputSerializer(serializers.Serializer[Any]):
        # A ticket is URL-safe ASCII; anything else cannot be one (and cannot be compared in constant time).
        ticket = serializers.RegexField(r"^[\x21-\x7e]{1,256}$", help_text="the run's current resume_ticket")
        input = serializers.JSONField(required=False, allow_null=True, default=None, help_text="passed to the agent")

    @_command_schema(
        operation_id="runs_resume",
        summary="Resume a waiting run",
        request=InputSerializer,
        description="Waiting → queued with the input. A retry of a resume that succeeded (the same ticket and "
        "input as JSON, the run not waiting again since) answers 200 with the run and writes nothing. Any other "
        "stale, used or invalidated ticket is a 409 `stale_ticket`, and a resume whose `run.resumed` would pass "
        "`max_events` a 409 `budget_exhausted`; nothing changes. `input` is checked like a create's (storable, "
        "within the body limit, the agent's own check for an object): a 400 naming the problem. The input is "
        "stored: past the owner's RUNLEDGER_MAX_STORED_BYTES_PER_USER a 429 `too_many_requests`.",
        errors=(400, 403, 404, 409, 413, 415, 429),
    )
    def post(self, request: Request, run_id: str) -> Response:
        data = self.valid_input(self.InputSerializer, request, run_id)
        resumed = run_resume(run_id=run_id, ticket=data["ticket"], input=data["input"], caller=_caller(request))
        return Response(_run_data(resumed.run, request))

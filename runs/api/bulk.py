"""`POST /api/runs/cancel/` and `POST /api/runs/stop/`: cancel or stop every run that matches a
filter (docs/design/commands.md#bulk-commands).

The filter is the run list's (`runs.api.filters`, `runs.selectors.run_list`), in the body; each
matching run the caller may command gets the single command (`runs.services.bulk`).
"""

from collections.abc import Callable
from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from runs.api.apis import RunApi, RunCollectionApi, _caller, _valid
from runs.api.filters import RunFilterSerializer, run_filters
from runs.api.schema import IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, documented, responses
from runs.api.serializers import ErrorSerializer
from runs.metadata import MAX_KEYS, key_problem, value_problem
from runs.selectors import run_list
from runs.services import (
    MAX_BULK_RUNS,
    Answer,
    BulkResult,
    Outcome,
    answer_once,
    runs_cancel_matching,
    runs_stop_matching,
)
from runs.transitions import CALLER_STOP_CODES, Status, StopCode


@extend_schema_serializer(component_name="RunBulkFilter")
class BulkFilterSerializer(RunFilterSerializer):
    """The list's filters as a JSON object; `status` and `end_code` a list (or a comma list). A
    name that is not a filter is refused: a misspelt filter would otherwise match more runs than
    meant."""

    metadata = serializers.DictField(
        required=False, help_text='runs whose metadata holds every key with its value, e.g. {"customer": "42"}'
    )

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(str(name) for name in data if name not in self.fields)
            if unknown:
                known = ", ".join(self.fields)
                raise serializers.ValidationError(
                    {name: [f"not a filter; the filters are {known}"] for name in unknown}
                )
        return super().to_internal_value(data)

    def validate_metadata(self, metadata: dict[str, Any]) -> dict[str, str]:
        # The rules of a label a run can store (runs.metadata): a filter that no run could match
        # is a mistake, refused as the list refuses it.
        if len(metadata) > MAX_KEYS:
            raise serializers.ValidationError(f"at most {MAX_KEYS} keys: no run has more")
        problems = {
            key: [problem] for key, value in metadata.items() if (problem := key_problem(key) or value_problem(value))
        }
        if problems:
            raise serializers.ValidationError(problems)
        return metadata


def _flat(errors: Any, prefix: str = "") -> dict[str, Any]:
    """DRF's nested errors named by their path (`filter.status`, `filter.metadata.customer`), so a
    400's `detail` and message name the field itself."""
    if not isinstance(errors, dict):
        return {prefix: errors}
    flat: dict[str, Any] = {}
    for name, inner in errors.items():
        # A serializer's own errors (`filter` not an object) are the field's.
        inner_name = prefix if name == "non_field_errors" and prefix else f"{prefix}.{name}" if prefix else str(name)
        flat.update(_flat(inner, inner_name))
    return flat


class _BulkInput(serializers.Serializer[Any]):
    filter = BulkFilterSerializer(help_text="the run list's filters; all must hold; `{}` matches every run you see")
    max = serializers.IntegerField(
        min_value=0,
        max_value=MAX_BULK_RUNS,
        help_text="the most runs you mean to command: more matches are a 409 `too_many_matches` and nothing is "
        f"done (`max` 0 asks only the count). At most {MAX_BULK_RUNS}.",
    )


def _outcomes_serializer(done: str) -> type[serializers.Serializer[Any]]:
    outcomes = [done, *(o.value for o in Outcome if o is not Outcome.DONE)]

    @extend_schema_serializer(component_name=f"RunBulk{done.capitalize()}")
    class OutcomesSerializer(serializers.Serializer[Any]):
        __doc__ = f"What the command did to each matching run: `{done}` by it; the others not touched."
        matched = serializers.IntegerField(help_text="the runs the filter matched (at most `max`)")
        counts = serializers.DictField(
            child=serializers.IntegerField(), help_text=f"by outcome, every one present: {', '.join(outcomes)}"
        )
        ids = serializers.DictField(
            child=serializers.ListField(child=serializers.UUIDField()), help_text="the runs' ids, by outcome"
        )

    return OutcomesSerializer


_OUTCOMES = (
    "Outcomes: `{done}` (this command ended it, with its one event), `already_ended` (it had ended: not touched), "
    "`no_longer_matching` (live, but its status left the filter's since the match), `forbidden` (you see it but may "
    "not {verb} it), `gone` (deleted meanwhile)."
)


def _body(result: BulkResult) -> dict[str, Any]:
    ids = result.by_name()
    return {
        "matched": result.matched,
        "counts": {name: len(found) for name, found in ids.items()},
        "ids": {name: [str(run_id) for run_id in found] for name, found in ids.items()},
    }


class _BulkApi(RunApi):
    """The shared steps: validate, match (the caller's visible runs), command each, answer once per
    Idempotency-Key."""

    InputSerializer: type[serializers.Serializer[Any]]
    scope: str

    def answer(self, request: Request, command: Callable[..., BulkResult]) -> Response:
        serializer = self.InputSerializer(data=request.data)
        if not serializer.is_valid():
            raise serializers.ValidationError(_flat(serializer.errors))
        data = dict(serializer.validated_data)
        key = request.headers.get("Idempotency-Key")
        headers = _valid(RunCollectionApi.HeaderSerializer, {} if key is None else {"idempotency_key": key})
        user = _caller(request)
        wanted = dict(data.pop("filter"))
        metadata = wanted.pop("metadata", {})
        filters = run_filters(wanted)
        max_runs = data.pop("max")

        def work() -> Answer:
            runs = run_list(user=user, metadata=metadata, **filters)
            result = command(runs=runs, actor=user, max_runs=max_runs, statuses=filters["status"], **data)
            return Answer(status=200, body=_body(result))

        done = answer_once(
            owner=user, scope=self.scope, key=headers.get("idempotency_key"), request_body=request.data, work=work
        )
        replayed = {"Idempotent-Replayed": "true"} if done.replayed else None
        return Response(done.answer.body, status=done.answer.status, headers=replayed)


def _bulk_schema(*, verb: str, done: str, request: Any, extra: str) -> Callable[[Any], Any]:
    return documented(
        operation_id=f"runs_{verb}_matching",
        summary=f"{verb.capitalize()} every run that matches a filter",
        description=f"Matches the runs you can see with the run list's filters (`filter`, all must hold), then "
        f"{verb}s each one you may {verb} exactly as `POST /api/runs/{{id}}/{verb}/` would: its own transaction and "
        f"row lock, one `run.{done}` event. More matches than `max`: a 409 `too_many_matches` with `detail.count`, "
        f"and nothing done. Otherwise 200 with the counts and ids by outcome. {_OUTCOMES.format(done=done, verb=verb)} "
        f"{extra} A malformed filter is a 400 naming the field (`filter.status`). With `Idempotency-Key` a retry "
        "answers the first 200 again and does nothing; a request that failed midway (a 503) stored no answer: its "
        f"runs {done} stay so, and its retry {verb}s the rest.",
        request=request,
        parameters=[IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED],
        responses={
            **responses({200: _outcomes_serializer(done)}, 400, 413, 415, 422),
            # Not the conflict of one run's state: no `run` in it.
            409: OpenApiResponse(
                ErrorSerializer,
                description="`too_many_matches`: more runs match than `max` (`detail.count`); nothing was done",
            ),
        },
    )


@extend_schema_serializer(component_name="RunCancelMatchingInput")
class CancelMatchingInput(_BulkInput):
    note = serializers.CharField(required=False, allow_blank=True, default="", max_length=10_000)


@extend_schema_serializer(component_name="RunStopMatchingInput")
class StopMatchingInput(_BulkInput):
    code = serializers.ChoiceField(choices=sorted(CALLER_STOP_CODES), required=False, default=StopCode.STAFF.value)
    reason = serializers.CharField(max_length=10_000)


def _bulk_api(verb: str, done: Status, given: type[_BulkInput], command: Callable[..., BulkResult], who: str) -> Any:
    """The API class of one command by filter: its input, its service, its documentation."""

    class Api(_BulkApi):
        InputSerializer = given
        scope = f"runs.{verb}"

        @_bulk_schema(verb=verb, done=done.value, request=given, extra=who)
        def post(self, request: Request) -> Response:
            return self.answer(request, command)

    Api.__name__ = Api.__qualname__ = f"Run{verb.capitalize()}MatchingApi"
    return Api


RunCancelMatchingApi = _bulk_api(
    "cancel",
    Status.CANCELLED,
    CancelMatchingInput,
    runs_cancel_matching,
    "Your own runs; anyone's you see with `runs.cancel_run`.",
)
RunStopMatchingApi = _bulk_api(
    "stop",
    Status.STOPPED,
    StopMatchingInput,
    runs_stop_matching,
    "Needs `runs.stop_run` (without it every run is `forbidden`).",
)

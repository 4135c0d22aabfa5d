"""`POST /api/runs/{id}/rerun/`: run an ended run again, or fork it from the middle of its log
(docs/design/commands.md#rerun)."""

from typing import Any

from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from runs import access
from runs.api.apis import MAX_INT, RunObjectApi, _caller, _command_schema, _run_data
from runs.api.serializers import RunOutputSerializer
from runs.services import Overrides, run_rerun


class RunRerunApi(RunObjectApi):
    rule = access.RERUN

    @extend_schema_serializer(component_name="RunRerunInput")
    class InputSerializer(serializers.Serializer[Any]):
        from_seq = serializers.IntegerField(
            min_value=1,
            max_value=MAX_INT,
            required=False,
            allow_null=True,
            help_text="fork: copy the original's agent events up to this seq, and continue from them",
        )
        agent = serializers.CharField(
            max_length=64, required=False, help_text="default: the original's; never with from_seq (a 400)"
        )
        input = serializers.DictField(required=False, help_text="default: the original's")
        max_steps = serializers.IntegerField(min_value=1, max_value=MAX_INT, required=False, allow_null=True)
        max_events = serializers.IntegerField(min_value=1, max_value=MAX_INT, required=False, allow_null=True)
        max_attempts = serializers.IntegerField(min_value=1, max_value=MAX_INT, required=False, allow_null=True)
        deadline = serializers.DateTimeField(
            required=False, allow_null=True, help_text="absolute time (ISO 8601); never copied from the original"
        )
        metadata = serializers.DictField(required=False, help_text="default: the original's labels")

    @_command_schema(
        operation_id="runs_rerun",
        summary="Rerun or fork an ended run",
        request=InputSerializer,
        success={201: RunOutputSerializer},
        errors=(400, 403, 404, 409, 413, 415, 429),
        description="201 with a new run of the original's agent, input, budgets (`max_steps`, `max_events`, "
        "`max_attempts`) and `metadata` (each may be given instead), owned by you, its `rerun_of` the original. Its deadline is "
        "the default unless `deadline` is given; its priority the original's, at most 100 without "
        "runs.prioritize_run. Needs to own the original or `runs.change_run` (403). A live "
        "original is a 409 `invalid_transition` with it as `run`. With `from_seq` it forks: the new run's log is "
        "its `run.created`, then a copy of the original's agent events among 1..from_seq (`forked_from_seq` in "
        "each copy's data), from which the agent continues; the copies count against its `max_events`. A "
        "`from_seq` past the original's last seq, one that cuts a tool call (a `tool.started` without its "
        "`tool.finished` by then), or a fork whose copies pass `max_events`, is a 400 naming `from_seq`; a fork "
        "with any `agent` is a 400 naming `agent`. The "
        "caps of a create apply (429).",
    )
    def post(self, request: Request, run_id: str) -> Response:
        data = self.valid_input(self.InputSerializer, request, run_id)
        overrides = Overrides(**{name: data.get(name) for name in Overrides.__dataclass_fields__})
        user = _caller(request)
        run = run_rerun(run_id=run_id, owner=user, from_seq=data.get("from_seq"), overrides=overrides, caller=user)
        return Response(_run_data(run, request), status=201)

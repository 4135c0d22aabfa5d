"""The Python client's models against the OpenAPI schema the server serves (/api/schema/): each
model has an attribute for every field of its components, and none the API does not answer — a
field added on the server without the client fails here, by name."""

import json
from typing import Any

import pytest
from django.test import Client

import runledger_client as rl
from runledger_client._cli_args import OVERLAPS, WEBHOOK_EVENTS
from runledger_client.models import api_fields

pytestmark = [pytest.mark.sqlite, pytest.mark.django_db]

MODELS: list[type[Any]] = [
    rl.Run,
    rl.Attempt,
    rl.Event,
    rl.Agent,
    rl.EventPage,
    rl.Page,
    rl.BulkResult,
    rl.RunSchedule,
    rl.Schedule,
    rl.ScheduleLastRun,
    rl.Webhook,
    rl.WebhookDelivery,
    rl.ApiToken,
]


def served_components() -> dict[str, Any]:
    response = Client().get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    components: dict[str, Any] = json.loads(response.content)["components"]["schemas"]
    return components


@pytest.mark.parametrize("model", MODELS, ids=lambda model: model.__name__)
def test_each_model_has_every_field_of_its_schema_components_and_no_other(model: type[Any]) -> None:
    components = served_components()
    ours = set(api_fields(model))
    served: set[str] = set()
    for name in model.SCHEMA:
        fields = set(components[name]["properties"])
        served |= fields
        missing = sorted(fields - ours)
        assert not missing, (
            f"runledger_client.models.{model.__name__} lacks the field(s) {', '.join(missing)} that the API's "
            f"{name} answers: add them (and to {model.__name__}.from_body)"
        )
    extra = sorted(ours - served)
    assert not extra, f"runledger_client.models.{model.__name__} has {', '.join(extra)}, which the API does not answer"


def test_every_object_the_api_answers_has_its_model() -> None:
    modelled = {name for model in MODELS for name in model.SCHEMA}
    answered = {
        name
        for name, component in served_components().items()
        if component.get("type") == "object"
        and "error" not in component.get("properties", {})
        and not name.endswith("Request")
        and name != "ErrorDetail"
    }
    # An open map of counters (steps, events and whatever the agent reports): Run.usage is its dict;
    # a backfill's answer is its `runs`, which `schedules.backfill()` returns as a list of Run.
    as_dicts = {"Usage", "ScheduleBackfilled"}
    assert sorted(answered - modelled - as_dicts) == []


def test_the_clis_webhook_events_are_those_the_api_takes() -> None:
    # The CLI offers them as --events' choices (and completes them) without asking the server.
    enum = served_components()["WebhookEndpoint"]["properties"]["events"]["items"]
    taken = enum.get("enum") or served_components()[enum["$ref"].rsplit("/", 1)[-1]]["enum"]
    assert sorted(WEBHOOK_EVENTS) == sorted(taken)


def test_the_clis_overlap_policies_are_those_the_api_takes() -> None:
    # The CLI offers them as --overlap's choices without asking the server.
    [enum] = served_components()["Schedule"]["properties"]["overlap"]["allOf"]
    assert list(OVERLAPS) == served_components()[enum["$ref"].rsplit("/", 1)[-1]]["enum"]

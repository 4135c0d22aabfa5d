"""The TypeScript client's types against the OpenAPI schema the server serves: they are generated
at build time from clients/js/openapi.json, which must be that schema — a field the types name
that the server no longer answers fails here, by name, as does one the server added."""

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from runs.selectors import run_list, run_list_values
from runs.selectors.run_json import run_json, run_list_item_json, run_with_current_attempt
from tests.factories import waiting_run
from tests.support.node import PACKAGE

pytestmark = [pytest.mark.sqlite, pytest.mark.django_db]

COMMITTED = PACKAGE / "openapi.json"


def served_schema() -> Any:
    response = Client(HTTP_HOST="localhost").get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    return json.loads(response.content)


def differences(ours: Any, served: Any, where: str = "") -> Iterator[str]:
    """Where `served` differs from `ours`, each place named by its path in the schema."""
    if isinstance(ours, dict) and isinstance(served, dict):
        for key in ours.keys() | served.keys():
            place = f"{where}.{key}" if where else str(key)
            if key not in served:
                yield f"{place}: in the client's types, no longer served"
            elif key not in ours:
                yield f"{place}: served, not in the client's types"
            else:
                yield from differences(ours[key], served[key], place)
    elif ours != served:
        yield f"{where}: {json.dumps(ours)[:80]} in the client's types, {json.dumps(served)[:80]} served"


def drift(ours: Any, served: Any) -> str:
    found = sorted(differences(ours, served))
    return "\n".join([*found[:30], "clients/js/openapi.json is not the served schema: run `npm run schema` there"])


def test_the_schema_the_client_types_are_generated_from_is_the_served_one() -> None:
    ours = json.loads(COMMITTED.read_text())
    served = served_schema()
    assert ours == served, drift(ours, served)


def test_a_field_the_types_name_gone_from_the_served_schema_fails_the_check_by_name() -> None:
    ours = json.loads(COMMITTED.read_text())
    served = served_schema()
    del served["components"]["schemas"]["RunOutput"]["properties"]["last_seq"]
    served["components"]["schemas"]["EventOutput"]["properties"]["seq"]["type"] = "string"
    assert ours != served
    assert drift(ours, served).splitlines()[:2] == [
        'components.schemas.EventOutput.properties.seq.type: "integer" in the client\'s types, "string" served',
        "components.schemas.RunOutput.properties.last_seq: in the client's types, no longer served",
    ]


def test_a_runs_json_has_the_fields_the_schema_declares_in_its_order(alice: User) -> None:
    schemas = served_schema()["components"]["schemas"]
    run = waiting_run(alice)
    assert list(run_json(run, ticket=True)) == list(schemas["RunOutput"]["properties"])
    assert "resume_ticket" not in run_json(run)
    listed = run_with_current_attempt(runs=run_list_values(runs=run_list(user=alice), max_bytes=1000)).get()
    assert list(run_list_item_json(listed, ticket=True)) == list(schemas["RunListItem"]["properties"])

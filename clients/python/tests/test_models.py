import dataclasses

import httpx
import pytest

import runledger_client as rl
from runledger_client.models import api_fields

# What a field the answer lacks reads as, by its declared type; None for the optional ones.
EMPTY = {"str": "", "int": 0, "bool": False, "tuple[str, ...]": (), "dict[str, str]": {}, "dict[str, Any]": {}}


def test_a_newer_servers_fields_are_kept_and_never_break_parsing() -> None:
    body = {"id": "r1", "status": "completed", "partial_output": {"x": 1}, "attempt": {"generation": 2, "new": True}}
    run = rl.Run.from_body(body)
    assert (run.id, run.status, run["partial_output"], run.attempt is not None and run.attempt["new"]) == (
        "r1",
        "completed",
        {"x": 1},
        True,
    )
    assert run.created_at is None and run.metadata == {} and run.truncated == ()
    event = rl.Event.from_object({"seq": 1, "type": "output.delta", "data": {"text": "a"}, "created_at": "x", "z": 1})
    assert event.created_at is None and event.object["z"] == 1


def test_with_options_changes_the_retries_and_timeout_of_some_calls_on_the_same_connections() -> None:
    seen: list[httpx.Request] = []

    def refused(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        raise httpx.ConnectError("refused")

    client = rl.Client(
        "http://test", "t", retry=rl.Retry(base=0.001, cap=0.001), transport=httpx.MockTransport(refused)
    )
    with client:
        quick = client.with_options(max_retries=0, timeout=2.5)
        assert quick._http is client._http
        with pytest.raises(rl.TransportError):
            quick.runs.get("r1")
        assert len(seen) == 1 and seen[0].extensions["timeout"]["read"] == 2.5
        with pytest.raises(rl.TransportError):
            client.runs.get("r1")
        assert len(seen) == 1 + 5 and seen[-1].extensions["timeout"]["read"] == 30.0


@pytest.mark.parametrize("model", [rl.Attempt, rl.Run, rl.Agent, rl.Webhook, rl.WebhookDelivery, rl.ApiToken])
def test_each_field_is_read_by_its_declared_type_and_a_missing_one_is_that_types_empty_value(model: type) -> None:
    body = {name: "x" for name in model.REQUIRED}
    read = model.from_body(body)
    assert read.data is body
    declared = {f.name: str(f.type) for f in dataclasses.fields(model)}
    for name in api_fields(model):
        assert getattr(read, name) == ("x" if name in model.REQUIRED else EMPTY.get(declared[name])), name

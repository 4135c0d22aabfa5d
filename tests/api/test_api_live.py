"""The API served by a real uvicorn process: a database outage answers 503, and Schemathesis
fuzzes the live OpenAPI schema with a token (no 5xx, nothing outside the schema)."""

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from django.contrib.auth.models import User
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from runs import services
from runs.events import EventType
from runs.services.schedules import schedule_create
from tests.conftest import ON_SQLITE
from tests.factories import queued_run, waiting_run
from tests.support.db import token_for
from tests.support.procs import Procs, free_port, subprocess_env
from tests.support.proxies import CuttableProxy
from tests.support.runs import event_types

pytestmark = [pytest.mark.sqlite, pytest.mark.processes]


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        assert exc.headers["Content-Type"] == "application/json"
        return exc.code, json.load(exc)


def test_an_unreachable_database_is_a_prompt_503_in_the_error_shape(procs: Procs, tmp_path: Any) -> None:
    # Nothing listens on a fresh port (PostgreSQL), and a database file cannot be created in a
    # missing folder (SQLite): either way every connection attempt fails.
    dead = (
        f"sqlite:///{tmp_path}/missing/db.sqlite3"
        if ON_SQLITE
        else f"postgres://nobody@127.0.0.1:{free_port()}/runledger?connect_timeout=3"
    )
    web = procs.uvicorn(env=subprocess_env(DATABASE_URL=dead))
    assert _get(web.url + "/healthz/") == (200, {"status": "ok"})
    started = time.monotonic()
    status, body = _get(web.url + "/readyz/")
    assert status == 503
    assert body["status"] == "unavailable" and body["error"]["code"] == "database_unavailable"
    status, body = _get(web.url + "/api/runs/", {"Authorization": "Token 0123456789abcdef"})
    assert status == 503
    assert body == {
        "error": {"code": "database_unavailable", "message": "the database is unavailable; retry later", "detail": None}
    }
    assert time.monotonic() - started < 10, "a dead database must fail fast, not hang"


# --- Schemathesis ---------------------------------------------------------------------------

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# Examples per operation, generation mode and id source (about 30 runs of them): well under a minute.
EXAMPLES = 12 if ON_SQLITE else 20


def _with_a_registered_agent(case: Any) -> Any:
    # A generated agent name is almost never registered (a 400 before anything is stored); the
    # registered one takes the generated input, parent and budgets all the way to the database.
    if isinstance(case.body, dict):
        case.body["agent"] = "demo"
    return case


@pytest.mark.django_db(transaction=True)
def test_the_live_api_answers_every_generated_request_within_its_schema(
    procs: Procs, make_user: Callable[..., User]
) -> None:
    fuzzer = make_user("fuzzer", perms=("runs.stop_run",))
    token = token_for(fuzzer)
    # Real runs in each state, so fixed ids reach past the 404 into the commands' state checks.
    waiting = waiting_run(fuzzer)
    queued = queued_run(fuzzer)
    ended = queued_run(fuzzer)
    services.run_cancel(run_id=ended.pk, actor=fuzzer)
    real_ids = [str(waiting.pk), str(queued.pk), str(ended.pk)]

    def real_schedule() -> str:
        """A schedule of the fuzzer's of its own for an operation, so that one's DELETE leaves the
        next operation's: a skip (a second fire refused while its run is queued: no worker runs),
        or one that creates a run at each fire."""
        overlap = ("skip", "allow_all")[turn % 2]
        return str(schedule_create(owner=fuzzer, agent="demo", input={}, every_seconds=3600, overlap=overlap).pk)

    web = procs.uvicorn()
    schema = schemathesis.openapi.from_url(web.url + "/api/schema/?format=json").exclude(path_regex=r"/stream/|/wait/")
    operations = [result.ok() for result in schema.get_all_operations()]
    labels = sorted(op.label for op in operations)
    assert len(labels) == 31, labels
    assert not any("stream" in label for label in labels)

    session = requests.Session()
    headers = {"Authorization": f"Token {token}"}
    # What a fuzzer does not send: no credentials, and a body over the limit, through uvicorn.
    assert session.get(web.url + "/api/runs/").json()["error"]["code"] == "not_authenticated"
    huge = json.dumps({"agent": "demo", "input": {"blob": "x" * 300_000}})
    response = session.post(
        web.url + "/api/runs/", data=huge, headers={**headers, "Content-Type": "application/json"}, timeout=20
    )
    assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"
    failures: list[str] = []
    seen: dict[str, set[int]] = {label: set() for label in labels}
    turn = 0
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            # Generated ids (almost always unknown: 404), then one of the real runs.
            run_ids: list[str | None] = [None]
            name = "schedule_id" if "{schedule_id}" in operation.path else "run_id"
            if "{schedule_id}" in operation.path:
                run_ids.append(real_schedule())
                turn += 1
            elif "{run_id}" in operation.path:
                run_ids.append(real_ids[turn % len(real_ids)])
                turn += 1
            for run_id in run_ids:
                path_parameters = {name: run_id} if run_id else None
                strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters)
                if mode is GenerationMode.POSITIVE and operation.label in ("POST /api/runs/", "POST /api/schedules/"):
                    strategy = strategy.map(_with_a_registered_agent)

                @settings(
                    max_examples=EXAMPLES,
                    derandomize=True,
                    database=None,
                    deadline=None,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck),
                )
                @given(case=strategy)
                def run_case(case: Any) -> None:
                    response = case.call(base_url=web.url, session=session, headers=headers, timeout=20)
                    seen[case.operation.label].add(response.status_code)
                    case.validate_response(response, checks=CHECKS)

                try:
                    run_case()
                except Unsatisfiable:
                    # With the id fixed, an operation without body or query has nothing left to negate.
                    if not (run_id and mode is GenerationMode.NEGATIVE):
                        raise
                except Exception as exc:
                    failures.append(f"{operation.label} [{mode.value}, id={run_id}]: {exc}")
    assert failures == [], "\n\n".join(failures)
    # The fuzzing got past validation into the services, not only into 400s and 404s.
    assert {201, 400} <= seen["POST /api/runs/"], seen
    assert {200, 404} <= seen["GET /api/runs/{run_id}/"], seen
    assert 200 in seen["GET /api/runs/{run_id}/events/"] and 200 in seen["GET /api/runs/"], seen
    assert {200, 404} <= seen["GET /api/schedules/{schedule_id}/"] and 200 in seen["GET /api/schedules/"], seen
    assert 400 in seen["POST /api/schedules/"] and 200 in seen["POST /api/schedules/{schedule_id}/pause/"], seen
    assert "Traceback" not in web.log(), web.log()


@pytest.mark.django_db(transaction=True)
def test_a_resume_whose_answer_was_lost_is_retried_safely(procs: Procs, make_user: Callable[..., User]) -> None:
    owner = make_user()
    run = waiting_run(owner)
    web = procs.uvicorn(env=subprocess_env())
    proxy = CuttableProxy(upstream_port=int(web.port or 0)).start()
    path = f"/api/runs/{run.pk}/resume/"
    body = {"ticket": run.resume_ticket, "input": {"answer": 42}}
    try:
        with httpx.Client(base_url=proxy.url, headers={"Authorization": f"Token {token_for(owner)}"}) as client:
            proxy.drop_next_answer(path)
            with pytest.raises(httpx.TransportError):
                client.post(path, json=body)
            assert proxy.dropped_answers == 1
            # The first try did resume the run; the client cannot know, so it retries.
            retried = client.post(path, json=body)
            assert retried.status_code == 200, retried.text
            assert retried.json()["status"] == "queued"
            other = client.post(path, json={**body, "input": {"answer": 41}})
            assert other.status_code == 409 and other.json()["error"]["code"] == "stale_ticket"
    finally:
        proxy.stop()
    assert event_types(run).count(EventType.RUN_RESUMED) == 1

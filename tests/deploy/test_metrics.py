"""`GET /metrics/` (docs/design/operations.md#metrics): who may read it, the series it always has,
and counts that add up across web and worker processes started plainly — the suite's own environment
and nothing about metrics — and that no restart lowers; a real Prometheus server scraping it; JSON
logs.

Counts accumulate over the session in the directory the test database's processes share, so the
process tests compare scrapes before and after, never absolute values."""

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from django.contrib.auth.models import User
from django.test import Client

from runs.models import Run, RunAttempt
from runs.transitions import Status
from tests.support.db import token_for
from tests.support.metrics import Families, parse, query, scrape, start_prometheus, value
from tests.support.procs import Proc, Procs, subprocess_env
from tests.support.runs import attempt, fresh
from tests.support.sse import Stream, auth_headers, stream_path
from tests.support.waiting import wait_until
from tests.support.workers import wait_status, wait_streaming

NAMED = {
    "runledger_runs",
    "runledger_queue_oldest_age_seconds",
    "runledger_events_appended",
    "runledger_cancel_release_seconds",
    "runledger_attempts_lost",
    "runledger_sse_streams_open",
    "runledger_http_requests",
}
LONG = {"deltas": 300, "delay_ms": 25}
# transaction=True: the process tests' processes must see the rows this process writes.
pytestmark = pytest.mark.django_db(transaction=True)
APPENDED = "runledger_events_appended_total"
LOST = "runledger_attempts_lost_total"
OPEN = "runledger_sse_streams_open"


# --- access and shape, in this process ---------------------------------------------------------


@pytest.fixture
def metrics_token(settings: pytest.FixtureRequest) -> str:
    settings.RUNLEDGER_METRICS_TOKEN = "scrape-me-0123456789"  # type: ignore[attr-defined]
    return "scrape-me-0123456789"


@pytest.mark.sqlite
def test_every_named_series_is_there_from_the_first_scrape_and_parses(client: Client, metrics_token: str) -> None:
    response = client.get("/metrics/", headers={"Authorization": f"Bearer {metrics_token}"})

    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    families = parse(response.content.decode())
    assert set(families) >= NAMED
    assert {s.labels["status"] for s in families["runledger_runs"].samples} == {s.value for s in Status}
    assert value(families, "runledger_queue_oldest_age_seconds") == 0
    assert value(families, "runledger_cancel_release_seconds_count") >= 0
    assert value(families, "runledger_http_requests_total", status="500") >= 0
    for name in (APPENDED, LOST, OPEN, "runledger_leases_stale"):
        assert value(families, name) >= 0


def test_anonymous_callers_get_401_never_a_redirect(client: Client) -> None:
    response = client.get("/metrics/")

    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert response.json()["error"]["code"] == "not_authenticated"


def test_a_wrong_bearer_token_is_refused_and_none_works_while_the_setting_is_empty(
    client: Client, settings: pytest.FixtureRequest, make_user: Callable[..., User]
) -> None:
    settings.RUNLEDGER_METRICS_TOKEN = ""  # type: ignore[attr-defined]
    assert client.get("/metrics/", headers={"Authorization": "Bearer "}).status_code == 401
    settings.RUNLEDGER_METRICS_TOKEN = "right"  # type: ignore[attr-defined]
    assert client.get("/metrics/", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/metrics/", headers={"Authorization": "Bearer right"}).status_code == 200
    # A wrong bearer token is not downgraded to the session of a user who could read them.
    client.force_login(make_user(perms=("runs.view_run",)))
    assert client.get("/metrics/", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_users_need_view_run_by_session_or_token(client: Client, make_user: Callable[..., User]) -> None:
    plain, viewer = make_user(), make_user(perms=("runs.view_run",))

    client.force_login(plain)
    assert client.get("/metrics/").status_code == 403
    assert client.get("/metrics/", headers=auth_headers(token_for(plain))).status_code == 403
    assert client.get("/metrics/", headers={"Authorization": "Token not-a-token"}).status_code == 401
    client.force_login(viewer)
    assert client.get("/metrics/").status_code == 200
    client.logout()
    assert client.get("/metrics/", headers=auth_headers(token_for(viewer))).status_code == 200


def test_an_address_with_too_many_failed_token_attempts_is_throttled_here_too(
    client: Client, settings: pytest.FixtureRequest, make_user: Callable[..., User]
) -> None:
    settings.RUNLEDGER_AUTH_FAILURES_MAX = 2  # type: ignore[attr-defined]
    viewer = make_user(perms=("runs.view_run",))
    wrong = {"Authorization": "Token not-a-token"}
    assert [client.get("/metrics/", headers=wrong).status_code for _ in range(2)] == [401, 401]
    refused = client.get("/metrics/", headers=auth_headers(token_for(viewer)))
    assert refused.status_code == 429 and "Retry-After" in refused
    assert refused.json()["error"]["code"] == "too_many_requests"


@pytest.mark.sqlite
def test_wrong_bearer_tokens_are_throttled_with_the_apis_token_attempts(
    client: Client, settings: pytest.FixtureRequest, metrics_token: str
) -> None:
    settings.RUNLEDGER_AUTH_FAILURES_MAX = 3  # type: ignore[attr-defined]
    right, wrong = {"Authorization": f"Bearer {metrics_token}"}, {"Authorization": "Bearer guess"}
    guesser, other = "10.9.0.1", "10.9.0.2"
    assert [client.get("/metrics/", headers=wrong, REMOTE_ADDR=guesser).status_code for _ in range(2)] == [401, 401]
    # One count with the API's token attempts from the address.
    assert client.get("/api/runs/", headers={"Authorization": "Token guess"}, REMOTE_ADDR=guesser).status_code == 401
    for headers in (wrong, right):  # refused unchecked: the right token too, so a hit cannot be told
        refused = client.get("/metrics/", headers=headers, REMOTE_ADDR=guesser)
        assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
        assert refused.json()["error"]["code"] == "too_many_requests"
    assert client.get("/api/runs/", headers={"Authorization": "Token guess"}, REMOTE_ADDR=guesser).status_code == 429
    assert client.get("/metrics/", headers=right, REMOTE_ADDR=other).status_code == 200
    # A right bearer is never counted.
    assert [client.get("/metrics/", headers=right, REMOTE_ADDR=other).status_code for _ in range(4)] == [200] * 4


# --- counts from plain processes ---------------------------------------------------------------


def _api(web: Proc, user: User) -> httpx.Client:
    return httpx.Client(base_url=web.url, headers=auth_headers(token_for(user)), timeout=10)


def _create(api: httpx.Client, input: dict[str, int]) -> Run:
    response = api.post("/api/runs/", json={"agent": "demo", "input": input})
    assert response.status_code == 201, response.text
    return Run.objects.get(pk=response.json()["id"])


def _scrape_when(
    metrics: Callable[[], Families], holds: Callable[[Families], bool], what: str, timeout: float = 15
) -> Families:
    """The first scrape for which `holds`: each process counts just after its commit, a moment
    after the committed row is visible here."""

    def scraped() -> Families | None:
        now = metrics()
        return now if holds(now) else None

    return wait_until(scraped, timeout=timeout, what=what)


def _scraper(web: Proc, make_user: Callable[..., User]) -> Callable[[], Families]:
    headers = auth_headers(token_for(make_user(perms=("runs.view_run",))))
    return lambda: scrape(web.url, headers)


@pytest.mark.processes
def test_appends_requests_and_open_streams_add_up_across_plain_web_and_worker_processes(
    procs: Procs, alice: User, make_user: Callable[..., User]
) -> None:
    web, other_web = procs.uvicorn(), procs.uvicorn()
    procs.worker("m1")
    metrics = _scraper(other_web, make_user)
    api = _api(web, alice)
    before = metrics()

    run = wait_status(_create(api, {"deltas": 3, "delay_ms": 1}), "completed")
    assert api.get("/api/runs/not-a-run/").status_code == 404

    # Every event of the run: created by one web process, the rest by the worker; read via another.
    appended = run.last_seq
    after = _scrape_when(metrics, lambda now: value(now, APPENDED) - value(before, APPENDED) >= appended, "the appends")
    assert value(after, APPENDED) - value(before, APPENDED) == appended
    for status, requests in (("201", 1), ("404", 1)):
        key = "runledger_http_requests_total"
        assert value(after, key, status=status) - value(before, key, status=status) == requests

    # A stream held open through `web` counts while it lasts, and not after its process died.
    long = wait_status(_create(api, LONG), "running")
    assert value(metrics(), "runledger_runs", status="running") == 1
    opened, headers = value(metrics(), OPEN), auth_headers(token_for(alice))

    async def hold_stream() -> None:
        stream = await Stream(web.url, stream_path(long), headers).open()
        try:
            assert stream.status == 200
            await asyncio.to_thread(wait_until, lambda: value(metrics(), OPEN) == opened + 1, 20, "the open stream")
            web.kill()
        finally:
            stream.close()

    asyncio.run(hold_stream())
    wait_until(lambda: value(metrics(), OPEN) == opened, what="the dead process's stream leaving the gauge")


def _long_run_on_plain_processes(
    procs: Procs, owner: User, make_user: Callable[..., User], *, streamed: int
) -> tuple[Proc, Callable[[], Families], httpx.Client, Run]:
    """A web process and a worker started plainly, and a long run the worker is `streamed` deltas into."""
    web = procs.uvicorn()
    worker = procs.worker("m1")
    api = _api(web, owner)
    run = _create(api, LONG)
    wait_streaming(run, streamed)
    return worker, _scraper(web, make_user), api, run


@pytest.mark.processes
def test_a_cancels_release_is_observed_in_the_histogram(
    procs: Procs, alice: User, make_user: Callable[..., User]
) -> None:
    _worker, metrics, api, run = _long_run_on_plain_processes(procs, alice, make_user, streamed=3)
    before = metrics()

    assert api.post(f"/api/runs/{run.pk}/cancel/", json={}).status_code == 200
    released = wait_until(lambda: (a := attempt(run)) is not None and a.released_at is not None and a)

    count, total = "runledger_cancel_release_seconds_count", "runledger_cancel_release_seconds_sum"
    after = _scrape_when(metrics, lambda now: value(now, count) > value(before, count), "the release observed")
    assert value(after, count) - value(before, count) == 1
    ended_at = fresh(run).ended_at
    assert ended_at is not None and released.released_at is not None
    latency = (released.released_at - ended_at).total_seconds()
    assert value(after, total) - value(before, total) == pytest.approx(latency, abs=1e-6)
    assert value(after, "runledger_cancel_release_seconds_bucket", le="+Inf") >= value(after, count)


@pytest.mark.processes
def test_a_lost_attempt_is_counted_and_no_restart_lowers_a_counter(
    procs: Procs, alice: User, make_user: Callable[..., User]
) -> None:
    doomed, metrics, _api_client, run = _long_run_on_plain_processes(procs, alice, make_user, streamed=10)

    doomed.kill()  # SIGKILL: nothing of it runs after this
    seq_at_kill, before = fresh(run).last_seq, metrics()
    sweeper = procs.worker("m2")

    after_kill = _scrape_when(
        metrics, lambda now: value(now, LOST) > value(before, LOST), "m2's sweeper counting the lost attempt", 30
    )
    assert value(after_kill, LOST) - value(before, LOST) == 1
    assert RunAttempt.objects.get(run=run, generation=1).outcome == "lost"

    wait_until(lambda: fresh(run).generation == 2, what="m2 taking the run over")
    sweeper.stop()  # SIGTERM: it requeues the run, and exits
    after_stop = metrics()
    procs.worker("m3")
    wait_status(run, "completed", timeout=60)
    after_restart = metrics()
    for name in (APPENDED, LOST, "runledger_cancel_release_seconds_count"):
        assert value(after_kill, name) <= value(after_stop, name) <= value(after_restart, name), name
    # Every event since the kill, though m2 has exited: its counts stay in the totals.
    total = fresh(run).last_seq - seq_at_kill
    wait_until(lambda: value(metrics(), APPENDED) - value(before, APPENDED) == total, what="every event counted")


# --- a real Prometheus server ------------------------------------------------------------------


@pytest.mark.processes
@pytest.mark.timeout(180)
def test_a_prometheus_server_scrapes_the_series_with_the_bearer_token(procs: Procs, tmp_path: Path) -> None:
    token = "prometheus-scrape-token"
    web = procs.uvicorn(env=subprocess_env(RUNLEDGER_METRICS_TOKEN=token))
    prometheus = start_prometheus(procs, tmp_path, target=web, token=token)

    found = wait_until(lambda: query(prometheus, "runledger_runs"), timeout=60, what="Prometheus's first scrape")

    assert {series["metric"]["status"] for series in found} == {s.value for s in Status}
    up = query(prometheus, 'up{job="runledger"}')
    assert [series["value"][1] for series in up] == ["1"]
    names = {series["metric"]["__name__"] for series in query(prometheus, '{__name__=~"runledger_.+"}')}
    assert {APPENDED, LOST, OPEN, "runledger_cancel_release_seconds_count", "runledger_http_requests_total"} <= names


# --- JSON logs ---------------------------------------------------------------------------------


@pytest.mark.processes
def test_json_logs_are_one_object_a_line_naming_the_run(procs: Procs, alice: User) -> None:
    env = subprocess_env(RUNLEDGER_LOG_FORMAT="json")
    web = procs.uvicorn(env=env, access_log=True)
    worker = procs.worker("json-logs", env=env)
    run = wait_status(_create(_api(web, alice), {"deltas": 3, "delay_ms": 1}), "completed")
    wait_until(lambda: '"released"' in worker.log(), what="the worker's release line")

    for proc in (web, worker):
        lines = [json.loads(line) for line in proc.log().splitlines() if line.strip()]
        assert lines and all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    worker_lines = [json.loads(line) for line in worker.log().splitlines() if line.strip()]
    about_run = [line for line in worker_lines if line.get("run_id") == str(run.pk)]
    assert {"claimed", "released"} <= {line.get("event") for line in about_run}
    assert all(line["generation"] == 1 and line["worker"] == "json-logs" for line in about_run)
    assert any(line.get("event") == "ready" for line in worker_lines)

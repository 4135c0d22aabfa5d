"""Finding runs: metadata on a run and the list's filters
(docs/design/api.md#metadata, #lists), and paging by cursor (docs/design/api.md#paging), on
PostgreSQL and SQLite. The race against paging uses real threads on their own connections."""

import datetime as dt
import queue
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from runs import services
from runs.models import Run
from tests.factories import queued_run, running_run
from tests.support.api import api_for, assert_error

pytestmark = pytest.mark.sqlite


@pytest.fixture
def api(alice: User) -> APIClient:
    return api_for(alice)


def ids(api: APIClient, **query: Any) -> set[str]:
    body = api.get("/api/runs/", query).json()
    assert body["next"] is None, "more than a page"
    return {run["id"] for run in body["results"]}


def every_page(api: APIClient, query: dict[str, Any]) -> Iterator[dict[str, Any]]:
    body = api.get("/api/runs/", query).json()
    yield body
    while body["next"] is not None:
        body = api.get(body["next"]).json()
        yield body


# --- metadata ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_metadata_is_stored_returned_and_listed(api: APIClient) -> None:
    labels = {"customer": "42", "ticket": "ENG-7", "note": "ü " * 200, "empty": ""}
    created = api.post("/api/runs/", {"agent": "demo", "input": {}, "metadata": labels}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["metadata"] == labels
    assert api.get(f"/api/runs/{created.json()['id']}/").json()["metadata"] == labels
    assert api.get("/api/runs/").json()["results"][0]["metadata"] == labels
    plain = api.post("/api/runs/", {"agent": "demo", "input": {}}, format="json").json()
    assert plain["metadata"] == {}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("metadata", "named"),
    [
        ({f"k{n}": "v" for n in range(51)}, None),
        ({"x" * 41: "v"}, "x" * 41),
        ({"big": "v" * 501}, "big"),
        ({"number": 42}, "number"),
        ({"nested": {"a": "b"}}, "nested"),
        ({"a[0]": "v"}, "a[0]"),
        ({"": "v"}, ""),
        ({"tab\there": "v"}, "tab\there"),
    ],
)
def test_metadata_past_stripes_bounds_is_a_400_naming_the_key(
    api: APIClient, metadata: dict[str, Any], named: str | None
) -> None:
    response = api.post("/api/runs/", {"agent": "demo", "input": {}, "metadata": metadata}, format="json")
    detail = assert_error(response, 400, "validation_error")["error"]["detail"]["metadata"]
    if named is not None:
        assert list(detail) == [named]
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_metadata_that_is_not_an_object_is_a_400(api: APIClient) -> None:
    for metadata in (["a"], "a=b", None):
        response = api.post("/api/runs/", {"agent": "demo", "input": {}, "metadata": metadata}, format="json")
        assert "metadata" in assert_error(response, 400, "validation_error")["error"]["detail"]
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_exactly_fifty_keys_of_forty_characters_and_values_of_500_are_allowed(api: APIClient) -> None:
    labels = {f"{n:02d}".ljust(40, "k"): "v" * 500 for n in range(50)}
    response = api.post("/api/runs/", {"agent": "demo", "input": {}, "metadata": labels}, format="json")
    assert response.status_code == 201, response.content
    assert Run.objects.get().metadata == labels


@pytest.mark.django_db
def test_children_carry_their_parents_metadata_unless_given(alice: User) -> None:
    parent = running_run(alice, metadata={"customer": "42"})
    inherited = services.run_child_spawn(run_id=parent.pk, generation=1, input={})
    own = services.run_child_spawn(run_id=parent.pk, generation=1, input={}, metadata={"customer": "7"})
    none = services.run_child_spawn(run_id=parent.pk, generation=1, input={}, metadata={})
    assert (inherited.metadata, own.metadata, none.metadata) == ({"customer": "42"}, {"customer": "7"}, {})
    assert Run.objects.get(pk=inherited.pk).metadata == {"customer": "42"}


@pytest.mark.django_db
def test_metadata_counts_toward_the_bytes_a_run_stores(alice: User) -> None:
    bare, labelled = queued_run(alice), queued_run(alice, metadata={"customer": "42"})
    assert labelled.stored_bytes - bare.stored_bytes == len('{"customer":"42"}')


# --- filters ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_metadata_filters_must_all_match(api: APIClient, alice: User, bob: User) -> None:
    a = queued_run(alice, metadata={"customer": "42", "tier": "gold"})
    b = queued_run(alice, metadata={"customer": "42", "tier": "free"})
    queued_run(alice, metadata={"customer": "7", "tier": "gold"})
    queued_run(alice)
    queued_run(bob, metadata={"customer": "42", "tier": "gold"})  # not visible to alice
    assert ids(api, **{"metadata.customer": "42"}) == {str(a.pk), str(b.pk)}
    assert ids(api, **{"metadata.customer": "42", "metadata.tier": "gold"}) == {str(a.pk)}
    assert ids(api, **{"metadata.customer": "4"}) == set()
    assert ids(api, **{"metadata.nope": "42"}) == set()


@pytest.mark.django_db
def test_metadata_keys_are_matched_whole_whatever_they_hold(api: APIClient, alice: User) -> None:
    odd = {"a__b": "1", "a.b": "2", 'q"uote': "3", "sp ace": "4", "ключ": "5", "$.x": "6", "a\\b": "7"}
    run = queued_run(alice, metadata=odd)
    queued_run(alice, metadata={"a": "x"})
    for key, value in odd.items():
        assert ids(api, **{f"metadata.{key}": value}) == {str(run.pk)}, key
    assert ids(api, **{f"metadata.{k}": v for k, v in odd.items()}) == {str(run.pk)}
    assert ids(api, **{"metadata.a__b": "2"}) == set()


@pytest.mark.django_db
def test_list_filters_by_end_code_several_statuses_agent_and_creation_time(api: APIClient, alice: User) -> None:
    running = running_run(alice)
    first = queued_run(alice)
    cancelled = queued_run(alice)
    services.run_cancel(run_id=cancelled.pk, actor=alice)
    queued = queued_run(alice)
    assert ids(api, status="queued,running") == {str(running.pk), str(first.pk), str(queued.pk)}
    assert ids(api, status="cancelled") == {str(cancelled.pk)}
    assert ids(api, end_code="cancelled_by_user") == {str(cancelled.pk)}
    assert ids(api, end_code="cancelled_by_staff,agent_error") == set()
    assert ids(api, status="queued", agent="demo", created_after=first.created_at.isoformat()) == {
        str(first.pk),
        str(queued.pk),
    }
    assert ids(api, created_before=first.created_at.isoformat(), status="running,queued") == {str(running.pk)}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "query",
    [
        {"status": "queued,bogus"},
        {"status": "queued,"},
        {"end_code": "nope"},
        {"metadata.": "x"},
        {"metadata.k": "v" * 501},
        {"metadata.a[b]": "x"},
        {"metadata.k": "a\x00b"},
        {"cursor": "not-a-cursor"},
        {"cursor": "x" * 1001},
        {"page_size": "0"},
    ],
)
def test_malformed_filters_and_cursors_are_400_naming_the_parameter(
    api: APIClient, alice: User, query: dict[str, str]
) -> None:
    queued_run(alice)
    detail = assert_error(api.get("/api/runs/", query), 400, "validation_error")["error"]["detail"]
    assert set(query) <= set(detail)


@pytest.mark.django_db
def test_one_metadata_key_given_twice_is_a_400(api: APIClient) -> None:
    response = api.get("/api/runs/?metadata.k=a&metadata.k=b")
    assert "metadata.k" in assert_error(response, 400, "validation_error")["error"]["detail"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("/api/runs/", "status=queued&status=running"),
        ("/api/runs/", "agent=a&agent=b"),
        ("/api/runs/", "end_code=agent_error&end_code=worker_lost"),
        ("/api/runs/", "parent=00000000-0000-0000-0000-000000000001&parent=00000000-0000-0000-0000-000000000002"),
        ("/api/runs/", "created_after=2024-01-01T00:00:00Z&created_after=2025-01-01T00:00:00Z"),
        ("/api/runs/", "created_before=2024-01-01T00:00:00Z&created_before=2025-01-01T00:00:00Z"),
        ("/api/runs/", "page_size=1&page_size=2"),
        ("/api/runs/", "cursor=a&cursor=b"),
        ("/api/agents/", "page_size=1&page_size=2"),
        ("/api/webhooks/", "page_size=1&page_size=1"),
        ("/api/runs/{run}/events/", "after_seq=0&after_seq=1"),
        ("/api/runs/{run}/events/", "limit=5&limit=5"),
        ("/api/runs/{run}/events/", "types=output.delta&types=run.*"),
    ],
)
def test_a_list_filter_given_twice_is_a_400_naming_it(api: APIClient, alice: User, path: str, query: str) -> None:
    run = queued_run(alice)
    key = query.split("=", 1)[0]

    response = api.get(path.format(run=run.pk) + "?" + query)

    detail = assert_error(response, 400, "validation_error")["error"]["detail"]
    assert detail == {key: [detail[key][0]]} and detail[key][0].startswith("given more than once"), detail
    # The key once is no such refusal (a bad value is refused for what it is).
    once = api.get(path.format(run=run.pk) + "?" + query.split("&", 1)[0])
    assert "given more than once" not in once.content.decode()


@pytest.mark.django_db
def test_several_statuses_are_one_comma_list_and_the_400_says_so(api: APIClient, alice: User) -> None:
    running = running_run(alice)
    queued = queued_run(alice)

    refused = assert_error(api.get("/api/runs/?status=queued&status=running"), 400, "validation_error")

    assert "comma list" in refused["error"]["detail"]["status"][0]
    assert ids(api, status="queued,running") == {str(queued.pk), str(running.pk)}


@pytest.mark.django_db
def test_a_forged_cursor_of_the_right_shape_with_bad_values_is_a_400(api: APIClient, alice: User) -> None:
    from runs.api.pagination import Position

    queued_run(alice)
    for values in (
        ("yesterday", "00000000-0000-0000-0000-000000000000"),
        ("2024-01-01T00:00:00+00:00", "not-a-uuid"),
        ("2024-01-01T00:00:00", "00000000-0000-0000-0000-000000000000"),  # naive
        ("2024-01-01T00:00:00+00:00",),
    ):
        cursor = Position(values).encode()
        assert (
            "cursor"
            in assert_error(api.get("/api/runs/", {"cursor": cursor}), 400, "validation_error")["error"]["detail"]
        )


# Every offset Python accepts: PostgreSQL holds none past ±15:59, and at either end of the calendar
# one moves the moment past the first or last datetime (year 9999 at -23:59: a 500 on both databases).
OFFSETS = st.integers(-(24 * 60 - 1), 24 * 60 - 1).map(lambda minutes: dt.timezone(dt.timedelta(minutes=minutes)))


def in_utc(moment: dt.datetime) -> dt.datetime | None:
    try:
        return moment.astimezone(dt.UTC)
    except OverflowError:
        return None


@pytest.fixture
def three_runs(alice: User) -> None:
    for _ in range(3):
        queued_run(alice)


@pytest.mark.django_db
@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(moment=st.datetimes(timezones=OFFSETS), back=st.booleans())
@example(
    moment=dt.datetime(9999, 12, 31, 23, 59, 59, 999999, dt.timezone(-dt.timedelta(hours=23, minutes=59))), back=False
)
@example(moment=dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=23, minutes=59))), back=True)
@example(moment=dt.datetime(2024, 1, 1, tzinfo=dt.timezone(-dt.timedelta(hours=20))), back=False)
def test_a_cursor_at_any_moment_with_any_offset_is_a_page_or_a_400_never_a_500(
    api: APIClient, alice: User, three_runs: None, moment: dt.datetime, back: bool
) -> None:
    from runs.api.pagination import Position

    cursor = Position((moment.isoformat(), "00000000-0000-0000-0000-000000000000"), back=back).encode()
    response = api.get("/api/runs/", {"cursor": cursor})

    utc = in_utc(moment)
    if utc is None:
        assert "cursor" in assert_error(response, 400, "validation_error")["error"]["detail"]
        return
    assert response.status_code == 200, response.content
    created = Run.objects.filter(owner=alice).values_list("created_at", flat=True)
    # The page holds the runs on the cursor's side of the moment, compared in UTC.
    beyond = [at for at in created if (at > utc if back else at < utc)]
    assert len(response.json()["results"]) == len(beyond)


# --- paging -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_pages_follow_next_and_previous_newest_first_without_a_count(api: APIClient, alice: User) -> None:
    runs = [str(queued_run(alice).pk) for _ in range(5)]
    newest_first = runs[::-1]
    first = api.get("/api/runs/", {"page_size": 2, "status": "queued"}).json()
    assert set(first) == {"next", "previous", "results"}
    assert first["previous"] is None and [r["id"] for r in first["results"]] == newest_first[:2]
    link = urlsplit(first["next"])
    assert link.scheme == "http" and link.path == "/api/runs/"
    assert parse_qs(link.query)["page_size"] == ["2"] and parse_qs(link.query)["status"] == ["queued"]
    second = api.get(first["next"]).json()
    assert [r["id"] for r in second["results"]] == newest_first[2:4]
    third = api.get(second["next"]).json()
    assert [r["id"] for r in third["results"]] == newest_first[4:] and third["next"] is None
    back = api.get(third["previous"]).json()
    assert [r["id"] for r in back["results"]] == newest_first[2:4]
    assert [r["id"] for r in api.get(back["previous"]).json()["results"]] == newest_first[:2]
    assert api.get(back["previous"]).json()["previous"] is None
    assert [r["id"] for r in api.get(back["next"]).json()["results"]] == newest_first[4:]


@pytest.mark.django_db
def test_runs_created_in_the_same_microsecond_are_each_listed_once(api: APIClient, alice: User) -> None:
    runs = [queued_run(alice) for _ in range(9)]
    moment = timezone.now()
    # Three runs a timestamp: the order falls back on the id, and a cursor's position is exact.
    for n, run in enumerate(runs):
        Run.objects.filter(pk=run.pk).update(created_at=moment - timedelta(seconds=n // 3))
    seen = [r["id"] for page in every_page(api, {"page_size": 2}) for r in page["results"]]
    assert set(seen) == {str(run.pk) for run in runs} and len(seen) == 9
    by_id = {str(r.pk): r for r in Run.objects.all()}
    keys = [(by_id[i].created_at, by_id[i].pk) for i in seen]
    assert keys == sorted(keys, reverse=True)
    # A run among the ties leaving the list does not shift the others.
    first = api.get("/api/runs/", {"page_size": 4, "status": "queued"}).json()
    services.run_cancel(run_id=first["results"][0]["id"], actor=alice)
    rest = [
        r["id"]
        for page in every_page(api, {"page_size": 4, "status": "queued", "cursor": _cursor(first)})
        for r in page["results"]
    ]
    assert rest == seen[4:]


def _cursor(page: dict[str, Any]) -> str:
    return parse_qs(urlsplit(page["next"]).query)["cursor"][0]


@pytest.mark.django_db
def test_page_size_defaults_to_50_and_is_clamped_to_500(api: APIClient, alice: User) -> None:
    for _ in range(501):
        queued_run(alice)
    first = api.get("/api/runs/").json()
    assert len(first["results"]) == 50 and first["next"] is not None
    clamped = api.get("/api/runs/", {"page_size": 10_000}).json()
    assert len(clamped["results"]) == 500
    assert len(api.get(clamped["next"]).json()["results"]) == 1


@pytest.mark.django_db
def test_the_agents_list_pages_by_cursor_too(api: APIClient) -> None:
    from runs.agents import registered_names

    names: list[str] = []
    body = api.get("/api/agents/", {"page_size": 1}).json()
    assert set(body) == {"next", "previous", "results"}
    while True:
        names += [agent["name"] for agent in body["results"]]
        if body["next"] is None:
            break
        body = api.get(body["next"]).json()
    assert names == sorted(registered_names())
    assert (
        "cursor" in assert_error(api.get("/api/agents/", {"cursor": "zz"}), 400, "validation_error")["error"]["detail"]
    )


# --- the proof: paging while the list changes ------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(180)
def test_paging_sees_each_run_that_still_matches_exactly_once_while_runs_are_created_and_finished(
    alice: User,
) -> None:
    """300 runs read 10 a page with a status filter, while another thread creates 100 runs and
    finishes 100 of the first 300 — between every two pages, ahead of the reader and behind it."""
    runs = [queued_run(alice) for _ in range(300)]
    # Ties as well: runs created in the same microsecond, in threes.
    moment = timezone.now() - timedelta(hours=1)
    for n, run in enumerate(runs):
        Run.objects.filter(pk=run.pk).update(created_at=moment + timedelta(seconds=n // 3))
    at_start = {str(run.pk) for run in runs}
    # Every third run, from both ends of the list: some finish before the reader reaches them,
    # some after it has passed them.
    finishing = [str(run.pk) for run in runs[::3]][:100]
    batches = 15
    go: list[queue.Queue[bool]] = [queue.Queue() for _ in range(batches + 1)]
    done: queue.Queue[bool] = queue.Queue()
    failures: list[BaseException] = []

    def writer() -> None:
        try:
            for batch in range(batches):
                go[batch].get(timeout=60)
                for n in range(batch, 100, batches):
                    queued_run(alice)
                    services.run_cancel(run_id=finishing[n], actor=alice)
                done.put(True)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)
            done.put(False)
        finally:
            connection.close()

    thread = threading.Thread(target=writer)
    thread.start()
    reader = api_for(alice)
    seen: list[str] = []
    pages = 0
    body = reader.get("/api/runs/", {"status": "queued,running", "page_size": 10}).json()
    while True:
        seen += [run["id"] for run in body["results"]]
        if pages < batches:
            go[pages].put(True)
            assert done.get(timeout=60), failures
        pages += 1
        if body["next"] is None:
            break
        body = reader.get(body["next"]).json()
    thread.join(timeout=60)
    assert not thread.is_alive() and not failures, failures
    still = at_start - set(finishing)
    assert len(seen) == len(set(seen)), "a run was listed twice"
    assert still <= set(seen), f"{len(still - set(seen))} runs that match were never listed"
    assert set(seen) <= at_start, "a run created after the first page was listed (it is newer than every cursor)"
    assert Run.objects.count() == 400

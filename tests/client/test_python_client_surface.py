"""The Python client's 0.2 surface against a live web process and worker (tests/support/live.py),
directly: every method of `client.runs`, `client.agents`, `client.schedules`, `client.webhooks` and `client.tokens`,
sync and async, with typed models; streams as context managers that close their connection (the
server's open-stream gauge drops); where `Client()` finds its server and token; the flat 0.1 names,
deprecated."""

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

import runledger_client as rl
from runs.agents.demo import demo_text
from tests.support.cli import run_cli
from tests.support.db import token_for
from tests.support.live import FAST, Live, run_async
from tests.support.metrics import scrape, value
from tests.support.procs import free_port
from tests.support.sse import auth_headers
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


LONG = {"deltas": 1000, "delay_ms": 50}


def test_every_method_of_webhooks_answers_typed_models(live: Live, alice: User, bob: User) -> None:
    url = f"http://127.0.0.1:{free_port()}/in"  # nothing listens: deliveries stay pending, listed all the same
    with rl.Client(live.web.url, token_for(alice), retry=FAST) as client:
        hook = client.webhooks.create(url, ["run.completed", "run.cancelled"], {"team": "a"})  # kept sorted
        assert isinstance(hook, rl.Webhook) and hook.secret is not None and hook.secret.startswith("whsec_")
        assert (hook.url, hook.events, hook.metadata, hook.enabled) == (
            url,
            ("run.cancelled", "run.completed"),
            {"team": "a"},
            True,
        )
        assert isinstance(hook.created_at, datetime) and hook.owner == alice.username
        other = client.webhooks.create(url, ["run.failed"])
        shown = client.webhooks.get(hook.id)
        assert shown.secret is None and shown.events == hook.events  # the secret is shown once
        assert [h.id for h in client.webhooks.list(page_size=1)] == [hook.id, other.id]
        off = client.webhooks.update(hook.id, events=["run.completed"], metadata={"team": "b"}, enabled=False)
        assert (off.events, off.metadata, off.enabled) == (("run.completed",), {"team": "b"}, False)
        assert client.webhooks.update(hook.id, enabled=True).enabled
        rotated = client.webhooks.rotate_secret(hook.id)
        assert rotated.secret not in (None, hook.secret) and isinstance(rotated.previous_secret_expires_at, datetime)

        done = client.runs.wait(client.runs.create("demo", {"deltas": 1, "delay_ms": 0}, metadata={"team": "b"}).id)
        [delivery] = client.webhooks.deliveries(hook.id)  # written in the end's own transaction
        assert isinstance(delivery, rl.WebhookDelivery) and isinstance(delivery.created_at, datetime)
        assert (delivery.run_id, delivery.seq, delivery.event_type) == (done.id, done.last_seq, "run.completed")
        assert delivery.status == "pending" and delivery.delivered_at is None

        with pytest.raises(rl.ValidationError):
            client.webhooks.create(url, ["run.created"])
        with pytest.raises(rl.PermissionDenied):
            client.webhooks.create(url, ["run.failed"], all_runs=True)
        with rl.Client(live.web.url, token_for(bob), retry=FAST) as hers, pytest.raises(rl.NotFound):
            hers.webhooks.get(hook.id)
        client.webhooks.delete(hook.id)
        with pytest.raises(rl.NotFound):
            client.webhooks.get(hook.id)
        assert [h.id for h in client.webhooks.list()] == [other.id]


def test_the_async_client_has_the_same_webhooks(live: Live, alice: User) -> None:
    url = f"http://127.0.0.1:{free_port()}/in"
    token = token_for(alice)

    async def scenario() -> tuple[rl.Webhook, rl.Webhook, rl.Webhook, list[str], rl.Run, list[Any], list[str]]:
        async with rl.AsyncClient(live.web.url, token, retry=FAST) as client:
            hook = await client.webhooks.create(url, ["run.cancelled"])
            changed = await client.webhooks.update(hook.id, url=url + "2", events=["run.cancelled", "run.stopped"])
            rotated = await client.webhooks.rotate_secret(hook.id)
            listed = [h.id async for h in client.webhooks.list()]
            run = await client.runs.create("demo", LONG)
            cancelled = await client.runs.cancel(run.id)
            deliveries = [(d.run_id, d.event_type) async for d in client.webhooks.deliveries(hook.id)]
            shown = await client.webhooks.get(hook.id)
            await client.webhooks.delete(hook.id)
            after = [h.id async for h in client.webhooks.list()]
            return changed, rotated, shown, listed, cancelled, deliveries, after

    changed, rotated, shown, listed, cancelled, deliveries, after = run_async(scenario)
    assert changed.url == url + "2" and changed.events == ("run.cancelled", "run.stopped")
    assert rotated.secret is not None and shown.secret is None and listed == [shown.id] and after == []
    assert deliveries == [(cancelled.id, "run.cancelled")]


def test_every_method_of_schedules_answers_typed_models(live: Live, alice: User, bob: User) -> None:
    with rl.Client(live.web.url, token_for(alice), retry=FAST) as client:
        nightly = client.schedules.create(
            "demo", {"deltas": 1, "delay_ms": 0}, cron="0 9 * * 1-5", timezone="Europe/Paris", metadata={"team": "a"}
        )
        assert isinstance(nightly, rl.Schedule) and isinstance(nightly.next_due_at, datetime)
        assert (nightly.cron, nightly.every_seconds, nightly.timezone, nightly.overlap) == (
            "0 9 * * 1-5",
            None,
            "Europe/Paris",
            "skip",
        )
        assert (nightly.paused, nightly.last_run, nightly.metadata) == (False, None, {"team": "a"})
        hourly = client.schedules.create("demo", LONG, every_seconds=3600, start_at=datetime(2020, 1, 1, tzinfo=UTC))
        assert [s.id for s in client.schedules.list(page_size=1)] == [hourly.id, nightly.id]
        assert client.schedules.get(nightly.id) == nightly
        changed = client.schedules.update(nightly.id, every_seconds=7200, priority=3)
        assert (changed.cron, changed.every_seconds, changed.priority) == ("", 7200, 3)
        assert client.schedules.pause(nightly.id).paused and not client.schedules.resume(nightly.id).paused

        run = client.schedules.trigger(hourly.id)  # a long run: still live below
        assert isinstance(run, rl.Run) and run["schedule"]["id"] == hourly.id
        last = client.schedules.get(hourly.id).last_run
        # The live worker may have claimed it meanwhile.
        assert isinstance(last, rl.ScheduleLastRun) and (last.id, last.status in ("queued", "running")) == (
            run.id,
            True,
        )
        with pytest.raises(rl.ScheduleOverlap) as skipped:
            client.schedules.trigger(hourly.id)
        assert isinstance(skipped.value, rl.Conflict) and skipped.value.run is not None
        assert skipped.value.run.id == run.id
        backfilled = client.schedules.backfill(
            hourly.id, start=datetime(2020, 1, 1, tzinfo=UTC), end="2020-01-01T05:00:00Z", max=2
        )
        assert [r["schedule"]["due_at"][:19] for r in backfilled] == ["2020-01-01T00:00:00", "2020-01-01T01:00:00"]
        assert {r.id for r in client.runs.list(schedule=hourly.id)} == {run.id, *(r.id for r in backfilled)}
        for made in (run, *backfilled):
            client.runs.cancel(made.id)

        with pytest.raises(rl.ValidationError) as refused:
            client.schedules.create("demo", every_seconds=5)
        assert "every_seconds" in refused.value.detail
        with pytest.raises(rl.ValidationError) as refused:
            client.schedules.create("demo", cron="0 9 * * *", timezone="Nowhere/City")
        assert "timezone" in refused.value.detail
        with rl.Client(live.web.url, token_for(bob), retry=FAST) as his:
            for call in (his.schedules.get, his.schedules.pause, his.schedules.trigger, his.schedules.delete):
                with pytest.raises(rl.NotFound):
                    call(nightly.id)
            assert list(his.schedules.list()) == []
        client.schedules.delete(nightly.id)
        with pytest.raises(rl.NotFound):
            client.schedules.get(nightly.id)
        assert [s.id for s in client.schedules.list()] == [hourly.id]


def test_the_async_client_has_the_same_schedules(live: Live, alice: User) -> None:
    token = token_for(alice)

    async def scenario() -> tuple[rl.Schedule, rl.Schedule, rl.Schedule, rl.Run, list[rl.Run], list[str], list[str]]:
        async with rl.AsyncClient(live.web.url, token, retry=FAST) as client:
            made = await client.schedules.create(
                "demo", {"deltas": 1, "delay_ms": 0}, every_seconds=60, overlap="allow_all"
            )
            paused = await client.schedules.pause(made.id)
            changed = await client.schedules.update(made.id, start_at="2020-01-01T00:00:00Z", end_at=None)
            run = await client.schedules.trigger(made.id)
            more = await client.schedules.backfill(
                made.id, start="2020-01-01T00:00:00Z", end="2020-01-01T00:02:00Z", max=5
            )
            listed = [s.id async for s in client.schedules.list()]
            await client.schedules.delete(made.id)
            return made, paused, changed, run, more, listed, [s.id async for s in client.schedules.list()]

    made, paused, changed, run, more, listed, after = run_async(scenario)
    assert paused.paused and changed.start_at == datetime(2020, 1, 1, tzinfo=UTC) and changed.paused
    assert run["schedule"]["id"] == made.id and len(more) == 3
    assert listed == [made.id] and after == []


def test_every_method_of_tokens_answers_typed_models(live: Live, alice: User) -> None:
    with rl.Client(live.web.url, token_for(alice, name="main"), retry=FAST) as client:
        ci = client.tokens.create("ci", expires_in=3600)
        assert isinstance(ci, rl.ApiToken) and ci.key is not None and ci.key.startswith("rl_")
        assert ci.key not in repr(ci)  # a key never reaches a log through a repr
        assert (ci.name, ci.issued_by, ci.last_used_at) == ("ci", "main", None)
        assert isinstance(ci.expires_at, datetime) and ci.expires_at - datetime.now(UTC) < timedelta(hours=1)
        listed = list(client.tokens.list(page_size=1))
        assert [t.name for t in listed] == ["main", "ci"] and all(t.key is None for t in listed)
        assert isinstance(listed[0].last_used_at, datetime)  # this client's own, in use
        with rl.Client(live.web.url, ci.key, retry=FAST) as issued:
            assert [t.name for t in issued.tokens.list()] == ["main", "ci"]
            with pytest.raises(rl.ValidationError):
                issued.tokens.create("ci")  # a name held
            client.tokens.delete("ci")
            with pytest.raises(rl.NotAuthenticated):
                list(issued.tokens.list())
        with pytest.raises(rl.NotFound):
            client.tokens.delete("ci")


def test_the_async_client_has_the_same_tokens(live: Live, alice: User) -> None:
    token = token_for(alice, name="main")

    async def scenario() -> tuple[rl.ApiToken, list[str], list[str]]:
        async with rl.AsyncClient(live.web.url, token, retry=FAST) as client:
            made = await client.tokens.create("nightly", expires_at=datetime.now(UTC) + timedelta(days=1))
            listed = [t.name async for t in client.tokens.list()]
            await client.tokens.delete("nightly")
            return made, listed, [t.name async for t in client.tokens.list()]

    made, listed, after = run_async(scenario)
    assert made.key is not None and made.issued_by == "main"
    assert listed == ["main", "nightly"] and after == ["main"]


@pytest.fixture
def no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config folder of the test's own, and none of the suite's RUNLEDGER_* variables."""
    for name in ("RUNLEDGER_URL", "RUNLEDGER_TOKEN", "RUNLEDGER_TOKEN_FILE", "RUNLEDGER_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config" / "runledger" / "config.toml"


def test_every_method_of_runs_and_agents_answers_typed_models(live: Live, make_user: Callable[..., User]) -> None:
    token = token_for(make_user(perms=("runs.stop_run",)))
    with rl.Client(live.web.url, token, retry=FAST) as client:
        assert "demo" in [agent.name for agent in client.agents.list()]
        [demo] = [agent for agent in client.agents.list(page_size=1) if agent.name == "demo"]
        assert isinstance(demo, rl.Agent) and isinstance(demo.event_types, tuple)

        run = client.runs.create("demo", {"deltas": 3, "delay_ms": 0}, metadata={"batch": "n1"})
        assert isinstance(run, rl.Run) and isinstance(run.created_at, datetime) and run.metadata == {"batch": "n1"}
        done = client.runs.wait(run.id)
        assert (done.status, done.output["text"], done.agent) == ("completed", demo_text(3), "demo")
        assert isinstance(done.attempt, rl.Attempt) and done.attempt.generation >= 1
        assert client.runs.get(run.id) == done
        page = client.runs.events(run.id, limit=2)
        assert [e.seq for e in page.events] == [1, 2] and isinstance(page.events[0].created_at, datetime)
        assert [r.id for r in client.runs.list(metadata={"batch": "n1"})] == [run.id]
        again = client.runs.rerun(run.id)
        assert again.rerun_of == run.id

        asked = client.runs.create("demo", {"deltas": 2, "delay_ms": 0, "ask": "name?"})
        waiting = wait_until(lambda: (r := client.runs.get(asked.id)).status == "waiting" and r, 30, "it asks")
        assert waiting.resume_ticket is not None
        assert client.runs.resume(asked.id, ticket=waiting.resume_ticket, input={"n": 1}).status == "queued"
        assert client.runs.wait(asked.id).output["answer"] == {"n": 1}

        long = client.runs.create("demo", LONG, metadata={"batch": "n2"})
        assert client.runs.pause(long.id).status in ("waiting", "running")
        assert client.runs.cancel(long.id, note="enough").status == "cancelled"
        stopped = client.runs.create("demo", LONG)
        assert client.runs.stop(stopped.id, reason="policy", code="policy").end_code == "policy"

        for _ in range(2):
            client.runs.create("demo", LONG, metadata={"batch": "n3"})
        assert client.runs.count_where(metadata={"batch": "n3"}) == 2
        cancelled = client.runs.cancel_where(max=2, metadata={"batch": "n3"}, status=["queued", "running"])
        assert cancelled.counts["cancelled"] == 2
        client.runs.create("demo", LONG, metadata={"batch": "n4"})
        assert client.runs.stop_where(max=1, reason="r", metadata={"batch": "n4"}).counts["stopped"] == 1


def test_the_async_client_has_the_same_namespaces(live: Live, alice: User) -> None:
    token = token_for(alice)

    async def scenario() -> tuple[list[str], rl.Run, str, list[int], int]:
        async with rl.AsyncClient(live.web.url, token, retry=FAST) as client:
            agents = [agent.name async for agent in client.agents.list()]
            run = await client.runs.create("demo", {"deltas": 4, "delay_ms": 0})
            async with client.runs.stream(run.id) as stream:
                text = await stream.text()
            done = await client.runs.wait(run.id, released=True, timeout=30)
            listed = [r.id async for r in client.runs.list()]
            page = await client.runs.events(run.id, after_seq=done.last_seq - 1)
            long = await client.runs.create("demo", LONG)
            await client.runs.pause(long.id)
            await client.runs.cancel(long.id)
            count = await client.runs.count_where(status="cancelled")
            return agents, done, text, [len(listed), *[e.seq for e in page.events]], count

    agents, done, text, seen, cancelled = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert "demo" in agents and text == demo_text(4) and done.released
    assert seen == [1, done.last_seq] and cancelled == 1


def test_leaving_a_with_stream_closes_its_connection_and_the_servers_open_stream_gauge_drops(
    live: Live, alice: User, make_user: Callable[..., User]
) -> None:
    headers = auth_headers(token_for(make_user(perms=("runs.view_run",))))

    def open_streams() -> float:
        return value(scrape(live.web.url, headers), "runledger_sse_streams_open")

    before = open_streams()
    with rl.Client(live.web.url, token_for(alice), retry=FAST) as client:
        run = client.runs.create("demo", LONG)
        with client.runs.stream(run.id) as stream:
            for event in stream:
                if event.seq >= 3:
                    break
            wait_until(lambda: open_streams() == before + 1, 10, "the stream counted open")
        wait_until(lambda: open_streams() == before, 10, "the stream closed by the `with`")

        token = token_for(alice)

        async def read_two_then_raise() -> None:
            async with (
                rl.AsyncClient(live.web.url, token, retry=FAST) as aclient,
                aclient.runs.stream(run.id) as events,
            ):
                async for event in events:
                    if event.seq >= 2:
                        raise LookupError("the reader's own error")

        with pytest.raises(LookupError):
            asyncio.run(asyncio.wait_for(read_two_then_raise(), 30))
        wait_until(lambda: open_streams() == before, 10, "the async stream closed on the error")

        with client.runs.stream(run.id, after_seq=0) as stream:
            assert next(iter(stream)).seq == 1
        client.runs.cancel(run.id)
        with client.runs.stream(run.id) as stream:
            terminal = stream.until_end()
        assert terminal is not None and terminal.type == "run.cancelled" and stream.terminal == terminal


def test_the_flat_names_of_0_1_still_work_and_warn(client: rl.Client, live: Live, alice: User) -> None:
    with pytest.warns(DeprecationWarning, match=r"client\.create\(\) is deprecated: use client\.runs\.create\(\)"):
        run = client.create("demo", {"deltas": 1, "delay_ms": 0})
    with pytest.warns(DeprecationWarning, match="client.runs.wait"):
        done = client.wait(run.id)
    assert done.status == "completed"
    with pytest.warns(DeprecationWarning, match="client.runs.stream"):
        assert [e.seq for e in client.stream(run.id, after_seq=done.last_seq)] == []
    token = token_for(alice)

    async def flat() -> rl.Run:
        async with rl.AsyncClient(live.web.url, token) as aclient:
            with pytest.warns(DeprecationWarning, match="client.runs.get"):
                return await aclient.get(run.id)

    assert asyncio.run(flat()).id == run.id


def test_arguments_win_over_the_environment_and_the_environment_over_the_profile(
    live: Live, alice: User, no_user_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    token_file = tmp_path / "token"
    token_file.write_text(token_for(alice) + "\n")
    token_file.chmod(0o600)
    no_user_config.parent.mkdir(parents=True)
    no_user_config.write_text(
        f'[profiles.default]\nurl = "{dead}"\ntoken = "wrong"\n\n'
        f'[profiles.live]\nurl = "{live.web.url}"\ntoken_file = "{token_file}"\n'
    )

    def agents(**arguments: Any) -> list[str]:
        with rl.Client(**arguments, retry=rl.Retry(attempts=1)) as client:
            return [agent.name for agent in client.agents.list()]

    assert "demo" in agents(profile="live")
    monkeypatch.setenv("RUNLEDGER_PROFILE", "live")
    assert "demo" in agents()
    with pytest.raises(rl.NotAuthenticated):  # the environment's token over the profile's file
        monkeypatch.setenv("RUNLEDGER_TOKEN", "wrong-too")
        agents()
    assert "demo" in agents(token=token_for(alice))  # an argument over the environment
    monkeypatch.setenv("RUNLEDGER_TOKEN_FILE", str(token_file))
    monkeypatch.delenv("RUNLEDGER_TOKEN")
    monkeypatch.delenv("RUNLEDGER_PROFILE")
    with pytest.raises(rl.TransportError):  # the default profile's dead URL, the environment's token
        agents()
    monkeypatch.setenv("RUNLEDGER_URL", live.web.url)
    assert "demo" in agents()
    with pytest.raises(rl.ConfigError, match=r"no profile 'nope' .*its profiles: default, live"):
        agents(profile="nope")

    by_cli = run_cli(None, None, "agents", "-o", "json", "--profile", "live", XDG_CONFIG_HOME=str(tmp_path / "config"))
    assert by_cli.returncode == 0 and "demo" in [a["name"] for a in json.loads(by_cli.stdout)]


def test_a_malformed_config_file_stops_only_a_client_that_needs_it(
    live: Live, alice: User, no_user_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_user_config.parent.mkdir(parents=True)
    no_user_config.write_text("[profiles.default\nurl = ")  # no TOML
    token = token_for(alice)

    def agents(**arguments: Any) -> list[str]:
        with rl.Client(**arguments, retry=FAST) as client:
            return [agent.name for agent in client.agents.list()]

    # Given a URL and a token — as arguments, from the environment, even with a profile named
    # there — the file is not needed, and not read.
    assert "demo" in agents(url=live.web.url, token=token)
    monkeypatch.setenv("RUNLEDGER_URL", live.web.url)
    monkeypatch.setenv("RUNLEDGER_TOKEN", token)
    monkeypatch.setenv("RUNLEDGER_PROFILE", "staging")
    assert "demo" in agents()
    by_cli = run_cli(live.web.url, token, "agents", "-o", "json", XDG_CONFIG_HOME=str(tmp_path / "config"))
    assert by_cli.returncode == 0, by_cli.stderr
    assert "demo" in [a["name"] for a in json.loads(by_cli.stdout)]
    # Needed — a token left to find there, or a profile named by argument — it is the error it was.
    with pytest.raises(rl.ConfigError, match="cannot read the config file"):
        agents(url=live.web.url, token=token, profile="default")
    monkeypatch.delenv("RUNLEDGER_TOKEN")
    with pytest.raises(rl.ConfigError, match="cannot read the config file"):
        agents()
    by_cli = run_cli(live.web.url, None, "agents", XDG_CONFIG_HOME=str(tmp_path / "config"))
    assert by_cli.returncode == 2 and "cannot read the config file" in by_cli.stderr


def test_no_url_or_token_anywhere_is_a_config_error_naming_what_is_missing(no_user_config: Path) -> None:
    with pytest.raises(rl.ConfigError, match="missing a URL and a token"):
        rl.Client()
    with pytest.raises(rl.ConfigError, match="missing a token"):
        rl.AsyncClient("http://127.0.0.1:9")

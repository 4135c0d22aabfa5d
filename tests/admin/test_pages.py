import httpx
import pytest
from django.contrib.auth.models import User
from django.test import Client

from runs.models import Run
from tests.factories import queued_run
from tests.support.procs import Procs, subprocess_env

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def test_pages_need_a_login(client: Client, alice: User) -> None:
    run = queued_run(alice)
    for url in ("/runs/", f"/runs/{run.pk}/"):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/?next=")


def test_the_login_page_is_public(client: Client) -> None:
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert b'name="password"' in response.content


def test_the_list_shows_only_ones_own_runs(client: Client, alice: User, bob: User) -> None:
    mine = queued_run(alice)
    theirs = queued_run(bob)
    client.force_login(alice)
    body = client.get("/runs/").content.decode()
    assert f"/runs/{mine.pk}/" in body
    assert f"/runs/{theirs.pk}/" not in body


def test_the_demo_form_starts_a_run_and_opens_its_watch_page(client: Client, alice: User) -> None:
    client.force_login(alice)
    response = client.post("/runs/", {"deltas": 5, "delay_ms": 10, "tool": "slow", "ask": "", "children": 0})
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"
    assert (run.owner_id, run.agent, run.status) == (alice.pk, "demo", "queued")
    assert run.input == {"deltas": 5, "delay_ms": 10, "tool": "slow", "ask": None, "children": 0}


def test_the_demo_form_refuses_bad_input_and_creates_nothing(client: Client, alice: User) -> None:
    client.force_login(alice)
    response = client.post("/runs/", {"deltas": -1, "delay_ms": "x", "children": 99})
    assert response.status_code == 200
    assert Run.objects.count() == 0
    assert b'role="alert"' in response.content


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)  # the web process reads the session this one writes
def test_without_the_demo_agent_the_list_offers_no_demo_run(procs: Procs, alice: User) -> None:
    browser = Client()
    browser.force_login(alice)
    assert "Start a demo run" in browser.get("/runs/").content.decode()  # here, `demo` is registered
    web = procs.uvicorn(env=subprocess_env(RUNLEDGER_AGENTS="runs.agents.openai_chat"))
    # The double-submit a browser page does, so that a POST reaches the view.
    secret = "abcdefghijklmnopqrstuvwxyzABCDEF"
    cookies = {"sessionid": browser.cookies["sessionid"].value, "csrftoken": secret}
    with httpx.Client(base_url=web.url, cookies=cookies, timeout=10) as site:
        page = site.get("/runs/")
        assert page.status_code == 200 and "<h1>Your runs</h1>" in page.text
        assert "Start a demo run" not in page.text and 'id="demo-form"' not in page.text
        posted = site.post("/runs/", data={"deltas": 5, "delay_ms": 10}, headers={"X-CSRFToken": secret})
    assert posted.status_code == 405 and posted.headers["Allow"] == "GET"
    assert not Run.objects.exists()


def test_the_watch_page_follows_the_visibility_rule(client: Client, alice: User, bob: User) -> None:
    run = queued_run(alice)
    client.force_login(bob)
    assert client.get(f"/runs/{run.pk}/").status_code == 404
    assert client.get("/runs/not-a-uuid/").status_code == 404
    client.force_login(alice)
    response = client.get(f"/runs/{run.pk}/")
    assert response.status_code == 200
    body = response.content.decode()
    assert f'data-stream-url="/api/runs/{run.pk}/stream/"' in body
    assert 'id="stop"' in body and "watch.js" in body

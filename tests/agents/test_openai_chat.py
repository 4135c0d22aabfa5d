"""The `openai_chat` agent (runs.agents.openai_chat) against an OpenAI-compatible model server.

The real endpoints are outside this network, so the model server is tests/support/openai_server.py,
a process of its own speaking real HTTP and SSE, whose log says what it received, what it sent and
when it saw a client go away. The agent runs in real worker processes started with
RUNLEDGER_AGENTS naming it and RUNLEDGER_OPENAI_BASE_URL pointing at that server.
"""

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

import runs.agents.openai_chat  # noqa: F401  (registers the agent here, as RUNLEDGER_AGENTS does in the workers)
from runs import services
from runs.agents.openai_chat import MODEL_RETRY
from runs.events import EventType
from runs.models import AttemptOutcome, Run, RunEvent
from tests.factories import queued_run
from tests.support.agents import AGENTS_ENV
from tests.support.api import assert_error
from tests.support.checks import assert_nothing_after_terminal
from tests.support.openai_server import API_KEY, ModelServer, answer_text, answer_words
from tests.support.procs import Procs, subprocess_env
from tests.support.runs import delta_count, delta_texts, deltas_of, event_types, fresh, released, stored_text
from tests.support.waiting import wait_until
from tests.support.workers import wait_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes, pytest.mark.timeout(90)]

MESSAGES = [
    {"role": "system", "content": "You answer in words."},
    {"role": "user", "content": "Count for me, please."},
]
# The cancel grace the worker gets in the cancel tests: the production default.
GRACE_SECONDS = 0.5
# Cancel → the worker trips the attempt's token, at most: it hears of the cancel by a notification,
# or by its poll.
HEARD = timedelta(seconds=1)


@pytest.fixture
def model(procs: Procs, tmp_path: Path) -> ModelServer:
    return ModelServer(procs, tmp_path)


def chat_run(owner: User, model: str, **input: Any) -> Run:
    return queued_run(owner, agent="openai_chat", input={"model": model, "messages": MESSAGES, **input})


def events_of(run: Run, type_: str) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=run.pk, type=type_).order_by("seq"))


def only_request(model: ModelServer) -> dict[str, Any]:
    requests = model.requests()
    assert len(requests) == 1, requests
    return requests[0]


def cancel_until_disconnected(model: ModelServer, run: Run, owner: User) -> tuple[dict[str, Any], Run]:
    """Cancel `run` while its one request is open: how the server saw the stream end, and the run
    once its attempt is released."""
    request = only_request(model)["request"]
    assert model.ended(request) is None

    services.run_cancel(run_id=run.pk, actor=owner)

    gone = wait_until(lambda: model.ended(request), what="the server seeing the stream end")
    assert gone["event"] == "disconnect", gone
    attempt = wait_until(lambda: released(run), what="the attempt's release")
    run = fresh(run)
    assert run.status == "cancelled" and run.ended_at is not None
    assert attempt.outcome == AttemptOutcome.CANCELLED and attempt.released_at is not None
    return gone, run


# --- streaming --------------------------------------------------------------------------------------


@pytest.mark.sqlite
def test_an_answer_is_stored_delta_by_delta_as_sent_and_completes_with_its_text_and_usage(
    procs: Procs, model: ModelServer, alice: User
) -> None:
    procs.worker("w1", env=model.env())
    run = wait_status(chat_run(alice, "test+words-30+slow-5ms", max_tokens=100, temperature=0.3), "completed")

    request = only_request(model)
    assert request["body"] == {
        "model": "test+words-30+slow-5ms",
        "messages": MESSAGES,
        "max_tokens": 100,
        "temperature": 0.3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert request["authorization"] == f"Bearer {API_KEY}"
    # Each chunk the server sent is one delta, in order, and nothing else is.
    assert delta_texts(run) == model.sent(request["request"]) == answer_words(30)
    assert run.output == {
        "text": answer_text(30),
        "usage": {"prompt_tokens": 8, "completion_tokens": 30, "total_tokens": 38},
        "finish_reason": "stop",
    }
    assert stored_text(run) == run.output["text"]
    types = event_types(run)
    assert types == [EventType.RUN_CREATED, EventType.RUN_STARTED] + [EventType.OUTPUT_DELTA] * 30 + [
        EventType.USAGE_REPORTED,
        EventType.RUN_COMPLETED,
    ]
    assert run.steps_used == 1  # one model turn
    # What it used, reported before its end and summed into the run.
    assert run.reported_usage == {"input_tokens": 8, "output_tokens": 30}

    # Cut short by max_tokens: a completion all the same, which says so.
    short = wait_status(chat_run(alice, "test+words-30", max_tokens=4), "completed")
    assert short.output["finish_reason"] == "length"
    assert stored_text(short) == short.output["text"] == answer_text(4)


@pytest.mark.sqlite
def test_a_run_that_names_no_bound_is_sent_the_operators_max_tokens(
    procs: Procs, model: ModelServer, alice: User
) -> None:
    procs.worker("w1", env=model.env(RUNLEDGER_OPENAI_MAX_TOKENS="7"))
    run = wait_status(chat_run(alice, "test+words-30"), "completed")
    assert only_request(model)["body"]["max_tokens"] == 7
    assert run.output["finish_reason"] == "length" and stored_text(run) == answer_text(7)


# --- cancel -----------------------------------------------------------------------------------------


@pytest.mark.sqlite
@pytest.mark.parametrize(
    ("behaviour", "streamed"),
    [("slow-20ms+usage-each", 5), ("wait-60000ms", 0)],
    ids=["mid-stream", "before-the-first-chunk"],
)
def test_a_cancel_closes_the_model_stream_within_the_grace_and_stores_nothing_after_it(
    procs: Procs, model: ModelServer, alice: User, behaviour: str, streamed: int
) -> None:
    procs.worker("w1", env=model.env(RUNLEDGER_CANCEL_GRACE_SECONDS=str(GRACE_SECONDS)))
    run = chat_run(alice, f"test+words-3000+{behaviour}")
    if streamed:
        wait_until(lambda: delta_count(run) >= streamed, what="the answer streaming")
    else:
        wait_until(model.requests, what="the request at the server")

    gone, run = cancel_until_disconnected(model, run, alice)

    # The model server stopped generating within the grace of the cancel's commit.
    assert run.ended_at is not None
    assert timedelta(seconds=gone["at"] - run.ended_at.timestamp()) < timedelta(seconds=GRACE_SECONDS), gone
    # What is stored is what the server sent, in order, up to the cancel — and nothing after it.
    sent = model.sent(gone["request"])
    assert len(sent) == gone["chunks"] >= streamed
    assert delta_texts(run) == sent[: delta_count(run)]
    assert_nothing_after_terminal(run)
    # The usage the server sent with its chunks until the close is the run's, added with the
    # attempt's release; before any chunk, the agent says it could not learn it.
    if streamed:
        assert run.reported_usage["input_tokens"] == 8
        assert delta_count(run) <= run.reported_usage["output_tokens"] <= gone["chunks"]
        assert "incomplete" not in run.reported_usage
    else:
        assert run.reported_usage == {"incomplete": True}


def test_a_stop_the_worker_finds_between_two_chunks_closes_the_model_stream_too(
    procs: Procs, model: ModelServer, alice: User
) -> None:
    # A budget stop trips while the agent is mostly parked at a `yield` (the server sends as fast
    # as it can), not inside a read: the worker closes the agent's generator rather than cancel a
    # read, and only the agent's own `async with` closes the stream then. The answer is longer
    # than the sockets' buffers hold, so the server cannot have sent it all by then.
    # The whole answer asked for: the default max_tokens (4,096 words here) fits in the sockets' buffers.
    env = model.env(RUNLEDGER_CANCEL_GRACE_SECONDS=str(GRACE_SECONDS), RUNLEDGER_OPENAI_MAX_TOKENS="1000000")
    procs.worker("w1", env=env)
    run = wait_status(
        queued_run(
            alice, agent="openai_chat", input={"model": "test+words-300000", "messages": MESSAGES}, max_events=10
        ),
        "stopped",
    )
    assert run.end_code == "budget_exhausted"
    gone = wait_until(lambda: model.ended(only_request(model)["request"]), what="the server seeing the stream end")
    assert gone["event"] == "disconnect", gone
    assert run.ended_at is not None
    assert timedelta(seconds=gone["at"] - run.ended_at.timestamp()) < timedelta(seconds=GRACE_SECONDS), gone
    assert delta_texts(run) == answer_words(10)
    assert_nothing_after_terminal(run)


@pytest.mark.sqlite
def test_a_cancel_closes_the_model_stream_at_the_end_of_the_grace_even_when_the_agent_ignores_it(
    procs: Procs, model: ModelServer, alice: User
) -> None:
    # An agent of one's own built on openai_chat, which after the first delta waits on work that
    # swallows the cancellation: its task never unwinds, so nothing of the agent closes the stream.
    # The attempt abandons it at the end of the grace and closes the stream it opened itself.
    env = {**model.settings(), **AGENTS_ENV, "RUNLEDGER_CANCEL_GRACE_SECONDS": str(GRACE_SECONDS)}
    worker = procs.worker("w1", env=subprocess_env(**env))
    run = queued_run(
        alice, agent="test-stubborn-chat", input={"model": "test+words-3000+slow-20ms", "messages": MESSAGES}
    )
    wait_until(lambda: delta_count(run) == 1, what="the first delta")
    request = only_request(model)["request"]
    wait_until(lambda: len(model.sent(request)) >= 5, what="the stream going on, unread")

    gone, run = cancel_until_disconnected(model, run, alice)

    assert run.ended_at is not None
    disconnected = timedelta(seconds=gone["at"] - run.ended_at.timestamp())
    grace = timedelta(seconds=GRACE_SECONDS)
    assert grace <= disconnected < grace + HEARD, disconnected
    assert "the agent ignored cancellation; abandoning it" in worker.log()
    assert delta_count(run) == 1
    assert_nothing_after_terminal(run)


# --- failures ---------------------------------------------------------------------------------------


def test_a_server_error_or_a_stream_dropped_mid_way_fails_the_run_with_a_clear_agent_error(
    procs: Procs, model: ModelServer, alice: User
) -> None:
    procs.worker("w1", env=model.env())
    dropped = wait_status(chat_run(alice, "test+words-20+drop-after-5"), "failed")
    assert dropped.end_code == "agent_error"
    assert dropped.end_reason.startswith("the model stream ended early, after 5 chunks: RemoteProtocolError: "), (
        dropped.end_reason
    )
    assert "incomplete chunked read" in dropped.end_reason
    assert stored_text(dropped) == answer_text(5)
    assert dropped.reported_usage == {"incomplete": True}  # the usage comes last: it never came
    assert_nothing_after_terminal(dropped)

    # Refused for good (a 400): one request, failed at once.
    refused = wait_status(chat_run(alice, "test+status-400"), "failed")
    assert refused.end_code == "agent_error"
    assert refused.end_reason == "the model server answered HTTP 400: test server: status 400"
    assert refused.error == {"body": {"message": "test server: status 400", "type": "test_error", "code": 400}}
    assert delta_count(refused) == 0 and EventType.STEP_RETRYING not in event_types(refused)
    # A server asking to be asked again after more than the agent waits: failed at once.
    later = wait_status(chat_run(alice, "test+busy-1-retry-3600"), "failed")
    assert later.end_reason == "the model server answered HTTP 429: test server: busy"
    # A stream broken after tokens is never asked again: the watchers saw them.
    assert [r["body"]["model"] for r in model.requests()] == [
        "test+words-20+drop-after-5",
        "test+status-400",
        "test+busy-1-retry-3600",
    ]


def test_a_server_error_is_retried_before_the_first_token_and_fails_the_run_once_the_policy_is_spent(
    procs: Procs, model: ModelServer, alice: User
) -> None:
    procs.worker("w1", env=model.env())
    failed = wait_status(chat_run(alice, "test+status-503"), "failed", timeout=60)
    assert failed.end_code == "agent_error"
    assert failed.end_reason == "the model server answered HTTP 503: test server: status 503"
    retries = [e.data for e in events_of(failed, EventType.STEP_RETRYING)]
    assert [(r["name"], r["ordinal"], r["call"], r["error"]) for r in retries] == [
        ("model", None, call, "RetryableError") for call in (1, 2, 3)
    ]
    assert len(model.requests()) == MODEL_RETRY.attempts == 4
    assert failed.steps_used == 4  # the model turn, and one more for each retry


@pytest.mark.sqlite
def test_a_429_with_retry_after_or_a_connection_cut_before_the_first_token_is_asked_again_and_completes(
    procs: Procs, model: ModelServer, alice: User
) -> None:
    procs.worker("w1", env=model.env())
    run = wait_status(chat_run(alice, "test+words-5+busy-2"), "completed", timeout=60)

    requests = model.requests()
    assert len(requests) == 3
    assert [model.ended(r["request"])["status"] for r in requests] == [429, 429, 200]  # type: ignore[index]
    # Each retry waited at least the server's Retry-After: 1.
    times = [r["at"] for r in requests]
    assert times[1] - times[0] >= 1 and times[2] - times[1] >= 1, times
    retries = [e.data for e in events_of(run, EventType.STEP_RETRYING)]
    assert [(r["call"], r["error"], r["message"]) for r in retries] == [
        (1, "RetryableError", "HTTP 429 Too Many Requests"),
        (2, "RetryableError", "HTTP 429 Too Many Requests"),
    ]
    assert all(r["wait"] >= 1 for r in retries)
    assert stored_text(run) == run.output["text"] == answer_text(5)

    # A connection closed before the first token: asked again, and answered.
    cut = wait_status(chat_run(alice, "test+words-3+cut-1"), "completed", timeout=60)
    (retry,) = [e.data for e in events_of(cut, EventType.STEP_RETRYING)]
    assert (retry["name"], retry["call"], retry["error"]) == ("model", 1, "RetryableError")
    assert retry["message"].startswith("RemoteProtocolError: "), retry
    assert stored_text(cut) == answer_text(3) and cut.steps_used == 2


BAD_INPUTS: list[tuple[dict[str, Any], str, str]] = [
    ({"messages": MESSAGES}, "model", "must be a non-empty string"),
    ({"model": " ", "messages": MESSAGES}, "model", "must be a non-empty string"),
    ({"model": "m"}, "messages", "must be a non-empty list"),
    ({"model": "m", "messages": []}, "messages", "must be a non-empty list"),
    ({"model": "m", "messages": [{"role": "user"}]}, "messages", "item 0 must be an object with exactly a role"),
    ({"model": "m", "messages": [{"role": "robot", "content": "hi"}]}, "messages", "item 0 must be an object"),
    ({"model": "m", "messages": [*MESSAGES, {"role": "user", "content": 7}]}, "messages", "item 2 must be"),
    ({"model": "m", "messages": MESSAGES, "max_tokens": 0}, "max_tokens", "must be a whole number from 1 to 50"),
    ({"model": "m", "messages": MESSAGES, "max_tokens": 51}, "max_tokens", "must be a whole number from 1 to 50"),
    ({"model": "m", "messages": MESSAGES, "max_tokens": "10"}, "max_tokens", "must be a whole number from 1"),
    ({"model": "m", "messages": MESSAGES, "max_tokens": 2.5}, "max_tokens", "must be a whole number from 1"),
    ({"model": "m", "messages": MESSAGES, "temperature": 3}, "temperature", "must be a number from 0 to 2"),
    ({"model": "m", "messages": MESSAGES, "continue": "yes"}, "continue", "must be true or false"),
    ({"model": "m", "messages": MESSAGES, "max_token": 10}, "max_token", "is not an input of openai_chat"),
]


@pytest.mark.sqlite
def test_bad_input_is_a_400_at_create_naming_the_key_and_nothing_is_stored(alice: User, settings: Any) -> None:
    settings.RUNLEDGER_OPENAI_MAX_TOKENS = 50
    api = APIClient()
    api.force_authenticate(alice)
    for input, key, problem in BAD_INPUTS:
        response = api.post("/api/runs/", {"agent": "openai_chat", "input": input}, format="json")
        error = assert_error(response, 400, "validation_error")["error"]
        (said,) = error["detail"]["input"][key]
        assert said.startswith(problem), (input, said)
        assert f"{key} {said}" in error["message"]
    assert Run.objects.count() == 0
    # The bound itself, and no bound at all once the setting is 0.
    at_most = {"model": "m", "messages": MESSAGES, "max_tokens": 50}
    assert api.post("/api/runs/", {"agent": "openai_chat", "input": at_most}, format="json").status_code == 201
    settings.RUNLEDGER_OPENAI_MAX_TOKENS = 0
    unbounded = {**at_most, "max_tokens": 1_000_000}
    assert api.post("/api/runs/", {"agent": "openai_chat", "input": unbounded}, format="json").status_code == 201


@pytest.mark.sqlite
def test_a_run_created_under_a_larger_bound_fails_in_the_worker_before_anything_is_sent(
    procs: Procs, model: ModelServer, alice: User
) -> None:
    # Created here under the default bound; the worker's is smaller, and it is the worker that sends.
    procs.worker("w1", env=model.env(RUNLEDGER_OPENAI_MAX_TOKENS="10"))
    run = wait_status(chat_run(alice, "test", max_tokens=100), "failed", "completed")
    assert (run.status, run.end_code) == ("failed", "agent_error")
    assert run.end_reason == "bad input: max_tokens must be a whole number from 1 to 10"
    assert run.error == {"input": run.input}
    assert model.requests() == []


# --- requeue --------------------------------------------------------------------------------------

WORDS = 300


@pytest.mark.parametrize("continues", [True, False], ids=["continue-final-message", "asked-again"])
def test_a_requeued_attempt_goes_on_from_the_stored_text_and_stores_nothing_twice(
    procs: Procs, model: ModelServer, alice: User, continues: bool
) -> None:
    first = procs.worker("w1", env=model.env())
    input = {"continue": True} if continues else {}
    run = chat_run(alice, f"test+words-{WORDS}+slow-20ms", **input)
    wait_until(lambda: delta_count(run) >= 10, what="some of the answer")
    first.kill()
    procs.worker("w2", env=model.env())  # its sweeper requeues the run once the lease lapses

    run = wait_status(run, "completed", timeout=30)

    assert (run.generation, run.lost_attempts) == (2, 1)
    stored_first = "".join(delta_texts(run, 1))
    kept = deltas_of(run, 1)
    asked, again = model.requests()
    assert model.ended(asked["request"])["event"] == "disconnect"  # the dead worker's connection closed
    if continues:
        # The server was asked to go on from the stored text, and sent only the rest.
        assert again["body"]["messages"] == [*MESSAGES, {"role": "assistant", "content": stored_first}]
        assert again["body"]["continue_final_message"] is True and again["body"]["add_generation_prompt"] is False
        assert model.sent(again["request"]) == answer_words(WORDS)[kept:]
        billed = WORDS - kept
    else:
        # Asked the same again, the server sent the whole answer; the stored part was skipped.
        assert again["body"] == asked["body"]
        assert model.sent(again["request"]) == answer_words(WORDS)
        billed = WORDS
    # Either way the stored text is the model's text once: no gap, no repeat.
    assert delta_texts(run) == answer_words(WORDS) and stored_text(run) == answer_text(WORDS)
    assert run.output["text"] == answer_text(WORDS)
    assert run.output["usage"]["completion_tokens"] == billed
    assert run.reported_usage["output_tokens"] == billed
    assert run.steps_used == 1
    assert_nothing_after_terminal(run)

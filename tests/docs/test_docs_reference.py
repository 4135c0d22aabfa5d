"""The reference pages say what the code does: the vocabularies they are rendered from are whole.

`mkdocs build --strict` (bin/test) fails when a rendered part of docs/reference/ is stale; these
tests check the sources themselves — that every name the code uses is in them.
"""

import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

import tests.support.agents  # noqa: F401  (registers test-steps here, as AGENTS_ENV does in processes)
from runs import services
from runs.events import EVENT_DATA, LIFECYCLE_TYPES, EventType, RequeueCause, WaitReason
from runs.http.errors import ERROR_CODES
from runs.models import RunEvent
from runs.testing import execute
from runs.transitions import END_CODE_MEANINGS, END_CODES, FailCode, StopCode
from tests.factories import queued_run, running_run
from tests.support.runs import fresh

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"


# Not what the app or its clients read: what npm installs and builds, and the JS package's own tests
# (their environment is the suite's, as tests/ is).
NOT_SOURCE = ("__pycache__", "node_modules", ".test-build", "dist")
JS_TESTS = ROOT / "clients" / "js" / "test"


def _source(*tops: str, suffixes: tuple[str, ...] = ()) -> dict[Path, str]:
    found = {}
    for top in tops:
        for path in sorted((ROOT / top).rglob("*")):
            skipped = any(part in NOT_SOURCE for part in path.parts) or path.suffix in (".pyc", ".png", ".ico")
            skipped = skipped or path.is_relative_to(JS_TESTS)
            if path.is_file() and not skipped and (not suffixes or path.suffix in suffixes):
                found[path] = path.read_text(errors="replace")
    return found


@pytest.mark.sqlite
@pytest.mark.timeout(30)
def test_every_runledger_name_in_the_code_is_in_the_settings_reference() -> None:
    texts = _source("runs", "config", "bin", "deploy", "clients")
    named = {name for text in texts.values() for name in re.findall(r"RUNLEDGER_[A-Z][A-Z0-9_]*[A-Z0-9]", text)}
    page = (REFERENCE / "settings.md").read_text()
    assert sorted(name for name in named if f"`{name}`" not in page) == []


@pytest.mark.sqlite
@pytest.mark.timeout(30)
def test_every_error_code_the_code_answers_is_in_the_error_reference() -> None:
    python = "\n".join(_source("runs", suffixes=(".py",)).values())
    spelled = set(re.findall(r"(?:error_response|_error)\((\d{3}), \"([a-z_]+)\"", python))
    assert {(int(status), code) for status, code in spelled} <= {(s, c) for c, (s, _) in ERROR_CODES.items()}
    codes = set(re.findall(r"^\s+code = \"([a-z_]+)\"$", python, re.MULTILINE))
    codes |= set(re.findall(r"error_body\(\"([a-z_]+)\"", python))
    codes |= set(re.findall(r"\(drf\.\w+, \"([a-z_]+)\"\)", python))
    assert codes, "the patterns above no longer find the codes: fix them"
    assert codes - set(ERROR_CODES) == set()


@pytest.mark.sqlite
@pytest.mark.timeout(30)
def test_every_end_code_has_its_meaning() -> None:
    every = {code for codes in END_CODES.values() for code in codes} - {""}
    assert set(END_CODE_MEANINGS) == every


def _data_keys(run_pk: Any) -> dict[str, set[str]]:
    keys: dict[str, set[str]] = {}
    for event in RunEvent.objects.filter(run_id=run_pk).order_by("seq"):
        keys.setdefault(event.type, set()).update(event.data)
    return keys


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_the_platform_writes_the_data_keys_the_event_reference_names(alice: User, tmp_path: Path) -> None:
    assert set(EVENT_DATA) == set(EventType)
    seen: dict[str, set[str]] = {}

    def record(run_pk: Any) -> None:
        for type_, keys in _data_keys(run_pk).items():
            seen.setdefault(type_, set()).update(keys)

    # created, started, a tool call the run ends inside (the platform's interrupted tool.finished),
    # a child, waiting, resumed, requeued, and each terminal event.
    run = running_run(alice)
    services.run_child_spawn(run_id=run.pk, generation=run.generation, input={"deltas": 1})
    services.run_events_append(
        run_id=run.pk,
        generation=run.generation,
        events=[(EventType.TOOL_STARTED, {"call_id": "c1", "name": "search"})],
    )
    waiting = services.run_wait(run_id=run.pk, generation=run.generation, reason=WaitReason.INPUT_REQUIRED, prompt="?")
    services.run_resume(run_id=run.pk, ticket=waiting.resume_ticket, input={"answer": 42})
    again = services.run_claim(worker="test-worker")
    assert again is not None and again[0].pk == run.pk
    services.run_requeue(run_id=run.pk, generation=again[0].generation, cause=RequeueCause.WORKER_SHUTDOWN)
    services.run_cancel(run_id=run.pk, actor=alice, note="enough")
    record(run.pk)

    done = running_run(alice)
    services.run_complete(run_id=done.pk, generation=done.generation, output={"answer": 42})
    record(done.pk)
    failed = running_run(alice)
    services.run_fail(run_id=failed.pk, generation=failed.generation, code=FailCode.AGENT_ERROR, reason="boom")
    record(failed.pk)
    stopped = running_run(alice)
    services.run_stop(run_id=stopped.pk, actor=alice, reason="policy", code=StopCode.POLICY)
    record(stopped.pk)
    # Durable steps: one retried, then completed (tests/agents/test_steps.py), and a fork's copy.
    calls = tmp_path / "calls"
    steps = queued_run(alice, agent="test-steps", input={"calls": str(calls), "steps": ["one"], "fail": "one"})
    assert execute(steps).run.status == "completed"
    record(steps.pk)
    record(services.run_rerun(run_id=steps.pk, owner=alice, from_seq=fresh(steps).last_seq).pk)
    # A fork of the first (last: it stays queued): its run.created names the original, its copies
    # their seq there.
    ended = RunEvent.objects.filter(run_id=run.pk).count()
    record(services.run_rerun(run_id=run.pk, owner=alice, from_seq=ended).pk)

    platform = {t for t in EventType if t in LIFECYCLE_TYPES or t == EventType.CHILD_SPAWNED}
    platform |= {EventType.STEP_COMPLETED, EventType.STEP_RETRYING}
    assert set(seen) >= platform | {EventType.TOOL_FINISHED}
    for type_ in platform:
        assert seen[type_] == set(EVENT_DATA[EventType(type_)][1]), type_
    # The platform's own tool.finished, closing the call the cancel interrupted, and its fork's copy.
    assert seen[EventType.TOOL_FINISHED] == set(EVENT_DATA[EventType.TOOL_FINISHED][1])

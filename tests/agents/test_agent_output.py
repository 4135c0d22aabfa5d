"""Nothing an agent emits is lost or misreported.

What an agent produces passes one check in the worker before anything of it is queued for writing
(runs/worker/checks.py, runs/storable.py): a value the database would refuse or could not give
back fails the run `invalid_output`, naming the event (or the output) and the path of the bad
value, with every event before it stored and nothing after it. A write the database refuses
anyway, or that fails otherwise, fails the run there and then (`invalid_output`, `storage_error`):
never `completed` over an unstored event, never a lost worker.

The agents here are scripts: lists of directives, some holding values no JSON can carry (NaN, a
set, a datetime), so they are given to the real attempt driver in this process — `Worker(once=True)`
on the test database — rather than through a run's input.
"""

import datetime
import decimal
import functools
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from hypothesis import example, given, settings
from hypothesis import strategies as st

from runs.agents import base
from runs.agents.base import AgentContext, Complete, Directive, Emit, Fail, Wait
from runs.events import EventType, WaitReason
from runs.metrics import series
from runs.models import AttemptOutcome, Run, RunAttempt, RunEvent
from runs.selectors.results import run_partial_output
from runs.storable import MAX_DEPTH, same_json
from runs.worker import Worker
from tests.factories import assert_log_is_sound, queued_run

SCRIPTED = "test-scripted"
PROBE = "probe.value"
# The directives of each scripted run, by run id.
SCRIPTS: dict[str, list[Any]] = {}


async def scripted(ctx: AgentContext) -> AsyncIterator[Directive]:
    for directive in SCRIPTS[str(ctx.run_id)]:
        if isinstance(directive, ChildInput):
            await ctx.spawn_child(directive.input)
        else:
            yield directive


@dataclass(frozen=True)
class ChildInput:
    input: Any


@pytest.fixture(autouse=True, scope="module")
def _scripted_agent() -> Iterator[None]:
    base.register(SCRIPTED, event_types=[PROBE])(scripted)
    yield
    base._REGISTRY.pop(SCRIPTED, None)


def run_script(owner: User, script: list[Any]) -> Run:
    run = queued_run(owner, agent=SCRIPTED, input={})
    SCRIPTS[str(run.pk)] = script
    try:
        # One slot, so seven database lanes rather than nine: with this process's own connection,
        # nine took the whole pool of ten, and a connection held anywhere else in the process made
        # every lane's call wait out the pool's timeout (3 s each, past the test's own).
        Worker(once=True, listen=False, concurrency=1).run(install_signals=False)
    finally:
        SCRIPTS.pop(str(run.pk), None)
    run.refresh_from_db()
    return run


def lost_attempts_counted() -> float:
    return sum(
        sample.value for sample in series.made().ATTEMPTS_LOST.collect()[0].samples if sample.name.endswith("_total")
    )


def stored(run: Run) -> list[tuple[str, Any]]:
    """The events the agent emitted that were stored: everything but the platform's own."""
    platform = {EventType.RUN_CREATED, EventType.RUN_STARTED, EventType.RUN_WAITING, EventType.RUN_FAILED}
    platform |= {EventType.RUN_COMPLETED}
    return [(e.type, e.data) for e in RunEvent.objects.filter(run=run).order_by("seq") if e.type not in platform]


def assert_ended_by_its_attempt(run: Run) -> None:
    """One attempt, which ended the run itself: no lost worker, no requeue, a sound log."""
    assert_log_is_sound(run)
    assert run.lost_attempts == 0 and run.end_code != "worker_lost"
    attempts = list(RunAttempt.objects.filter(run=run))
    assert len(attempts) == 1 and attempts[0].released_at is not None
    assert attempts[0].outcome == run.status != AttemptOutcome.LOST


@pytest.fixture
def owner(transactional_db: None) -> User:
    return User.objects.create_user("scripter")


# --- what a new user hit ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.sqlite
def test_a_nan_in_an_event_fails_the_run_with_the_events_before_it_stored(owner: User) -> None:
    script = [
        Emit(EventType.OUTPUT_DELTA, {"text": "one "}),
        Emit(EventType.OUTPUT_DELTA, {"text": "two ", "score": float("nan")}),
        Emit(EventType.OUTPUT_DELTA, {"text": "three "}),
        Complete({"text": "one two three "}),
    ]
    lost_before = lost_attempts_counted()

    run = run_script(owner, script)

    assert (run.status, run.end_code) == ("failed", "invalid_output")
    assert run.end_reason == "event 1 (output.delta): its data cannot be stored: $.score: nan is not a finite number"
    assert stored(run) == [(EventType.OUTPUT_DELTA, {"text": "one "})]
    assert_ended_by_its_attempt(run)
    assert lost_attempts_counted() == lost_before


@pytest.mark.django_db(transaction=True)
@pytest.mark.sqlite
@pytest.mark.parametrize(
    ("data", "given"),
    [({"text": 5}, "a int"), ({"text": None}, "a NoneType"), ({"text": ["d"]}, "a list"), ({"delta": "d"}, "none")],
    ids=["number", "null", "list", "no-text"],
)
def test_a_delta_whose_text_is_not_a_string_fails_the_run_with_the_deltas_before_it_stored(
    owner: User, data: dict[str, Any], given: str
) -> None:
    script = [
        Emit(EventType.OUTPUT_DELTA, {"text": "d0 "}),
        Emit(EventType.OUTPUT_DELTA, {"text": "d1 "}),
        Emit(EventType.OUTPUT_DELTA, data),
        Complete({"text": "d0 d1 5"}),
    ]

    run = run_script(owner, script)

    assert (run.status, run.end_code) == ("failed", "invalid_output")
    assert run.end_reason == f"event 2 (output.delta): an output.delta needs a text that is a string, not {given}"
    assert stored(run) == [(EventType.OUTPUT_DELTA, {"text": "d0 "}), (EventType.OUTPUT_DELTA, {"text": "d1 "})]
    # The partial output is the text of the deltas stored, never a number joined in.
    assert run_partial_output(run=run) == {"text": "d0 d1 "}
    assert_ended_by_its_attempt(run)


@pytest.mark.django_db(transaction=True)
@pytest.mark.sqlite
@pytest.mark.parametrize(
    ("ending", "reason"),
    [
        (Complete({"score": float("nan")}), "the output cannot be stored: $.score: nan is not a finite number"),
        (Complete({"at": datetime.date(2026, 1, 1)}), "the output cannot be stored: $.at: a date is not a JSON value"),
        (Fail("broke", error={"seen": {1, 2}}), "the fail error cannot be stored: $.seen: a set is not a JSON value"),
        (Fail(None, error=None), "the fail reason is a NoneType, not a string"),
        (Fail("a\x00b"), "the fail reason cannot be stored: $: a string holds a NUL character"),
        (Wait(WaitReason.INPUT_REQUIRED, b"name?"), "the wait prompt cannot be stored: $: a bytes is not a JSON value"),
        (Wait("napping"), "unknown wait reason 'napping'"),
    ],
    ids=["nan-output", "date-output", "set-error", "no-reason", "nul-reason", "bytes-prompt", "unknown-wait"],
)
def test_an_ending_that_cannot_be_stored_fails_the_run_at_once_never_as_a_lost_worker(
    owner: User, ending: Directive, reason: str
) -> None:
    lost_before = lost_attempts_counted()

    run = run_script(owner, [Emit(EventType.OUTPUT_DELTA, {"text": "kept "}), ending])

    assert (run.status, run.end_code, run.end_reason) == ("failed", "invalid_output", reason)
    assert stored(run) == [(EventType.OUTPUT_DELTA, {"text": "kept "})]
    assert_ended_by_its_attempt(run)
    assert lost_attempts_counted() == lost_before


@pytest.mark.django_db(transaction=True)
@pytest.mark.sqlite
def test_a_child_input_that_cannot_be_stored_fails_the_parent_and_makes_no_child(owner: User) -> None:
    script = [Emit(EventType.OUTPUT_DELTA, {"text": "kept "}), ChildInput({"n": float("inf")}), Complete(None)]

    run = run_script(owner, script)

    assert (run.status, run.end_code) == ("failed", "invalid_output")
    assert run.end_reason == "the child's input cannot be stored: $.n: inf is not a finite number"
    assert not Run.objects.filter(parent=run).exists()
    assert stored(run) == [(EventType.OUTPUT_DELTA, {"text": "kept "})]
    assert_ended_by_its_attempt(run)


@pytest.mark.django_db(transaction=True)
@pytest.mark.sqlite
def test_an_exception_whose_message_cannot_be_stored_still_fails_the_run_as_the_agents_error(owner: User) -> None:
    async def raises(ctx: AgentContext) -> AsyncIterator[Directive]:
        yield Emit(EventType.OUTPUT_DELTA, {"text": "kept "})
        raise ValueError("bad \x00 byte and \ud800 half")

    base.register("test-raises-unstorable")(raises)
    try:
        run = queued_run(owner, agent="test-raises-unstorable", input={})
        Worker(once=True, listen=False).run(install_signals=False)
    finally:
        base._REGISTRY.pop("test-raises-unstorable", None)
    run.refresh_from_db()

    assert (run.status, run.end_code) == ("failed", "agent_error")
    assert run.end_reason == "the agent raised ValueError: bad \ufffd byte and ? half"
    assert run.error == {"type": "ValueError", "message": "bad \ufffd byte and ? half"}
    assert_ended_by_its_attempt(run)


# --- the property: any script, either stored exactly or failed at its first bad value -----------------


class Custom:
    """An object of the agent's own, which json.dumps cannot turn into JSON."""


good_text = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=12)
good_scalar = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | good_text
)
good_json = st.recursive(
    good_scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(good_text, inner, max_size=3), max_leaves=8
)
good_data = st.dictionaries(good_text, good_json, max_size=4)

OVERSIZE = 256 * 1024


@dataclass(frozen=True)
class Bad:
    """A value no run may store, and what the check must say about it once placed at `path`."""

    value: Any
    says: str

    def at(self, path: str, depth: int) -> str:
        """What is said of it at `path`, `depth` levels down (the data itself is level 1)."""
        return self.says.format(path=path, deeper="[0]" * (MAX_DEPTH + 1 - depth))


class LongInt(int):
    """An integer longer than Python turns into text: its own repr, so a report can show it."""

    def __repr__(self) -> str:
        return f"<an integer of {self.bit_length()} bits>"


def _nested(depth: int) -> Any:
    return functools.reduce(lambda inner, _: [inner], range(depth), 0)


bad_value = st.sampled_from(
    [
        Bad(float("nan"), "{path}: nan is not a finite number"),
        Bad(float("inf"), "{path}: inf is not a finite number"),
        Bad(float("-inf"), "{path}: -inf is not a finite number"),
        Bad("nul \x00 inside", "{path}: a string holds a NUL character"),
        Bad("half \ud800 pair", "{path}: a string holds an unpaired UTF-16 surrogate"),
        Bad({"a", "b"}, "{path}: a set is not a JSON value"),
        Bad(b"bytes", "{path}: a bytes is not a JSON value"),
        Bad(datetime.datetime(2026, 12, 2, 12, 0), "{path}: a datetime is not a JSON value"),
        Bad(decimal.Decimal("1.5"), "{path}: a Decimal is not a JSON value"),
        Bad(Custom(), "{path}: a Custom is not a JSON value"),
        Bad({1: "one"}, "{path}: a key is a int, not a string"),
        Bad(LongInt(10**5000), "{path}: an integer too long to read back"),
        # Reported where the nesting first goes too deep.
        Bad(_nested(80), "{path}{deeper}: nested deeper than 64 levels"),
        Bad("x" * (OVERSIZE + 1), "$: "),
    ]
)


@st.composite
def bad_data(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """Good data with one bad value placed in it: the data and what the check must say."""
    data = draw(good_data)
    bad = draw(bad_value)
    where = draw(st.sampled_from(["key", "list", "object"]))
    value, path, depth = {
        "key": (bad.value, "$.bad", 2),
        "list": ([bad.value], "$.bad[0]", 3),
        "object": ({"k": bad.value}, "$.bad.k", 3),
    }[where]
    return {**data, "bad": value}, bad.at(path, depth)


@st.composite
def event(draw: st.DrawFn) -> tuple[Emit, str | None]:
    """An event and, when it cannot be stored, what the reason must say of its data."""
    type_ = draw(st.sampled_from([EventType.OUTPUT_DELTA, PROBE]))
    # A delta's text is a string (its own rule, tested on its own): the bad value is elsewhere.
    text = {"text": draw(good_text)} if type_ == EventType.OUTPUT_DELTA else {}
    if draw(st.integers(0, 5)):
        return Emit(type_, draw(good_data) | text), None
    data, says = draw(bad_data())
    return Emit(type_, data | text), says


@st.composite
def ending(draw: st.DrawFn) -> tuple[Directive, str | None]:
    kind = draw(st.sampled_from(["complete", "fail", "wait"]))
    bad = not draw(st.integers(0, 3))
    if bad:
        data, says = draw(bad_data())
        named = {"complete": "the output", "fail": "the fail error", "wait": "the wait prompt"}[kind]
        directive: Directive = {
            "complete": Complete(data),
            "fail": Fail("the agent failed", data),
            "wait": Wait(WaitReason.INPUT_REQUIRED, data),
        }[kind]
        return directive, f"{named} cannot be stored: {says}"
    value = draw(good_json)
    good: Directive = {
        "complete": Complete(value),
        "fail": Fail(draw(good_text), value),
        "wait": Wait(WaitReason.INPUT_REQUIRED, draw(good_text)),
    }[kind]
    return good, None


def expected(run: Run, script: list[tuple[Directive, str | None]]) -> None:
    """The oracle: the run as the script says it must end, from how the script was built."""
    emitted: list[tuple[str, Any]] = []
    for index, (directive, says) in enumerate(script[:-1]):
        assert isinstance(directive, Emit)
        if says is not None:
            assert (run.status, run.end_code) == ("failed", "invalid_output"), run.end_reason
            assert run.end_reason.startswith(f"event {index} ({directive.type}): "), run.end_reason
            assert says in run.end_reason, (says, run.end_reason)
            assert_stored_exactly(run, emitted)
            return
        emitted.append((directive.type, directive.data))
    assert_stored_exactly(run, emitted)
    directive, says = script[-1]
    if says is not None:
        assert (run.status, run.end_code) == ("failed", "invalid_output")
        assert says in run.end_reason, (says, run.end_reason)
    elif isinstance(directive, Complete):
        assert run.status == "completed" and same_json(run.output, directive.output)
    elif isinstance(directive, Fail):
        assert (run.status, run.end_code, run.end_reason) == ("failed", "agent_error", directive.reason)
        assert same_json(run.error, directive.error)
    else:
        assert isinstance(directive, Wait) and run.status == "waiting"
        last = RunEvent.objects.filter(run=run).order_by("-seq").first()
        assert last is not None and last.data == {"reason": directive.reason, "prompt": directive.prompt}


def assert_stored_exactly(run: Run, emitted: list[tuple[str, Any]]) -> None:
    got = stored(run)
    assert [t for t, _ in got] == [t for t, _ in emitted]
    assert all(same_json(g, e) for (_, g), (_, e) in zip(got, emitted, strict=True)), (got, emitted)


@pytest.mark.django_db(transaction=True)
@pytest.mark.sqlite
@pytest.mark.timeout(300)
@settings(max_examples=100, deadline=None, database=None)
@given(script=st.tuples(st.lists(event(), max_size=8), ending()).map(lambda parts: [*parts[0], parts[1]]))
@example(
    script=[
        (Emit(EventType.OUTPUT_DELTA, {"text": "a"}), None),
        (Emit(EventType.OUTPUT_DELTA, {"text": "b", "bad": float("nan")}), "$.bad: nan is not a finite number"),
        (Emit(EventType.OUTPUT_DELTA, {"text": "c"}), None),
        (Complete({"text": "abc"}), None),
    ]
)
def test_every_script_is_stored_exactly_or_fails_at_its_first_bad_value(
    script: list[tuple[Directive, str | None]],
) -> None:
    owner, _ = User.objects.get_or_create(username="property")
    lost_before = lost_attempts_counted()

    run = run_script(owner, [directive for directive, _ in script])

    expected(run, script)
    assert_ended_by_its_attempt(run)
    assert lost_attempts_counted() == lost_before


# --- writes the database refuses anyway, or that fail otherwise -------------------------------------


@pytest.fixture
def refusing_database(transactional_db: None) -> Iterator[None]:
    """PostgreSQL triggers that refuse what the check lets through: an event or a run's output
    holding the key `refuse` (SQLSTATE 22023, a data error), or an event holding `break` (P0001,
    any other error)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE FUNCTION test_refuse_event() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.data ? 'break' THEN
                    RAISE EXCEPTION 'the disk is on fire';
                END IF;
                IF NEW.data ? 'refuse' THEN
                    RAISE EXCEPTION 'refused by the test' USING ERRCODE = '22023';
                END IF;
                RETURN NEW;
            END $$;
            CREATE FUNCTION test_refuse_output() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF jsonb_typeof(NEW.output) = 'object' AND NEW.output ? 'refuse' THEN
                    RAISE EXCEPTION 'refused by the test' USING ERRCODE = '22023';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER test_refuse_event BEFORE INSERT ON runs_runevent
                FOR EACH ROW EXECUTE FUNCTION test_refuse_event();
            CREATE TRIGGER test_refuse_output BEFORE UPDATE ON runs_run
                FOR EACH ROW EXECUTE FUNCTION test_refuse_output();
            """
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "DROP TRIGGER test_refuse_event ON runs_runevent; DROP TRIGGER test_refuse_output ON runs_run;"
                "DROP FUNCTION test_refuse_event(); DROP FUNCTION test_refuse_output();"
            )


def deltas(*texts: str, **extra: Any) -> list[Emit]:
    return [Emit(EventType.OUTPUT_DELTA, {"text": text, **extra}) for text in texts]


@pytest.mark.django_db(transaction=True)
def test_an_event_the_database_refuses_fails_the_run_with_the_events_before_it_stored(
    owner: User, refusing_database: None
) -> None:
    # Emitted without a pause, so the writer batches them: the batch fails as one transaction and
    # is written again one event at a time.
    script = [*deltas("a", "b", "c"), *deltas("x", refuse=True), *deltas("d"), Complete({"text": "abcd"})]

    run = run_script(owner, script)

    assert (run.status, run.end_code) == ("failed", "invalid_output")
    assert run.end_reason.startswith(
        "the event at seq 6 (output.delta) could not be stored: DataError: refused by the test"
    )
    assert stored(run) == [(EventType.OUTPUT_DELTA, {"text": t}) for t in "abc"]
    assert_ended_by_its_attempt(run)


@pytest.mark.django_db(transaction=True)
def test_a_write_that_fails_otherwise_fails_the_run_with_storage_error_never_completed(
    owner: User, refusing_database: None
) -> None:
    run = run_script(owner, [*deltas("a"), *deltas("x", **{"break": 1}), Complete({"text": "a"})])

    assert (run.status, run.end_code) == ("failed", "storage_error")
    assert run.end_reason.startswith(
        "the event at seq 4 (output.delta) could not be stored: ProgrammingError: the disk is on fire"
    )
    assert stored(run) == [(EventType.OUTPUT_DELTA, {"text": "a"})]
    assert_ended_by_its_attempt(run)


@pytest.mark.django_db(transaction=True)
def test_an_end_the_database_refuses_is_this_attempts_failure_not_a_lost_worker(
    owner: User, refusing_database: None
) -> None:
    lost_before = lost_attempts_counted()

    run = run_script(owner, [*deltas("a"), Complete({"refuse": True})])

    assert (run.status, run.end_code) == ("failed", "invalid_output")
    assert run.end_reason.startswith("the run's end (run_complete) could not be stored: DataError: refused by the test")
    assert run.output is None
    assert stored(run) == [(EventType.OUTPUT_DELTA, {"text": "a"})]
    assert_ended_by_its_attempt(run)
    assert lost_attempts_counted() == lost_before

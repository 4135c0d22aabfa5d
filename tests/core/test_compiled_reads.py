"""The hot reads compiled once per process (runs.selectors.compiled, docs/design/api.md#hot-reads):
each kept statement is the one its QuerySet compiles to now, so that a changed model cannot leave it
stale; each call sends the very statement the ORM's own call sends, with its values prepared as the
fields prepare them (a UUID is hex on SQLite), and gives the same objects. A run read for its JSON
carries its current attempt and its partial output equal to what their own reads give.
"""

from collections.abc import Callable, Iterator
from datetime import timedelta
from functools import partial
from typing import Any
from uuid import UUID

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import F, FilteredRelation, Model, Q, Subquery
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs import services
from runs.agents import base
from runs.exceptions import NotFound
from runs.models import ApiToken, AuthFailure, Run, RunAttempt, key_digest
from runs.selectors import _RUN, run_get
from runs.selectors.compiled import CompiledRead, Param
from runs.selectors.credentials import _TOKEN, _TOKEN_AND_FAILURE, token_with_failure
from runs.selectors.results import partial_output_rules, run_partial_output
from runs.selectors.run_json import _ATTEMPT, JOINED_ATTEMPT, run_current_attempt
from runs.services.quotas import _FAIR, _URGENT
from tests.factories import queued_run, running_run
from tests.support.db import token_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite, pytest.mark.timeout(60)]

TWO_KEYS = "test-compiled-two-keys"
NONE = "test-compiled-no-partial"
PLAN = "plan.updated"


@pytest.fixture(autouse=True, scope="module")
def _agents() -> Iterator[None]:
    async def idle(ctx: base.AgentContext) -> Any:  # never executed: the runs here are claimed by hand
        yield base.Complete(output={})

    # Its own order, not the keys' sorted one: the partial output keeps the rule's.
    rule = {"text": ("output.delta", "text"), "plan": (PLAN, "step")}
    base.register(TWO_KEYS, event_types=[PLAN], partial_output=rule)(idle)
    base.register(NONE, partial_output=None)(idle)
    yield
    base._REGISTRY.pop(TWO_KEYS, None)
    base._REGISTRY.pop(NONE, None)


def sent(call: Callable[[], Any]) -> tuple[list[str], Any]:
    """The statements `call` sends, as the server receives them, and what it returned."""
    with CaptureQueriesContext(connection) as captured:
        result = call()
    return [q["sql"] for q in captured.captured_queries], result


def data(obj: Any, depth: int = 2) -> Any:
    """An object's values, and those of the objects loaded with it (a joined attempt caches its
    run: the loop ends at `depth`), for comparing two reads."""
    if not isinstance(obj, Model):
        return obj
    values = {name: data(value, depth - 1) for name, value in vars(obj).items() if name != "_state"}
    if depth <= 1:
        return values
    return values | {"_cached": {name: data(value, depth - 1) for name, value in obj._state.fields_cache.items()}}


def same_read(orm: Callable[[], Any], compiled: Callable[[], Any]) -> Any:
    orm_sql, orm_result = sent(orm)
    compiled_sql, compiled_result = sent(compiled)
    assert compiled_sql == orm_sql
    assert data(compiled_result) == data(orm_result)
    return compiled_result


def test_every_kept_statement_is_the_one_its_queryset_compiles_to_now(alice: User) -> None:
    queued_run(alice)  # the reads compile on first use: use each once
    shapes: list[tuple[CompiledRead[Any], tuple[Any, ...]]] = [
        (_TOKEN, ()),
        (_TOKEN_AND_FAILURE, (1,)),
        (_TOKEN_AND_FAILURE, (5,)),
        (_RUN, ((), False, None)),
        (_RUN, (("agent", "last_seq"), False, None)),
        (_RUN, ((), True, partial_output_rules())),
        (_ATTEMPT, ()),
    ]
    for read, shape in shapes:
        assert read.kept_sql(*shape) == read.fresh_sql(*shape), read.build.__qualname__
    with transaction.atomic():  # a claim's picks lock what they read: compiled in its transaction
        for read, shape in [(_FAIR, ()), (_URGENT, (0,)), (_URGENT, (2,))]:
            assert read.kept_sql(*shape) == read.fresh_sql(*shape), read.build.__qualname__


def test_the_token_read_sends_what_the_orm_sends_and_gives_the_same_token(alice: User) -> None:
    key = token_for(alice)
    digest = key_digest(key)
    now = timezone.now()
    for i in range(3):
        AuthFailure.objects.create(key="a failure key", failed_at=now - timedelta(seconds=i))
    since = now - timedelta(minutes=1)

    def with_failure(nth: int) -> Any:
        newest = AuthFailure.objects.filter(key="a failure key", failed_at__gt=since).order_by("-failed_at")
        failed = Subquery(newest.values("failed_at")[nth - 1 : nth])
        return ApiToken.objects.select_related("user").annotate(block_failed_at=failed).filter(digest=digest).first()

    token = same_read(
        lambda: ApiToken.objects.select_related("user").filter(digest=digest).first(),
        lambda: _TOKEN.objects(digest=digest)[0],
    )
    assert token.user == alice

    def compiled(nth: int) -> ApiToken:
        return _TOKEN_AND_FAILURE.objects(nth, digest=digest, failure_key="a failure key", since=since)[0]

    for nth in (2, 3, 4):
        found = same_read(partial(with_failure, nth), partial(compiled, nth))
        assert (found.block_failed_at is None) == (nth > 3)
    assert token_with_failure(key=key, failures=("a failure key", 3, since))[1] == now - timedelta(seconds=2)
    assert token_with_failure(key=key + "x", failures=None) == (None, None)


def test_a_run_read_sends_what_the_orm_sends_whatever_form_its_id_takes(alice: User, bob: User) -> None:
    run = running_run(alice)
    for run_id in (run.pk, str(run.pk), str(run.pk).upper(), run.pk.hex):
        same_read(partial(Run.objects.select_related("owner").get, pk=run_id), partial(run_get, run_id=run_id))
        same_read(
            partial(Run.objects.only("owner_id", "agent", "last_seq").get, pk=run_id),
            partial(run_get, run_id=run_id, only=("agent", "last_seq")),
        )
    same_read(
        lambda: RunAttempt.objects.filter(run_id=run.pk, generation=run.generation).first(),
        lambda: run_current_attempt(run=run),
    )
    for missing in (UUID(int=7), "not-a-uuid", "", "1" * 40):
        with pytest.raises(NotFound):
            run_get(run_id=missing)
    with pytest.raises(NotFound):
        run_get(run_id=run.pk, user=bob)  # not theirs: as if there were no such run


def test_a_run_read_for_its_json_joins_its_attempt_and_partial_output_as_their_own_reads_give_them(
    alice: User,
) -> None:
    running = running_run(alice)
    two = running_run(alice, agent=TWO_KEYS)
    services.run_events_append(
        run_id=two.pk,
        generation=two.generation,
        events=[("output.delta", {"text": "hal"}), (PLAN, {"step": 1}), ("output.delta", {"text": "f"})],
    )
    none = running_run(alice, agent=NONE)
    services.run_events_append(run_id=none.pk, generation=none.generation, events=[("output.delta", {"text": "x"})])
    gone = running_run(alice)
    services.run_events_append(run_id=gone.pk, generation=gone.generation, events=[("output.delta", {"text": "y"})])
    for run in (two, none, gone):
        services.run_cancel(run_id=run.pk, actor=alice)
    queued = queued_run(alice)
    # An agent no longer registered keeps the default rule.
    Run.objects.filter(pk=gone.pk).update(agent="test-compiled-unregistered")
    expected = {queued.pk: None, running.pk: None, two.pk: {"text": "half", "plan": "1"}, none.pk: None}
    expected[gone.pk] = {"text": "y"}
    for run_id, output in expected.items():
        joined = run_get(run_id=run_id, for_json=True)
        plain = run_get(run_id=run_id)
        # The joined attempt caches its run too (as select_related sets it): its values are compared.
        assert data(getattr(joined, JOINED_ATTEMPT), 1) == data(run_current_attempt(run=plain), 1)
        assert run_partial_output(run=joined) == run_partial_output(run=plain) == output
        assert list((run_partial_output(run=joined) or {}).keys()) == list((output or {}).keys())
        if connection.vendor != "postgresql":
            attempt = FilteredRelation("attempts", condition=Q(attempts__generation=F("generation")))
            orm = (
                Run.objects.select_related("owner").annotate(**{JOINED_ATTEMPT: attempt}).select_related(JOINED_ATTEMPT)
            )
            same_read(partial(orm.get, pk=run_id), partial(lambda pk: _RUN.objects((), True, None, pk=pk)[0], run_id))
    assert getattr(run_get(run_id=queued.pk, for_json=True), JOINED_ATTEMPT) is None


def test_a_read_whose_values_are_not_all_parameters_is_refused_when_it_is_compiled(alice: User) -> None:
    generation = Param(RunAttempt._meta.get_field("generation"), (3, 4))
    limited = CompiledRead(
        RunAttempt, lambda *, generation: RunAttempt.objects.all()[:generation], generation=generation
    )
    with pytest.raises(ValueError, match="change the statement's text"):
        limited.objects(generation=1)
    unused = CompiledRead(
        RunAttempt, lambda *, generation: RunAttempt.objects.filter(generation=9), generation=generation
    )
    with pytest.raises(ValueError, match="no parameter takes"):
        unused.objects(generation=1)


def test_a_read_with_its_constants_inlined_sends_what_the_orm_sends_and_gives_the_same_runs(
    alice: User, bob: User
) -> None:
    """`inline` (the claim's picks): on PostgreSQL the queryset's constants are written into the
    statement's text, a `%` in one too, and its Params alone go as parameters; what the server
    receives and the objects are the ORM's, on both databases."""
    for priority in (1, 7):
        queued_run(alice, priority=priority)
    queued_run(bob, priority=7)

    def runs(*, owner: Any) -> Any:
        return Run.objects.filter(owner_id=owner, status="queued", priority__gt=5, agent__startswith="de")

    read = CompiledRead(Run, runs, inline=True, owner=Param(Run._meta.get_field("owner"), (-1, -2)))
    found = same_read(lambda: list(runs(owner=alice.pk)), lambda: read.objects(owner=alice.pk))
    assert [(run.owner_id, run.priority) for run in found] == [(alice.pk, 7)]
    assert len(read.statement(owner=alice.pk)[1]) == (4 if connection.vendor == "sqlite" else 1)

"""What a run produced and used, for its JSON (docs/design/execution.md#partial-output,
docs/design/events.md#usage): its partial output, read when asked for and never written by the
commands that end a run, and its usage."""

import json
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import JSONField
from django.db.models.expressions import RawSQL

from runs.agents import TEXT_OF_DELTAS, PartialOutput, partial_output_rule, registered
from runs.events import USAGE_PLATFORM, EventType
from runs.models import Run, RunEvent
from runs.transitions import Status

# The ends whose run has a partial output; a completed run's `output` is its result.
PARTIAL_STATUSES = frozenset({Status.FAILED, Status.CANCELLED, Status.STOPPED})


def run_partial_output(*, run: Run) -> dict[str, str] | None:
    """The run's partial output by its agent's rule, or None: the run did not end other than
    completed, or stored no event the rule reads (`Run.partial_events`, counted as they were
    appended, so that a run without one costs no statement). On PostgreSQL one aggregate over the
    run's events of the rule's types, the text concatenated in the database."""
    if hasattr(run, JOINED_PARTIAL_OUTPUT):
        joined: dict[str, str] | None = getattr(run, JOINED_PARTIAL_OUTPUT)
        return joined
    rule = partial_output_rule(run.agent)
    if run.status not in PARTIAL_STATUSES or not run.partial_events or not rule:
        return None
    sources = list(rule.items())
    if connection.vendor == "postgresql":
        # Raw: django.contrib.postgres (StringAgg) needs psycopg to import, and a SQLite install has none.
        texts = ", ".join(
            "COALESCE(string_agg(data ->> %s, '' ORDER BY seq) FILTER (WHERE type = %s), '')" for _ in sources
        )
        params: list[Any] = [value for _, (type_, field) in sources for value in (field, type_)]
        sql = f"SELECT {texts} FROM {RunEvent._meta.db_table} WHERE run_id = %s AND type = ANY(%s)"
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, run.pk, sorted({type_ for _, (type_, _) in sources})])
            found = cursor.fetchone()
        return {key: found[i] for i, (key, _) in enumerate(sources)}
    events = RunEvent.objects.filter(run_id=run.pk, type__in={type_ for _, (type_, _) in sources})
    parts: dict[str, list[str]] = {key: [] for key, _ in sources}
    for type_, data in events.order_by("seq").values_list("type", "data"):
        for key, (source_type, field) in sources:
            value = data.get(field) if source_type == type_ and isinstance(data, dict) else None
            if value is not None:
                parts[key].append(value if isinstance(value, str) else _json_text(value))
    return {key: "".join(texts) for key, texts in parts.items()}


# The partial output read with the run itself (`partial_output_column`), by `runs.selectors.run_get`.
JOINED_PARTIAL_OUTPUT = "joined_partial_output"


def _rule_json(rule: PartialOutput | None) -> list[list[str]]:
    return [[key, type_, field] for key, (type_, field) in (rule or {}).items()]


def partial_output_rules() -> str | None:
    """Every registered agent's rule, and the default one, as `partial_output_column` reads them
    (JSON text): on PostgreSQL; None elsewhere, where the partial output stays a read of its own."""
    if connection.vendor != "postgresql":
        return None
    by_agent = {agent.name: _rule_json(agent.partial_output) for agent in registered()}
    return json.dumps([by_agent, _rule_json(TEXT_OF_DELTAS)], separators=(",", ":"))


def partial_output_column(rules: str) -> RawSQL:
    """`run_partial_output` as a column of the run's own read (PostgreSQL): for each key of the
    rule of the run's agent (`rules`, from `partial_output_rules`), in its order, the text of its
    events' data key in seq order — the aggregate above, run only for a run that has one."""
    runs, events = Run._meta.db_table, RunEvent._meta.db_table
    statuses = sorted(str(status) for status in PARTIAL_STATUSES)
    sql = f"""CASE WHEN {runs}.status IN (%s, %s, %s) AND {runs}.partial_events > 0 THEN (
        SELECT json_object_agg(rule.item ->> 0, COALESCE((
            SELECT string_agg(e.data ->> (rule.item ->> 2), '' ORDER BY e.seq) FROM {events} e
            WHERE e.run_id = {runs}.id AND e.type = rule.item ->> 1), '') ORDER BY rule.n)::text
        FROM jsonb_array_elements(COALESCE((%s::jsonb -> 0) -> {runs}.agent, %s::jsonb -> 1))
            WITH ORDINALITY AS rule(item, n)) END"""
    return RawSQL(sql, (*statuses, rules, rules), output_field=JSONField())


def _json_text(value: Any) -> str:
    # What PostgreSQL's ->> gives of a value that is not a string: its JSON text.
    return json.dumps(value, ensure_ascii=False)


def run_usage(*, run: Run) -> dict[str, Any]:
    """The run's `usage`: its steps and events used, and the counters its agent reported, summed."""
    steps, events = USAGE_PLATFORM
    return {steps: run.steps_used, events: run.events_used, **run.reported_usage}


# The counters summed by agent over the runs ended since a time, in the database: each run's
# `reported_usage` taken apart there, its numbers only (`incomplete` is a flag), over the ended
# runs' index (`run_ended`).
_USAGE_BY_AGENT_SQL = {
    "postgresql": f"""
        SELECT r.agent, u.key, SUM(u.value::text::numeric), COUNT(DISTINCT r.id)
        FROM {Run._meta.db_table} r CROSS JOIN LATERAL jsonb_each(r.reported_usage) u
        WHERE r.ended_at >= %s AND jsonb_typeof(u.value) = 'number'
        GROUP BY r.agent, u.key ORDER BY r.agent, u.key""",
    "sqlite": f"""
        SELECT r.agent, u.key, SUM(u.value), COUNT(DISTINCT r.id)
        FROM {Run._meta.db_table} r, json_each(r.reported_usage) u
        WHERE r.ended_at >= %s AND u.type IN ('integer', 'real')
        GROUP BY r.agent, u.key ORDER BY r.agent, u.key""",
}


def usage_by_agent(*, since: datetime) -> dict[str, dict[str, float]]:
    """{agent: {counter: sum}} over the runs ended since `since` (the staff dashboard's table)."""
    found: dict[str, dict[str, float]] = {}
    with connection.cursor() as cursor:
        cursor.execute(_USAGE_BY_AGENT_SQL[connection.vendor], [since])
        for agent, counter, total, _runs in cursor.fetchall():
            found.setdefault(agent, {})[counter] = float(total)
    return found


def run_steps(*, run: Run) -> dict[str, Any]:
    """The run's durable steps (docs/design/execution.md#steps): how many completed, and the
    retries of each step by name, with the last error — read from their events' names and errors,
    never their results."""
    events = RunEvent.objects.filter(run_id=run.pk, type__in=[EventType.STEP_COMPLETED, EventType.STEP_RETRYING])
    completed = 0
    retries: dict[str, dict[str, Any]] = {}
    for type_, name, error, message in events.order_by("seq").values_list(
        "type", "data__name", "data__error", "data__message"
    ):
        if type_ == EventType.STEP_COMPLETED:
            completed += 1
            continue
        retried = retries.setdefault(str(name), {"retries": 0})
        retried["retries"] += 1
        retried["last_error"] = f"{error}: {message}"
    return {"completed": completed, "retries": retries}

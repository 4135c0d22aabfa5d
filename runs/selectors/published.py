"""What the edge's publisher reads after a wake-up (docs/design/edge.md#publishing): the new events of
every run the notifications named, in one statement, through the wire format's codec
(`runs.selectors.wire`). No visibility rule: what it reads goes to the streams of each run, whose
users were checked when they connected."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from runs.models import LIVE_VALUES, Run, RunEvent
from runs.selectors.states import run_status_last_seq
from runs.selectors.wire import EVENT_COLUMNS, NOT_PLAIN, json_rows, run_events_json_after


@dataclass
class RunNews:
    """One run's status, its last seq and its events after the head asked for, in seq order."""

    status: str
    last_seq: int
    rows: list[tuple[int, str, str]] = field(default_factory=list)  # (seq, type, event_json)


# A head of NULL is a run the reader has not seen: read from its first event if it is live, else
# only its state (its streams are only to be closed). The lateral read stays one index range scan
# per run; OFFSET 0 keeps it whole, so each row's data is printed once, not once per use.
_NEWS_SQL = f"""
SELECT run_key, run_status, run_last_seq, {EVENT_COLUMNS}
FROM (
    SELECT wanted.run_id AS run_key, r.status AS run_status, r.last_seq AS run_last_seq,
        page.seq, page.type, page.data, page.plain, page.created_at, page.attempt
    FROM unnest(%(runs)s::uuid[], %(heads)s::bigint[]) AS wanted(run_id, head)
    JOIN {Run._meta.db_table} r ON r.id = wanted.run_id
    LEFT JOIN LATERAL (
        SELECT seq, type, data::text AS data, data::text !~ %(not_plain)s AS plain, created_at, attempt
        FROM {RunEvent._meta.db_table} e
        WHERE e.run_id = wanted.run_id
            AND e.seq > coalesce(wanted.head, 0) AND e.seq <= coalesce(wanted.head, 0) + %(limit)s
            AND (wanted.head IS NOT NULL OR r.status = ANY(%(live)s))
        ORDER BY e.seq
        LIMIT %(limit)s
    ) page ON true
    OFFSET 0
) news
ORDER BY run_key, seq
"""


def runs_events_after_heads(*, heads: Mapping[str, int | None], limit: int) -> dict[str, RunNews]:
    """For each run of `heads` that still exists: its status, last seq, and up to `limit` events
    after its head (None: a run not seen yet — from its first event if it is live, none if it
    ended). One statement on PostgreSQL, whatever the number of runs."""
    if not heads:
        return {}
    if connection.vendor != "postgresql":
        return _one_by_one(heads, limit)
    params: dict[str, Any] = {
        "runs": list(heads),
        "heads": list(heads.values()),
        "not_plain": NOT_PLAIN,
        "limit": limit,
        "live": LIVE_VALUES,
    }
    with connection.cursor() as cursor:
        cursor.execute(_NEWS_SQL, params)
        fetched = cursor.fetchall()
    found: dict[str, RunNews] = {}
    for run_key, status, last_seq, *event in fetched:
        news = found.setdefault(str(run_key), RunNews(status=status, last_seq=last_seq))
        if event[0] is not None:
            news.rows += json_rows([event])
    return found


def _one_by_one(heads: Mapping[str, int | None], limit: int) -> dict[str, RunNews]:
    found: dict[str, RunNews] = {}
    for run_id, head in heads.items():
        state = run_status_last_seq(run_id=run_id)
        if state is None:
            continue
        news = found[run_id] = RunNews(status=state[0], last_seq=state[1])
        if head is not None or state[0] in LIVE_VALUES:
            news.rows = run_events_json_after(run_id=run_id, after_seq=head or 0, limit=limit)
    return found

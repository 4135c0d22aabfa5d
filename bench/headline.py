"""The headline of `bench/run_all.py`: each fast-path figure beside its floor measured in the same
run, its target, met or not, and how it grows with stored history (tiers x10, x100) — and the
table docs/benchmarks.md leads with, rendered from `summary.json` (docs/hooks/benchmarks.py).

How it is measured and read: docs/benchmarks.md#headline.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The targets, as times the floor beside each figure (or in its own unit where it says so).
TARGETS = {
    "get_run_p50_x_healthz": 3,
    "create_ahead_p50_x_floor": 5,
    "http_cancel_p50_x_floor": 6,
    "http_cancel_p99_x_floor": 8,
    "start_p50_ms": 15,
    "stream_one_client_events_per_s": 10_000,
}
# A figure at the largest tier against the same figure at x1 (for a rate, x1 against it).
GROWTH_LIMIT = 1.5

Tier = dict[str, Any]


@dataclass(frozen=True)
class Figure:
    name: str
    unit: str
    value: Callable[[Tier], float]
    # The reference measured in the same tier, and what it is; None: the figure is itself one.
    floor: Callable[[Tier], float] | None = None
    floor_is: str = ""
    # Target as times the floor, or (`target_in_unit`) in the figure's unit.
    target_x: float | None = None
    target_in_unit: float | None = None
    rate: bool = False


def _lcw(p: str) -> Callable[[Tier], float]:
    return lambda t: t["floor"]["lock_check_write_ms"][p]


def _requests(key: str, p: str) -> Callable[[Tier], float]:
    return lambda t: t["requests"][key][p]


FIGURES = [
    Figure(
        "lock-check-write p50 after 1 ms idle (raw psycopg)",
        "ms",
        lambda t: t["floor"]["lock_check_write_idle_ms"]["p50"],
        _lcw("p50"),
        "lock-check-write p50, back to back",
    ),
    Figure("`GET /healthz/` p50 (Django, no database)", "ms", _requests("healthz_ms", "p50")),
    Figure(
        "`GET /api/runs/{id}/` p50",
        "ms",
        _requests("get_run_ms", "p50"),
        _requests("healthz_ms", "p50"),
        "`/healthz/` p50",
        TARGETS["get_run_p50_x_healthz"],
    ),
    Figure(
        "`GET /api/runs/{id}/` p99",
        "ms",
        _requests("get_run_ms", "p99"),
        _requests("healthz_ms", "p99"),
        "`/healthz/` p99",
    ),
    Figure(
        "`POST /api/runs/` scheduled ahead p50",
        "ms",
        _requests("create_ahead_ms", "p50"),
        _lcw("p50"),
        "lock-check-write p50",
        TARGETS["create_ahead_p50_x_floor"],
    ),
    Figure(
        "`POST /api/runs/` scheduled ahead p99",
        "ms",
        _requests("create_ahead_ms", "p99"),
        _lcw("p99"),
        "lock-check-write p99",
    ),
    Figure(
        "cancel of a running run, HTTP p50",
        "ms",
        _requests("cancel_running_ms", "p50"),
        _lcw("p50"),
        "lock-check-write p50",
        TARGETS["http_cancel_p50_x_floor"],
    ),
    Figure(
        "cancel of a running run, HTTP p99",
        "ms",
        _requests("cancel_running_ms", "p99"),
        _lcw("p99"),
        "lock-check-write p99",
        TARGETS["http_cancel_p99_x_floor"],
    ),
    Figure(
        "create → `run.started` at a watcher p50",
        "ms",
        lambda t: t["start"]["to_run_started_ms"]["p50"],
        lambda t: 2 * t["floor"]["txn_start_to_notified_ms"]["p50"] + t["floor"]["lock_check_write_ms"]["p50"],
        "2 x txn → NOTIFY + lock-check-write p50",
        target_in_unit=TARGETS["start_p50_ms"],
    ),
    Figure(
        "append: one run's events committed",
        "events/s",
        lambda t: t["append_one"]["committed_events_per_s"],
        lambda t: t["floor"]["append_batch_100_ev_per_s"],
        "batched appends, 100 a transaction",
        rate=True,
    ),
    Figure(
        "stream: one SSE client of stored events",
        "events/s",
        lambda t: t["stream_one"]["events_per_s"],
        lambda t: t["floor"]["replay_rows"] / t["floor"]["replay_100k_s"],
        "a read in pages of 1000",
        target_in_unit=TARGETS["stream_one_client_events_per_s"],
        rate=True,
    ),
]


def _times(value: float, floor: float, rate: bool) -> float:
    """How many times slower than the floor: a time over its floor, a floor rate over the rate."""
    return round(floor / value if rate else value / floor, 2)


def _row(figure: Figure, tiers: dict[str, Tier]) -> dict[str, Any]:
    x1 = tiers["x1"]
    value = figure.value(x1)
    floor = figure.floor(x1) if figure.floor else None
    x_floor = _times(value, floor, figure.rate) if floor else None
    target: str | None = None
    met: bool | None = None
    if figure.target_x is not None and x_floor is not None:
        target, met = f"≤ {figure.target_x:g}x {figure.floor_is}", x_floor <= figure.target_x
    elif figure.target_in_unit is not None:
        sign = "≥" if figure.rate else "≤"
        target = f"{sign} {figure.target_in_unit:,g} {figure.unit}"
        met = value >= figure.target_in_unit if figure.rate else value <= figure.target_in_unit
    row: dict[str, Any] = {
        "figure": figure.name,
        "unit": figure.unit,
        "value": value,
        "floor": round(floor, 3) if floor else None,
        "floor_is": figure.floor_is,
        "x_floor": x_floor,
        "target": target,
        "met": met,
        "tiers": {},
    }
    for label, tier in tiers.items():
        if label == "x1":
            continue
        try:
            grown = figure.value(tier)
        except KeyError:  # a tier that did not measure it
            continue
        # Slower or fewer a second are both "grown": the limit holds either way round.
        growth = round(grown / value, 2) if value else None
        slower = (value / grown if figure.rate else grown / value) if grown and value else None
        row["tiers"][label] = {
            "value": grown,
            "vs_x1": growth,
            "within_limit": None if slower is None else slower <= GROWTH_LIMIT,
        }
    return row


def headline(result: dict[str, Any]) -> dict[str, Any]:
    """The headline of a `run_all` result: when, where, and a row per figure of FIGURES."""
    m = result["machine"]
    tiers = result["tiers"]
    return {
        "at": result["at"],
        "mode": result["mode"],
        "revision": result["revision"],
        "machine": (
            f"{m['nproc']} x {m['cpu']}, {m['memory_gib']} GiB, PostgreSQL {m.get('postgresql', '?')} on the same "
            f"machine (fsync {m.get('postgresql_fsync', '?')}), Python {m['python']}"
        ),
        "load_average": [m["load_average"][0], m.get("load_average_end", [None])[0]],
        "growth_tiers": {
            label: tier.get("background", {}).get("total_runs") for label, tier in tiers.items() if label != "x1"
        },
        "rows": [_row(figure, tiers) for figure in FIGURES],
    }


def fmt(v: Any) -> str:
    """A figure as the tables show it: "—" for none; two decimals below 100, one below 1,000, none above."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "**no**"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:,.1f}" if abs(v) >= 100 else f"{v:,.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _line(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def markdown(h: dict[str, Any]) -> str:
    """The headline as a caption and one table."""
    tiers = list(h["growth_tiers"])
    sizes = ", ".join(f"{label}: {runs:,} stored runs" for label, runs in h["growth_tiers"].items() if runs)
    lines = [
        f"Measured {h['at'][:16].replace('T', ' ')} UTC on {h['machine']}, load average {h['load_average'][0]} "
        f"at the start and {h['load_average'][1]} at the end; `python -m bench run_all"
        f"{' --quick' if h['mode'] == 'quick' else '' if h['mode'] == 'full' else ' --size ' + h['mode']}` at "
        f"revision `{h['revision']}`, one uvicorn web process and two workers. "
        f"“x floor”: the figure over its floor measured in the same run (for a rate, the floor's rate over "
        f"the figure's), the floor being raw psycopg doing the same database work (`bench/floor.py`) or, "
        f"for a read, `/healthz/`. Growth: the figure with more history stored ({sizes or 'not measured'}) over "
        f"the same at x1; within {GROWTH_LIMIT:g}x of x1 is the target.",
        "",
        _line(["figure", "value", "x floor", "the floor (same run)", "target", "met", *(f"{t} / x1" for t in tiers)]),
        _line(["---", "---:", "---:", "---", "---", ":-:", *("---:" for _ in tiers)]),
    ]
    for row in h["rows"]:
        floor = f"{fmt(row['floor'])} {row['unit']}: {row['floor_is']}" if row["floor"] is not None else "—"
        cells = [
            f"{row['figure']}",
            f"{fmt(row['value'])} {row['unit']}",
            fmt(row["x_floor"]),
            floor,
            row["target"] or "—",
            "—" if row["met"] is None else fmt(row["met"]),
        ]
        for label in tiers:
            grown = row["tiers"].get(label)
            if grown is None or grown["vs_x1"] is None:
                cells.append("—")
            else:
                cells.append(fmt(grown["vs_x1"]) + ("" if grown["within_limit"] else " **over**"))
        lines.append(_line(cells))
    return "\n".join(lines) + "\n"

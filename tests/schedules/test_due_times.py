"""Due times (runs.recurrence, docs/design/schedules.md#due-times): cron and intervals, driven with
explicit instants across daylight-saving changes — no database, no clock."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from runs.recurrence import MACROS, Rule, cron_problem, zone_problem

pytestmark = pytest.mark.sqlite

PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = ZoneInfo("America/New_York")
ANCHOR = datetime(2026, 1, 1, tzinfo=UTC)


def following(rule: Rule, after: datetime, n: int) -> list[datetime]:
    found = []
    for _ in range(n):
        after = rule.next_after(after)
        found.append(after)
    return found


def test_an_interval_counts_from_its_anchor_whenever_the_fire_happened() -> None:
    rule = Rule(cron="", every_seconds=7, zone="UTC", anchor=ANCHOR)
    assert rule.next_after(ANCHOR - timedelta(seconds=1)) == ANCHOR
    assert rule.next_after(ANCHOR - timedelta(seconds=8)) == ANCHOR - timedelta(seconds=7)
    assert rule.next_after(ANCHOR) == ANCHOR + timedelta(seconds=7)
    # A fire 300 ms late does not move the next due time: it follows from the due time itself.
    late = ANCHOR + timedelta(seconds=7, milliseconds=300)
    assert rule.next_after(late) == ANCHOR + timedelta(seconds=14)
    assert rule.latest_at_or_before(late) == ANCHOR + timedelta(seconds=7)
    # The grid extends before the anchor (a backfill's due times); start_at bounds the fires.
    assert rule.latest_at_or_before(ANCHOR - timedelta(microseconds=1)) == ANCHOR - timedelta(seconds=7)


def test_an_interval_is_elapsed_time_across_a_daylight_saving_change() -> None:
    anchor = datetime(2026, 3, 29, 0, 30, tzinfo=PARIS)  # the night Paris springs forward at 02:00
    rule = Rule(cron="", every_seconds=3600, zone="Europe/Paris", anchor=anchor)
    dues = following(rule, anchor, 3)
    assert [d - anchor for d in dues] == [timedelta(hours=h) for h in (1, 2, 3)]
    assert [d.astimezone(PARIS).hour for d in dues] == [1, 3, 4]


def test_a_cron_reads_the_wall_clock_of_its_zone() -> None:
    rule = Rule(cron="0 9 * * 1-5", every_seconds=None, zone="Europe/Paris", anchor=ANCHOR)
    winter = rule.next_after(datetime(2026, 1, 9, 12, tzinfo=UTC))  # a Friday, after 9:00 in Paris
    assert winter == datetime(2026, 1, 12, 8, tzinfo=UTC)  # Monday 09:00 CET
    summer = rule.next_after(datetime(2026, 7, 1, tzinfo=UTC))
    assert summer == datetime(2026, 7, 1, 7, tzinfo=UTC)  # 09:00 CEST


def test_a_due_time_in_a_skipped_hour_fires_once_at_the_first_valid_instant_after_it() -> None:
    # New York springs forward on 2026-03-08: 02:00 EST becomes 03:00 EDT (07:00 UTC).
    daily = Rule(cron="30 2 * * *", every_seconds=None, zone="America/New_York", anchor=ANCHOR)
    dues = following(daily, datetime(2026, 3, 7, 12, tzinfo=UTC), 3)
    assert dues == [
        datetime(2026, 3, 8, 7, 0, tzinfo=UTC),  # 02:30 does not exist: 03:00 EDT, the change itself
        datetime(2026, 3, 9, 6, 30, tzinfo=UTC),  # 02:30 EDT
        datetime(2026, 3, 10, 6, 30, tzinfo=UTC),
    ]
    # Every quarter hour: 02:00, 02:15, 02:30 and 02:45 are one instant with 03:00, fired once.
    quarterly = Rule(cron="*/15 * * * *", every_seconds=None, zone="America/New_York", anchor=ANCHOR)
    local = [
        d.astimezone(NEW_YORK).strftime("%H:%M")
        for d in following(quarterly, datetime(2026, 3, 8, 6, 30, tzinfo=UTC), 4)
    ]
    assert local == ["01:45", "03:00", "03:15", "03:30"]


def test_a_repeated_hour_fires_each_wall_time_once_at_its_first_occurrence() -> None:
    # Paris falls back on 2026-10-25: 03:00 CEST becomes 02:00 CET; 02:00 to 02:59 happen twice.
    daily = Rule(cron="30 2 * * *", every_seconds=None, zone="Europe/Paris", anchor=ANCHOR)
    dues = following(daily, datetime(2026, 10, 24, 12, tzinfo=UTC), 2)
    assert dues == [datetime(2026, 10, 25, 0, 30, tzinfo=UTC), datetime(2026, 10, 26, 1, 30, tzinfo=UTC)]
    quarterly = Rule(cron="*/15 * * * *", every_seconds=None, zone="Europe/Paris", anchor=ANCHOR)
    dues = following(quarterly, datetime(2026, 10, 24, 23, 50, tzinfo=UTC), 10)
    walls = [d.astimezone(PARIS).strftime("%H:%M") for d in dues]
    assert walls == ["02:00", "02:15", "02:30", "02:45", "03:00", "03:15", "03:30", "03:45", "04:00", "04:15"]
    assert len(set(dues)) == len(dues) and dues == sorted(dues)
    # 02:45 CEST (00:45 UTC) to 03:00 CET (02:00 UTC): the second pass fired nothing.
    assert dues[4] - dues[3] == timedelta(minutes=75)
    # Asked from inside the second pass, the latest due time is the first pass's.
    inside = datetime(2026, 10, 25, 1, 20, tzinfo=UTC)  # 02:20 CET, the second 02:20
    assert quarterly.latest_at_or_before(inside) == datetime(2026, 10, 25, 0, 45, tzinfo=UTC)
    assert quarterly.next_after(inside) == datetime(2026, 10, 25, 2, 0, tzinfo=UTC)


def test_the_macros_are_the_crons_they_stand_for() -> None:
    after = datetime(2026, 5, 13, 10, 17, tzinfo=UTC)
    for macro, cron in MACROS.items():
        assert cron_problem(macro) is None
        assert Rule(macro, None, "UTC", ANCHOR).next_after(after) == Rule(cron, None, "UTC", ANCHOR).next_after(after)
    assert Rule("@hourly", None, "UTC", ANCHOR).next_after(after) == datetime(2026, 5, 13, 11, tzinfo=UTC)


@pytest.mark.parametrize(
    "cron", ["", "* * * *", "* * * * * *", "61 * * * *", "* 24 * * *", "0 0 30 2 *", "@reboot", "hello"]
)
def test_what_is_not_five_fields_or_a_macro_is_refused(cron: str) -> None:
    assert cron_problem(cron) is not None


@pytest.mark.parametrize("zone", ["Nowhere/City", "posixrules", "../etc/passwd", ""])
def test_only_the_time_zone_databases_names_are_zones(zone: str) -> None:
    assert zone_problem(zone) is not None
    assert zone_problem("Europe/Paris") is None and zone_problem("UTC") is None


def test_a_crons_shortest_gap_is_its_closest_two_due_times() -> None:
    assert Rule("*/5 * * * *", None, "UTC", ANCHOR).shortest_gap(ANCHOR) == 300
    assert Rule("0,1 * * * *", None, "UTC", ANCHOR).shortest_gap(ANCHOR) == 60
    assert Rule("", 42, "UTC", ANCHOR).shortest_gap(ANCHOR) == 42

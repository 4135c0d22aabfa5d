"""When a schedule is due (docs/design/schedules.md#due-times): cron and interval due times in a time
zone, daylight-saving changes as the design page states. Pure Python, no ORM: the services and the
scheduler ask it, the tests drive it with explicit instants."""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from cronsim import CronSim, CronSimError

# The common macros, as Vixie cron reads them (cronsim reads five fields only).
MACROS: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# How many of a cron's next due times its shortest gap is judged on (RUNLEDGER_MIN_SCHEDULE_SECONDS):
# a week of an every-minute cron's, more than enough for any five fields' pattern to repeat.
GAP_SAMPLE = 2000
_ONE_SECOND = timedelta(seconds=1)


def cron_problem(cron: str) -> str | None:
    """What is wrong with `cron` as a schedule's expression, or None: five fields or a macro."""
    expanded = MACROS.get(cron.strip().lower(), cron)
    if len(expanded.split()) != 5:
        return "must be five fields (minute hour day-of-month month day-of-week) or one of " + ", ".join(MACROS)
    try:
        CronSim(expanded, datetime(2000, 1, 1))
    except CronSimError as exc:
        return f"is not a cron expression: {exc}"
    return None


def zone_problem(name: str) -> str | None:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return "must be an IANA time zone name, such as UTC or Europe/Paris"
    # ZoneInfo also opens files by relative path ("posixrules", "right/UTC"): only the database's names.
    return None if name in _zones() else "must be an IANA time zone name, such as UTC or Europe/Paris"


_ZONES: set[str] = set()


def _zones() -> set[str]:
    if not _ZONES:
        _ZONES.update(available_timezones())
    return _ZONES


@dataclass(frozen=True)
class Rule:
    """A schedule's due times: `cron` read in `zone`, or every `every_seconds` from `anchor`."""

    cron: str
    every_seconds: int | None
    zone: str
    anchor: datetime

    def __post_init__(self) -> None:
        # In UTC: adding to a time of another zone would move its wall clock, not elapsed time.
        object.__setattr__(self, "anchor", self.anchor.astimezone(UTC))

    def next_after(self, instant: datetime) -> datetime:
        """The first due time strictly after `instant`."""
        if self.every_seconds is not None:
            # The grid extends before the anchor too (a backfill's); `start_at` bounds the fires.
            step = _micros(timedelta(seconds=self.every_seconds))
            return self.anchor + timedelta(microseconds=(_micros(instant - self.anchor) // step + 1) * step)
        zone = ZoneInfo(self.zone)
        # The wall clock's matches in order, each mapped to its instant: one before `instant`
        # (a repeated hour's second pass, whose wall times fired on the first) is passed over.
        local = instant.astimezone(zone).replace(tzinfo=None, microsecond=0)
        matches = CronSim(MACROS.get(self.cron.strip().lower(), self.cron), local)
        while True:
            due = _instant(next(matches), zone)
            if due > instant:
                return due

    def latest_at_or_before(self, instant: datetime) -> datetime | None:
        """The last due time at or before `instant` (None: none in the 50 years a cron is searched)."""
        if self.every_seconds is not None:
            step = _micros(timedelta(seconds=self.every_seconds))
            return self.anchor + timedelta(microseconds=_micros(instant - self.anchor) // step * step)
        zone = ZoneInfo(self.zone)
        local = instant.astimezone(zone).replace(tzinfo=None)
        matches = CronSim(MACROS.get(self.cron.strip().lower(), self.cron), local + _ONE_SECOND, reverse=True)
        try:
            due = _instant(next(matches), zone)
            while due > instant:
                due = _instant(next(matches), zone)
        except StopIteration:
            return None
        # Inside a repeated hour's second pass, wall times after `local` fired on the first pass,
        # before `instant`: the latest may be one of those.
        while (later := self.next_after(due)) <= instant:
            due = later
        return due

    def shortest_gap(self, after: datetime) -> float:
        """The fewest seconds between two due times: the interval, or a cron's over its next
        `GAP_SAMPLE` due times after `after`."""
        if self.every_seconds is not None:
            return float(self.every_seconds)
        shortest, previous = float("inf"), self.next_after(after)
        for _ in range(GAP_SAMPLE):
            following = self.next_after(previous)
            shortest = min(shortest, (following - previous).total_seconds())
            previous = following
        return shortest


def _micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """The instant of the wall-clock time `wall` in `zone`: in a repeated hour its first
    occurrence; in a skipped hour the first valid instant after it (the clock change itself)."""
    first = wall.replace(tzinfo=zone, fold=0)
    if first.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == wall:
        return first.astimezone(UTC)
    # Skipped: fold=0 reads it with the offset before the change (later in UTC), fold=1 with the
    # offset after it (earlier): the change lies between the two; find its second.
    low = int(wall.replace(tzinfo=zone, fold=1).timestamp())
    high = int(first.timestamp())
    after = datetime.fromtimestamp(high, zone).utcoffset()
    while high - low > 1:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, zone).utcoffset() == after:
            high = middle
        else:
            low = middle
    return datetime.fromtimestamp(high, UTC)

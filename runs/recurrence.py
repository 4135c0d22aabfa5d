"""When a schedule is due (docs/design/schedules.md#due-times): cron and interval due times in a time
zone, daylight-saving changes as the design page states. Pure Python, no ORM: the services and the
scheduler ask it, the tests drive it with explicit instants."""

import itertools
from collections.abc import Iterator
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
# How many of a cron's next due times its shortest gap is judged on (RUNLEDGER_MIN_SCHEDULE_SECONDS,
# when above a minute): five fields' closest pair comes round within them.
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
        return next(self._cron_after(instant))

    def _cron_after(self, instant: datetime) -> Iterator[datetime]:
        """A cron's due times after `instant`, in order: the wall clock's matches, each mapped to its
        instant; one not after the last (a repeated hour's second pass, whose wall times fired on
        the first; a skipped hour's, the same instant) is passed over."""
        zone = ZoneInfo(self.zone)
        local = instant.astimezone(zone).replace(tzinfo=None, microsecond=0)
        last = instant
        for wall in CronSim(MACROS.get(self.cron.strip().lower(), self.cron), local):
            due = _instant(wall, zone)
            if due > last:
                last = due
                yield due

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
        dues = list(itertools.islice(self._cron_after(after), GAP_SAMPLE + 1))
        return min((b - a).total_seconds() for a, b in itertools.pairwise(dues))


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

"""`manage.py purge_runs`: delete what outlived its use, old ended runs first
(docs/design/operations.md#retention)."""

import re
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from runs import services

_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_age(text: str) -> timedelta:
    """`30d`, `12h`, `90m`, `45s`, `2w` → a timedelta."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", text)
    if match is None:
        raise ValueError(f"{text!r} is not an age like 30d, 12h, 90m, 45s or 2w")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


class Command(BaseCommand):
    help = (
        "Delete terminal runs (completed, failed, cancelled, stopped) that ended longer ago than "
        "--older-than, with their events and attempts, in batches, and their webhook deliveries once over. Live runs are never touched; a run "
        "goes only together with its whole subtree of child runs, so one whose descendant must stay stays."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than", required=True, help="retention age: runs that ended longer ago go (30d, 12h, 90m, 2w)"
        )
        parser.add_argument("--batch-size", type=int, default=500, help="runs deleted per transaction (500)")
        parser.add_argument("--dry-run", action="store_true", help="say what would be deleted, delete nothing")
        parser.add_argument(
            "--yes", action="store_true", help="confirm an age below one day (it deletes runs that only just ended)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            age = parse_age(options["older_than"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        if age < timedelta(days=1) and not options["dry_run"] and not options["yes"]:
            raise CommandError(
                f"--older-than {options['older_than']} deletes runs that ended less than a day ago: add --yes to "
                "confirm (or --dry-run to see what it would delete)"
            )
        cutoff = timezone.now() - age
        result = services.runs_purge(ended_before=cutoff, batch_size=options["batch_size"], dry_run=options["dry_run"])
        what = f"{result.runs} terminal runs ({result.events} events, {result.attempts} attempts) that ended before {cutoff.isoformat()}"
        if options["dry_run"]:
            self.stdout.write(f"Dry run: would delete {what}.")
        else:
            self.stdout.write(
                self.style.SUCCESS(
                    f"Deleted {what} in {result.batches} batches, {result.webhook_deliveries} webhook deliveries "
                    f"of purged runs, {result.idempotency_records} idempotency records past their TTL, and "
                    f"{result.auth_failures} failed sign-ins and token attempts past their window."
                )
            )

"""`manage.py seed_demo`: a demo dataset for trying the staff console (docs/design/operations.md#dashboard)."""

from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs import services
from runs.access import User
from runs.events import EventType, RequeueCause, WaitReason
from runs.models import Run
from runs.transitions import FailCode, Status, StopCode

WORKER = "seed_demo"


@dataclass
class Seeded:
    run: Run
    story: str


class Command(BaseCommand):
    help = (
        "Create a demo dataset for trying the staff console: runs in every status, with events, child "
        "runs and a long timeline, all made through the services as a worker and staff would."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--owner", default="demo", help="username owning the runs (created if missing)")
        parser.add_argument("--long-events", type=int, default=1200, help="events of the long-running run")

    def handle(self, *args: Any, **options: Any) -> None:
        owner = self._owner(options["owner"])
        self._clear_the_queue(owner)
        seeded = self._seed(owner, long_events=options["long_events"])
        self.stdout.write(self.style.SUCCESS(f"Seeded {len(seeded)} demo runs owned by {owner.get_username()!r}:"))
        for item in seeded:
            run = Run.objects.get(pk=item.run.pk)
            events = f"{run.last_seq} event{'s' if run.last_seq != 1 else ''}"
            self.stdout.write(f"  {run.status:<9}  {run.pk}  {events:>11}  {item.story}")
        self.stdout.write(
            "Browse them at /admin/runs/run/. The running and waiting ones have no worker behind them: "
            "their heartbeats go stale, and a worker's sweeper requeues the running ones and runs them for real."
        )

    def _owner(self, username: str) -> User:
        model = get_user_model()
        user = model.objects.filter(**{model.USERNAME_FIELD: username}).first()
        if user is None:
            user = model.objects.create_user(**{model.USERNAME_FIELD: username}, password=None)
            self.stdout.write(f"Created user {username!r} (no usable password) to own the demo runs.")
        return user

    def _clear_the_queue(self, owner: User) -> None:
        """The seed claims runs the way a worker does, and a claim takes the oldest queued run: any
        queued run would be taken instead of the seed's own. Queued runs an earlier seed left for
        this owner are cancelled; anyone else's make the command refuse."""
        queued = Run.objects.filter(status=Status.QUEUED)
        others = queued.exclude(owner_id=owner.pk).count()
        if others:
            raise CommandError(
                f"{others} queued runs of other users exist; seed_demo claims runs as a worker would and "
                "must not take them. Seed an empty database, or let a worker drain the queue first."
            )
        for run in queued.order_by("created_at", "id"):
            services.run_cancel(run_id=run.pk, actor=owner, note="left queued by an earlier seed_demo")
            self.stdout.write(f"Cancelled {run.pk}, left queued by an earlier seed.")

    def _seed(self, owner: User, *, long_events: int) -> list[Seeded]:
        seeded: list[Seeded] = []

        def create(story: str, **input: Any) -> Run:
            run = services.run_create(owner=owner, agent="demo", input=input)
            seeded.append(Seeded(run, story))
            return run

        # Every claim must take the run just created, so runs that stay queued are made last.
        run = create("streamed text, called a tool, completed", deltas=6, tool="slow")
        generation = self._claim(run)
        self._chatter(run, generation, deltas=6, tool=True)
        services.run_complete(run_id=run.pk, generation=generation, output={"text": "The demo answer."})

        run = create("failed with agent_error", deltas=3)
        generation = self._claim(run)
        self._chatter(run, generation, deltas=3)
        services.run_fail(
            run_id=run.pk,
            generation=generation,
            code=FailCode.AGENT_ERROR,
            reason="the demo agent raised",
            error={"type": "RuntimeError", "message": "simulated failure"},
        )

        run = create("cancelled by its owner while running; the worker released it", deltas=40)
        generation = self._claim(run)
        self._chatter(run, generation, deltas=4)
        services.run_cancel(run_id=run.pk, actor=owner, note="no longer needed")
        services.run_attempt_release(run_id=run.pk, generation=generation)

        run = create("stopped by policy while running; the worker released it", deltas=40)
        generation = self._claim(run)
        self._chatter(run, generation, deltas=5)
        services.run_stop(run_id=run.pk, actor=None, code=StopCode.POLICY, reason="demo: over the allowed runtime")
        services.run_attempt_release(run_id=run.pk, generation=generation)

        run = create("waiting for input", deltas=4, ask="Which city?")
        generation = self._claim(run)
        self._chatter(run, generation, deltas=2)
        services.run_wait(run_id=run.pk, generation=generation, reason=WaitReason.INPUT_REQUIRED, prompt="Which city?")

        run = create(f"running, {long_events} events: a long timeline", deltas=long_events, delay_ms=10)
        generation = self._claim(run)
        self._chatter(run, generation, deltas=max(0, long_events - 2))

        parent = create("cancelled parent: its running child ended with it", deltas=20, children=1)
        generation = self._claim(parent)
        child = services.run_child_spawn(run_id=parent.pk, generation=generation, input={"deltas": 20})
        seeded.append(Seeded(child, "child of the cancelled parent (parent_cancelled)"))
        child_generation = self._claim(child)
        self._chatter(child, child_generation, deltas=3)
        services.run_cancel(run_id=parent.pk, actor=owner, note="demo: cancel the whole tree")

        parent = create("running parent with two children", deltas=30, children=2)
        generation = self._claim(parent)
        first = services.run_child_spawn(run_id=parent.pk, generation=generation, input={"deltas": 3})
        second = services.run_child_spawn(run_id=parent.pk, generation=generation, input={"deltas": 30})
        seeded.append(Seeded(first, "completed child of the running parent"))
        seeded.append(Seeded(second, "running child of the running parent"))
        first_generation = self._claim(first)
        self._chatter(first, first_generation, deltas=3)
        services.run_complete(run_id=first.pk, generation=first_generation, output={"text": "child done"})
        self._chatter(second, self._claim(second), deltas=2)

        # From here on runs stay queued, so nothing more is claimed.
        run = create("lost its worker (lease expired) and went back to the queue", deltas=10)
        generation = self._claim(run)
        self._chatter(run, generation, deltas=2)
        services.run_requeue(run_id=run.pk, generation=generation, cause=RequeueCause.LEASE_EXPIRED)

        create("queued, waiting for a worker", deltas=10)
        return seeded

    def _claim(self, run: Run) -> int:
        claimed = services.run_claim(worker=WORKER)
        if claimed is None or claimed[0].pk != run.pk:
            if claimed is not None:
                # Not ours: hand it back as a worker shutting down cleanly would.
                services.run_requeue(
                    run_id=claimed[0].pk, generation=claimed[0].generation, cause=RequeueCause.WORKER_SHUTDOWN
                )
            raise CommandError("a worker or another client took a queued run meanwhile; stop the workers and retry")
        return claimed[0].generation

    @staticmethod
    def _chatter(run: Run, generation: int, *, deltas: int, tool: bool = False) -> None:
        """The events a demo agent would emit, appended as its current attempt."""
        events: list[tuple[str, dict[str, Any]]] = [
            (EventType.OUTPUT_DELTA, {"text": f"chunk {i} "}) for i in range(deltas)
        ]
        if tool:
            call = {"call_id": "call-1", "name": "slow"}
            events[len(events) // 2 : len(events) // 2] = [
                (EventType.TOOL_STARTED, {**call, "arguments": {"seconds": 5}}),
                (EventType.TOOL_FINISHED, {**call, "result": "slept 5 s"}),
            ]
        for start in range(0, len(events), 500):
            services.run_events_append(run_id=run.pk, generation=generation, events=events[start : start + 500])

"""Where a cancellation's time goes inside a worker, for `bench/step_kinds.py --trace`.

The worker processes load this module as one of RUNLEDGER_AGENTS (it registers no agent). With
BENCH_TRACE_FILE set, it wraps the worker's functions from the control notification to the release
write and appends a line `run_id stage time.time()` to that file at each stage; it changes no
behaviour. The stages: docs/benchmarks.md#method-step_kinds.
"""

import functools
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

STAGES = ("notified", "recheck", "read", "tripped", "close", "reaped", "closed", "written")
PATH = os.environ.get("BENCH_TRACE_FILE")


def stamp(run_id: Any, stage: str) -> None:
    assert _fd is not None
    os.write(_fd, f"{run_id} {stage} {time.time():.6f}\n".encode())


def _run_of(label: str) -> str:
    # A Steps label is its attempt's repr: "<attempt 1 of run UUID>".
    return label.rsplit(" ", 1)[-1].rstrip(">")


def _install() -> None:
    from runs import notify, services
    from runs.worker import attempt, steps, worker

    on_notify = worker.Worker._on_notify

    def _on_notify(self: worker.Worker, channel: str, payload: str) -> None:
        if channel == notify.CONTROL:
            stamp(notify.parse_control_payload(payload)[0], "notified")
        on_notify(self, channel, payload)

    recheck = worker.Worker._recheck

    async def _recheck(self: worker.Worker, held: list[Any], *, via: str) -> None:
        if via == "notification":
            for run_id, _ in held:
                stamp(run_id, "recheck")
        await recheck(self, held, via=via)

    run_worker_states = worker.run_worker_states

    def _run_worker_states(*, run_ids: list[Any]) -> Any:
        states = run_worker_states(run_ids=run_ids)
        if len(run_ids) == 1:  # a notification's re-read, not the poll's of every run held
            stamp(run_ids[0], "read")
        return states

    stop = attempt.Execution.stop

    def _stop(self: attempt.Execution, reason: str, *, via: str) -> None:
        if not self.token.tripped:
            stamp(self.run_id, "tripped")
        stop(self, reason, via=via)

    close = steps.Steps.close

    async def _close(self: steps.Steps) -> None:
        first = not self._stopped
        if first:
            stamp(_run_of(self._label), "close")
        await close(self)
        if first:
            stamp(_run_of(self._label), "closed")

    leader_exited = steps.Steps._leader_exited

    def _leader_exited(self: steps.Steps, pid: int) -> None:
        stamp(_run_of(self._label), "reaped")
        leader_exited(self, pid)

    release = services.run_attempt_release

    @functools.wraps(release)
    def _release(**kwargs: Any) -> None:
        release(**kwargs)
        stamp(kwargs["run_id"], "written")

    patches: Iterable[tuple[Any, str, Callable[..., Any]]] = (
        (worker.Worker, "_on_notify", _on_notify),
        (worker.Worker, "_recheck", _recheck),
        (worker, "run_worker_states", _run_worker_states),
        (attempt.Execution, "stop", _stop),
        (steps.Steps, "close", _close),
        (steps.Steps, "_leader_exited", _leader_exited),
        (services, "run_attempt_release", _release),
    )
    for owner, name, fn in patches:
        setattr(owner, name, fn)


_fd = os.open(PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if PATH else None
if _fd is not None:
    _install()


def read(path: str) -> dict[str, dict[str, list[float]]]:
    """The stamps of a trace file: run id → stage → times, in order."""
    out: dict[str, dict[str, list[float]]] = {}
    with open(path) as f:
        for line in f:
            run_id, stage, at = line.split()
            out.setdefault(run_id, {}).setdefault(stage, []).append(float(at))
    return out

"""A stand-in worker for the SSE tests and benchmarks: a separate process that appends events to a running run.

    python -m tests.support.sse_writer RUN_ID GENERATION --count N --seed S [--max-batch B]
        [--pause-ms MS | --interval S] [--pad-max P] [--commits] [--complete] [--mixed]

It appends `output.delta` events through `runs.services.run_events_append` (the worker's own write
path: one transaction per batch, seq under the run's row lock, NOTIFY at commit) in random batches
of 1..B with random pauses of 0..MS ms (or one batch every S seconds, on a fixed schedule), then
completes the run with `--complete`. With `--commits` it prints `seq committed_at` after each
commit, the completion's included, and nothing else: the benchmarks time delivery against it.
Tests start it with `tests.support.procs.start_writer`, benchmarks with `paced_command`.
"""

import argparse
import os
import random
import sys
import time


def paced_command(run_id: object, generation: int, *, count: int, interval: float) -> list[str]:
    """One delta per transaction, `interval` s apart, each commit printed, then the run completed."""
    return [
        *(sys.executable, "-m", __name__, str(run_id), str(generation), "--count", str(count), "--seed", "0"),
        *("--max-batch", "1", "--interval", str(interval), "--pad-max", "0", "--commits", "--complete"),
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_id")
    parser.add_argument("generation", type=int)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--max-batch", type=int, default=3)
    pace = parser.add_mutually_exclusive_group()
    pace.add_argument("--pause-ms", type=float, default=0)
    pace.add_argument("--interval", type=float, help="seconds from one batch's start to the next's")
    parser.add_argument("--pad-max", type=int, default=300, help="each delta padded with 0..P bytes")
    parser.add_argument("--commits", action="store_true", help="print `seq committed_at` after each commit")
    parser.add_argument("--complete", action="store_true")
    # Half the events tool calls instead of deltas: for the streams of chosen types.
    parser.add_argument("--mixed", action="store_true")
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from runs import services
    from runs.events import EventType

    rng = random.Random(args.seed)

    def delta(i: int) -> dict[str, str]:
        if not args.pad_max:
            return {"text": f"delta {i}"}
        return {"text": f"delta {i}", "pad": "x" * rng.randint(0, args.pad_max)}

    written = 0
    next_at = time.monotonic()
    while written < args.count:
        n = min(rng.randint(1, args.max_batch), args.count - written)
        batch = [
            (EventType.TOOL_STARTED, {"call_id": f"c{written + i}", "name": "t"})
            if args.mixed and rng.random() < 0.5
            else (EventType.OUTPUT_DELTA, delta(written + i))
            for i in range(n)
        ]
        rows = services.run_events_append(run_id=args.run_id, generation=args.generation, events=batch)
        if args.commits:
            print(rows[-1].seq, repr(time.time()), flush=True)  # the call returned: committed
        written += n
        if args.interval is not None:
            next_at += args.interval
            time.sleep(max(0.0, next_at - time.monotonic()))  # pacing the load, not synchronising
        elif args.pause_ms:
            time.sleep(rng.uniform(0, args.pause_ms) / 1000)  # pacing the writer, not synchronising
    if args.complete:
        run = services.run_complete(run_id=args.run_id, generation=args.generation, output={"deltas": written})
        if args.commits:
            print(run.last_seq, repr(time.time()), flush=True)
        else:
            print(f"completed at seq {run.last_seq}", flush=True)
    if not args.commits:
        print(f"wrote {written} events", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A stand-in worker for SSE tests: a separate process that appends events to a running run.

    python -m tests.support.sse_writer RUN_ID GENERATION --count N --seed S [--max-batch B]
        [--pause-ms MS] [--complete] [--mixed]

It appends `output.delta` events through `runs.services.run_events_append` (the worker's own write
path: one transaction per batch, seq under the run's row lock, NOTIFY at commit) in random batches
of 1..B with random pauses of 0..MS ms, then completes the run with `--complete`. Tests start it
with `tests.support.procs.start_writer`. The real worker (`manage.py runworker`) can replace it
where a test needs an agent rather than a fast writer.
"""

import argparse
import os
import random
import sys
import time


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_id")
    parser.add_argument("generation", type=int)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--max-batch", type=int, default=3)
    parser.add_argument("--pause-ms", type=float, default=0)
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
    written = 0
    while written < args.count:
        n = min(rng.randint(1, args.max_batch), args.count - written)
        batch = [
            (EventType.TOOL_STARTED, {"call_id": f"c{written + i}", "name": "t"})
            if args.mixed and rng.random() < 0.5
            else (EventType.OUTPUT_DELTA, {"text": f"delta {written + i}", "pad": "x" * rng.randint(0, 300)})
            for i in range(n)
        ]
        services.run_events_append(run_id=args.run_id, generation=args.generation, events=batch)
        written += n
        if args.pause_ms:
            time.sleep(rng.uniform(0, args.pause_ms) / 1000)  # pacing the writer, not synchronising
    if args.complete:
        run = services.run_complete(run_id=args.run_id, generation=args.generation, output={"deltas": written})
        print(f"completed at seq {run.last_seq}", flush=True)
    print(f"wrote {written} events", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

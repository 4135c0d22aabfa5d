"""The writer of the many-watchers benchmark: appends one event per transaction through the
service layer to a run whose attempt the benchmark holds, printing `seq committed_at` after each
commit (the call returned = committed), then completes the run.

    python bench/writer.py RUN_ID GENERATION COUNT INTERVAL_SECONDS   (DATABASE_URL from the environment)
"""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    run_id, generation, count, interval = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from runs import services
    from runs.events import EventType

    next_at = time.monotonic()
    for i in range(count):
        rows = services.run_events_append(
            run_id=run_id, generation=generation, events=[(EventType.OUTPUT_DELTA, {"text": f"delta {i}"})]
        )
        print(rows[-1].seq, repr(time.time()), flush=True)
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))  # pacing the load, not synchronising
    run = services.run_complete(run_id=run_id, generation=generation, output={"deltas": count})
    print(run.last_seq, repr(time.time()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

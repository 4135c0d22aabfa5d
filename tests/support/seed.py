"""The seed of the tests that draw at random (cuts, faults, drops): one per session, printed by
the tests that use it, so a failure replays with RUNLEDGER_TEST_SEED=<seed>."""

import os
import random

SEED = int(os.environ.get("RUNLEDGER_TEST_SEED") or random.randrange(2**32))

"""A free port for a server a test or benchmark is about to start. Also run as a script by
bin/pgcluster (standard library only), which prints one."""

import random
import socket
from pathlib import Path

_draw = random.SystemRandom()  # not the global generator, which a test may seed


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


_handed_out: set[int] = set()


def free_port() -> int:
    """A port free now for a server about to start, chosen outside the kernel's ephemeral range:
    a port the kernel chose (bind to 0) is one it may give any outgoing connection on the machine
    before our server binds it (Pushpin's condure once failed so). Never one handed out before in
    this process; drawn at random, so parallel test processes seldom meet."""
    low, high = _ephemeral_range()
    candidates = [p for p in range(10000, 65536) if not low <= p <= high and p not in _handed_out]
    for port in _draw.sample(candidates, min(len(candidates), 200)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in 10000-65535 outside the ephemeral range {low}-{high}")


if __name__ == "__main__":
    print(free_port())

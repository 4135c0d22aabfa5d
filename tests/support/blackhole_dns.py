"""A DNS server that never answers, and a process started with it as its only nameserver.

`BlackholeDns` listens on UDP port 53 of a loopback address of its own (127.x.y.z) and counts the
queries it swallows; `under()` prefixes a command so that it runs in a mount namespace of its own
(`unshare -m`, root) where /etc/resolv.conf names only that server, asked for 30 s twice: any
lookup of a name not in /etc/hosts then blocks the thread that makes it for a minute. Nothing else
on the machine is touched.
"""

import random
import socket
import threading
from pathlib import Path
from types import TracebackType


class BlackholeDns:
    def __init__(self, folder: Path) -> None:
        self.address = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
        self.resolv_conf = folder / "resolv.conf"
        self.queries = 0
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._stop = threading.Event()

    def __enter__(self) -> "BlackholeDns":
        self._socket.bind((self.address, 53))
        self._socket.settimeout(0.2)
        self.resolv_conf.write_text(f"nameserver {self.address}\noptions timeout:30 attempts:2\n")
        threading.Thread(target=self._swallow, daemon=True).start()
        return self

    def _swallow(self) -> None:
        while not self._stop.is_set():
            try:
                self._socket.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.queries += 1

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._socket.close()

    def under(self, args: list[str]) -> list[str]:
        """`args` run with this server as the only nameserver."""
        script = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(self.resolv_conf), *args]

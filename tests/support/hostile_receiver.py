"""A webhook receiver that never lets a request finish, in its own process: what a user who wants
to hold the workers' deliveries would run.

    python -m tests.support.hostile_receiver PORT hang|drip LOG

`hang` accepts each connection, reads the request and never answers; `drip` answers one byte of an
endless head every 0.1 s, so that no single read ever waits long. Each connection is held until the
client closes it. LOG gets a JSON line per connection when it ends: {"path", "sent", "seconds"}.
"""

import asyncio
import json
import sys
import time
from pathlib import Path

DRIP = b"HTTP/1.1 200 OK\r\nX-Drip: " + b"x" * 1_000_000


async def main(port: int, mode: str, log: Path) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        began, sent, path = time.monotonic(), 0, "?"
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode(errors="replace")
            if mode == "drip":
                for byte in DRIP:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    sent += 1
                    await asyncio.sleep(0.1)
            # Until the client gives up: its read ends when it closes the connection.
            while await reader.read(65536):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with log.open("a") as out:
                out.write(json.dumps({"path": path, "sent": sent, "seconds": time.monotonic() - began}) + "\n")

    server = await asyncio.start_server(serve, "127.0.0.1", port, backlog=512)
    print("hostile receiver ready", flush=True)
    async with server:
        await server.serve_forever()


def ended(log: Path) -> list[dict[str, object]]:
    """The connections it has seen end so far."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.endswith("}")]


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])))

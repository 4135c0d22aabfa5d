"""`manage.py runedge`: Pushpin in front of the web processes, configured and supervised
(docs/design/edge.md#how)."""

import re
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.conf import conf
from runs.streaming.edge import pushpin
from runs.streaming.edge.control import socket_path

_ADDRESS = re.compile(r"(?:(?P<host>[^:\s]+|\[[0-9a-fA-F:]+\]):)?(?P<port>[0-9]{1,5})")


def _address(value: str, *, host_required: bool = False) -> str:
    if value.startswith(pushpin.UNIX):
        if host_required:
            # Its routes take HOST:PORT (or a ZeroMQ target): zurl, which makes its requests, has no Unix sockets.
            raise CommandError(
                "Pushpin 1.36 reaches the web processes over TCP only: --upstream HOST:PORT of web processes "
                "that trust no forwarded header (docs/how-to/edge.md#front-door)"
            )
        if not value.removeprefix(pushpin.UNIX).startswith("/") or len(value.encode()) > len(pushpin.UNIX) + 107:
            raise CommandError(f"{value!r} is not unix:/ABSOLUTE/PATH (107 bytes at most)")
        return value
    found = _ADDRESS.fullmatch(value)
    if found is None or not 0 < int(found["port"]) < 65536 or (host_required and not found["host"]):
        raise CommandError(f"{value!r} is not {'HOST:PORT' if host_required else '[ADDRESS:]PORT'}")
    return value


class Command(BaseCommand):
    help = (
        "Run Pushpin in the foreground in front of the web processes (docs/design/edge.md), signing with "
        "RUNLEDGER_GRIP_KEY, until SIGTERM or SIGINT. bin/edge installs Pushpin first if it is missing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--port",
            required=True,
            help="[ADDRESS:]PORT the clients connect to, or unix:PATH, a socket in a folder only nginx's group may "
            "enter (made open to all once ready; refused in a folder others may reach)",
        )
        parser.add_argument(
            "--control",
            required=True,
            help="PATH of the socket for publish and recover, in a folder only this user may enter (made "
            "with mode 700 if missing); the web processes, run as the same user, have RUNLEDGER_GRIP_URL=ipc://PATH",
        )
        parser.add_argument("--upstream", required=True, help="HOST:PORT of the web processes")
        parser.add_argument("--log-level", type=int, default=2, help="Pushpin's: 2 logs each request, 1 only warnings")

    def handle(self, *args: Any, **options: Any) -> None:
        conf.require()  # also under --skip-checks: Pushpin would sign with a key the web processes refuse
        port = _address(options["port"])
        upstream = _address(options["upstream"], host_required=True)
        control = Path(options["control"])
        try:
            socket_path(f"ipc://{control}")
        except ValueError as exc:
            raise CommandError(f"--control: {exc}") from exc
        try:
            status = pushpin.run(
                port=port,
                control=control,
                upstream=upstream,
                key=conf.GRIP_KEY,
                log_level=options["log_level"],
            )
        except (FileNotFoundError, PermissionError) as exc:
            raise CommandError(str(exc)) from exc
        if status:
            sys.exit(status)

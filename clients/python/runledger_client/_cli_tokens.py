"""`runledger tokens …`: the caller's API tokens (docs/design/api.md#tokens). Each command takes the
client, its arguments and the output, and returns the exit status, as those of runledger_client.cli
do."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from runledger_client._cli_args import OK, deleting
from runledger_client._output import Output, printable
from runledger_client.client import Client
from runledger_client.models import ApiToken


def _when(value: object, none: str) -> str:
    return str(value) if value else none


def _line(token: ApiToken) -> str:
    used = _when(token.data.get("last_used_at"), "never used")
    issued = f"  issued by {printable(token.issued_by)}" if token.issued_by else ""
    return f"{printable(token.name):<24}  expires {_when(token.data.get('expires_at'), 'never')}  {used}{issued}"


def cmd_create(client: Client, args: argparse.Namespace, out: Output) -> int:
    token = client.tokens.create(args.name, expires_in=args.expires)
    # The key alone, as `manage.py create_token` prints it: KEY=$(runledger tokens create ci).
    out.one(token.data, printable(token.key or ""))
    return OK


def cmd_list(client: Client, args: argparse.Namespace, out: Output) -> int:
    out.many((token.data, _line(token)) for token in client.tokens.list())
    return OK


HANDLERS: dict[str, Callable[[Client, argparse.Namespace, Output], int]] = {
    "tokens create": cmd_create,
    "tokens list": cmd_list,
    "tokens delete": deleting("name", lambda client, name: client.tokens.delete(name)),
}

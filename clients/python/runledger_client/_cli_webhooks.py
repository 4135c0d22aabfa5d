"""`runledger webhooks …`: the caller's webhook endpoints (docs/design/webhooks.md#endpoints). Each
command takes the client, its arguments and the output, and returns the exit status, as those of
runledger_client.cli do."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from runledger_client._cli_args import OK, at_most, deleting
from runledger_client._output import Output, facts, printable
from runledger_client.client import Client
from runledger_client.models import Webhook, WebhookDelivery


def _facts(hook: Webhook) -> str:
    """An endpoint for people: its facts, one per line; the secret only when the answer has one."""
    shown = [
        ("id", hook.id),
        ("url", hook.url),
        ("events", " ".join(hook.events)),
        ("where", ", ".join(f"{k}={v}" for k, v in hook.metadata.items())),
        ("all_runs", "yes" if hook.all_runs else ""),
        ("enabled", "yes" if hook.enabled else "no"),
        ("disabled", hook.disabled_reason),
        ("failing", hook.data.get("failing_since")),
        ("owner", hook.owner),
        ("created_at", hook.data.get("created_at")),
        ("secret", hook.secret),
    ]
    return facts(shown)


def _line(hook: Webhook) -> str:
    state = "enabled " if hook.enabled else "disabled"
    return f"{hook.id}  {state}  {' '.join(hook.events):<40}  {printable(hook.url)}"


def _delivery_line(delivery: WebhookDelivery) -> str:
    return (
        f"{delivery.id}  {delivery.status:<9}  {delivery.event_type:<13}  {delivery.run_id}  "
        f"attempts {delivery.attempts}  {delivery.data.get('created_at')}"
    )


def _fields(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "events": args.events,
        "metadata": dict(args.where) if args.where is not None else None,
        "all_runs": args.all_runs,
    }


def cmd_create(client: Client, args: argparse.Namespace, out: Output) -> int:
    fields = _fields(args)
    hook = client.webhooks.create(
        args.endpoint_url, fields["events"], fields["metadata"], all_runs=bool(fields["all_runs"])
    )
    out.one(hook.data, f"{hook.id}\nsecret: {hook.secret} (shown only now: keep it to verify the signatures)")
    return OK


def cmd_list(client: Client, args: argparse.Namespace, out: Output) -> int:
    out.many((hook.data, _line(hook)) for hook in client.webhooks.list())
    return OK


def cmd_show(client: Client, args: argparse.Namespace, out: Output) -> int:
    hook = client.webhooks.get(args.id)
    out.one(hook.data, _facts(hook))
    return OK


def cmd_update(client: Client, args: argparse.Namespace, out: Output) -> int:
    hook = client.webhooks.update(args.id, url=args.endpoint_url, enabled=args.enabled, **_fields(args))
    out.one(hook.data, _facts(hook))
    return OK


def cmd_rotate_secret(client: Client, args: argparse.Namespace, out: Output) -> int:
    hook = client.webhooks.rotate_secret(args.id)
    out.one(
        hook.data,
        f"secret: {hook.secret} (shown only now; the old one signs too until "
        f"{hook.data.get('previous_secret_expires_at')})",
    )
    return OK


def cmd_deliveries(client: Client, args: argparse.Namespace, out: Output) -> int:
    deliveries = at_most(client.webhooks.deliveries(args.id), args.limit)
    out.many((delivery.data, _delivery_line(delivery)) for delivery in deliveries)
    return OK


HANDLERS: dict[str, Callable[[Client, argparse.Namespace, Output], int]] = {
    "webhooks create": cmd_create,
    "webhooks list": cmd_list,
    "webhooks show": cmd_show,
    "webhooks update": cmd_update,
    "webhooks delete": deleting("id", lambda client, id: client.webhooks.delete(id)),
    "webhooks rotate-secret": cmd_rotate_secret,
    "webhooks deliveries": cmd_deliveries,
}

"""Where webhooks may go (docs/design/webhooks.md#safe-requests): every IPv6 form that embeds an
IPv4 address is checked on that address, site-local and local-use NAT64 are refused, the
operator's RUNLEDGER_WEBHOOKS_DENY holds even with private addresses allowed, and registration
checks the URL as written, never naming what a name resolves to — refused by the check itself, at
the API, and at delivery without a connection made."""

import asyncio
import ipaddress
import socket
from collections.abc import Iterator
from dataclasses import replace

import pytest
from django.contrib.auth.models import User

from runs import services
from runs.http.outbound import address_problem, embedded_ipv4, url_problem
from runs.models import WebhookEndpoint
from runs.services.webhook_endpoints import webhook_create
from runs.services.webhooks import deliveries_claim
from runs.worker.webhooks import post
from tests.factories import queued_run
from tests.support.api import api_for, assert_error

pytestmark = pytest.mark.sqlite

# The five, then the other ways of spelling a private IPv4 address in IPv6.
REFUSED = [
    "64:ff9b::a9fe:a9fe",  # NAT64 (well-known prefix) of 169.254.169.254, the metadata address
    "::7f00:1",  # IPv4-compatible 127.0.0.1
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "::ffff:0:7f00:1",  # IPv4-translated 127.0.0.1
    "fec0::1",  # site-local
    "::ffff:7f00:1",  # IPv4-mapped 127.0.0.1
    "::ffff:10.1.2.3",
    "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
    "64:ff9b:1::a9fe:a9fe",  # local-use NAT64: its IPv4 address's place is its operator's choice
    "2002:a9fe:a9fe::1",  # 6to4 of the metadata address
    "2001:0:a00:1::",  # Teredo whose server is 10.0.0.1
]
PUBLIC = ["93.184.216.34", "2606:4700::1111", "64:ff9b::808:808", "2002:808:808::1", "::ffff:93.184.216.34"]


@pytest.mark.parametrize("text", REFUSED)
def test_every_ipv6_form_that_embeds_a_private_ipv4_address_is_refused(text: str) -> None:
    assert address_problem(ipaddress.ip_address(text)) is not None


@pytest.mark.parametrize("text", PUBLIC)
def test_public_addresses_pass_however_they_are_written(text: str) -> None:
    assert address_problem(ipaddress.ip_address(text)) is None


def test_the_embedded_address_is_unwrapped_from_each_form() -> None:
    loopback = ipaddress.IPv4Address("127.0.0.1")
    for text in ("::7f00:1", "2002:7f00:1::", "::ffff:0:7f00:1", "::ffff:7f00:1", "64:ff9b::7f00:1"):
        assert loopback in embedded_ipv4(ipaddress.ip_address(text)), text
    assert embedded_ipv4(ipaddress.ip_address("2606:4700::1111")) == []


def test_the_operators_deny_ranges_hold_even_with_private_addresses_allowed(settings: object) -> None:
    settings.RUNLEDGER_WEBHOOKS_ALLOW_PRIVATE = True  # type: ignore[attr-defined]
    settings.RUNLEDGER_WEBHOOKS_DENY = ["10.0.0.0/8", "169.254.169.254/32", "fd00::/8"]  # type: ignore[attr-defined]
    for text in ("10.9.9.9", "::ffff:10.9.9.9", "64:ff9b::a9fe:a9fe", "fd12::1"):
        problem = address_problem(ipaddress.ip_address(text))
        assert problem is not None and "RUNLEDGER_WEBHOOKS_DENY" in problem, text
    assert address_problem(ipaddress.ip_address("127.0.0.1")) is None  # private, allowed, not denied


@pytest.mark.parametrize(
    "url",
    [
        *(f"http://[{text}]/in" for text in REFUSED),
        "http://127.1/in",  # what the C resolver reads as 127.0.0.1, never asking DNS
        "http://2130706433/in",
        "http://0x7f.1/in",
        "http://localhost:8000/in",
        "http://hooks.localhost/in",
    ],
)
def test_registration_refuses_a_refused_address_as_written(alice: User, url: str) -> None:
    assert url_problem(url) is not None
    body = assert_error(
        api_for(alice).post("/api/webhooks/", {"url": url, "events": ["run.failed"]}, format="json"),
        400,
        "validation_error",
    )
    assert "url" in body["error"]["detail"]
    assert not WebhookEndpoint.objects.exists()


def test_registration_accepts_any_name_unresolved(alice: User) -> None:
    # Not resolved: a name whose DNS says nothing, or a private address, is checked at delivery.
    for url in ("https://hooks.example.invalid/in", "https://internal.corp.example/in"):
        assert url_problem(url) is None
        created = api_for(alice).post("/api/webhooks/", {"url": url, "events": ["run.failed"]}, format="json")
        assert created.status_code == 201, created.content


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A socket listening on 127.0.0.1: what a delivery that got past the guard would reach."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.setblocking(False)
        yield sock


def test_a_delivery_to_any_refused_form_records_a_refusal_and_connects_nowhere(
    alice: User, listener: socket.socket
) -> None:
    port = listener.getsockname()[1]
    webhook_create(owner=alice, url="https://hooks.example.test/in", events=["run.cancelled"])
    services.run_cancel(run_id=queued_run(alice).pk, actor=alice)
    (claimed,), _ = deliveries_claim(limit=1)
    for text in [*REFUSED, "127.0.0.1"]:
        host = f"[{text}]" if ":" in text else text
        # As if registered before the guard knew the form: every delivery checks again.
        outcome = asyncio.run(post(replace(claimed, url=f"http://{host}:{port}/in"), timeout=2))
        assert outcome.status_code is None and outcome.error.startswith("refused:"), (text, outcome)
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing ever connected

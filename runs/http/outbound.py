"""Requests the platform sends to addresses its users chose (webhooks): only to public addresses,
checked on the address actually connected to (docs/design/webhooks.md#safe-requests). A name is
resolved once per connection and the socket goes to the checked address itself, the request
keeping its host name (Host, SNI, the certificate check); no proxy from the environment and no
redirects, which would send it somewhere unchecked. A URL being registered is checked without DNS
(`url_problem`).
"""

import asyncio
import contextlib
import ipaddress
import socket
import ssl
import threading
from collections.abc import Iterable
from functools import cache
from typing import Any
from urllib.parse import urlsplit

import certifi
import httpcore
import httpx

from runs.conf import conf

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# IPv6 ranges whose last 32 bits are an IPv4 address a packet ends up at (RFC 4291 compatible and
# mapped, RFC 2765 translated, RFC 6052 NAT64's well-known prefix).
_LOW_32_EMBEDS = tuple(
    ipaddress.IPv6Network(net) for net in ("::/96", "::ffff:0:0/96", "::ffff:0:0:0/96", "64:ff9b::/96")
)
# Never a public web server, whatever Python's tables say: site-local (deprecated, RFC 3879), and
# the local-use NAT64 prefix (RFC 8215), whose IPv4 address sits where its operator's prefix
# length puts it, so it cannot be unwrapped and checked.
_NEVER_PUBLIC = tuple(ipaddress.IPv6Network(net) for net in ("fec0::/10", "64:ff9b:1::/48"))


class RefusedAddress(Exception):
    """The host is, or resolves to, an address requests may not go to."""


def embedded_ipv4(address: Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries to: mapped, translated, compatible, NAT64,
    6to4, Teredo (its server and its client)."""
    if isinstance(address, ipaddress.IPv4Address):
        return []
    found = [ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)] if any(address in n for n in _LOW_32_EMBEDS) else []
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found.extend(address.teredo)
    return found


@cache
def _denied(ranges: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(text, strict=False) for text in ranges)


def address_problem(address: Address) -> str | None:
    """Why requests may not go to `address`, or None. The IPv4 address an IPv6 one embeds is
    checked too; the operator's RUNLEDGER_WEBHOOKS_DENY applies even with private addresses allowed."""
    checked = [address, *embedded_ipv4(address)]
    for one in checked:
        if any(one.version == net.version and one in net for net in _denied(tuple(conf.WEBHOOKS_DENY))):
            return f"{address} is in a range this service never sends webhooks to (RUNLEDGER_WEBHOOKS_DENY)"
    if conf.WEBHOOKS_ALLOW_PRIVATE:
        return None
    for one in checked:
        # Not global: loopback, private, link-local (the cloud metadata address among them),
        # unspecified, reserved, shared (CGNAT). Multicast is never a web server.
        never = isinstance(one, ipaddress.IPv6Address) and any(one in net for net in _NEVER_PUBLIC)
        if never or one.is_multicast or not one.is_global:
            return f"{address} is not a public address (loopback, private, link-local, metadata or reserved)"
    return None


def _overrides() -> dict[str, str]:
    pairs = (item.partition("=") for item in conf.WEBHOOKS_RESOLVE_OVERRIDES)
    return {host.lower(): address for host, _, address in pairs}


def literal_address(host: str) -> Address | None:
    """The address `host` spells without DNS: an IP literal, or an IPv4 address in any form the C
    resolver reads as one (`127.1`, `2130706433`, `0x7f.1`), which never reaches DNS."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    if host and all(c in "0123456789abcdefxABCDEFX." for c in host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def _checked(host: str, addresses: Iterable[str]) -> list[str]:
    found = [ipaddress.ip_address(address.split("%", 1)[0]) for address in addresses]
    if not found:
        raise RefusedAddress(f"{host} resolves to no address")
    # Every address, not only the first: the connect may fall back to any of them.
    for address in found:
        if (problem := address_problem(address)) is not None:
            # A name's address is not said: the owner of the URL would learn what names resolve
            # to inside the platform's network.
            raise RefusedAddress(problem if literal_address(host) else f"{host} resolves to a refused address")
    return [str(address) for address in found]


def _getaddrinfo(host: str, port: int) -> "asyncio.Future[list[Any]]":
    """getaddrinfo on a thread of its own, not the loop's shared executor: a resolver that never
    answers holds that one thread (until the C resolver gives up), never another delivery's lookup."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[list[Any]] = loop.create_future()

    def settle(result: list[Any] | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result or [])

    def resolve() -> None:
        try:
            infos, error = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM), None
        except BaseException as exc:  # handed to the awaiting request
            infos, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(settle, infos, error)

    threading.Thread(target=resolve, name=f"resolve-{host}", daemon=True).start()
    return future


async def resolve(host: str, port: int) -> list[str]:
    """The checked addresses of `host` (RefusedAddress if any is refused)."""
    if (literal := literal_address(host)) is not None:
        return _checked(host, [str(literal)])
    if (address := _overrides().get(host.lower())) is not None:
        return _checked(host, [address])
    infos = await _getaddrinfo(host, port)
    return _checked(host, dict.fromkeys(str(info[4][0]) for info in infos))


def url_problem(url: str) -> str | None:
    """Why `url` cannot take webhooks, or None: a scheme other than http(s), no host, a bad port,
    or a host that is a refused address as written. Names are not resolved (every delivery checks
    what it connects to): this never waits on DNS."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    try:
        parts.port  # noqa: B018  # raises on a port out of range
    except ValueError:
        return "has a port that is not a number from 0 to 65535"
    host = parts.hostname.rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        # Loopback by definition (RFC 6761), whatever a resolver would say.
        return None if conf.WEBHOOKS_ALLOW_PRIVATE else f"{host} is a loopback name"
    if (literal := literal_address(host)) is not None:
        return address_problem(literal)
    return None


class _CheckedBackend(httpcore.AsyncNetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        error: Exception | None = None
        for address in await resolve(host, port):
            try:
                return await self._inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except httpcore.ConnectError as exc:
                error = exc
        assert error is not None
        raise error

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise RefusedAddress("no requests over Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


@cache
def _tls() -> ssl.SSLContext:
    # Loading the CA bundle takes milliseconds: once per process, shared by every client.
    return ssl.create_default_context(cafile=certifi.where())


def client(*, timeout: float) -> httpx.AsyncClient:
    """An HTTP client whose connections go only where `resolve` allows. Its pool holds one
    connection: a client serves one request (docs/design/webhooks.md#delivery)."""
    transport = httpx.AsyncHTTPTransport(verify=_tls())
    # httpx's transport takes no network backend; its pool is rebuilt with the checking one.
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=_tls(), network_backend=_CheckedBackend(), max_connections=10
    )
    return httpx.AsyncClient(transport=transport, timeout=timeout, follow_redirects=False, trust_env=False)

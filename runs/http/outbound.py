"""Requests the platform sends to addresses its users chose (webhooks): only to public addresses,
checked on the address actually connected to (docs/design/webhooks.md#safe-requests).

A name is resolved once per connection, every address it gives is checked, and the connection is
made to the checked address itself: no second resolution between the check and the connect that a
DNS answer changed in between could slip a private address through. The request keeps its host
name (the Host header, TLS's SNI and certificate check), only the socket goes to the address.
No proxy from the environment, no redirects: both would send the request somewhere unchecked.
"""

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import certifi
import httpcore
import httpx

from runs.conf import conf

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class RefusedAddress(Exception):
    """The host is, or resolves to, an address requests may not go to."""


def address_problem(address: Address) -> str | None:
    """Why requests may not go to `address`, or None."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    # Not global: loopback, private, link-local (the cloud metadata address among them),
    # unspecified, reserved, shared (CGNAT). Multicast is never a web server.
    if address.is_multicast or not address.is_global:
        return f"{address} is not a public address (loopback, private, link-local, metadata or reserved)"
    return None


def _overrides() -> dict[str, str]:
    pairs = (item.partition("=") for item in conf.WEBHOOKS_RESOLVE_OVERRIDES)
    return {host.lower(): address for host, _, address in pairs}


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _checked(host: str, addresses: Iterable[str]) -> list[str]:
    found = [ipaddress.ip_address(address.split("%", 1)[0]) for address in addresses]
    if not found:
        raise RefusedAddress(f"{host} resolves to no address")
    if not conf.WEBHOOKS_ALLOW_PRIVATE:
        # Every address, not only the first: the connect may fall back to any of them.
        for address in found:
            if (problem := address_problem(address)) is not None:
                raise RefusedAddress(f"{host}: {problem}")
    return [str(address) for address in found]


def _without_dns(host: str) -> str | None:
    """The address of a literal or of an overridden host, or None: ask DNS."""
    if (literal := _literal(host)) is not None:
        return str(literal)
    return _overrides().get(host.lower())


async def resolve(host: str, port: int) -> list[str]:
    """The checked addresses of `host` (RefusedAddress if any is refused)."""
    if (address := _without_dns(host)) is not None:
        return _checked(host, [address])
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return _checked(host, dict.fromkeys(str(info[4][0]) for info in infos))


def url_problem(url: str) -> str | None:
    """Why `url` cannot take webhooks as registered, or None: a scheme other than http(s), or a host
    that is, or now resolves to, a refused address. A name that does not resolve yet is accepted;
    every delivery checks again on what it connects to."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return "has a port that is not a number from 0 to 65535"
    try:
        if (address := _without_dns(parts.hostname)) is not None:
            _checked(parts.hostname, [address])
        else:
            infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
            _checked(parts.hostname, dict.fromkeys(str(info[4][0]) for info in infos))
    except RefusedAddress as exc:
        return str(exc)
    except (OSError, UnicodeError):
        return None
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


def client(*, timeout: float) -> httpx.AsyncClient:
    """An HTTP client whose connections go only where `resolve` allows."""
    transport = httpx.AsyncHTTPTransport()
    # httpx's transport takes no network backend; its pool is rebuilt with the checking one.
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=ssl.create_default_context(cafile=certifi.where()), network_backend=_CheckedBackend()
    )
    return httpx.AsyncClient(transport=transport, timeout=timeout, follow_redirects=False, trust_env=False)

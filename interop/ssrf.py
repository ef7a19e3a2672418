"""The SSRF screen of push-notification URLs: where our workers may POST on a caller's behalf.

A caller names the URL, our worker sends to it from inside our network, so a URL must not reach
anything a stranger could not reach from outside: only **global unicast** addresses are allowed.
Refused: loopback, private (RFC 1918, ULA), shared (100.64/10), link-local (169.254/16 — the cloud
metadata service — and fe80::/10), multicast, reserved, unspecified, and IPv6 forms that carry such an
IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``, 6to4, Teredo, NAT64 are judged by the address inside).

The host is resolved and *every* address it resolves to must pass (a name with one public and one
private address is refused). A host in ``A2A_PUSH_ALLOWED_HOSTS`` (an operator's list, exact host
names or literal addresses, compared case-insensitively) skips the address rule: the tests allow
127.0.0.1 that way. The screen runs when a config is created AND before every send (a name that
resolved to a public address yesterday may resolve to 127.0.0.1 today: DNS rebinding); ``screen``
returns the addresses it judged so the sender can connect to one of those and not resolve again.

``a2a.utils.push_url_validator`` has the same address rule but is async, knows no allow-list and
returns no address; ours is the one the product uses.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

Resolver = Callable[[str, int], list[str]]
MAX_URL = 2048


class UrlRefused(ValueError):
    """A push URL we will not send to; ``reason`` is a short code, the message says why in words."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Screened:
    url: str
    scheme: str
    host: str
    port: int
    addresses: tuple[str, ...]  # what the host resolved to, each judged (empty when allow-listed by name)
    allow_listed: bool


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (A and AAAA), in the resolver's order."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _embedded_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in ipaddress.ip_network("64:ff9b::/96"):  # NAT64 well-known prefix
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_refusal(text: str) -> str | None:
    """Why ``text`` (one IP address) is not a global unicast destination, or None when it is."""
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return "not an IP address"
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded_v4(address)
        if inner is not None:
            why = address_refusal(str(inner))
            return f"carries {inner}, {why}" if why else None
    for test, why in (
        (address.is_unspecified, "unspecified"),
        (address.is_loopback, "loopback"),
        (address.is_link_local, "link-local"),
        (address.is_multicast, "multicast"),
        (address.is_reserved, "reserved"),
        (address.is_private, "private"),
        (not address.is_global, "not global"),
    ):
        if test:
            return why
    return None


def _allow_listed(host: str) -> bool:
    allowed = {entry.strip().lower().strip("[]") for entry in settings.A2A_PUSH_ALLOWED_HOSTS}
    return host.lower() in allowed


def screen(url: str, *, resolver: Resolver | None = None) -> Screened:
    """``url`` judged as a push destination, or ``UrlRefused`` (module docstring for the rules)."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL:
        raise UrlRefused("malformed", f"the URL must be 1-{MAX_URL} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise UrlRefused("malformed", f"the URL does not parse: {error}") from None
    if parts.scheme not in ("http", "https"):
        raise UrlRefused("scheme", "only http and https URLs are sent to")
    if parts.username or parts.password:
        raise UrlRefused("credentials", "credentials in the URL are not accepted (use authentication)")
    host = (parts.hostname or "").lower()
    if not host:
        raise UrlRefused("host", "the URL names no host")
    port = port or (443 if parts.scheme == "https" else 80)
    if _allow_listed(host):
        return Screened(url, parts.scheme, host, port, (), True)
    try:
        addresses = (resolver or resolve)(host, port)
    except (OSError, UnicodeError):
        raise UrlRefused("unresolved", f"the host {host} does not resolve") from None
    if not addresses:
        raise UrlRefused("unresolved", f"the host {host} does not resolve")
    for address in addresses:
        why = address_refusal(address)
        if why is not None:
            raise UrlRefused(
                "address", f"the host {host} resolves to {address} ({why}): only global unicast is allowed"
            )
    return Screened(url, parts.scheme, host, port, tuple(addresses), False)

"""Which network addresses the proxy may connect to on a job's behalf. No Django: the proxy core uses it.

A model endpoint is a URL an admin registered; the address it reaches is decided by DNS at connect time,
so a check of the URL alone can be bypassed (a name that resolves to 127.0.0.1, or one whose answer
changes between a check and the connection: DNS rebinding). The check therefore runs on the address a
socket is about to connect to: `guarded_socket` is aiohttp's socket factory, called with every address
a connection attempt uses, after resolution, IP literals and redirects included.

Refused unless the endpoint allows private networks explicitly: every address that is not globally
routable (loopback, link-local, private, shared, documentation, reserved, unspecified) and multicast, also
when wrapped in an IPv6 address (IPv4-mapped, 6to4, Teredo).
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import aiohttp

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
REFUSAL_MARK = "refused by Trove's address policy"


class AddressRefused(OSError):
    """A connection to a non-public address, which the endpoint does not allow."""


def address_refusal(address: str) -> str | None:
    """Why `address` (an IP literal) is not public ("loopback", "private", ...), or None when it is."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone ("fe80::1%eth0") is not part of it
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        reason = address_refusal(str(ip.ipv4_mapped))  # a socket to ::ffff:a.b.c.d talks to a.b.c.d
        return None if reason is None else f"{reason} (inside {ip})"
    for inner in _embedded_ipv4(ip):
        reason = address_refusal(str(inner))
        if reason is not None:
            return f"{reason} (inside {ip})"
    return _category(ip)


def _embedded_ipv4(ip: IPAddress) -> list[ipaddress.IPv4Address]:
    if not isinstance(ip, ipaddress.IPv6Address):
        return []
    teredo = ip.teredo[1] if ip.teredo else None
    return [inner for inner in (ip.sixtofour, teredo) if inner is not None]


def _category(ip: IPAddress) -> str | None:
    # The named categories first, for a clearer message; `is_global` catches the rest (100.64/10, 192.0.2/24...).
    for reason, matches in (("unspecified", ip.is_unspecified), ("loopback", ip.is_loopback),
                            ("link-local", ip.is_link_local), ("multicast", ip.is_multicast),
                            ("private", ip.is_private), ("reserved", ip.is_reserved)):
        if matches:
            return reason
    return None if ip.is_global else "special-purpose"


def refusal_message(address: str, reason: str) -> str:
    return (f"{address} is a {reason} address, {REFUSAL_MARK}: the proxy connects to loopback, link-local and "
            "private addresses only for an endpoint an admin registered with allow_private_network")


def guarded_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """aiohttp's socket factory for endpoints without allow_private_network: refuse before connecting."""
    family, type_, proto, _, sockaddr = addr_info
    address = str(sockaddr[0])
    reason = address_refusal(address)
    if reason is not None:
        raise AddressRefused(refusal_message(address, reason))
    return socket.socket(family=family, type=type_, proto=proto)


def address_refusal_in(exc: BaseException) -> str | None:
    """The refusal's message when a connection error came from `guarded_socket`, else None. aiohttp wraps
    its errors, and joins them when every address of a name failed ("Multiple exceptions: ...")."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, AddressRefused):
            return str(seen)
        if REFUSAL_MARK in str(seen) and not isinstance(seen, aiohttp.ClientError):
            return str(seen).removeprefix("Multiple exceptions: ")
        seen = getattr(seen, "os_error", None) or seen.__cause__
    return None


"""Client addresses: loopback, networks of trusted proxies, and the client a trusted proxy names.

Every trust decision is made on the TCP peer (the address that opened the connection). The
address in X-Forwarded-For is only what a proxy says, and counts only when the peer is a proxy we
trust: it is who per-address limits count, never who is trusted.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from services.config import SettingsError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def is_loopback(host: str | None) -> bool:
    """True for a loopback address (127.0.0.0/8, ::1) or the names `localhost` and `ip6-localhost`."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address((host or "").strip("[]")).is_loopback
    except ValueError:
        return False


def networks(spec: str, setting_name: str) -> list[Network]:
    """The comma-separated addresses or networks of a setting; SettingsError names it when one is bad."""
    try:
        return [ipaddress.ip_network(part.strip(), strict=False) for part in spec.split(",") if part.strip()]
    except ValueError as error:
        raise SettingsError(f"{setting_name}: {error}") from None


def in_networks(address: str | None, trusted: Iterable[Network]) -> bool:
    try:
        ip = ipaddress.ip_address((address or "").strip("[]"))
    except ValueError:
        return False
    return any(ip in network for network in trusted)


def forwarded_client(peer: str | None, forwarded_for: str | None, trusted: list[Network]) -> str | None:
    """The client's address: the peer itself, unless the peer is a trusted proxy that says whom it
    forwards (X-Forwarded-For). Each proxy appends the address it saw, so the list is read from the
    right, past our own proxies, to the first address they did not vouch for. An entry that is not an
    address (a proxy passing on what the client wrote) ends the walk at the last proxy that added it."""
    if not forwarded_for or not in_networks(peer, trusted):
        return peer
    client = peer
    for entry in reversed([part.strip() for part in forwarded_for.split(",")]):
        try:
            address = str(ipaddress.ip_address(_without_port(entry)))
        except ValueError:
            return client
        client = address
        if not in_networks(address, trusted):
            return address
    return client


def _without_port(entry: str) -> str:
    """`1.2.3.4:5678` and `[::1]:5678` as proxies sometimes write them, without the port."""
    if entry.startswith("[") and "]" in entry:
        return entry[1 : entry.index("]")]
    if entry.count(":") == 1:
        return entry.split(":", 1)[0]
    return entry

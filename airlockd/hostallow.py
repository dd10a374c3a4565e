"""The package broker's allow-list entries: which `host:port` a run may open a tunnel to.

An entry is a host name (`pkgs.example.org`), a name with every name under it (`*.example.net`: one or more
labels before `example.net`, never `example.net` itself), or an address (`127.0.0.1`, `[::1]`), each
with an optional port (443 when none is given). Names are compared in lower case, with one trailing
dot dropped; Unicode names must be written in their ASCII (`xn--`) form.

A name entry only ever reaches public addresses: what it resolves to on this machine must be a
global address (not loopback, private, link-local, shared, multicast or reserved), so that a name
the agent can make resolve anywhere (a wildcard DNS service, a rebinding server) never reaches this
machine or its network. An address entry reaches exactly that address, whatever it is: whoever
wrote it into the policy named it on purpose (a local registry mirror, a test registry on loopback).
Pure: no resolving here (gateway/broker.py resolves, then asks `reachable`).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

DEFAULT_PORT = 443
_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*")
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class HostEntry:
    """One allow-list entry: `host` (a name, the name under `*.`, or an address's text), `port`."""

    host: str
    port: int
    wildcard: bool = False
    address: IPAddress | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if isinstance(self.address, ipaddress.IPv6Address) else self.host
        return f"{'*.' if self.wildcard else ''}{host}:{self.port}"

    def matches(self, host: str, port: int) -> bool:
        """Whether a tunnel to `host:port` (as `split_target` gives them) is this entry's."""
        if port != self.port:
            return False
        if self.address is not None:
            return parse_address(host) == self.address
        if self.wildcard:
            return host.endswith("." + self.host) and parse_address(host) is None
        return host == self.host


def parse_address(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _port(text: str, entry: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"broker entry {entry!r}: the port must be a number from 1 to 65535")
    return int(text)


def _name(text: str) -> str | None:
    """`text` as a host name in lower case without its trailing dot, or None when it is not one."""
    name = text.lower()
    if name.endswith("."):
        name = name[:-1]
    return name if len(name) <= 253 and _NAME.fullmatch(name) else None


def parse_entry(entry: str) -> HostEntry:
    """One policy entry as a HostEntry; ValueError saying what is wrong with it."""
    text = entry.strip()
    if "://" in text or "/" in text or "@" in text:
        raise ValueError(f"broker entry {entry!r}: give a host and an optional port (pkgs.example.org, mirror:8443)")
    if text.startswith("["):  # [v6]:port
        inside, _, rest = text[1:].partition("]")
        address = parse_address(inside)
        if not isinstance(address, ipaddress.IPv6Address) or (rest and not rest.startswith(":")):
            raise ValueError(f"broker entry {entry!r}: not an IPv6 address in brackets")
        port = _port(rest[1:], entry) if rest else DEFAULT_PORT
        return HostEntry(str(address), port, address=address)
    host, sep, port_text = text.rpartition(":") if text.count(":") == 1 else (text, "", "")
    if not sep:
        host = text
    port = _port(port_text, entry) if sep else DEFAULT_PORT
    address = parse_address(host)
    if address is not None:
        return HostEntry(str(address), port, address=address)
    wildcard = host.startswith("*.")
    name = _name(host[2:] if wildcard else host)
    if name is None or "*" in host[2 if wildcard else 0 :]:
        raise ValueError(
            f"broker entry {entry!r}: not a host name (letters, digits and '-' in dot-separated labels,"
            " '*.' only in front, Unicode names in their xn-- form)"
        )
    if wildcard and "." not in name:
        raise ValueError(f"broker entry {entry!r}: a wildcard needs a domain of two labels or more (*.example.org)")
    return HostEntry(name, port, wildcard=wildcard)


def split_target(target: str) -> tuple[str, int] | None:
    """A CONNECT request's `host:port` as (host in lower case, no trailing dot; an address in its
    canonical text), or None when it is not one."""
    if target.startswith("["):
        inside, _, rest = target[1:].partition("]")
        address = parse_address(inside)
        if not isinstance(address, ipaddress.IPv6Address) or not rest.startswith(":"):
            return None
        host, port_text = str(address), rest[1:]
    else:
        host, sep, port_text = target.rpartition(":")
        if not sep or ":" in host:
            return None
        address = parse_address(host)
        if address is not None:
            host = str(address)
        else:
            name = _name(host)
            if name is None:
                return None
            host = name
    if not port_text.isdigit() or not 0 < int(port_text) < 65536 or len(port_text) > 5:
        return None
    return host, int(port_text)


_V6_UNICAST = ipaddress.ip_network("2000::/3")
# Global unicast prefixes that carry an IPv4 address inside (6to4, Teredo, NAT64's well-known and
# local-use prefixes): the IPv4 address could be this machine's or a private network's, and a
# relay on the way would deliver there. Refused rather than unpicked.
_V6_EMBEDDING = tuple(ipaddress.ip_network(n) for n in ("2002::/16", "2001::/32", "64:ff9b::/96", "64:ff9b:1::/48"))
_V4_RELAYS = (ipaddress.ip_network("192.88.99.0/24"), ipaddress.ip_network("192.0.0.0/24"))


def reachable(address: IPAddress) -> bool:
    """Whether a name entry may reach `address`: a global unicast IPv4 address (one mapped into
    IPv6 is judged as itself; not the 6to4 relay anycast or the IETF protocol block), or a global
    unicast IPv6 address in 2000::/3 that embeds no IPv4 address."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return reachable(address.ipv4_mapped)
        return address in _V6_UNICAST and address.is_global and not any(address in net for net in _V6_EMBEDDING)
    return address.is_global and not address.is_multicast and not any(address in net for net in _V4_RELAYS)


def first_match(entries: tuple[HostEntry, ...], host: str, port: int) -> HostEntry | None:
    return next((e for e in entries if e.matches(host, port)), None)

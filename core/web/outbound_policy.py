"""Which addresses an outbound request may reach: the policy that card fetches and model calls share (issue 34).

Agent cards and remote agents' endpoints (`core.a2a.outbound`, which also does the fetching) and
agents' model endpoints (`apiBase`, checked at save, in "Try it" and before every model call by
`core.chat.llm`) are URLs that people name; fetched blindly, such a URL reaches Redis, PostgreSQL,
this app's own API or a cloud's metadata service. The rule, in one place:

- only `http` and `https` URLs;
- the host name is resolved (the event loop's `getaddrinfo`, so `localhost`, `2130706433` and
  `0x7f.1` resolve as the system would) and refused if ANY of its addresses is loopback, private,
  link-local, multicast, reserved, unspecified or otherwise not public, unless the host name or the
  address's network is in the allow-list (`OUTBOUND_ALLOW_HOSTS`);
- a cloud metadata address (169.254.169.254, fd00:ec2::254, and the same addresses written as
  IPv4-mapped, IPv4-compatible, 6to4 or NAT64 IPv6) is refused always: no allow-list entry, host
  name or network unlocks it. Nothing this app talks to lives there, and what lives there hands out
  the machine's cloud credentials.

This module only decides; it opens no connection. It sits with `core.web` so that every core package
that fetches (`core.a2a`, `core.chat`, `core.delegation`) can import it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

import httpx

from core import metrics
from core.errors import AppError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

METADATA_ADDRESSES = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")})
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052: the IPv4 address is the last 32 bits
METADATA = "a cloud metadata address"


class OutboundError(AppError, httpx.TransportError):
    """A request refused by the policy, or one that failed; `category` says which in a few words.

    A `httpx.TransportError`, so the a2a-sdk client reports it like any network failure.
    """

    code = "outbound_error"

    def __init__(self, category: str, *, request: httpx.Request | None = None) -> None:
        super().__init__(category, request=request)
        self.category = category


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (IPv4-mapped, IPv4-compatible, 6to4, NAT64), or None."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    packed = int(address)
    if packed >> 32 == 0 and packed > 1:  # ::a.b.c.d (deprecated "IPv4-compatible"; :: and ::1 are not)
        return ipaddress.IPv4Address(packed)
    return None


def is_metadata(address: IPAddress) -> bool:
    """True for a cloud metadata address, in any of its spellings."""
    return address in METADATA_ADDRESSES or embedded_ipv4(address) in METADATA_ADDRESSES


@dataclass(frozen=True, slots=True)
class AllowList:
    """Hosts and networks that may be reached although their addresses are not public (never a metadata address).

    Attributes:
        hosts: host names, lower case (`localhost`, `agents.internal`).
        networks: addresses and networks (`127.0.0.1`, `10.0.0.0/8`, `::1`).
    """

    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowList:
        """From the setting's entries: each one an IP address, a network (CIDR) or a host name."""
        hosts: set[str] = set()
        networks: list[IPNetwork] = []
        for entry in entries:
            entry = entry.strip().lower().rstrip(".")
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                hosts.add(entry)
        return cls(frozenset(hosts), tuple(networks))

    def allows(self, host: str, address: IPAddress) -> bool:
        """True when `address` (one of `host`'s) may be reached although it is not public."""
        if is_metadata(address):
            return False
        return any(address in network for network in self.networks) or host.lower().rstrip(".") in self.hosts


#: Every address but the metadata ones: for the operator's own configuration (`LLM_API_BASE`), which may
#: name any server of the operator's network but is still never sent to the metadata service.
OPERATOR_CONFIGURED = AllowList(networks=(ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")))


def refusal(address: IPAddress) -> str | None:
    """Why `address` is not reached without the allow-list (e.g. "a loopback address"); None when it is public."""
    if is_metadata(address):
        return METADATA
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for test, what in (
        ("is_unspecified", "an unspecified address"),
        ("is_loopback", "a loopback address"),
        ("is_link_local", "a link-local address"),
        ("is_multicast", "a multicast address"),
        ("is_private", "a private address"),
        ("is_reserved", "a reserved address"),
    ):
        if getattr(address, test):
            return what
    if not address.is_global:
        return "not a public address"
    return None


async def checked_addresses(url: httpx.URL, allow: AllowList) -> list[IPAddress]:
    """Resolve `url`'s host and return its addresses, all allowed by the policy.

    Raises:
        OutboundError: not http(s), the host does not resolve, or one of its addresses is not allowed.
    """
    if url.scheme not in {"http", "https"}:
        metrics.OUTBOUND_REFUSED.labels("not http or https").inc()
        raise OutboundError("not allowed: only http and https URLs are fetched")
    host = url.host
    if not host:
        raise OutboundError("not a valid URL")
    port = url.port or (443 if url.scheme == "https" else 80)
    addresses = _literal_address(host) or await _resolved(host, port)
    if not addresses:
        raise OutboundError("could not resolve the host name")
    for address in addresses:
        reason = refusal(address)
        if reason is not None and not allow.allows(host, address):
            metrics.OUTBOUND_REFUSED.labels(reason).inc()
            raise OutboundError(f"not allowed: {reason}")
    return addresses


def _literal_address(host: str) -> list[IPAddress]:
    """`host` as its one address when it is an address written the canonical way (`127.0.0.1`, `::1`), else [].

    `getaddrinfo` would answer it with itself, from a worker thread (the event loop's executor): a model call
    to an operator's `LLM_API_BASE=http://10.0.0.5:8000/v1` checks it before every call. Other spellings
    (`2130706433`, `0x7f.1`, a zone id) are resolved as the system resolves them.
    """
    try:
        return [] if "%" in host else [ipaddress.ip_address(host)]
    except ValueError:
        return []


async def _resolved(host: str, port: int) -> list[IPAddress]:
    """The addresses `host` resolves to (the event loop's `getaddrinfo`), each once, in order."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise OutboundError("could not resolve the host name") from exc
    addresses: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


async def url_refusal(url: str, allow: AllowList) -> str | None:
    """Why `url` may not be fetched under the policy ("not allowed: a loopback address"), or None when it may."""
    try:
        await checked_addresses(httpx.URL(url), allow)
    except OutboundError as exc:
        return exc.category
    except httpx.InvalidURL:
        return "not a valid URL"
    return None

"""Where a tenant's input may send the node: one egress rule for every connection a download makes.

A ModelCache names its origin (an OCI registry, an object-store endpoint in its Secret, a Hub
repository), and the origin names more: a token realm, redirects, storage URLs. Each of those
connections is opened by the agent (or the PVC-mode Job) from inside the cluster, so without a
rule a tenant reaches what the node reaches: the cloud metadata service, the API server's
neighbours, in-cluster services (issue 37 item 3). The rule, decided here once:

* never the metadata addresses (169.254.169.254, fd00:ec2::254, ...), nor the unspecified,
  loopback, link-local or multicast ones, nor the cluster's (RFC 1918, CGNAT 100.64/10,
  ULA fc00::/7, reserved), unless the platform lists them in `ALLOWED_SETTING`
  (a metadata address only when listed by itself);
* decided on the address the connection is opened to, at connect time (`connect`: the name is
  resolved once and only the addresses that passed are dialled, so a name that resolves to a
  public address for a check and to 169.254.169.254 for the connect cannot slip through);
* every hop (redirects, the token realm) is a new connection, so each is decided again;
* origins the platform configured itself (the Hugging Face endpoint, OCI mirrors, the proxy)
  are trusted as configured (`EgressPolicy.trusting`); where they redirect is not;
* a refusal happens before any packet is sent, with one message naming the host and the
  address class, so it tells nothing about whether anything listens there.

Through a proxy (HTTPS_PROXY, downloads.proxy) the proxy resolves the target, not the agent:
the agent refuses a target written as a refused address, and names are the proxy's to decide
(its own access list must refuse internal destinations). The chart's NetworkPolicy for the
agent (templates/node-egress-policy.yaml) denies the metadata addresses at the CNI as well.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from praesto import names

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

REASON_EGRESS_REFUSED = "EgressRefused"  # the condition reason of a refused connection (api.REASONS)
ENV_ALLOWED = names.ENV_EGRESS_ALLOWED_CIDRS
ALLOWED_SETTING = "downloads.egress.allowedCIDRs"  # the chart value the platform lists them in

# Cloud instance metadata and credential endpoints: AWS IMDS (v4, v6), ECS/EKS Pod Identity
# (169.254.170.2, .23, fd00:ec2::23), GCP and Azure (169.254.169.254), Alibaba (100.100.100.200).
METADATA = tuple(
    ipaddress.ip_network(n)
    for n in ("169.254.169.254/32", "169.254.170.2/32", "169.254.170.23/32", "fd00:ec2::254/128",
              "fd00:ec2::23/128", "100.100.100.200/32")
)  # fmt: skip
CGNAT = ipaddress.ip_network("100.64.0.0/10")
ULA = ipaddress.ip_network("fc00::/7")
RFC1918 = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
NAT64 = ipaddress.ip_network("64:ff9b::/96")  # the well-known prefix: an IPv4 address inside


def address_class(address: IPAddress) -> str | None:
    """The class that keeps `address` out by default ("metadata", "loopback", ...), or None."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or (
            ipaddress.IPv4Address(int(address) & 0xFFFFFFFF) if address in NAT64 else None
        )
        if inner is not None:
            return address_class(inner)
    if any(address in n for n in METADATA):
        return "metadata"
    for name, test in (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
    ):
        if test:
            return name
    if address in CGNAT or address in ULA or any(address in n for n in RFC1918):
        return "private"
    if address.is_reserved or address.is_private:  # 240/4, broadcast, benchmarking, documentation...
        return "reserved"
    return None


def refusal(address: IPAddress, allowed: Iterable[IPNetwork]) -> str | None:
    """The class that refuses `address` under the platform's `allowed` networks, or None.

    A listed network admits the addresses in it; a metadata address only a network that is
    that address alone, so listing the Pod network or 169.254.0.0/16 never opens the metadata service.
    """
    found = address_class(address)
    if found is None:
        return None
    listed = (n for n in allowed if n.version == address.version and address in n)
    if any(found != "metadata" or n.num_addresses == 1 for n in listed):
        return None
    return found


class EgressRefused(Exception):
    """A connection the rule refused, before any packet: the message names host, class and fix."""

    def __init__(self, host: str, address_class: str) -> None:
        super().__init__(
            f"egress to {host} refused: {address_class} addresses are not allowed; list it in "
            f"{ALLOWED_SETTING} if the platform means it"
        )
        self.host, self.address_class = host, address_class


def parse_allowed(text: str) -> tuple[IPNetwork, ...]:
    """`10.0.0.0/8,fd00::/8` (comma or space separated); ValueError names the bad entry."""
    networks = []
    for entry in text.replace(",", " ").split():
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is not a CIDR; list networks like 10.0.0.0/8 or fd00::/8") from None
    return tuple(networks)


def _origin(url: str) -> str:
    """host:port of an http(s) URL, lowercased, with the scheme's default port."""
    parts = urlsplit(url if "://" in url else f"https://{url}")
    port = parts.port or (80 if parts.scheme == "http" else 443)
    return f"{(parts.hostname or '').lower()}:{port}"


@dataclass(frozen=True)
class EgressPolicy:
    """The rule for one download: the platform's allowed networks and the origins it configured.

    The default allows nothing internal: what production runs when the platform listed nothing.
    """

    allowed: tuple[IPNetwork, ...] = ()
    trusted: frozenset[str] = field(default_factory=frozenset)  # "host:port" the platform configured

    @classmethod
    def from_text(cls, text: str | None) -> EgressPolicy:
        return cls(parse_allowed(text or ""))

    def trusting(self, *urls: str | None) -> EgressPolicy:
        """This rule, with the origins of `urls` (platform-configured endpoints) trusted as they are."""
        more = {_origin(u) for u in urls if u}
        return EgressPolicy(self.allowed, self.trusted | more)

    def is_trusted(self, host: str, port: int) -> bool:
        return f"{host.lower().strip('[]')}:{port}" in self.trusted

    def check_address(self, host: str, address: str) -> None:
        """Raise EgressRefused when `address` (what `host` resolved to) is refused."""
        found = refusal(ipaddress.ip_address(address.split("%", 1)[0]), self.allowed)
        if found is not None:
            raise EgressRefused(host, found)

    def check_literal(self, host: str, port: int) -> None:
        """A target another party resolves (a proxy): refused when it is written as a refused
        address or names this machine; any other name is the proxy's to decide."""
        bare = host.strip("[]")
        if self.is_trusted(bare, port):
            return
        if bare.lower() == "localhost" or bare.lower().endswith(".localhost"):
            self.check_address(host, "127.0.0.1")
            return
        try:
            ipaddress.ip_address(bare.split("%", 1)[0])
        except ValueError:
            return
        self.check_address(host, bare)

    def check_url(self, url: str) -> None:
        """Resolve `url`'s host now and refuse it unless some address passes: for a client this
        rule cannot hook at connect time (the object stores' Rust client, which resolves again
        when it connects: the NetworkPolicy, not this, holds against a name that rebinds).
        A name that does not resolve is left to the client, which fails on it the same way."""
        parts = urlsplit(url)
        port = parts.port or (80 if parts.scheme == "http" else 443)
        if not parts.hostname or self.is_trusted(parts.hostname, port):
            return
        try:
            self.admitted(parts.hostname, port)
        except socket.gaierror:
            return

    def admitted(self, host: str, port: int) -> list[tuple[socket.AddressFamily, tuple[Any, ...]]]:
        """(family, sockaddr) of each address `host` resolves to now that the rule admits;
        EgressRefused (for the first refused one) when none is."""
        bare = host.strip("[]")
        found: EgressRefused | None = None
        usable: list[tuple[socket.AddressFamily, tuple[Any, ...]]] = []
        for family, _, _, _, address in socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM):
            try:
                self.check_address(host, str(address[0]))
            except EgressRefused as refused:
                found = found or refused
                continue
            usable.append((family, address))
        if not usable:
            assert found is not None  # getaddrinfo answers at least one address or raises
            raise found
        return usable


def connect(
    host: str,
    port: int,
    timeout: float | None,
    source_address: tuple[str, int] | None,
    policy: EgressPolicy,
) -> socket.socket:
    """`socket.create_connection`, dialling only the addresses `policy` admits for `host`.

    The name is resolved once here and the very addresses checked are the ones dialled: DNS
    rebinding between a check and the connect has nothing to rebind."""
    if policy.is_trusted(host, port):
        return socket.create_connection((host, port), timeout, source_address)
    error: OSError | None = None
    for family, address in policy.admitted(host, port):
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            if isinstance(timeout, int | float):  # not socket's "global default" sentinel
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(address)
            return sock
        except OSError as failed:
            error = failed
            sock.close()
    assert error is not None
    raise error

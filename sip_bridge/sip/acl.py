"""Inbound source filtering: which peers may talk to the bridge, and how fast.

A bridge on a public address is probed by SIP scanners within minutes. The ACL tells a
configured trunk's or PBX's addresses from the rest; the rate limiter caps what any one
source can make the bridge do. Both are pure: addresses and an explicit clock in, a yes/no
out. :mod:`sip_bridge.sip.admission` applies them to new INVITEs.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["RateLimiter", "Silencer", "SourceAcl", "normalize_ip"]

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


def _parse_ip(ip: str) -> IpAddress | None:
    """The address, with IPv4-mapped IPv6 (``::ffff:a.b.c.d``) unwrapped to IPv4."""
    try:
        addr = ipaddress.ip_address(ip.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.scope_id is not None:  # fe80::1%eth0: the zone does not change who it is
            addr = ipaddress.IPv6Address(str(addr).split("%", 1)[0])
        if addr.ipv4_mapped is not None:
            return addr.ipv4_mapped
    return addr


def normalize_ip(ip: str) -> str:
    """Canonical text of ``ip`` (so ``::FFFF:1.2.3.4``, ``1.2.3.4`` are one source); else as is."""
    addr = _parse_ip(ip)
    return str(addr) if addr is not None else ip


class SourceAcl:
    """An allow-list of IPv4/IPv6 CIDRs (a bare address is a /32 or /128).

    A dual-stack socket reports IPv4 peers as ``::ffff:a.b.c.d``, so mapped addresses are
    matched against the IPv4 entries, and a ``::ffff:0:0/96``-style entry is turned into its
    IPv4 equivalent. Entries with host bits set (``10.0.0.1/8``) are rejected: they are
    almost always a typo for a narrower range. An empty list allows nothing.
    """

    def __init__(self, cidrs: list[str]) -> None:
        v4: list[ipaddress.IPv4Network] = []
        v6: list[ipaddress.IPv6Network] = []
        for cidr in cidrs:
            try:
                net = ipaddress.ip_network(cidr.strip(), strict=True)
            except ValueError as exc:
                raise ValueError(f"invalid CIDR {cidr!r} in ACL: {exc}") from exc
            if isinstance(net, ipaddress.IPv6Network) and net.subnet_of(_MAPPED):
                base = net.network_address.ipv4_mapped
                assert base is not None
                v4.append(ipaddress.IPv4Network(f"{base}/{net.prefixlen - 96}"))
            elif isinstance(net, ipaddress.IPv4Network):
                v4.append(net)
            else:
                v6.append(net)
        self.v4: tuple[ipaddress.IPv4Network, ...] = tuple(ipaddress.collapse_addresses(v4))
        self.v6: tuple[ipaddress.IPv6Network, ...] = tuple(ipaddress.collapse_addresses(v6))

    def allows(self, ip: str) -> bool:
        """Whether packets from ``ip`` are accepted; unparseable addresses never are."""
        addr = _parse_ip(ip)
        if isinstance(addr, ipaddress.IPv4Address):
            return any(addr in net for net in self.v4)
        if isinstance(addr, ipaddress.IPv6Address):
            return any(addr in net for net in self.v6)
        return False


@dataclass(slots=True)
class _Bucket:
    tokens: float
    last: float


class RateLimiter:
    """Token bucket per source IP, in bounded memory.

    Each source may send ``burst`` messages at once and ``rate_per_s`` on average. A source
    idle for ``burst / rate_per_s`` seconds has a full bucket again, which is what a new
    entry gets, so such entries are evicted without changing any answer. The table is an
    LRU capped at ``max_sources``: under a flood of distinct (spoofed) sources the least
    recently seen is dropped, which at worst gives it a fresh bucket, never unbounded memory.
    ``now`` is any monotonic clock in seconds; time going backwards is treated as no time.
    """

    def __init__(
        self, rate_per_s: float, burst: float, now: float, max_sources: int = 10_000
    ) -> None:
        if not rate_per_s > 0:
            raise ValueError("rate_per_s must be positive")
        if not burst >= 1:
            raise ValueError("burst must be >= 1")
        if max_sources < 1:
            raise ValueError("max_sources must be >= 1")
        self.rate_per_s = float(rate_per_s)
        self.burst = float(burst)
        self.max_sources = max_sources
        self.refill_s = self.burst / self.rate_per_s  # idle this long == a fresh source
        self._now = now
        self._table: OrderedDict[str, _Bucket] = OrderedDict()
        self.evicted_idle = 0
        self.evicted_lru = 0

    def __len__(self) -> int:
        return len(self._table)

    def allow(self, ip: str, now: float) -> bool:
        """Take one token for ``ip`` at time ``now``; False means drop the message."""
        now = max(now, self._now)
        self._now = now
        key = normalize_ip(ip)
        self.expire(now)
        b = self._table.get(key)
        if b is None:
            if len(self._table) >= self.max_sources:
                self._table.popitem(last=False)
                self.evicted_lru += 1
            b = self._table[key] = _Bucket(self.burst, now)
        else:
            self._table.move_to_end(key)
            b.tokens = min(self.burst, b.tokens + (now - b.last) * self.rate_per_s)
            b.last = now
        if b.tokens >= 1.0:
            b.tokens -= 1.0
            return True
        return False

    def expire(self, now: float) -> int:
        """Drop sources idle long enough to have refilled; returns how many went.

        The table is in last-seen order, so this only looks at the stale front: amortised
        O(1) per call.
        """
        gone = 0
        table = self._table
        while table:
            key, b = next(iter(table.items()))
            if now - b.last < self.refill_s:
                break
            del table[key]
            gone += 1
        self.evicted_idle += gone
        return gone


class Silencer:
    """Sources refused again and again are not answered at all for a while.

    Even a stateless 403 or 503 costs a parse, a response and a send. A source refused
    ``after`` times in a row without being admitted once is a flood or a scanner: its
    datagrams are dropped unread until it has been quiet for ``quiet_s`` (each dropped
    datagram restarts that wait). Keys are the source address as the transport gives it
    (one form per peer); the table is an LRU capped at ``max_sources``, like
    :class:`RateLimiter`'s.
    """

    def __init__(self, after: int, quiet_s: float, max_sources: int = 10_000) -> None:
        if after < 1 or not quiet_s > 0 or max_sources < 1:
            raise ValueError("need after >= 1, quiet_s > 0 and max_sources >= 1")
        self.after = after
        self.quiet_s = float(quiet_s)
        self.max_sources = max_sources
        self._table: OrderedDict[str, list[float]] = OrderedDict()  # ip -> [refusals, last]
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._table)

    def refused(self, ip: str, now: float) -> None:
        entry = self._table.get(ip)
        if entry is None:
            if len(self._table) >= self.max_sources:
                self._table.popitem(last=False)
            self._table[ip] = [1.0, now]
            return
        self._table.move_to_end(ip)
        entry[0] += 1.0
        entry[1] = now

    def admitted(self, ip: str) -> None:
        self._table.pop(ip, None)

    def silenced(self, ip: str, now: float) -> bool:
        """Whether to drop a datagram from ``ip`` unread (counted in ``dropped``)."""
        if not self._table:
            return False
        entry = self._table.get(ip)
        if entry is None or entry[0] < self.after:
            return False
        if now - entry[1] > self.quiet_s:
            del self._table[ip]  # quiet long enough: heard again, from a clean slate
            return False
        entry[1] = now
        self.dropped += 1
        return True

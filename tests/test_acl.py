"""SourceAcl CIDR matching and the per-source token-bucket RateLimiter (simulated time)."""

from __future__ import annotations

import pytest

from sip_bridge.sip.acl import RateLimiter, Silencer, SourceAcl, normalize_ip


@pytest.mark.parametrize(
    ("ip", "allowed"),
    [
        ("10.0.0.0", True),  # network address is inside
        ("10.255.255.255", True),  # broadcast address is inside
        ("11.0.0.0", False),  # one past the end
        ("9.255.255.255", False),  # one before
        ("192.168.1.7", True),  # a bare address is a /32
        ("192.168.1.8", False),
        ("203.0.113.64", True),  # /26 boundaries
        ("203.0.113.127", True),
        ("203.0.113.63", False),
        ("203.0.113.128", False),
        ("2001:db8::1", True),
        ("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", True),
        ("2001:db9::", False),
        ("2001:DB8::ABCD", True),  # case-insensitive
        ("::1", True),  # bare IPv6 is a /128
        ("::2", False),
        ("[2001:db8::5]", True),  # bracketed as in a Via host
        ("fe80::1%eth0", True),  # zone id ignored
        ("fe80::2", False),
        ("not-an-ip", False),
        ("", False),
        ("10.0.0.256", False),
    ],
)
def test_cidr_matching(ip: str, allowed: bool) -> None:
    acl = SourceAcl(
        ["10.0.0.0/8", "192.168.1.7", "203.0.113.64/26", "2001:db8::/32", "::1", "fe80::1/128"]
    )
    assert acl.allows(ip) is allowed


def test_ipv4_mapped_ipv6_sources_match_ipv4_entries() -> None:
    acl = SourceAcl(["198.51.100.0/24"])
    assert acl.allows("::ffff:198.51.100.9")
    assert acl.allows("::FFFF:c633:6409")  # same address in hex
    assert not acl.allows("::ffff:198.51.101.9")
    assert not acl.allows("64:ff9b::c633:6409")  # NAT64 prefix is not a mapped address


def test_mapped_cidr_entries_become_ipv4() -> None:
    acl = SourceAcl(["::ffff:192.0.2.0/120"])
    assert acl.v4 and not acl.v6
    assert acl.allows("192.0.2.200")
    assert acl.allows("::ffff:192.0.2.1")
    assert not acl.allows("192.0.3.1")


def test_catch_all_and_empty() -> None:
    assert SourceAcl(["0.0.0.0/0"]).allows("8.8.8.8")
    assert not SourceAcl(["0.0.0.0/0"]).allows("2001:db8::1")
    assert SourceAcl(["::/0"]).allows("2001:db8::1")
    assert not SourceAcl([]).allows("127.0.0.1")


def test_overlapping_entries_are_collapsed() -> None:
    acl = SourceAcl(["10.0.0.0/8", "10.1.0.0/16", "10.2.3.4"])
    assert len(acl.v4) == 1
    assert acl.allows("10.1.2.3")


@pytest.mark.parametrize("bad", ["10.0.0.0/33", "10.0.0.1/8", "banana", "2001:db8::/129", ""])
def test_invalid_cidr_raises_naming_it(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid CIDR") as info:
        SourceAcl(["10.0.0.0/8", bad])
    assert repr(bad) in str(info.value)


def test_normalize_ip() -> None:
    assert normalize_ip("::ffff:1.2.3.4") == "1.2.3.4"
    assert normalize_ip("2001:DB8:0:0::1") == "2001:db8::1"
    assert normalize_ip("junk") == "junk"


def test_burst_then_steady_rate() -> None:
    rl = RateLimiter(rate_per_s=10, burst=5, now=0.0)
    assert [rl.allow("1.2.3.4", 0.0) for _ in range(7)] == [True] * 5 + [False] * 2
    # 10/s refill: one token every 100 ms.
    assert not rl.allow("1.2.3.4", 0.05)
    assert rl.allow("1.2.3.4", 0.1)
    assert not rl.allow("1.2.3.4", 0.1)
    # Over 10 simulated seconds at 100 attempts/s, about rate * 10 (+ leftover) get through.
    t, passed = 0.1, 0
    for _ in range(1000):
        t += 0.01
        passed += rl.allow("1.2.3.4", t)
    assert 99 <= passed <= 101


def test_sources_are_independent_and_spellings_are_one_source() -> None:
    rl = RateLimiter(rate_per_s=1, burst=2, now=0.0)
    assert rl.allow("1.2.3.4", 0.0) and rl.allow("::ffff:1.2.3.4", 0.0)
    assert not rl.allow("1.2.3.4", 0.0)  # the mapped spelling used the same bucket
    assert rl.allow("5.6.7.8", 0.0)
    assert rl.allow("2001:db8::1", 0.0)
    assert not rl.allow("1.2.3.4", 0.5)
    assert rl.allow("1.2.3.4", 1.0)


def test_bucket_never_exceeds_burst_after_long_idle() -> None:
    rl = RateLimiter(rate_per_s=2, burst=3, now=0.0)
    assert rl.allow("a", 0.0)
    results = [rl.allow("a", 1000.0) for _ in range(5)]
    assert results == [True, True, True, False, False]


def test_time_going_backwards_grants_nothing_extra() -> None:
    rl = RateLimiter(rate_per_s=1, burst=1, now=10.0)
    assert rl.allow("a", 10.0)
    assert not rl.allow("a", 5.0)
    assert not rl.allow("a", 10.5)
    assert rl.allow("a", 11.0)


def test_idle_sources_are_evicted() -> None:
    rl = RateLimiter(rate_per_s=5, burst=10, now=0.0)  # refilled after 2 s
    for i in range(100):
        rl.allow(f"10.0.0.{i}", 0.0)
    assert len(rl) == 100
    rl.allow("10.0.1.1", 1.9)
    assert len(rl) == 101
    rl.allow("10.0.1.2", 2.0)
    assert len(rl) == 2  # the first 100 had refilled and were dropped
    assert rl.evicted_idle == 100
    assert rl.expire(10.0) == 2 and len(rl) == 0


def test_memory_bound_under_100k_distinct_sources() -> None:
    rl = RateLimiter(rate_per_s=1, burst=5, now=0.0, max_sources=10_000)
    biggest = 0
    for i in range(100_000):
        ip = f"{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}.1"
        assert rl.allow(ip, i * 1e-5)  # 1 s in all: nobody goes idle long enough
        biggest = max(biggest, len(rl))
    assert biggest == 10_000
    assert rl.evicted_lru == 90_000
    # A flood does not evict a source that keeps talking (LRU, not FIFO): keep one busy.
    rl2 = RateLimiter(rate_per_s=1000, burst=5, now=0.0, max_sources=100)
    for i in range(10_000):
        rl2.allow(f"2001:db8::{i:x}", i * 1e-6)
        if i % 50 == 0:
            rl2.allow("192.0.2.1", i * 1e-6)
        assert len(rl2) <= 100
    assert "192.0.2.1" in rl2._table


@pytest.mark.parametrize(
    "kwargs", [{"rate_per_s": 0}, {"burst": 0.5}, {"max_sources": 0}, {"rate_per_s": -1}]
)
def test_bad_parameters(kwargs: dict[str, float]) -> None:
    args: dict[str, float] = {"rate_per_s": 1, "burst": 1, "now": 0.0, **kwargs}
    with pytest.raises(ValueError):
        RateLimiter(**args)  # type: ignore[arg-type]


def test_silencer_drops_a_source_refused_too_often_until_it_is_quiet() -> None:
    s = Silencer(after=3, quiet_s=10.0)
    for t in (0.0, 0.1):
        s.refused("192.0.2.9", t)
    assert not s.silenced("192.0.2.9", 0.2)  # two refusals: still answered
    s.refused("192.0.2.9", 0.3)
    assert s.silenced("192.0.2.9", 0.4) and s.silenced("192.0.2.9", 9.0)
    assert not s.silenced("192.0.2.10", 9.0)  # another source is answered
    assert s.silenced("192.0.2.9", 18.9)  # each dropped datagram restarts the quiet wait
    assert not s.silenced("192.0.2.9", 30.0) and len(s) == 0  # quiet 11 s: heard again
    assert s.dropped == 3
    for t in range(5):  # an admission in between starts the count again
        s.refused("198.51.100.1", float(t))
        if t == 1:
            s.admitted("198.51.100.1")
    assert s.silenced("198.51.100.1", 5.0)  # refused 3 times since, the last at 4
    s.admitted("198.51.100.1")
    assert not s.silenced("198.51.100.1", 5.0)


def test_silencer_memory_is_bounded() -> None:
    s = Silencer(after=1, quiet_s=60.0, max_sources=100)
    for i in range(10_000):
        s.refused(f"10.0.{i // 256}.{i % 256}", 0.0)
    assert len(s) == 100 and s.silenced("10.0.39.15", 1.0)  # the newest are kept
    with pytest.raises(ValueError):
        Silencer(after=0, quiet_s=1.0)

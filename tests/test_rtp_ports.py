"""RtpPortPool: even ports from the range, real loopback sockets, exhaustion and release."""

from __future__ import annotations

import asyncio
import random
import socket

import pytest

from sip_bridge.media.rtp_ports import PortsExhausted, RtpPortPool


class Sink(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.got: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.got.put_nowait(data)


def _free_range(pairs: int, host: str = "127.0.0.1") -> tuple[int, int]:
    """An even-aligned range of `pairs` RTP/RTCP pairs nobody holds right now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    rng = random.Random()
    for _ in range(200):
        low = rng.randrange(20000, 60000, 2)
        socks = []
        try:
            for p in range(low, low + 2 * pairs):
                s = socket.socket(family, socket.SOCK_DGRAM)
                socks.append(s)
                s.bind((host, p))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return low, low + 2 * pairs - 1
    raise AssertionError("no free port range found")


def test_allocates_even_ports_that_really_receive() -> None:
    async def main() -> None:
        low, high = _free_range(4)
        pool = RtpPortPool(low, high)
        assert pool.capacity == 4
        leases = [await pool.bind("127.0.0.1", Sink) for _ in range(3)]
        ports = [lease.port for lease in leases]
        assert len(set(ports)) == 3
        assert all(p % 2 == 0 and low <= p and p + 1 <= high for p in ports)
        assert pool.in_use == frozenset(ports) and pool.free == 1
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for lease in leases:
                s.sendto(b"hello %d" % lease.port, ("127.0.0.1", lease.port))
        for lease in leases:
            got = await asyncio.wait_for(lease.protocol.got.get(), 2)
            assert got == b"hello %d" % lease.port
        for lease in leases:
            lease.close()
        assert pool.in_use == frozenset(ports)  # asyncio closes sockets on the next tick
        await asyncio.sleep(0)
        assert pool.in_use == frozenset()

    asyncio.run(main())


def test_exhaustion_raises_and_release_gives_the_port_back() -> None:
    async def main() -> None:
        low, high = _free_range(2)
        pool = RtpPortPool(low, high)
        a = await pool.bind("127.0.0.1", Sink)
        b = await pool.bind("127.0.0.1", Sink)
        with pytest.raises(PortsExhausted, match=rf"{low}\.\.{high}: 2 held by calls"):
            await pool.bind("127.0.0.1", Sink)
        await a.aclose()
        a.close()  # idempotent
        assert pool.in_use == frozenset({b.port})
        c = await pool.bind("127.0.0.1", Sink)
        assert c.port == a.port
        # the socket really was closed: the port can be bound again once released
        await c.aclose()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", a.port))
        b.close()

    asyncio.run(main())


def test_port_held_by_another_process_is_skipped() -> None:
    async def main() -> None:
        low, high = _free_range(3)
        pool = RtpPortPool(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as squatter:
            squatter.bind(("127.0.0.1", low))
            lease = await pool.bind("127.0.0.1", Sink)
            assert lease.port == low + 2
            assert pool.busy_elsewhere == 1
            other = await pool.bind("127.0.0.1", Sink)
            assert other.port == low + 4
            with pytest.raises(PortsExhausted, match="1 busy elsewhere"):
                await pool.bind("127.0.0.1", Sink)
            lease.close()
            other.close()

    asyncio.run(main())


def test_released_port_is_reused_last() -> None:
    async def main() -> None:
        low, high = _free_range(3)
        pool = RtpPortPool(low, high)
        first = await pool.bind("127.0.0.1", Sink)
        await first.aclose()
        second = await pool.bind("127.0.0.1", Sink)
        third = await pool.bind("127.0.0.1", Sink)
        assert (first.port, second.port, third.port) == (low, low + 2, low + 4)
        second.close()
        third.close()

    asyncio.run(main())


def test_ipv6_loopback() -> None:
    async def main() -> None:
        low, high = _free_range(1, "::1")
        pool = RtpPortPool(low, high)
        lease = await pool.bind("::1", Sink)
        assert lease.port == low
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.sendto(b"v6", ("::1", lease.port))
        assert await asyncio.wait_for(lease.protocol.got.get(), 2) == b"v6"
        await lease.aclose()
        assert pool.free == 1

    asyncio.run(main())


def test_other_bind_errors_propagate_without_leaking_the_port() -> None:
    async def main() -> None:
        low, high = _free_range(1)
        pool = RtpPortPool(low, high)
        with pytest.raises(OSError) as info:
            await pool.bind("192.0.2.1", Sink)  # TEST-NET-1: not a local address
        assert not isinstance(info.value, PortsExhausted)
        assert pool.in_use == frozenset()

    asyncio.run(main())


def test_range_validation() -> None:
    assert RtpPortPool(10001, 10004).capacity == 1  # only 10002/10003 fits
    assert RtpPortPool(10000, 10006).capacity == 3  # 10006 has no 10007 for RTCP
    for low, high in [(10000, 10000), (10001, 10002), (0, 10), (20, 10), (65534, 70000)]:
        with pytest.raises(ValueError):
            RtpPortPool(low, high)

"""The pool of local RTP ports: even ports from a configured range, bound as asyncio UDP.

RTP goes on even ports and RTCP on the next odd one (RFC 3550 section 11), so only even
ports are handed out and ``port + 1`` must also lie in the range. Ports are taken
round-robin after the last one handed out, so a port freed by a call is reused last:
stray late packets of the old call then rarely land in a new one. A port some other
process holds (EADDRINUSE) is skipped, not fatal; when every port has been tried, the
pool raises :class:`PortsExhausted`.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["PortsExhausted", "RtpPortLease", "RtpPortPool"]

P = TypeVar("P", bound=asyncio.DatagramProtocol)


class PortsExhausted(RuntimeError):
    """No even port of the range could be bound (all in use by calls or by others)."""


class RtpPortLease(Generic[P]):
    """One bound RTP socket; :meth:`close` closes it and gives the port back (idempotent).

    asyncio closes a transport's socket on the next loop iteration, so the port goes back
    to the pool then too (a rebind before that would fail with EADDRINUSE); ``await
    aclose()`` returns once it is back.
    """

    def __init__(
        self, pool: RtpPortPool, port: int, transport: asyncio.DatagramTransport, protocol: P
    ) -> None:
        self.pool = pool
        self.port = port
        self.transport = transport
        self.protocol = protocol
        self.closed = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.transport.close()  # schedules the socket's close with call_soon
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.pool.release(self.port)
        else:
            loop.call_soon(self.pool.release, self.port)  # FIFO: after the socket closed

    async def aclose(self) -> None:
        """Close and wait until the port is back in the pool."""
        self.close()
        await asyncio.sleep(0)


class RtpPortPool:
    """Even ports in ``low..high`` (inclusive, ``port + 1 <= high`` for RTCP)."""

    def __init__(self, low: int, high: int) -> None:
        first = low + (low % 2)
        if not 0 < low <= high <= 65535:
            raise ValueError("need 0 < low <= high <= 65535")
        self.low = low
        self.high = high
        self._ports = list(range(first, high, 2))  # p + 1 <= high
        if not self._ports:
            raise ValueError(f"range {low}..{high} holds no even RTP/RTCP port pair")
        self._in_use: set[int] = set()
        self._next = 0  # index into _ports where the next search starts
        self.busy_elsewhere = 0  # EADDRINUSE seen (ports held by other processes)

    @property
    def capacity(self) -> int:
        return len(self._ports)

    @property
    def in_use(self) -> frozenset[int]:
        return frozenset(self._in_use)

    @property
    def free(self) -> int:
        return len(self._ports) - len(self._in_use)

    def release(self, port: int) -> None:
        """Give a port back (no-op if it is not held)."""
        self._in_use.discard(port)

    async def bind(self, host: str, protocol_factory: Callable[[], P]) -> RtpPortLease[P]:
        """Bind a UDP endpoint on ``host`` (IPv4 or IPv6 literal) at the next free even port.

        Raises :class:`PortsExhausted` when none is left; other bind errors (a host that
        is not local, say) propagate at once.
        """
        loop = asyncio.get_running_loop()
        n = len(self._ports)
        busy = 0
        for i in range(n):
            idx = (self._next + i) % n
            port = self._ports[idx]
            if port in self._in_use:
                continue
            self._in_use.add(port)  # reserve across the await: concurrent binds differ
            try:
                transport, protocol = await loop.create_datagram_endpoint(
                    protocol_factory, local_addr=(host, port)
                )
            except OSError as exc:
                self._in_use.discard(port)
                if exc.errno != errno.EADDRINUSE:
                    raise
                busy += 1
                self.busy_elsewhere += 1
                continue
            self._next = (idx + 1) % n
            return RtpPortLease(self, port, transport, protocol)
        raise PortsExhausted(
            f"no free RTP port in {self.low}..{self.high}: {len(self._in_use)} held by calls,"
            f" {busy} busy elsewhere, {n} in the range"
        )

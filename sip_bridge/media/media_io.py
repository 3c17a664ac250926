"""The I/O edges of one call's media: the RTP socket's asyncio protocol (with the port lease
that exists before the call's media does), the polled socket the media clock reads once
the call runs, and the packetiser of our audio."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import time
from typing import Protocol

from sip_bridge.media.rtp import RtpSender
from sip_bridge.media.rtp_ports import RtpPortLease, RtpPortPool

__all__ = [
    "AudioRtpSender",
    "Datagram",
    "DatagramSink",
    "MediaSocket",
    "PolledSocket",
    "RtpLease",
    "RtpProtocol",
    "realtime_offset",
    "reserve_rtp_port",
]

_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # 35 on Linux
_SOL_SOCKET = socket.SOL_SOCKET
_TIMESPEC = struct.Struct("@qq")
_ANC_SPACE = socket.CMSG_SPACE(_TIMESPEC.size)

#: A datagram read by the clock: (data, source address, arrival time on the loop's clock).
Datagram = tuple[bytes, tuple[str, int], float]


class DatagramSink(Protocol):
    """What receives a call's RTP datagrams from asyncio (a call's media: before the clock
    polls its socket, and where the loop has no epoll)."""

    send_errors: int

    def on_datagram(self, data: bytes, addr: tuple[str, int], now: float | None = None) -> None: ...


class RtpProtocol(asyncio.DatagramProtocol):
    def __init__(self, media: DatagramSink | None = None) -> None:
        self.media = media  # None while the port is reserved but the call not set up

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if self.media is not None:
            self.media.on_datagram(data, (str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        if self.media is not None:
            self.media.send_errors += 1  # ICMP port unreachable and the like: keep going


RtpLease = RtpPortLease[RtpProtocol]


async def reserve_rtp_port(pool: RtpPortPool, host: str) -> RtpLease:
    """Bind a port before the media parameters are known.

    SIP needs our port for the SDP answer before the call's media can be built;
    hand the lease to :class:`~sip_bridge.media.call_media.CallMedia` afterwards (packets
    before that are dropped).
    """
    return await pool.bind(host, RtpProtocol)


class MediaSocket(Protocol):
    """What a call's media uses of its RTP socket: a :class:`PolledSocket`, or in tests and
    benchmarks a fake (a protocol, so the compiled media path does not insist on the class).
    """

    send_errors: int

    def fileno(self) -> int: ...

    def read(self, loop_now: float, offset: float) -> Datagram | None: ...

    def drain(self, loop_now: float, limit: int = 64) -> list[Datagram]: ...

    def sendto(self, data: bytes, dest: tuple[str, int]) -> None: ...

    def close(self) -> None: ...


class PolledSocket:
    """A call's RTP socket read by polling from the media clock's tick, not by asyncio.

    Why: asyncio's datagram path (epoll wake-up, transport, protocol) cost ~37 us a packet
    at 100 calls, draining each socket once per 20 ms tick ~12 us (measured). Arrival times
    stay exact: the kernel stamps each datagram (SO_TIMESTAMPNS), converted to the loop's
    clock; without stamps the time of the read is used. The asyncio transport stays for the
    lease (bind, close, port accounting) with its reading paused; this socket is a dup of
    its descriptor, so both see the same datagrams and the same non-blocking mode.
    """

    def __init__(self, transport: asyncio.DatagramTransport) -> None:
        ts = transport.get_extra_info("socket")
        self.sock = socket.socket(ts.family, socket.SOCK_DGRAM, fileno=os.dup(ts.fileno()))
        self.sock.setblocking(False)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            self.stamped = True
        except OSError:
            self.stamped = False
        # Selector loops pause a datagram transport in later 3.11 releases (3.11.7 does); in
        # Debian 12's 3.11.2 pause_reading raises NotImplementedError. Unpaused, asyncio
        # keeps reading too, harmlessly: its protocol hands datagrams to the same receiver.
        pause = getattr(transport, "pause_reading", None)
        if pause is not None:
            with contextlib.suppress(NotImplementedError):
                pause()
        self.send_errors = 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self, loop_now: float, offset: float) -> Datagram | None:
        """One queued datagram, or None when the queue is empty.

        ``offset`` is :func:`realtime_offset`: it maps the kernel's realtime stamp onto the
        loop's clock; arrivals are capped at ``loop_now``.
        """
        for _ in range(8):
            try:
                data, anc, _, addr = self.sock.recvmsg(2048, _ANC_SPACE)
            except (BlockingIOError, InterruptedError):
                return None
            except OSError:  # an ICMP error queued for what we sent: counted, read on
                self.send_errors += 1
                continue
            arrival = loop_now
            for level, kind, raw in anc:
                if level == _SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                    sec, nsec = _TIMESPEC.unpack_from(raw)
                    stamp = sec + nsec * 1e-9 - offset
                    if stamp < loop_now:
                        arrival = stamp
            if len(addr) != 2:  # IPv6: (host, port, flowinfo, scope_id)
                addr = (addr[0], addr[1])
            return data, addr, arrival
        return None

    def drain(self, loop_now: float, limit: int = 64) -> list[Datagram]:
        """Up to ``limit`` queued datagrams as (data, source, arrival on the loop clock); a
        flood beyond waits for the next tick (and overflows the kernel buffer, not us)."""
        out: list[Datagram] = []
        offset = realtime_offset()
        for _ in range(limit):
            d = self.read(loop_now, offset)
            if d is None:
                break
            out.append(d)
        return out

    def sendto(self, data: bytes, dest: tuple[str, int]) -> None:
        try:
            self.sock.sendto(data, dest)
        except OSError:  # full buffer, ICMP unreachable and the like: keep going
            self.send_errors += 1

    def close(self) -> None:
        self.sock.close()


_RTP_HEADER = struct.Struct("!BBHII")


class AudioRtpSender(RtpSender):
    """:class:`RtpSender` whose packets (never CSRCs, extensions or padding on our audio
    stream) are packed straight from its counters: the same bytes without building and
    validating an :class:`~sip_bridge.media.rtp.RtpPacket` per frame (~12 us -> ~2 us)."""

    def next_packet(
        self,
        payload: bytes,
        samples: int,
        marker: bool = False,
        payload_type: int | None = None,
    ) -> bytes:
        if samples < 0:
            raise ValueError("samples must be >= 0")
        pt = self.payload_type if payload_type is None else payload_type
        if not 0 <= pt < 128:
            raise ValueError(f"payload type {pt} out of range")
        b1 = pt | 0x80 if marker or self._marker_pending else pt
        data = _RTP_HEADER.pack(0x80, b1, self.sequence, self.timestamp, self.ssrc) + payload
        self.advance(samples, len(payload))
        return data


def realtime_offset() -> float:
    """``time.time()`` minus the loop's clock (asyncio's is ``time.monotonic()``), read now.

    Taken from fresh readings rather than against a ``now`` captured earlier in the tick: a
    stale ``now`` would stamp every packet early by the tick's age so far. The wall clock
    is read between two loop-clock readings, up to three times, and the tightest pair is
    kept: a thread preempted between two reads (tens of ms on a loaded core, seen as a
    drain whose packets all looked 50 ms late) would shift every stamp by that much."""
    best_gap = 1.0
    offset = 0.0
    for _ in range(3):
        before = time.monotonic()
        wall = time.time()
        after = time.monotonic()
        if after - before < best_gap:
            best_gap, offset = after - before, wall - (before + after) / 2
        if best_gap < 50e-6:
            break
    return offset

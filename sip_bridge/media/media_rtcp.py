"""One call's RTCP leg: an :class:`RtcpSession` plus where its packets go and what came back.

Kept apart from :mod:`sip_bridge.media.call_media` so the RTP chain stays readable. The
session counts
what we send and receive; this wrapper adds the destination (RTP port + 1, an ``a=rtcp``
port, or the RTP address itself under rtcp-mux), optional latching of that destination
and the peer's latest view of our stream for :class:`~sip_bridge.media.call_media.MediaStats`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from dataclasses import replace as _replace
from typing import cast

from sip_bridge.media.rtcp import RtcpError
from sip_bridge.media.rtcp_session import RtcpReport, RtcpSession
from sip_bridge.media.srtp import SrtpContext

__all__ = ["RtcpLink", "RtcpPeerStats", "RtcpProtocol", "bind_rtcp"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RtcpPeerStats:
    """The peer's latest report about our stream (None until one arrived)."""

    rtcp_in: int = 0  # RTCP compound packets digested (both sockets)
    rtcp_out: int = 0
    rtcp_malformed: int = 0
    fraction_lost_pct: float | None = None
    cumulative_lost: int | None = None
    jitter_ms: float | None = None
    rtt_ms: float | None = None  # None until the peer echoes one of our SRs (LSR/DLSR)
    last_report_at: float | None = None  # loop time of the last report block about us
    peer_bye: bool = False


class RtcpLink:
    """Sans-I/O glue around :class:`RtcpSession`; the caller owns sockets and the clock."""

    def __init__(
        self,
        session: RtcpSession,
        remote: tuple[str, int],
        *,
        mux: bool,
        latch: bool,
    ) -> None:
        self.session = session
        self.remote = remote  # where reports go (the RTP address itself under rtcp-mux)
        self.mux = mux
        self.latch = latch
        self.latched = False
        self.stats = RtcpPeerStats()
        self.srtp: SrtpContext | None = None  # SRTCP on the RTCP socket (the call's context)

    def retarget(self, remote: tuple[str, int], *, mux: bool, latch: bool) -> None:
        """A re-INVITE moved the peer: report there, latch afresh if latching."""
        self.remote, self.mux, self.latch, self.latched = remote, mux, latch, False

    def receive(self, data: bytes, source: tuple[str, int], now: float) -> list[RtcpReport]:
        """A compound RTCP packet from ``source``; a malformed one is counted, not raised."""
        s = self.stats
        try:
            reports = self.session.on_rtcp(data, now)
        except (RtcpError, ValueError):
            self.stats = _replace(s, rtcp_malformed=s.rtcp_malformed + 1)
            return []
        if self.latch and not self.latched and not self.mux:
            self.remote, self.latched = source, True
        bye = s.peer_bye or _has_bye(data)
        s = _replace(s, rtcp_in=s.rtcp_in + 1, peer_bye=bye)
        if reports:
            r = reports[-1]
            rtt = s.rtt_ms if r.rtt_s is None else r.rtt_s * 1000.0
            s = _replace(
                s,
                fraction_lost_pct=r.fraction_lost * 100.0,
                cumulative_lost=r.cumulative_lost,
                jitter_ms=r.jitter_s * 1000.0,
                rtt_ms=rtt,
                last_report_at=now,
            )
        self.stats = s
        return reports

    def due(self, now: float) -> bytes | None:
        """The next report if its time has come, else None."""
        if now < self.session.next_report_time():
            return None
        return self._out(self.session.build_report(now))

    def bye(self, now: float, reason: str | None = None) -> bytes:
        return self._out(self.session.bye(now, reason))

    def _out(self, data: bytes) -> bytes:
        self.stats = _replace(self.stats, rtcp_out=self.stats.rtcp_out + 1)
        return data


def _has_bye(data: bytes) -> bool:
    """Walk the compound's headers for a BYE (PT 203); the session drops the source."""
    offset = 0
    while offset + 4 <= len(data):
        if data[offset + 1] == 203:
            return True
        offset += 4 * (int.from_bytes(data[offset + 2 : offset + 4], "big") + 1)
    return False


class RtcpProtocol(asyncio.DatagramProtocol):
    """The RTCP socket (RTP port + 1): hands datagrams to a callback with the loop time."""

    def __init__(self, link: RtcpLink) -> None:
        self.link = link
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # cast, not isinstance: asyncio's selector datagram transport is not registered
        # as a DatagramTransport subclass on every Python version.
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        now = asyncio.get_running_loop().time()
        srtp = self.link.srtp
        if srtp is not None:
            clear = srtp.unprotect_rtcp(data)
            if clear is None:
                return  # failed authentication or replay: counted, dropped
            data = clear
        self.link.receive(data, (str(addr[0]), int(addr[1])), now)

    def error_received(self, exc: Exception) -> None:
        log.debug("RTCP socket error: %s", exc)


async def bind_rtcp(
    rtp: asyncio.DatagramTransport, link: RtcpLink
) -> asyncio.DatagramTransport | None:
    """RTCP on RTP port + 1 (the pool keeps it free); None if taken (we report from RTP)."""
    host, port = rtp.get_extra_info("sockname")[:2]
    loop = asyncio.get_running_loop()
    try:
        transport, _ = await loop.create_datagram_endpoint(
            lambda: RtcpProtocol(link), local_addr=(str(host), int(port) + 1)
        )
    except OSError as exc:
        log.warning("RTCP port %d unavailable (%s)", int(port) + 1, exc)
        return None
    return transport

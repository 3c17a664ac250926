"""RTCP statistics (RFC 3550 A.3, A.8) and the per-call RTCP session, sans-I/O.

Packet formats live in :mod:`sip_bridge.media.rtcp`; this is what a call does with
them: count what arrived, report it, and read the peer's view of us (loss,
jitter, round-trip time).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from sip_bridge.media.rtcp import (
    RTCP_MIN_INTERVAL,
    SDES_CNAME,
    Bye,
    ReceiverReport,
    ReportBlock,
    RtcpPacket,
    SdesChunk,
    SenderReport,
    SourceDescription,
    check_field,
    ntp_from_seconds,
    ntp_middle32,
    parse_compound,
    serialize_compound,
)
from sip_bridge.media.rtp import InterarrivalJitter, unwrap_seq

__all__ = ["ReceptionStats", "RtcpReport", "RtcpSession", "rtcp_interval"]

_COMPENSATION = math.e - 1.5  # RFC 3550 6.3.1: undo the bias of timer reconsideration
_MAX_BLOCKS = 31
_UDP_IP_OVERHEAD = 28

# ---------------------------------------------------------------------------------------
# Statistics (RFC 3550 A.3, A.8) and the per-call session
# ---------------------------------------------------------------------------------------


class ReceptionStats:
    """What we have received from one source, reduced to a :class:`ReportBlock`.

    Sequence numbers are extended with :func:`~sip_bridge.media.rtp.unwrap_seq`; the base is the
    lowest extended number seen, so packets reordered before the first one still count as
    expected.  There is no A.1 probation/resync: a restarted source should use a new SSRC.
    """

    def __init__(self, ssrc: int, clock_rate: int) -> None:
        self.ssrc = ssrc
        self.received = 0
        self.base_seq: int | None = None
        self.max_seq: int | None = None
        self.jitter = InterarrivalJitter(clock_rate)
        self._expected_prior = 0
        self._received_prior = 0
        self.last_sr: tuple[int, float] | None = None  # (LSR, arrival time)

    def on_packet(self, seq: int, timestamp: int, arrival: float) -> None:
        self.on_untimed_packet(seq)
        self.jitter.update(arrival, timestamp)

    def on_untimed_packet(self, seq: int) -> None:
        """Count a packet for the loss figures only (:meth:`on_packet` adds the jitter).
        RFC 4733 events come here directly: their timestamp is the key's start, the same
        in every packet of a key, so it says nothing of jitter."""
        m = self.max_seq
        if m is not None and seq == (m + 1) & 0xFFFF:  # the next one: no unwrapping to do
            self.max_seq = m + 1
            self.received += 1
            return
        ext = unwrap_seq(self.max_seq, seq)
        self.max_seq = ext if self.max_seq is None else max(self.max_seq, ext)
        self.base_seq = ext if self.base_seq is None else min(self.base_seq, ext)
        self.received += 1

    @property
    def expected(self) -> int:
        if self.max_seq is None or self.base_seq is None:
            return 0
        return self.max_seq - self.base_seq + 1

    @property
    def cumulative_lost(self) -> int:
        """Signed: duplicates can push it below zero (RFC 3550 6.4.1)."""
        return self.expected - self.received

    def report_block(self, now: float) -> ReportBlock:
        """A report block as of ``now``; starts a new interval for fraction lost."""
        expected = self.expected
        expected_interval = expected - self._expected_prior
        lost_interval = expected_interval - (self.received - self._received_prior)
        self._expected_prior, self._received_prior = expected, self.received
        fraction = 0
        if expected_interval > 0 and lost_interval > 0:
            fraction = min(255, (lost_interval << 8) // expected_interval)
        cum = max(-(1 << 23), min((1 << 23) - 1, self.cumulative_lost))
        lsr = dlsr = 0
        if self.last_sr is not None:
            lsr = self.last_sr[0]
            dlsr = min(0xFFFF_FFFF, max(0, int((now - self.last_sr[1]) * 65536)))
        highest = (self.max_seq or 0) & 0xFFFF_FFFF
        jitter = min(0xFFFF_FFFF, int(self.jitter.jitter))
        return ReportBlock(self.ssrc, fraction, cum, highest, jitter, lsr, dlsr)


@dataclass(frozen=True, slots=True)
class RtcpReport:
    """A peer's view of our stream, from a report block about our SSRC."""

    reporter_ssrc: int
    fraction_lost: float  # 0..1 since the reporter's previous report
    cumulative_lost: int
    highest_seq: int
    jitter_s: float
    rtt_s: float | None  # None until the peer echoes one of our SRs


def rtcp_interval(
    members: int,
    senders: int,
    rtcp_bw: float,
    we_sent: bool,
    avg_rtcp_size: float,
    initial: bool,
    rand: float,
) -> float:
    """RFC 3550 A.7 deterministic interval times ``rand + 0.5`` (``rand`` in [0, 1))."""
    n = members
    if 0 < senders <= members * 0.25:
        if we_sent:
            rtcp_bw *= 0.25
            n = senders
        else:
            rtcp_bw *= 0.75
            n = members - senders
    t_min = RTCP_MIN_INTERVAL / 2 if initial else RTCP_MIN_INTERVAL
    t = max(avg_rtcp_size * n / rtcp_bw, t_min)
    return t * (rand + 0.5) / _COMPENSATION


class RtcpSession:
    """One RTP session's RTCP: counts what we send and receive, builds and reads reports.

    ``now`` is any monotonic clock in seconds; NTP time is ``now + ntp_offset`` (pass
    ``time.time() - time.monotonic() + NTP_UNIX_OFFSET`` in production).  ``rand``
    returns uniform [0, 1) for the interval randomisation.
    """

    def __init__(
        self,
        ssrc: int,
        clock_rate: int,
        cname: str,
        now: float,
        *,
        ntp_offset: float = 0.0,
        session_bw_bps: float = 64_000.0,
        rand: Callable[[], float] | None = None,
    ) -> None:
        check_field("ssrc", ssrc, 32)
        if clock_rate <= 0 or session_bw_bps <= 0:
            raise ValueError("clock_rate and session_bw_bps must be positive")
        self.ssrc = ssrc
        self.clock_rate = clock_rate
        self.cname = cname
        self.ntp_offset = ntp_offset
        self.sources: dict[int, ReceptionStats] = {}
        self.packet_count = 0
        self.octet_count = 0
        self._last_rtp: tuple[int, float] | None = None  # (rtp_ts, send time)
        self._we_sent = False
        self._rtcp_bw = session_bw_bps * 0.05 / 8  # octets/s
        self._avg_rtcp_size = 100.0 + _UDP_IP_OVERHEAD
        self._rand = rand if rand is not None else random.Random().random
        self._initial = True
        self._next = now + self._interval()

    def ntp(self, now: float) -> int:
        return ntp_from_seconds(now + self.ntp_offset)

    def _interval(self) -> float:
        senders = sum(1 for s in self.sources.values() if s.received) + int(self._we_sent)
        members = len(self.sources) + 1
        return rtcp_interval(
            members,
            senders,
            self._rtcp_bw,
            self._we_sent,
            self._avg_rtcp_size,
            self._initial,
            self._rand(),
        )

    def on_rtp_sent(self, packet_len: int, payload_len: int, rtp_ts: int, now: float) -> None:
        """Count a sent RTP packet (``packet_len`` kept for symmetry; SR counts payload)."""
        del packet_len
        self.packet_count = (self.packet_count + 1) & 0xFFFF_FFFF
        self.octet_count = (self.octet_count + payload_len) & 0xFFFF_FFFF
        self._last_rtp = (rtp_ts, now)
        self._we_sent = True

    def on_rtp_received(self, ssrc: int, seq: int, ts: int, now: float) -> None:
        stats = self.sources.get(ssrc)
        if stats is None:
            stats = self.sources[ssrc] = ReceptionStats(ssrc, self.clock_rate)
        m = stats.max_seq
        if m is not None and seq == (m + 1) & 0xFFFF:  # on_packet's in-order case, inlined
            stats.max_seq = m + 1
            stats.received += 1
            stats.jitter.update(now, ts)
            return
        stats.on_packet(seq, ts, now)

    def on_event_received(self, ssrc: int, seq: int) -> None:
        """An RFC 4733 event packet from ``ssrc``: in the loss figures, not in the jitter."""
        stats = self.sources.get(ssrc)
        if stats is None:
            stats = self.sources[ssrc] = ReceptionStats(ssrc, self.clock_rate)
        stats.on_untimed_packet(seq)

    def on_rtcp(self, data: bytes | bytearray | memoryview, now: float) -> list[RtcpReport]:
        """Digest a peer's compound packet; returns its report blocks about our SSRC."""
        reports: list[RtcpReport] = []
        arrival = ntp_middle32(self.ntp(now))
        for packet in parse_compound(data):
            if isinstance(packet, SenderReport) and packet.ssrc in self.sources:
                self.sources[packet.ssrc].last_sr = (ntp_middle32(packet.ntp_timestamp), now)
            if isinstance(packet, (SenderReport, ReceiverReport)):
                mine = (b for b in packet.reports if b.ssrc == self.ssrc)
                reports.extend(self._digest(packet.ssrc, b, arrival) for b in mine)
            elif isinstance(packet, Bye):
                for ssrc in packet.ssrcs:
                    self.sources.pop(ssrc, None)
        return reports

    def _digest(self, reporter: int, block: ReportBlock, arrival: int) -> RtcpReport:
        rtt = None
        if block.lsr:
            rtt = ((arrival - block.lsr - block.dlsr) & 0xFFFF_FFFF) / 65536.0
            if rtt > 3600.0:  # negative before the wrap: clock glitch or bogus report
                rtt = None
        return RtcpReport(
            reporter,
            block.fraction_lost / 256.0,
            block.cumulative_lost,
            block.highest_seq,
            block.jitter / self.clock_rate,
            rtt,
        )

    def next_report_time(self) -> float:
        return self._next

    def _report(self, now: float) -> list[RtcpPacket]:
        blocks = tuple(s.report_block(now) for s in list(self.sources.values())[:_MAX_BLOCKS])
        head: RtcpPacket
        if self._we_sent and self._last_rtp is not None:
            ts, sent_at = self._last_rtp
            rtp_ts = (ts + round((now - sent_at) * self.clock_rate)) & 0xFFFF_FFFF
            head = SenderReport(
                self.ssrc, self.ntp(now), rtp_ts, self.packet_count, self.octet_count, blocks
            )
        else:
            head = ReceiverReport(self.ssrc, blocks)
        cname = self.cname.encode("utf-8")[:255]
        return [head, SourceDescription((SdesChunk(self.ssrc, ((SDES_CNAME, cname),)),))]

    def _sent(self, data: bytes, now: float) -> bytes:
        size = len(data) + _UDP_IP_OVERHEAD
        self._avg_rtcp_size += (size - self._avg_rtcp_size) / 16.0
        self._initial = False
        self._next = now + self._interval()
        self._we_sent = False
        return data

    def build_report(self, now: float) -> bytes:
        """SR if we sent RTP since the last report, else RR; always with SDES CNAME."""
        return self._sent(serialize_compound(self._report(now)), now)

    def bye(self, now: float, reason: str | None = None) -> bytes:
        """Final compound packet: report, CNAME, then BYE (RFC 3550 6.6)."""
        raw = None if reason is None else reason.encode("utf-8")[:255]
        packets = [*self._report(now), Bye((self.ssrc,), raw)]
        return self._sent(serialize_compound(packets), now)

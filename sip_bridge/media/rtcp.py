"""RTCP (RFC 3550) packets and per-call statistics, sans-I/O.

Why: call-center operators want per-call loss, jitter and round-trip time, and some
trunks drop calls whose RTCP goes silent.  Everything here takes bytes and an explicit
``now`` (seconds on any monotonic clock) and returns values or bytes; the NTP wall clock
is ``now + ntp_offset`` so tests can place it anywhere, wraps included.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from sip_bridge.media.rtp import looks_like_rtcp

PT_SR = 200
PT_RR = 201
PT_SDES = 202
PT_BYE = 203
SDES_CNAME = 1
NTP_UNIX_OFFSET = 2_208_988_800  # seconds from 1900-01-01 to 1970-01-01
RTCP_MIN_INTERVAL = 5.0

_HDR = struct.Struct("!BBH")
_SENDER_INFO = struct.Struct("!IQIII")
_BLOCK = struct.Struct("!IIIIII")
_U32 = struct.Struct("!I")


class RtcpError(ValueError):
    """Malformed RTCP data, or a field that does not fit its wire width when building."""


def check_field(name: str, value: int, bits: int) -> None:
    if not 0 <= value < (1 << bits):
        raise RtcpError(f"{name} {value!r} out of range for {bits} bits")


def ntp_from_seconds(seconds: float) -> int:
    """64-bit NTP timestamp (32.32 fixed point, modulo 2**64) for seconds since 1900."""
    return round(seconds * 4294967296.0) & 0xFFFF_FFFF_FFFF_FFFF


def ntp_middle32(ntp: int) -> int:
    """The compact 16.16 form used by LSR (RFC 3550 6.4.1)."""
    return (ntp >> 16) & 0xFFFF_FFFF


@dataclass(frozen=True, slots=True)
class ReportBlock:
    """One reception report; ``cumulative_lost`` is signed (duplicates can make it < 0)."""

    ssrc: int
    fraction_lost: int  # loss since the previous report, in 1/256
    cumulative_lost: int  # 24-bit two's complement on the wire
    highest_seq: int  # extended highest sequence number received
    jitter: int  # timestamp units
    lsr: int = 0  # middle 32 bits of the last SR's NTP time, 0 if none
    dlsr: int = 0  # delay since that SR in 1/65536 s

    def serialize(self) -> bytes:
        check_field("ssrc", self.ssrc, 32)
        check_field("fraction_lost", self.fraction_lost, 8)
        if not -(1 << 23) <= self.cumulative_lost < (1 << 23):
            raise RtcpError(f"cumulative_lost {self.cumulative_lost} out of 24-bit range")
        for name in ("highest_seq", "jitter", "lsr", "dlsr"):
            check_field(name, getattr(self, name), 32)
        lost = (self.fraction_lost << 24) | (self.cumulative_lost & 0xFF_FFFF)
        return _BLOCK.pack(self.ssrc, lost, self.highest_seq, self.jitter, self.lsr, self.dlsr)

    @classmethod
    def parse(cls, data: bytes, offset: int) -> ReportBlock:
        ssrc, lost, highest, jitter, lsr, dlsr = _BLOCK.unpack_from(data, offset)
        cum = lost & 0xFF_FFFF
        if cum & 0x80_0000:
            cum -= 1 << 24
        return cls(ssrc, lost >> 24, cum, highest, jitter, lsr, dlsr)


@dataclass(frozen=True, slots=True)
class SenderReport:
    ssrc: int
    ntp_timestamp: int  # 64-bit NTP
    rtp_timestamp: int
    packet_count: int
    octet_count: int  # payload octets only
    reports: tuple[ReportBlock, ...] = ()


@dataclass(frozen=True, slots=True)
class ReceiverReport:
    ssrc: int
    reports: tuple[ReportBlock, ...] = ()


@dataclass(frozen=True, slots=True)
class SdesChunk:
    """Items as (type, raw bytes): PRIV and non-UTF-8 text survive a round trip."""

    ssrc: int
    items: tuple[tuple[int, bytes], ...] = ()

    @property
    def cname(self) -> str | None:
        for kind, value in self.items:
            if kind == SDES_CNAME:
                return value.decode("utf-8", "replace")
        return None


@dataclass(frozen=True, slots=True)
class SourceDescription:
    chunks: tuple[SdesChunk, ...] = ()


@dataclass(frozen=True, slots=True)
class Bye:
    ssrcs: tuple[int, ...] = ()
    reason: bytes | None = None


@dataclass(frozen=True, slots=True)
class UnknownRtcp:
    """APP, XR, RTPFB, ...: kept opaque so a compound packet still parses."""

    packet_type: int
    count: int
    payload: bytes


RtcpPacket = SenderReport | ReceiverReport | SourceDescription | Bye | UnknownRtcp


def _blocks(data: bytes, offset: int, count: int, end: int) -> tuple[ReportBlock, ...]:
    if offset + count * _BLOCK.size > end:
        raise RtcpError("report blocks overrun the packet")
    return tuple(ReportBlock.parse(data, offset + i * _BLOCK.size) for i in range(count))


def _parse_sdes(body: bytes, count: int) -> SourceDescription:
    chunks = []
    pos = 0
    for _ in range(count):
        if pos + 4 > len(body):
            raise RtcpError("SDES chunk truncated")
        (ssrc,) = _U32.unpack_from(body, pos)
        pos += 4
        items = []
        while True:
            if pos >= len(body):
                raise RtcpError("SDES chunk without END item")
            kind = body[pos]
            if kind == 0:
                pos = (pos + 4) & ~3  # END octet plus nulls to the next 32-bit boundary
                break
            if pos + 2 > len(body) or pos + 2 + body[pos + 1] > len(body):
                raise RtcpError("SDES item overruns the packet")
            length = body[pos + 1]
            items.append((kind, body[pos + 2 : pos + 2 + length]))
            pos += 2 + length
        chunks.append(SdesChunk(ssrc, tuple(items)))
    return SourceDescription(tuple(chunks))


def _parse_bye(body: bytes, count: int) -> Bye:
    if count * 4 > len(body):
        raise RtcpError("BYE SSRC list overruns the packet")
    ssrcs = struct.unpack_from(f"!{count}I", body)
    rest = body[count * 4 :]
    reason = None
    if rest:
        if 1 + rest[0] > len(rest):
            raise RtcpError("BYE reason overruns the packet")
        reason = rest[1 : 1 + rest[0]]
    return Bye(tuple(ssrcs), reason)


def _parse_one(pt: int, count: int, body: bytes) -> RtcpPacket:
    if pt == PT_SR:
        if len(body) < _SENDER_INFO.size:
            raise RtcpError("SR too short")
        ssrc, ntp, rtp_ts, packets, octets = _SENDER_INFO.unpack_from(body, 0)
        blocks = _blocks(body, _SENDER_INFO.size, count, len(body))
        return SenderReport(ssrc, ntp, rtp_ts, packets, octets, blocks)
    if pt == PT_RR:
        if len(body) < 4:
            raise RtcpError("RR too short")
        (ssrc,) = _U32.unpack_from(body, 0)
        return ReceiverReport(ssrc, _blocks(body, 4, count, len(body)))
    if pt == PT_SDES:
        return _parse_sdes(body, count)
    if pt == PT_BYE:
        return _parse_bye(body, count)
    return UnknownRtcp(pt, count, body)


def parse_compound(data: bytes | bytearray | memoryview) -> list[RtcpPacket]:
    """Parse a (compound) RTCP datagram; any malformation raises :class:`RtcpError`.

    Profile-specific extensions after SR/RR report blocks are ignored.
    """
    buf = bytes(data)
    if not looks_like_rtcp(buf):
        raise RtcpError("not an RTCP packet (RFC 5761 demux)")
    packets: list[RtcpPacket] = []
    pos = 0
    while pos < len(buf):
        if pos + 4 > len(buf):
            raise RtcpError("truncated RTCP header")
        first, pt, words = _HDR.unpack_from(buf, pos)
        if first >> 6 != 2:
            raise RtcpError(f"bad RTCP version {first >> 6}")
        end = pos + 4 * (words + 1)
        if end > len(buf):
            raise RtcpError("RTCP length overruns the datagram")
        body = buf[pos + 4 : end]
        if first & 0x20:
            if not body or not 1 <= body[-1] <= len(body):
                raise RtcpError("bad RTCP padding")
            body = body[: -body[-1]]
        packets.append(_parse_one(pt, first & 0x1F, body))
        pos = end
    return packets


def _body(packet: RtcpPacket) -> tuple[int, int, bytes]:
    if isinstance(packet, SenderReport):
        check_field("ssrc", packet.ssrc, 32)
        check_field("ntp_timestamp", packet.ntp_timestamp, 64)
        for name in ("rtp_timestamp", "packet_count", "octet_count"):
            check_field(name, getattr(packet, name), 32)
        info = _SENDER_INFO.pack(
            packet.ssrc,
            packet.ntp_timestamp,
            packet.rtp_timestamp,
            packet.packet_count,
            packet.octet_count,
        )
        return PT_SR, len(packet.reports), info + b"".join(b.serialize() for b in packet.reports)
    if isinstance(packet, ReceiverReport):
        check_field("ssrc", packet.ssrc, 32)
        blocks = b"".join(b.serialize() for b in packet.reports)
        return PT_RR, len(packet.reports), _U32.pack(packet.ssrc) + blocks
    if isinstance(packet, SourceDescription):
        parts = []
        for chunk in packet.chunks:
            check_field("ssrc", chunk.ssrc, 32)
            raw = bytearray(_U32.pack(chunk.ssrc))
            for kind, value in chunk.items:
                if not 1 <= kind <= 255:
                    raise RtcpError(f"SDES item type {kind!r} out of range 1..255")
                check_field("SDES item length", len(value), 8)
                raw += bytes((kind, len(value))) + value
            raw += bytes(4 - len(raw) % 4)  # END plus alignment: always at least one null
            parts.append(bytes(raw))
        return PT_SDES, len(packet.chunks), b"".join(parts)
    if isinstance(packet, Bye):
        for ssrc in packet.ssrcs:
            check_field("ssrc", ssrc, 32)
        out = b"".join(_U32.pack(s) for s in packet.ssrcs)
        if packet.reason is not None:
            check_field("BYE reason length", len(packet.reason), 8)
            out += bytes((len(packet.reason),)) + packet.reason
            out += bytes(-len(out) % 4)
        return PT_BYE, len(packet.ssrcs), out
    check_field("packet_type", packet.packet_type, 8)
    if len(packet.payload) % 4:
        raise RtcpError("unknown RTCP payload must be a multiple of 4 octets")
    return packet.packet_type, packet.count, packet.payload


def serialize_packet(packet: RtcpPacket, padding: int = 0) -> bytes:
    """One RTCP packet; ``padding`` (a positive multiple of 4) sets the P bit."""
    pt, count, body = _body(packet)
    check_field("count", count, 5)
    if padding:
        if padding % 4 or not 0 < padding < 256:
            raise RtcpError("padding must be a multiple of 4 in 4..252")
        body += bytes(padding - 1) + bytes((padding,))
    first = 0x80 | (0x20 if padding else 0) | count
    check_field("length", len(body) // 4, 16)
    return _HDR.pack(first, pt, len(body) // 4) + body


def serialize_compound(packets: Iterable[RtcpPacket], pad_to: int | None = None) -> bytes:
    """Concatenate packets; ``pad_to`` pads the last one (RFC 3550 6.4.1) to a multiple."""
    items = list(packets)
    if not items:
        raise RtcpError("a compound RTCP packet needs at least one packet")
    head = b"".join(serialize_packet(p) for p in items[:-1])
    last = serialize_packet(items[-1])
    if pad_to:
        if pad_to % 4 or pad_to <= 0:
            raise RtcpError("pad_to must be a positive multiple of 4")
        extra = -(len(head) + len(last)) % pad_to
        if extra:
            last = serialize_packet(items[-1], extra)
    return head + last

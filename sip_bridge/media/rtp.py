"""RTP (RFC 3550) and telephone-event (RFC 4733) packets, sans-I/O.

Everything here is pure: bytes in, objects out, and back.  Nothing opens a socket or
reads a clock; times, when needed, are passed in by the caller.

* :class:`RtpPacket` parses and serializes the fixed header, CSRC list, header
  extension and padding.  Every malformed input raises :class:`RtpError` (a
  ``ValueError``) and nothing else.
* :class:`TelephoneEvent` is the 4-byte RFC 4733 event payload; :func:`dtmf_to_event`
  and :func:`event_to_dtmf` map DTMF characters to event codes.
* DTMF key presses on top of these packets live in :mod:`sip_bridge.media.dtmf`.
* :class:`RtpSender` keeps the per-stream sender state (SSRC, sequence number,
  timestamp, marker, RTCP sender counters).
* :func:`unwrap_seq` / :func:`unwrap_ts` extend 16-bit sequence numbers and 32-bit
  timestamps; :class:`InterarrivalJitter` is the RFC 3550 section 6.4.1 estimator.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass

from jitter.seqnum import unwrap_near

__all__ = [
    "DTMF_EVENTS",
    "RTP_HEADER_SIZE",
    "RTP_VERSION",
    "InterarrivalJitter",
    "RtpError",
    "RtpExtension",
    "RtpPacket",
    "RtpSender",
    "TelephoneEvent",
    "dtmf_to_event",
    "event_to_dtmf",
    "looks_like_rtcp",
    "unwrap_seq",
    "unwrap_ts",
]

RTP_VERSION = 2
RTP_HEADER_SIZE = 12

_SEQ_MOD = 1 << 16
_TS_MOD = 1 << 32
_TS_HALF = 1 << 31
_TS_MASK = _TS_MOD - 1
_HEADER = struct.Struct("!BBHII")
_EXT_HEADER = struct.Struct("!HH")
_EVENT = struct.Struct("!BBH")

#: RFC 4733 section 3.2: event codes 0-15 are the DTMF keys, in this order.
DTMF_EVENTS = "0123456789*#ABCD"


class RtpError(ValueError):
    """Malformed RTP or telephone-event data (or an out-of-range field when building)."""


def check_range(name: str, value: int, bits: int) -> None:
    """Refuse a value that would be silently truncated in its wire field."""
    if not 0 <= value < (1 << bits):
        raise RtpError(f"{name} {value!r} out of range for {bits} bits")


@dataclass(frozen=True, slots=True)
class RtpExtension:
    """RFC 3550 section 5.3.1 header extension: 16-bit profile word and its data.

    ``data`` length must be a multiple of 4 (the length field counts 32-bit words).
    """

    profile: int
    data: bytes = b""

    def __post_init__(self) -> None:
        check_range("extension profile", self.profile, 16)
        if len(self.data) % 4:
            raise RtpError(f"extension data length {len(self.data)} is not a multiple of 4")
        if len(self.data) // 4 >= _SEQ_MOD:
            raise RtpError("extension data too long")


@dataclass(frozen=True, slots=True)
class RtpPacket:
    """One RTP packet (RFC 3550 section 5.1); the version is always 2.

    ``padding`` is the number of padding octets at the end of the packet, including
    the final count octet (0: the P bit is clear).  :meth:`serialize` writes zeros
    followed by the count, so ``parse(serialize(p)) == p``.  ``csrc`` is a tuple (the
    dataclass is frozen and hashable).
    """

    payload_type: int = 0
    sequence: int = 0
    timestamp: int = 0
    ssrc: int = 0
    payload: bytes = b""
    marker: bool = False
    csrc: tuple[int, ...] = ()
    extension: RtpExtension | None = None
    padding: int = 0

    def __post_init__(self) -> None:
        check_range("payload type", self.payload_type, 7)
        check_range("sequence", self.sequence, 16)
        check_range("timestamp", self.timestamp, 32)
        check_range("ssrc", self.ssrc, 32)
        if len(self.csrc) > 15:
            raise RtpError(f"{len(self.csrc)} CSRCs, at most 15")
        for c in self.csrc:
            check_range("csrc", c, 32)
        if not 0 <= self.padding <= 255:
            raise RtpError(f"padding {self.padding} out of range 0..255")

    @property
    def header_size(self) -> int:
        """Octets before the payload (fixed header, CSRCs, extension)."""
        size = RTP_HEADER_SIZE + 4 * len(self.csrc)
        if self.extension is not None:
            size += 4 + len(self.extension.data)
        return size

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview) -> RtpPacket:
        """Parse one RTP packet; raises :class:`RtpError` (only) on malformed input."""
        buf = bytes(data)
        n = len(buf)
        if n < RTP_HEADER_SIZE:
            raise RtpError(f"RTP packet too short: {n} < {RTP_HEADER_SIZE} octets")
        b0, b1, seq, ts, ssrc = _HEADER.unpack_from(buf)
        version = b0 >> 6
        if version != RTP_VERSION:
            raise RtpError(f"RTP version {version}, expected {RTP_VERSION}")
        has_padding = bool(b0 & 0x20)
        has_extension = bool(b0 & 0x10)
        cc = b0 & 0x0F
        off = RTP_HEADER_SIZE
        if n < off + 4 * cc:
            raise RtpError(f"CSRC count {cc} runs past the end of a {n}-octet packet")
        csrc = struct.unpack_from(f"!{cc}I", buf, off)
        off += 4 * cc
        extension = None
        if has_extension:
            if n < off + 4:
                raise RtpError("extension header runs past the end of the packet")
            profile, words = _EXT_HEADER.unpack_from(buf, off)
            off += 4
            if n < off + 4 * words:
                raise RtpError(f"extension length {words} words runs past the end of the packet")
            extension = RtpExtension(profile, buf[off : off + 4 * words])
            off += 4 * words
        end = n
        padding = 0
        if has_padding:
            if end == off:
                raise RtpError("padding bit set but no octet left for the padding count")
            padding = buf[-1]
            if padding == 0:
                raise RtpError("padding count is 0")
            if padding > end - off:
                raise RtpError(f"padding count {padding} exceeds the {end - off} payload octets")
            end -= padding
        return cls(
            payload_type=b1 & 0x7F,
            sequence=seq,
            timestamp=ts,
            ssrc=ssrc,
            payload=buf[off:end],
            marker=bool(b1 & 0x80),
            csrc=csrc,
            extension=extension,
            padding=padding,
        )

    def serialize(self, pad_to: int | None = None) -> bytes:
        """Build the packet.

        With ``pad_to`` (1..255) the packet is padded so that its total length is a
        multiple of ``pad_to`` (no padding when it already is), overriding
        ``self.padding``; otherwise ``self.padding`` octets are appended.
        """
        padding = self.padding
        if pad_to is not None:
            if not 1 <= pad_to <= 255:
                raise RtpError(f"pad_to {pad_to} out of range 1..255")
            padding = -(self.header_size + len(self.payload)) % pad_to
        b0 = (RTP_VERSION << 6) | len(self.csrc)
        if padding:
            b0 |= 0x20
        if self.extension is not None:
            b0 |= 0x10
        b1 = self.payload_type | (0x80 if self.marker else 0)
        parts = [_HEADER.pack(b0, b1, self.sequence, self.timestamp, self.ssrc)]
        if self.csrc:
            parts.append(struct.pack(f"!{len(self.csrc)}I", *self.csrc))
        if self.extension is not None:
            ext = self.extension
            parts.append(_EXT_HEADER.pack(ext.profile, len(ext.data) // 4))
            parts.append(ext.data)
        parts.append(self.payload)
        if padding:
            parts.append(bytes(padding - 1) + bytes((padding,)))
        return b"".join(parts)


def looks_like_rtcp(data: bytes | bytearray | memoryview) -> bool:
    """RFC 5761 section 4 demultiplexing: version 2 and second octet in 192..223."""
    return len(data) >= 2 and data[0] >> 6 == RTP_VERSION and 192 <= data[1] <= 223


# ---------------------------------------------------------------------------------------
# Sequence number / timestamp extension
# ---------------------------------------------------------------------------------------


def _unwrap(last_ext: int | None, value: int, modulus: int) -> int:
    if not 0 <= value < modulus:
        raise ValueError(f"value {value} out of range 0..{modulus - 1}")
    if last_ext is None:
        return value
    return unwrap_near(value, last_ext, modulus.bit_length() - 1)


def unwrap_seq(last_ext: int | None, seq: int) -> int:
    """Extend a 16-bit sequence number to the extended value nearest ``last_ext``.

    The result ``r`` satisfies ``r % 2**16 == seq`` and
    ``-2**15 <= r - last_ext < 2**15`` (exactly half a cycle away counts as *behind*).
    With ``last_ext=None`` (first packet) it returns ``seq``.  A packet older than the
    first one seen, before any wrap, gives a negative value: start from a base such as
    ``seq + 2**16`` if the caller needs RFC 3550's unsigned ``cycles | seq`` form.
    """
    return _unwrap(last_ext, seq, _SEQ_MOD)


def unwrap_ts(last_ext: int | None, ts: int) -> int:
    """Extend a 32-bit RTP timestamp; same contract as :func:`unwrap_seq` with 2**32."""
    return _unwrap(last_ext, ts, _TS_MOD)


class InterarrivalJitter:
    """RFC 3550 section 6.4.1 interarrival jitter estimator (J += (|D| - J) / 16).

    ``update(arrival_s, rtp_timestamp)`` takes the arrival time in seconds on any
    monotonic clock and returns the current estimate in timestamp units;
    :attr:`jitter_ms` gives it in milliseconds.
    """

    def __init__(self, clock_rate: int = 8000) -> None:
        if clock_rate <= 0:
            raise ValueError("clock_rate must be positive")
        self.clock_rate = clock_rate
        self.jitter = 0.0
        self._last_transit: float | None = None
        self._last_ts: int | None = None

    def update(self, arrival_s: float, rtp_timestamp: int) -> float:
        last = self._last_ts
        if last is not None and 0 <= rtp_timestamp < _TS_MOD:  # unwrap_ts, inlined (hot)
            ext = last + ((rtp_timestamp - last + _TS_HALF) & _TS_MASK) - _TS_HALF
        else:
            ext = unwrap_ts(last, rtp_timestamp)
        self._last_ts = ext
        transit = arrival_s * self.clock_rate - ext
        if self._last_transit is not None:
            d = abs(transit - self._last_transit)
            self.jitter += (d - self.jitter) / 16.0
        self._last_transit = transit
        return self.jitter

    @property
    def jitter_ms(self) -> float:
        return self.jitter * 1000.0 / self.clock_rate


# ---------------------------------------------------------------------------------------
# RFC 4733 telephone-event
# ---------------------------------------------------------------------------------------


def dtmf_to_event(digit: str) -> int:
    """DTMF character ('0'-'9', '*', '#', 'A'-'D', case-insensitive) to event code."""
    if len(digit) != 1 or digit.upper() not in DTMF_EVENTS:
        raise ValueError(f"not a DTMF character: {digit!r}")
    return DTMF_EVENTS.index(digit.upper())


def event_to_dtmf(event: int) -> str | None:
    """Event code to DTMF character, or None for non-DTMF events (flash, tones...)."""
    return DTMF_EVENTS[event] if 0 <= event < len(DTMF_EVENTS) else None


@dataclass(frozen=True, slots=True)
class TelephoneEvent:
    """RFC 4733 section 2.3 event payload: event, E bit, volume (-dBm0), duration."""

    event: int
    end: bool = False
    volume: int = 10
    duration: int = 0

    def __post_init__(self) -> None:
        check_range("event", self.event, 8)
        check_range("volume", self.volume, 6)
        check_range("duration", self.duration, 16)

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview) -> TelephoneEvent:
        """Parse the first 4 octets (the R bit is ignored); RtpError if shorter."""
        if len(data) < _EVENT.size:
            raise RtpError(f"telephone-event payload too short: {len(data)} < 4 octets")
        event, flags, duration = _EVENT.unpack_from(bytes(data[:4]))
        return cls(event=event, end=bool(flags & 0x80), volume=flags & 0x3F, duration=duration)

    def serialize(self) -> bytes:
        return _EVENT.pack(self.event, (0x80 if self.end else 0) | self.volume, self.duration)


# ---------------------------------------------------------------------------------------
# Sending
# ---------------------------------------------------------------------------------------


class RtpSender:
    """Sender-side bookkeeping of one RTP stream (one SSRC).

    Initial SSRC, sequence number and timestamp are random (RFC 3550 section 5.1) unless
    given; pass ``rng=random.Random(seed)`` for reproducible tests.  Each
    :meth:`next_packet` uses the current :attr:`sequence` and :attr:`timestamp`, then
    advances the sequence number by one (16-bit wrap) and the timestamp by ``samples``
    (32-bit wrap).  The first packet, and the first after :meth:`start_talkspurt` or
    :meth:`skip`, carries the marker bit.  :attr:`packet_count` / :attr:`octet_count`
    are the RFC 3550 sender-report counters (payload octets: no headers, no padding).
    """

    def __init__(
        self,
        payload_type: int = 0,
        *,
        ssrc: int | None = None,
        sequence: int | None = None,
        timestamp: int | None = None,
        rng: random.Random | None = None,
    ) -> None:
        gen = rng if rng is not None else random.SystemRandom()
        check_range("payload type", payload_type, 7)
        self.payload_type = payload_type
        self.ssrc: int = gen.getrandbits(32) if ssrc is None else ssrc
        self.sequence: int = gen.getrandbits(16) if sequence is None else sequence
        self.timestamp: int = gen.getrandbits(32) if timestamp is None else timestamp
        check_range("ssrc", self.ssrc, 32)
        check_range("sequence", self.sequence, 16)
        check_range("timestamp", self.timestamp, 32)
        self.packet_count = 0
        self.octet_count = 0
        self._marker_pending = True

    def start_talkspurt(self) -> None:
        """Set the marker bit on the next packet."""
        self._marker_pending = True

    def skip(self, samples: int, *, talkspurt: bool = True) -> None:
        """Advance the timestamp over ``samples`` not sent (silence / DTX).

        The next packet starts a new talkspurt (marker) unless ``talkspurt=False``.
        """
        if samples < 0:
            raise ValueError("samples must be >= 0")
        self.timestamp = (self.timestamp + samples) % _TS_MOD
        if talkspurt:
            self._marker_pending = True

    def next_rtp_packet(
        self,
        payload: bytes,
        samples: int,
        marker: bool = False,
        payload_type: int | None = None,
    ) -> RtpPacket:
        """Like :meth:`next_packet` but returns the :class:`RtpPacket`."""
        if samples < 0:
            raise ValueError("samples must be >= 0")
        packet = RtpPacket(
            payload_type=self.payload_type if payload_type is None else payload_type,
            sequence=self.sequence,
            timestamp=self.timestamp,
            ssrc=self.ssrc,
            payload=bytes(payload),
            marker=marker or self._marker_pending,
        )
        self.advance(samples, len(payload))
        return packet

    def advance(self, samples: int, octets: int) -> None:
        """A packet of ``samples`` and ``octets`` of payload went out: the counters move on
        (sequence, timestamp, RTCP's packet and octet counts) and the marker is spent."""
        self._marker_pending = False
        self.sequence = (self.sequence + 1) % _SEQ_MOD
        self.timestamp = (self.timestamp + samples) % _TS_MOD
        self.packet_count += 1
        self.octet_count += octets

    def next_packet(
        self,
        payload: bytes,
        samples: int,
        marker: bool = False,
        payload_type: int | None = None,
    ) -> bytes:
        """Serialize the next packet carrying ``payload`` worth ``samples`` clock ticks."""
        return self.next_rtp_packet(payload, samples, marker, payload_type).serialize()

"""One call's RTP receive side, sans-I/O: datagram in, jitter buffer fed, digits out.

Filters what a public RTP port receives (malformed packets, RTCP, strangers,
stray SSRCs, unknown payload types), latches onto the caller's real address
when asked (symmetric RTP), decodes G.711 and pushes it into the jitter buffer.
"""

from __future__ import annotations

import functools
import ipaddress
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jitter import JitterBuffer
from resample import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from resample.g711 import G711Codec
from sip_bridge.media.dtmf import DtmfDigit, DtmfReceiver
from sip_bridge.media.rtp import RtpError, RtpPacket, looks_like_rtcp

RATE = 8000
CN_PAYLOAD_TYPE = 13
SSRC_SWITCH_PACKETS = 3  # consecutive packets of a new SSRC before we follow it
# Symmetric RTP: consecutive packets (in sequence) a source other than the signalled address
# must send before we latch onto it. One stray or sprayed packet (the "RTP bleed" attack)
# never redirects a call's media; a NATed phone loses its first 40 ms.
LATCH_PACKETS = 3
_NO_CANDIDATE = (("", 0), -1, 0)


CODECS: dict[int, G711Codec] = {
    0: G711Codec("PCMU", ulaw_encode, ulaw_decode),
    8: G711Codec("PCMA", alaw_encode, alaw_decode),
}


_FIXED_HEADER = struct.Struct("!BBHII")


@functools.lru_cache(maxsize=4096)
def addr_key(host: str, port: int) -> tuple[str, int]:
    """Canonical (ip, port), with IPv4-mapped IPv6 turned back into IPv4 (memoised: it is
    asked for every datagram, and parsing the address cost ~9 us)."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host, port
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), port


@dataclass
class RtpReceiver:
    """Sans-I/O receive side: ``receive(datagram, source, now)`` and the counters."""

    jb: JitterBuffer
    codec: G711Codec
    payload_type: int
    remote: tuple[str, int]
    latch: bool = False
    dtmf: DtmfReceiver | None = None
    # (ssrc, sequence, timestamp, now) of each accepted packet, e.g. for RTCP statistics
    on_accepted: Callable[[int, int, int, float], None] | None = None
    # (ssrc, sequence) of each RFC 4733 event packet of the stream: it counts for RTCP's
    # loss figures, but its timestamp (the key's start, repeated) says nothing of jitter
    on_event_packet: Callable[[int, int], None] | None = None
    latched: bool = False
    packets: int = 0  # every datagram
    accepted: int = 0  # audio / CN packets pushed into the jitter buffer
    malformed: int = 0
    rtcp: int = 0
    wrong_source: int = 0
    wrong_payload_type: int = 0
    wrong_ssrc: int = 0
    dtmf_packets: int = 0
    ssrc: int | None = None
    _candidate: tuple[int, int] = field(default=(-1, 0))  # (ssrc, consecutive packets)
    # The address the SDP gave (``remote`` until latched): when latching, packets from it
    # are always the peer's, even after an earlier stranger was latched onto.
    signalled: tuple[str, int] = ("", 0)
    # (source, last sequence, packets in a row) of a source that may become the peer
    _latch_candidate: tuple[tuple[str, int], int, int] = field(default=_NO_CANDIDATE)

    def __post_init__(self) -> None:
        if not self.signalled[0]:
            self.signalled = self.remote

    def receive(self, data: bytes, source: tuple[str, int], now: float) -> list[DtmfDigit]:
        """One datagram that arrived at ``now``; returns completed DTMF key presses."""
        if self.take_audio(data, source, now):
            return []
        self.packets += 1
        if looks_like_rtcp(data):
            self.rtcp += 1  # RTCP muxed on the RTP port: not handled yet
            return []
        try:
            pkt = RtpPacket.parse(data)
        except RtpError:
            self.malformed += 1
            return []
        src = addr_key(*source[:2])
        is_event = self.dtmf is not None and pkt.payload_type == self.dtmf.payload_type
        known = pkt.payload_type in (self.payload_type, CN_PAYLOAD_TYPE) or is_event
        if src != self.remote:
            if not (self.latch and known and self._may_latch(src, pkt.sequence)):
                self.wrong_source += 1
                return []
            self.remote = src
            self.jb.source_changed()
        if not known:
            self.wrong_payload_type += 1
            return []
        if self.latch:
            self.latched = True
        if is_event:
            assert self.dtmf is not None
            self.dtmf_packets += 1
            if self.ssrc is None or pkt.ssrc == self.ssrc:
                # the key took an audio sequence number: not a loss, and no audio to conceal
                self.jb.skip_sequence(pkt.sequence, pkt.ssrc)
                if self.on_event_packet is not None:
                    self.on_event_packet(pkt.ssrc, pkt.sequence)
            return self.dtmf.feed(pkt, now)
        if not self._ssrc_ok(pkt.ssrc):
            self.wrong_ssrc += 1
            return []
        try:
            if pkt.payload_type == CN_PAYLOAD_TYPE:
                level = pkt.payload[0] & 0x7F if pkt.payload else 127
                self.jb.push_comfort_noise(pkt.sequence, pkt.timestamp, level, now, pkt.ssrc)
            else:
                pcm = self.codec.decode(pkt.payload)
                self.jb.push(pkt.sequence, pkt.timestamp, pcm, now, pkt.marker, pkt.ssrc)
        except ValueError:  # e.g. an empty payload
            self.malformed += 1
            return []
        self.accepted += 1
        if self.on_accepted is not None:
            self.on_accepted(pkt.ssrc, pkt.sequence, pkt.timestamp, now)
        return []

    def counters(self) -> dict[str, Any]:
        """The receive side's part of :class:`~sip_bridge.media.call_media.MediaStats`."""
        return {
            "remote": self.remote,
            "latched": self.latched,
            "packets_in": self.packets,
            "packets_accepted": self.accepted,
            "malformed": self.malformed,
            "rtcp_in": self.rtcp,
            "wrong_source": self.wrong_source,
            "wrong_payload_type": self.wrong_payload_type,
            "wrong_ssrc": self.wrong_ssrc,
        }

    def take_audio(self, data: bytes, source: tuple[str, int], now: float) -> bool:
        """The common packet cheaply, or False (nothing done) for :meth:`receive` to decide:
        audio from the expected source and SSRC with a plain header (version 2, no padding,
        extension or CSRCs), which is what :meth:`RtpPacket.parse` would make of it,
        without building the object. Such a packet is never RTCP (its second octet is
        0, 8, 128 or 136 for G.711) and never a DTMF event."""
        if len(data) <= 12 or data[0] != 0x80:
            return False
        _, b1, seq, ts, ssrc = _FIXED_HEADER.unpack_from(data)
        if b1 & 0x7F != self.payload_type or (self.ssrc is not None and ssrc != self.ssrc):
            return False
        remote = self.remote
        if source != remote and addr_key(source[0], source[1]) != remote:
            return False
        self.packets += 1
        if self.latch:
            self.latched = True
        if self.ssrc is None or self._candidate[1]:
            self._lock(ssrc)  # what _ssrc_ok does for the locked SSRC: forget a stray one
        pcm = self.codec.dec_table.take(np.frombuffer(data, np.uint8, -1, 12))
        self.jb.push_packet(seq, ts, pcm, now, b1 >= 0x80, ssrc)
        self.accepted += 1
        if self.on_accepted is not None:
            self.on_accepted(ssrc, seq, ts, now)
        return True

    def _may_latch(self, src: tuple[str, int], seq: int) -> bool:
        """Whether a packet from ``src`` (not ``remote``) makes it the peer: the signalled
        address always does; another source only before latching, after
        :data:`LATCH_PACKETS` packets in a row with consecutive sequence numbers."""
        if src == self.signalled:
            self._latch_candidate = _NO_CANDIDATE
            return True
        if self.latched:
            return False
        cand, last, count = self._latch_candidate
        count = count + 1 if cand == src and seq == (last + 1) & 0xFFFF else 1
        if count >= LATCH_PACKETS:
            self._latch_candidate = _NO_CANDIDATE
            return True
        self._latch_candidate = (src, seq, count)
        return False

    def _ssrc_ok(self, ssrc: int) -> bool:
        """Lock on the first SSRC; follow a new one only after a few packets in a row.

        A lone stray packet cannot reset the jitter buffer, but a real stream change
        (re-INVITE, transfer inside the PBX) is followed within a few packets.
        """
        if self.ssrc is None or ssrc == self.ssrc:
            self._lock(ssrc)
            return True
        cand, count = self._candidate
        count = count + 1 if cand == ssrc else 1
        self._candidate = (ssrc, count)
        if count >= SSRC_SWITCH_PACKETS:
            self._lock(ssrc)
            return True
        return False

    def _lock(self, ssrc: int) -> None:
        self.ssrc = ssrc
        self._candidate = (-1, 0)

"""One call's RTP receive side, sans-I/O: datagram in, jitter buffer fed, digits out.

Filters what a public RTP port receives (malformed packets, RTCP, strangers,
stray SSRCs, unknown payload types), latches onto the caller's real address
when asked (symmetric RTP), decodes G.711 and pushes it into the jitter buffer.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from jitter import JitterBuffer
from resample import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from sip_bridge.dtmf import DtmfDigit, DtmfReceiver
from sip_bridge.rtp import RtpError, RtpPacket, looks_like_rtcp

RATE = 8000
CN_PAYLOAD_TYPE = 13
SSRC_SWITCH_PACKETS = 3  # consecutive packets of a new SSRC before we follow it


@dataclass(frozen=True, slots=True)
class Codec:
    name: str
    encode: Callable[[NDArray[np.int16]], NDArray[np.uint8]]
    decode: Callable[[NDArray[np.uint8] | bytes], NDArray[np.int16]]


CODECS: dict[int, Codec] = {
    0: Codec("PCMU", ulaw_encode, ulaw_decode),
    8: Codec("PCMA", alaw_encode, alaw_decode),
}


def addr_key(host: str, port: int) -> tuple[str, int]:
    """Canonical (ip, port), with IPv4-mapped IPv6 turned back into IPv4."""
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
    codec: Codec
    payload_type: int
    remote: tuple[str, int]
    latch: bool = False
    dtmf: DtmfReceiver | None = None
    on_accepted: Callable[[RtpPacket, float], None] | None = None  # e.g. RTCP statistics
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

    def receive(self, data: bytes, source: tuple[str, int], now: float) -> list[DtmfDigit]:
        """One datagram that arrived at ``now``; returns completed DTMF key presses."""
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
            if not (self.latch and not self.latched and known):
                self.wrong_source += 1
                return []
            self.remote = src
        if not known:
            self.wrong_payload_type += 1
            return []
        if self.latch:
            self.latched = True
        if is_event:
            assert self.dtmf is not None
            self.dtmf_packets += 1
            return self.dtmf.feed(pkt)
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
            self.on_accepted(pkt, now)
        return []

    def _ssrc_ok(self, ssrc: int) -> bool:
        """Lock on the first SSRC; follow a new one only after a few packets in a row.

        A lone stray packet cannot reset the jitter buffer, but a real stream change
        (re-INVITE, transfer inside the PBX) is followed within a few packets.
        """
        if self.ssrc is None or ssrc == self.ssrc:
            self.ssrc = ssrc
            self._candidate = (-1, 0)
            return True
        cand, count = self._candidate
        count = count + 1 if cand == ssrc else 1
        self._candidate = (ssrc, count)
        if count >= SSRC_SWITCH_PACKETS:
            self.ssrc = ssrc
            self._candidate = (-1, 0)
            return True
        return False

"""A tiny reader for classic libpcap files: UDP datagrams and RTP packets out.

Supports both byte orders, microsecond and nanosecond timestamps, and the link types
EN10MB (Ethernet, with 802.1Q/802.1ad tags), LINUX_SLL, LINUX_SLL2, NULL/LOOP
(BSD loopback) and RAW (also the IPV4/IPV6 link types), carrying IPv4 or IPv6.
Fragmented IP packets, non-UDP packets and packets cut short by the snap length are
skipped.  pcapng is not supported (convert with ``editcap -F pcap in.pcapng out.pcap``).

A structurally broken file (bad magic, truncated header or record) raises
:class:`PcapError`; since :func:`iter_udp` is a generator, a truncated record is
reported when iteration reaches it.
"""

from __future__ import annotations

import ipaddress
import os
import struct
from collections.abc import Collection, Iterator
from typing import NamedTuple

from sip_bridge.media.rtp import RtpError, RtpPacket, looks_like_rtcp

__all__ = [
    "DEFAULT_RTP_PAYLOAD_TYPES",
    "LINKTYPE_EN10MB",
    "LINKTYPE_IPV4",
    "LINKTYPE_IPV6",
    "LINKTYPE_LINUX_SLL",
    "LINKTYPE_LINUX_SLL2",
    "LINKTYPE_LOOP",
    "LINKTYPE_NULL",
    "LINKTYPE_RAW",
    "PcapError",
    "UdpDatagram",
    "iter_udp",
    "read_rtp_packets",
]

LINKTYPE_NULL = 0
LINKTYPE_EN10MB = 1
LINKTYPE_RAW = 101
LINKTYPE_LOOP = 108
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276
_DLT_RAW_ALIASES = (12, 14)  # DLT_RAW on some BSDs / OpenBSD
_SUPPORTED_LINKTYPES = frozenset(
    (
        LINKTYPE_NULL,
        LINKTYPE_EN10MB,
        LINKTYPE_RAW,
        LINKTYPE_LOOP,
        LINKTYPE_LINUX_SLL,
        LINKTYPE_IPV4,
        LINKTYPE_IPV6,
        LINKTYPE_LINUX_SLL2,
        *_DLT_RAW_ALIASES,
    )
)

_MAGIC_USEC = 0xA1B2C3D4
_MAGIC_NSEC = 0xA1B23C4D
_PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"

_ETHERTYPE_IPV4 = 0x0800
_ETHERTYPE_IPV6 = 0x86DD
_ETHERTYPE_VLAN = (0x8100, 0x88A8, 0x9100)
_BSD_AF_INET6 = (10, 24, 28, 30)  # Linux, NetBSD/OpenBSD, FreeBSD, macOS
_IPPROTO_UDP = 17
_IPV6_EXT_HEADERS = (0, 43, 60)  # hop-by-hop, routing, destination options
_IPV6_FRAGMENT = 44

#: What :func:`read_rtp_packets` keeps by default: static audio payload types 0..34
#: and dynamic ones 96..127 (35..95 are unassigned or collide with RTCP).
DEFAULT_RTP_PAYLOAD_TYPES: frozenset[int] = frozenset(range(35)) | frozenset(range(96, 128))


class PcapError(ValueError):
    """The file is not a readable classic pcap file."""


class UdpDatagram(NamedTuple):
    """One UDP datagram from a capture."""

    timestamp: float  # seconds since the epoch, as captured
    src: str
    sport: int
    dst: str
    dport: int
    payload: bytes


def _link_to_ip(linktype: int, frame: bytes) -> bytes | None:
    """Strip the link-layer header; None when the frame does not carry IP."""
    if linktype == LINKTYPE_EN10MB:
        if len(frame) < 14:
            return None
        off = 12
        (ethertype,) = struct.unpack_from("!H", frame, off)
        while ethertype in _ETHERTYPE_VLAN and len(frame) >= off + 6:
            off += 4
            (ethertype,) = struct.unpack_from("!H", frame, off)
        if ethertype not in (_ETHERTYPE_IPV4, _ETHERTYPE_IPV6):
            return None
        return frame[off + 2 :]
    if linktype == LINKTYPE_LINUX_SLL:
        if len(frame) < 16:
            return None
        (proto,) = struct.unpack_from("!H", frame, 14)
        return frame[16:] if proto in (_ETHERTYPE_IPV4, _ETHERTYPE_IPV6) else None
    if linktype == LINKTYPE_LINUX_SLL2:
        if len(frame) < 20:
            return None
        (proto,) = struct.unpack_from("!H", frame, 0)
        return frame[20:] if proto in (_ETHERTYPE_IPV4, _ETHERTYPE_IPV6) else None
    if linktype in (LINKTYPE_NULL, LINKTYPE_LOOP):
        if len(frame) < 4:
            return None
        if linktype == LINKTYPE_LOOP:
            (family,) = struct.unpack_from("!I", frame)
        else:  # host byte order of the capturing machine: take the plausible reading
            le, be = struct.unpack_from("<I", frame)[0], struct.unpack_from(">I", frame)[0]
            family = le if le < 256 else be
        return frame[4:] if family == 2 or family in _BSD_AF_INET6 else None
    return frame  # RAW, IPV4, IPV6: the frame is the IP packet


def _ip_to_udp(
    packet: bytes,
) -> tuple[str, int, str, int, bytes] | None:
    """Parse IPv4/IPv6 + UDP; None for anything else (or broken / fragmented)."""
    if not packet:
        return None
    version = packet[0] >> 4
    if version == 4:
        if len(packet) < 20:
            return None
        ihl = (packet[0] & 0x0F) * 4
        (total_len,) = struct.unpack_from("!H", packet, 2)
        (frag,) = struct.unpack_from("!H", packet, 6)
        if ihl < 20 or total_len < ihl or len(packet) < total_len:
            return None
        if frag & 0x3FFF:  # MF flag or a fragment offset
            return None
        if packet[9] != _IPPROTO_UDP:
            return None
        src = str(ipaddress.IPv4Address(packet[12:16]))
        dst = str(ipaddress.IPv4Address(packet[16:20]))
        l4 = packet[ihl:total_len]
    elif version == 6:
        if len(packet) < 40:
            return None
        (payload_len,) = struct.unpack_from("!H", packet, 4)
        if len(packet) < 40 + payload_len:
            return None
        nxt = packet[6]
        src = str(ipaddress.IPv6Address(packet[8:24]))
        dst = str(ipaddress.IPv6Address(packet[24:40]))
        l4 = packet[40 : 40 + payload_len]
        while nxt in _IPV6_EXT_HEADERS or nxt == _IPV6_FRAGMENT:
            if len(l4) < 8:
                return None
            if nxt == _IPV6_FRAGMENT:
                (frag,) = struct.unpack_from("!H", l4, 2)
                if frag & 0xFFF9:  # offset or M flag: a real fragment
                    return None
                hdr_len = 8
            else:
                hdr_len = (l4[1] + 1) * 8
            if len(l4) < hdr_len:
                return None
            nxt = l4[0]
            l4 = l4[hdr_len:]
        if nxt != _IPPROTO_UDP:
            return None
    else:
        return None
    if len(l4) < 8:
        return None
    sport, dport, udp_len = struct.unpack_from("!HHH", l4)
    if udp_len < 8 or udp_len > len(l4):
        return None
    return src, sport, dst, dport, bytes(l4[8:udp_len])


def _load(source: str | os.PathLike[str] | bytes) -> bytes:
    if isinstance(source, bytes):
        return source
    try:
        with open(source, "rb") as f:
            return f.read()
    except OSError as exc:
        raise PcapError(f"cannot read {os.fspath(source)!r}: {exc}") from exc


def iter_udp(source: str | os.PathLike[str] | bytes) -> Iterator[UdpDatagram]:
    """Yield every (unfragmented, complete) UDP datagram of a classic pcap file.

    ``source`` is a path or the file's bytes.
    """
    data = _load(source)
    if len(data) < 24:
        if data[:4] == _PCAPNG_MAGIC:
            raise PcapError("pcapng is not supported; convert with editcap -F pcap")
        raise PcapError(f"not a pcap file: {len(data)} octets, the header needs 24")
    for endian in ("<", ">"):
        (magic,) = struct.unpack_from(endian + "I", data)
        if magic in (_MAGIC_USEC, _MAGIC_NSEC):
            break
    else:
        if data[:4] == _PCAPNG_MAGIC:
            raise PcapError("pcapng is not supported; convert with editcap -F pcap")
        raise PcapError(f"not a pcap file: bad magic {data[:4].hex()}")
    divisor = 1e9 if magic == _MAGIC_NSEC else 1e6
    major, _minor, _zone, _sigfigs, _snaplen, network = struct.unpack_from(
        endian + "HHiIII", data, 4
    )
    if major != 2:
        raise PcapError(f"unsupported pcap version {major}")
    linktype = network & 0x03FFFFFF  # upper bits may carry FCS information
    if linktype not in _SUPPORTED_LINKTYPES:
        raise PcapError(f"unsupported link type {linktype}")
    record = struct.Struct(endian + "IIII")
    off = 24
    index = 0
    while off < len(data):
        if len(data) - off < record.size:
            raise PcapError(f"truncated record header at offset {off} (packet {index})")
        ts_sec, ts_frac, incl_len, orig_len = record.unpack_from(data, off)
        off += record.size
        if len(data) - off < incl_len:
            raise PcapError(
                f"truncated packet {index} at offset {off}: {incl_len} octets announced, "
                f"{len(data) - off} left"
            )
        frame = data[off : off + incl_len]
        off += incl_len
        index += 1
        if incl_len < orig_len:  # cut by the snap length: the UDP payload is incomplete
            continue
        ip = _link_to_ip(linktype, frame)
        if ip is None:
            continue
        udp = _ip_to_udp(ip)
        if udp is None:
            continue
        yield UdpDatagram(ts_sec + ts_frac / divisor, *udp)


def read_rtp_packets(
    source: str | os.PathLike[str] | bytes,
    port: int | None = None,
    payload_types: Collection[int] = DEFAULT_RTP_PAYLOAD_TYPES,
) -> list[tuple[float, RtpPacket]]:
    """The RTP packets of a capture as ``(arrival_time_s, packet)``, in file order.

    With ``port``, only datagrams whose source or destination port is ``port``.
    Datagrams that are not valid RTP (version 2, parseable, not RTCP, payload type in
    ``payload_types``) are skipped.
    """
    out: list[tuple[float, RtpPacket]] = []
    for dgram in iter_udp(source):
        if port is not None and port not in (dgram.sport, dgram.dport):
            continue
        if looks_like_rtcp(dgram.payload):
            continue
        try:
            packet = RtpPacket.parse(dgram.payload)
        except RtpError:
            continue
        if packet.payload_type in payload_types:
            out.append((dgram.timestamp, packet))
    return out

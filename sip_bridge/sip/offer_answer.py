"""SDP offer/answer (RFC 3264) for a G.711 voice bridge: what we answer, offer and accept.

The SDP model and its parser live in :mod:`sip_bridge.sip.sdp`; this module holds the
decisions: which codec, which telephone-event payload type, which ptime and
direction, and which address we advertise (from configuration, never a wildcard).

SRTP (SDES, RFC 4568) follows ``MediaConfig.srtp``: ``off`` answers plain RTP only (an
SAVP-only offer gets 488), ``optional`` answers with SRTP when the offer has a usable
``a=crypto`` (on RTP/SAVP, or on RTP/AVP as "best effort" peers do) and plain RTP otherwise,
``required`` refuses (488) any offer without a usable crypto line and offers RTP/SAVP
itself. Our key is fresh per call (``MediaConfig.srtp_key``), never the peer's.
"""

from __future__ import annotations

import ipaddress
import os
import random
from dataclasses import dataclass, field

from sip_bridge.media.srtp import SRTP_MODES, SUITES, SrtpKeys
from sip_bridge.sip.sdp import (
    DIRECTIONS,
    Attributes,
    Connection,
    CryptoAttribute,
    MediaDescription,
    NoCommonCodec,
    Origin,
    SdpCodec,
    SdpError,
    SessionDescription,
)

__all__ = [
    "MediaConfig",
    "NegotiatedMedia",
    "accept_answer",
    "answer",
    "answered_media",
    "bump_version",
    "make_offer",
]

_REVERSE = {"sendrecv": "sendrecv", "sendonly": "recvonly", "recvonly": "sendonly"}
_PTIMES = (10, 20, 30, 40, 60)
_RTP_PROTOS = ("RTP/AVP", "RTP/AVPF")
_SRTP_PROTOS = ("RTP/SAVP", "RTP/SAVPF")
_G711 = ("PCMU", "PCMA")
_G711_PT = {"PCMU": 0, "PCMA": 8}
_TE = "TELEPHONE-EVENT"


@dataclass
class MediaConfig:
    """What we put in our SDP.  ``address`` is the advertised (external/NAT) address."""

    address: str
    rtp_port: int
    address6: str | None = None  # used when the offer's stream is IN IP6 and address isn't
    codecs: tuple[str, ...] = _G711
    telephone_event: bool = True
    telephone_event_pt: int = 101  # only used in our own offers
    ptime: int = 20
    prefer_local: bool = False
    rtcp_mux: bool = False  # echo a=rtcp-mux when offered (RFC 5761); off: separate RTCP
    username: str = "sip-bridge"
    session_name: str = "sip-bridge"
    srtp: str = "optional"  # off / optional / required (see the module docstring)
    # Our SRTP master key||salt per suite of SUITES (30 bytes each), fresh per MediaConfig:
    # one per call, so a re-offer in the same call keeps the key the media runs with.
    srtp_key: bytes = field(default_factory=lambda: os.urandom(30 * len(SUITES)), repr=False)

    def __post_init__(self) -> None:
        for addr in (self.address, self.address6):
            if addr is not None and not _advertisable(addr):
                raise ValueError(f"not an advertisable address (0.0.0.0 never is): {addr!r}")
        if not 0 < self.rtp_port < 65536:
            raise ValueError(f"bad RTP port {self.rtp_port}")
        self.codecs = tuple(c.upper() for c in self.codecs)
        if not self.codecs or any(c not in _G711 for c in self.codecs):
            raise ValueError(f"codecs must be a non-empty subset of {_G711}")
        if self.ptime not in _PTIMES or not 96 <= self.telephone_event_pt <= 127:
            raise ValueError("bad ptime or telephone-event payload type")
        if self.srtp not in SRTP_MODES or len(self.srtp_key) != 30 * len(SUITES):
            raise ValueError(f"srtp must be one of {SRTP_MODES} (with a 60-byte srtp_key)")

    def crypto(self, tag: int, suite: str) -> CryptoAttribute:
        """Our a=crypto line for ``suite`` (answers reuse the offer's tag)."""
        i = SUITES.index(suite)
        return CryptoAttribute(tag, suite, self.srtp_key[30 * i : 30 * (i + 1)])

    def address_for(self, addrtype: str) -> tuple[str, str]:
        """(address, addrtype) matching the peer's family when we have one."""
        for addr in (self.address, self.address6):
            if addr is not None and _addrtype(addr) == addrtype:
                return addr, addrtype
        return self.address, _addrtype(self.address)


def _addrtype(addr: str) -> str:
    """IP4/IP6 for a literal, IP4 for a host name (RFC 4566 allows FQDNs in c=/o=)."""
    return "IP6" if ":" in addr else "IP4"


def _advertisable(addr: str) -> bool:
    try:
        return not ipaddress.ip_address(addr).is_unspecified
    except ValueError:
        return bool(addr) and not any(c.isspace() for c in addr)


@dataclass(frozen=True)
class NegotiatedMedia:
    """The outcome of offer/answer, seen from our side of the call."""

    stream_index: int
    remote_address: str  # the peer's SDP says; may be private: latch on first RTP
    remote_port: int
    payload_type: int  # what we send (the PT in the peer's SDP)
    codec: str  # "PCMU" or "PCMA"
    clock_rate: int
    telephone_event_pt: int | None  # what we send DTMF with
    recv_telephone_event_pt: int | None  # what our SDP told the peer to use
    ptime: int  # what we packetise at (the peer's a=ptime, else ours, else 20)
    direction: str  # ours: sendrecv / sendonly / recvonly / inactive
    rtcp_port: int | None = None  # from a=rtcp; None means RTP port + 1 unless rtcp_mux
    rtcp_address: str | None = None
    rtcp_mux: bool = False
    srtp: SrtpKeys | None = None  # SDES-SRTP keys, None for plain RTP

    @property
    def can_send(self) -> bool:
        return self.direction in ("sendrecv", "sendonly")

    @property
    def can_receive(self) -> bool:
        return self.direction in ("sendrecv", "recvonly")

    @property
    def remote_is_private(self) -> bool:
        """True for RFC 1918/ULA/link-local addresses: expect NAT, use symmetric RTP."""
        try:
            return ipaddress.ip_address(self.remote_address).is_private
        except ValueError:
            return False


def _pick(offered: list[SdpCodec], local: MediaConfig) -> SdpCodec | None:
    usable = [c for c in offered if c.name.upper() in local.codecs and c.clock_rate == 8000]
    usable = [c for c in usable if c.channels == 1]
    if local.prefer_local:
        usable.sort(key=lambda c: local.codecs.index(c.name.upper()))
    return usable[0] if usable else None


def _event_codec(codecs: list[SdpCodec], rate: int) -> SdpCodec | None:
    return next((c for c in codecs if c.name.upper() == _TE and c.clock_rate == rate), None)


def _crypto(m: MediaDescription, local: MediaConfig, why: list[str]) -> CryptoAttribute | None:
    """The first offered crypto line we can use (RFC 4568 6.1), None if none or srtp off."""
    if local.srtp == "off":
        return None
    good, bad = m.cryptos()
    why += bad
    for c in good:
        if c.supported:
            return c
        why.append(f"a=crypto {c.tag} {c.suite}: suite, MKI or session parameters unsupported")
    return None


def _choose(
    offer: SessionDescription, local: MediaConfig
) -> tuple[int, SdpCodec, CryptoAttribute | None]:
    """The audio stream we accept, its codec and crypto line, or :class:`NoCommonCodec`."""
    offered: list[str] = []
    why: list[str] = []
    saw_audio = saw_rtp = False
    for i, m in enumerate(offer.media):
        if m.media != "audio" or m.port == 0:
            continue
        saw_audio = True
        proto = m.proto.upper()
        if proto not in _RTP_PROTOS and proto not in _SRTP_PROTOS:
            continue
        crypto = _crypto(m, local, why)
        if crypto is None and (proto in _SRTP_PROTOS or local.srtp == "required"):
            continue
        saw_rtp = True
        codecs = m.codecs()
        chosen = _pick(codecs, local)
        if chosen is not None:
            return i, chosen, crypto
        offered += [f"{c.name}/{c.clock_rate}" for c in codecs] or m.formats
    if not saw_audio:
        raise NoCommonCodec("no active audio stream offered", 304)
    if not saw_rtp:
        if local.srtp == "off":
            raise NoCommonCodec("only secure or non-RTP audio offered (we do RTP/AVP)", 302)
        want = " or ".join(SUITES)
        reason = f"; {why[0]}" if why else ""
        raise NoCommonCodec(f"SRTP: no usable a=crypto offered (we do {want}){reason}", 302)
    want = ", ".join(local.codecs)
    raise NoCommonCodec(f"incompatible media format: offered {', '.join(offered)}; want {want}")


def answer(
    offer: SessionDescription,
    local: MediaConfig,
    *,
    session_id: int | None = None,
    version: int = 0,
    previous: SessionDescription | None = None,
) -> SessionDescription:
    """RFC 3264 answer: one accepted audio stream, all others rejected in place.

    With ``previous`` (our last SDP in this dialog, for a re-INVITE) the session id is kept
    and the version goes up by one only if the body changed (RFC 3264 section 8).
    """
    index, codec, crypto = _choose(offer, local)
    m = offer.media[index]
    offer_conn = offer.connection_for(index)
    assert offer_conn is not None  # parse_sdp guarantees it for active streams
    addr, atype = local.address_for(offer_conn.addrtype)
    event = _event_codec(m.codecs(), codec.clock_rate) if local.telephone_event else None

    ptime = offer.ptime_for(index)
    ptime = ptime if ptime in _PTIMES else local.ptime
    if m.maxptime is not None and ptime > m.maxptime:
        ptime = max((p for p in _PTIMES if p <= m.maxptime), default=_PTIMES[0])

    offered_dir = offer.direction_for(index)
    if offer_conn.is_null and offered_dir in ("sendrecv", "recvonly"):
        # RFC 2543 hold (RFC 3264 8.4): the offerer gave no address, so it cannot receive.
        offered_dir = "sendonly" if offered_dir == "sendrecv" else "inactive"
    direction = _REVERSE.get(offered_dir, "inactive")

    attrs: Attributes = [("rtpmap", f"{codec.payload_type} {codec.name.upper()}/8000")]
    formats = [str(codec.payload_type)]
    if event is not None:
        formats.append(str(event.payload_type))
        attrs.append(("rtpmap", f"{event.payload_type} telephone-event/{event.clock_rate}"))
        if event.fmtp:
            attrs.append(("fmtp", f"{event.payload_type} {event.fmtp}"))
    attrs.append(("ptime", str(ptime)))
    if local.rtcp_mux and m.has_attr("rtcp-mux"):
        attrs.append(("rtcp-mux", None))
    if crypto is not None:
        attrs.append(("crypto", local.crypto(crypto.tag, crypto.suite).to_str()))
    attrs.append((direction, None))

    media = [MediaDescription(o.media, 0, o.proto, list(o.formats)) for o in offer.media]
    media[index] = MediaDescription("audio", local.rtp_port, m.proto, formats, attributes=attrs)
    sid = str(session_id if session_id is not None else random.getrandbits(62))
    if previous is not None:
        sid, version = previous.origin.session_id, previous.origin.version
    result = SessionDescription(
        Origin(local.username, sid, version, addr, atype),
        local.session_name,
        Connection(addr, atype),
        media=media,
    )
    if previous is not None and _changed(previous, result):
        result.origin.version += 1
    return result


def _changed(old: SessionDescription, new: SessionDescription) -> bool:
    probe = new.copy()
    probe.origin = old.origin
    return probe.to_str() != old.to_str()


def make_offer(
    local: MediaConfig, session_id: int, version: int = 0, direction: str = "sendrecv"
) -> SessionDescription:
    """Our offer (delayed offer in the 200 OK, or a re-INVITE/hold with ``direction``)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"bad direction {direction!r}")
    _, atype = local.address_for(_addrtype(local.address))
    formats = [str(_G711_PT[c]) for c in local.codecs]
    attrs: Attributes = [
        ("rtpmap", f"{f} {c}/8000") for f, c in zip(formats, local.codecs, strict=True)
    ]
    if local.telephone_event:
        pt = local.telephone_event_pt
        formats.append(str(pt))
        attrs += [("rtpmap", f"{pt} telephone-event/8000"), ("fmtp", f"{pt} 0-16")]
    attrs.append(("ptime", str(local.ptime)))
    proto = "RTP/AVP"
    if local.srtp == "required":  # SDES: every suite we do, ours first (RFC 4568 6.1)
        proto = "RTP/SAVP"
        attrs += [("crypto", local.crypto(t, s).to_str()) for t, s in enumerate(SUITES, 1)]
    attrs.append((direction, None))
    return SessionDescription(
        Origin(local.username, str(session_id), version, local.address, atype),
        local.session_name,
        Connection(local.address, atype),
        media=[MediaDescription("audio", local.rtp_port, proto, formats, attributes=attrs)],
    )


def bump_version(sdp: SessionDescription) -> SessionDescription:
    """A copy with o= version + 1, for a re-offer that changes the session."""
    out = sdp.copy()
    out.origin.version += 1
    return out


def _negotiated(local: SessionDescription, remote: SessionDescription, i: int) -> NegotiatedMedia:
    lm, rm = local.media[i], remote.media[i]
    lcodecs, rcodecs = lm.codecs(), rm.codecs()
    common = [
        c
        for c in rcodecs
        if c.name.upper() in _G711
        and c.clock_rate == 8000
        and any(c.same_format(x) for x in lcodecs)
    ]
    if not common:
        raise SdpError(f"stream {i}: no G.711 codec common to both sides")
    codec = common[0]
    lte, rte = _event_codec(lcodecs, 8000), _event_codec(rcodecs, 8000)
    if lte is None or rte is None:
        lte = rte = None
    rptime = remote.ptime_for(i)
    lptime = local.ptime_for(i)
    ptime = rptime if rptime in _PTIMES else lptime if lptime in _PTIMES else 20
    conn = remote.connection_for(i)
    assert conn is not None
    ldir, rdir = local.direction_for(i), remote.direction_for(i)
    send = ldir in ("sendrecv", "sendonly") and rdir in ("sendrecv", "recvonly")
    send = send and not conn.is_null
    recv = ldir in ("sendrecv", "recvonly") and rdir in ("sendrecv", "sendonly")
    direction = {(True, True): "sendrecv", (True, False): "sendonly", (False, True): "recvonly"}
    rtcp = rm.rtcp
    srtp = _keys(lm, rm, i)
    return NegotiatedMedia(
        stream_index=i,
        remote_address=conn.host,
        remote_port=rm.port,
        payload_type=codec.payload_type,
        codec=codec.name.upper(),
        clock_rate=codec.clock_rate,
        telephone_event_pt=rte.payload_type if rte else None,
        recv_telephone_event_pt=lte.payload_type if lte else None,
        ptime=ptime,
        direction=direction.get((send, recv), "inactive"),
        rtcp_port=rtcp[0] if rtcp else None,
        rtcp_address=rtcp[1] if rtcp else None,
        rtcp_mux=lm.has_attr("rtcp-mux") and rm.has_attr("rtcp-mux"),
        srtp=srtp,
    )


def _keys(lm: MediaDescription, rm: MediaDescription, i: int) -> SrtpKeys | None:
    """Our crypto line and the peer's with the same tag and suite (the answer has one)."""
    mine, _ = lm.cryptos()
    if not mine:
        return None
    theirs, _ = rm.cryptos()
    for r in theirs:
        for c in mine:
            if (c.tag, c.suite) == (r.tag, r.suite) and c.supported and r.supported:
                return SrtpKeys.from_crypto(c, r)
    raise NoCommonCodec(f"stream {i}: no a=crypto matching ours (SRTP keys)", 302)


def answered_media(offer: SessionDescription, our_answer: SessionDescription) -> NegotiatedMedia:
    """The media we agreed to in :func:`answer`, seen from our side (we are the answerer)."""
    for i, m in enumerate(our_answer.media):
        if m.port != 0 and m.media == "audio":
            return _negotiated(our_answer, offer, i)
    raise NoCommonCodec("answer accepts no audio stream")


def accept_answer(our_offer: SessionDescription, answer_sdp: SessionDescription) -> NegotiatedMedia:
    """Check the peer's answer against our offer (RFC 3264 section 6) and negotiate.

    The answer must mirror our m= lines and only use formats we offered; a valid answer
    that rejects every audio stream raises :class:`NoCommonCodec`.
    """
    if len(answer_sdp.media) != len(our_offer.media):
        raise SdpError("answer has a different number of m= lines than the offer")
    chosen: int | None = None
    for i, (o, a) in enumerate(zip(our_offer.media, answer_sdp.media, strict=True)):
        if (o.media, o.proto.upper()) != (a.media, a.proto.upper()):
            raise SdpError(f"answer m= line {i} is {a.media} {a.proto}, offer had {o.media}")
        if a.port == 0:
            continue
        if o.port == 0:
            raise SdpError(f"answer accepts stream {i} that we rejected")
        offered = o.codecs()
        for c in a.codecs():
            if not any(c.same_format(x) for x in offered):
                raise SdpError(f"answer uses {c.name}/{c.clock_rate}, which we did not offer")
        secure = a.proto.upper() in _SRTP_PROTOS
        if chosen is None and a.media == "audio" and (a.proto.upper() in _RTP_PROTOS or secure):
            chosen = i
    if chosen is None:
        raise NoCommonCodec("the answer rejected our audio stream")
    return _negotiated(our_offer, answer_sdp, chosen)

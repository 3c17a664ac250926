"""SDP (RFC 4566) parse/serialize and RFC 3264 offer/answer for one G.711 audio stream.

Sans-I/O: text in, dataclasses out, and back; no sockets, no clock (session ids and
versions are passed in).  The bridge speaks PCMU and PCMA plus RFC 4733 telephone-event,
so negotiation reduces to picking one audio stream, one codec and the DTMF payload type,
and rejecting every other stream *in place* (port 0) so offer and answer m= lines stay
aligned, as RFC 3264 section 6 requires.

* Codec choice: the first codec in the **offer's** order that we support (RFC 3264
  section 6.1 asks the answerer to honour the offerer's preference), unless
  ``MediaConfig.prefer_local`` is set, then the first of ``MediaConfig.codecs`` offered.
* telephone-event is answered with the offer's payload type number and fmtp, at the
  chosen codec's clock rate (8000), never the 48 kHz one some offers pair with Opus.
* The answer lists exactly one audio codec, so the peer cannot switch codecs mid-call.
* Malformed input raises :class:`SdpError` (status 400) and nothing else; an offer we
  cannot serve raises :class:`NoCommonCodec` (status 488, with Warning header text).
"""

from __future__ import annotations

import base64
import binascii
import copy
import re
from dataclasses import dataclass, field

__all__ = [
    "DIRECTIONS",
    "STATIC_PAYLOAD_TYPES",
    "Connection",
    "CryptoAttribute",
    "MediaDescription",
    "NoCommonCodec",
    "Origin",
    "SdpCodec",
    "SdpError",
    "SessionDescription",
    "parse_sdp",
]

DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")

#: RFC 3551 tables 4 and 5: payload types usable without an a=rtpmap line.
STATIC_PAYLOAD_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("PCMU", 8000, 1), 3: ("GSM", 8000, 1), 4: ("G723", 8000, 1), 5: ("DVI4", 8000, 1),
    6: ("DVI4", 16000, 1), 7: ("LPC", 8000, 1), 8: ("PCMA", 8000, 1), 9: ("G722", 8000, 1),
    10: ("L16", 44100, 2), 11: ("L16", 44100, 1), 12: ("QCELP", 8000, 1), 13: ("CN", 8000, 1),
    14: ("MPA", 90000, 1), 15: ("G728", 8000, 1), 16: ("DVI4", 11025, 1),
    17: ("DVI4", 22050, 1), 18: ("G729", 8000, 1), 25: ("CelB", 90000, 1),
    26: ("JPEG", 90000, 1), 28: ("nv", 90000, 1), 31: ("H261", 90000, 1),
    32: ("MPV", 90000, 1), 33: ("MP2T", 90000, 1), 34: ("H263", 90000, 1),
}  # fmt: skip

_NUM = re.compile(r"[0-9]{1,20}")
_PORT = re.compile(r"([0-9]{1,5})(?:/([0-9]{1,5}))?")
_RTPMAP = re.compile(r"([0-9]{1,3})\s+([^/\s]+)/([0-9]{1,9})(?:/([0-9]{1,2}))?")


class SdpError(ValueError):
    """Malformed or unacceptable SDP; ``status`` is the SIP response code to send."""

    status = 400


class NoCommonCodec(SdpError):
    """The offer has no audio stream we can serve: answer 488 with :meth:`warning`."""

    status = 488

    def __init__(self, message: str, warn_code: int = 305) -> None:
        super().__init__(message)
        self.warn_code = warn_code  # RFC 3261 20.43: 302 transport, 304 media, 305 format

    def warning(self, agent: str = "sip-bridge") -> str:
        """Value for the Warning header of the 488 (RFC 3261 section 20.43)."""
        text = str(self).replace("\\", "/").replace('"', "'")
        return f'{self.warn_code} {agent} "{text}"'


@dataclass
class Origin:
    """The o= line; ``version`` must grow whenever a re-offer/answer changes (RFC 3264 8)."""

    username: str
    session_id: str
    version: int
    address: str
    addrtype: str = "IP4"
    nettype: str = "IN"

    def to_str(self) -> str:
        return (
            f"{self.username} {self.session_id} {self.version} "
            f"{self.nettype} {self.addrtype} {self.address}"
        )

    @classmethod
    def parse(cls, value: str) -> Origin:
        parts = value.split()
        if len(parts) != 6:
            raise SdpError(f"o= needs 6 fields: {value!r}")
        user, sid, ver, net, atype, addr = parts  # sid kept verbatim: some stacks use hex
        if not _NUM.fullmatch(ver):  # not int(): it takes '+1', '1_0' and Unicode digits
            raise SdpError(f"bad o= version: {ver!r}")
        return cls(user, sid, int(ver), addr, atype, net)


@dataclass
class Connection:
    """A c= line; ``address`` may carry a multicast /ttl suffix, :attr:`host` drops it."""

    address: str
    addrtype: str = "IP4"
    nettype: str = "IN"

    @property
    def host(self) -> str:
        return self.address.split("/", 1)[0]

    @property
    def is_null(self) -> bool:
        """RFC 2543 hold (c=0.0.0.0): the peer does not want to receive anything."""
        return self.host in ("0.0.0.0", "::")

    def to_str(self) -> str:
        return f"{self.nettype} {self.addrtype} {self.address}"

    @classmethod
    def parse(cls, value: str) -> Connection:
        parts = value.split()
        if len(parts) != 3:
            raise SdpError(f"c= needs 3 fields: {value!r}")
        return cls(parts[2], parts[1], parts[0])


@dataclass(frozen=True)
class SdpCodec:
    """One payload type of an m= line, resolved through a=rtpmap or the static table."""

    payload_type: int
    name: str
    clock_rate: int
    channels: int = 1
    fmtp: str | None = None

    def same_format(self, other: SdpCodec) -> bool:
        """Same encoding regardless of payload type number (RFC 3264 lets them differ)."""
        mine, theirs = (self.name.upper(), self.clock_rate, self.channels), other
        return mine == (theirs.name.upper(), theirs.clock_rate, theirs.channels)


Attributes = list[tuple[str, str | None]]  # (name, value) in order; flags have None

#: RFC 4568 suites whose master key||salt is 16 + 14 bytes (the ones libsrtp and we do).
SRTP_KEY_LENGTHS = {"AES_CM_128_HMAC_SHA1_80": 30, "AES_CM_128_HMAC_SHA1_32": 30}
_CRYPTO = re.compile(r"([0-9]{1,9})\s+(\S+)\s+(\S+)((?:\s+\S+)*)\s*")
_LIFETIME = re.compile(r"(?:2\^)?[0-9]{1,20}")
_MKI = re.compile(r"([0-9]{1,20}):([0-9]{1,3})")


@dataclass(frozen=True)
class CryptoAttribute:
    """One RFC 4568 ``a=crypto`` line (SDES): the sender's own SRTP master key and salt.

    Why its own type: the key travels in the SDP, so parsing is strict (a line we cannot
    use must be told apart from one we read wrongly), and our answer names the offer's tag.
    """

    tag: int
    suite: str
    key_salt: bytes
    lifetime: str | None = None
    mki: str | None = None  # "value:length" when given (we cannot do MKI: not acceptable)
    session_params: tuple[str, ...] = ()

    @property
    def supported(self) -> bool:
        """A suite we do, with no MKI and no session parameters (RFC 4568 6.3.3)."""
        return self.suite in SRTP_KEY_LENGTHS and self.mki is None and not self.session_params

    def to_str(self) -> str:
        key = "inline:" + base64.b64encode(self.key_salt).decode("ascii")
        if self.lifetime is not None:
            key += f"|{self.lifetime}"
        if self.mki is not None:
            key += f"|{self.mki}"
        return " ".join([str(self.tag), self.suite, key, *self.session_params])

    @classmethod
    def parse(cls, value: str) -> CryptoAttribute:
        """SdpError naming what is wrong with a malformed line."""
        m = _CRYPTO.fullmatch(value.strip())
        if not m:
            raise SdpError(f"a=crypto needs '<tag> <suite> inline:<key>': {value[:60]!r}")
        tag, suite, key_params = int(m.group(1)), m.group(2), m.group(3)
        if ";" in key_params:
            raise SdpError("a=crypto with several keys is not supported")
        method, _, info = key_params.partition(":")
        if method.lower() != "inline" or not info:
            raise SdpError(f"a=crypto key method must be inline: {key_params[:40]!r}")
        key_b64, *rest = info.split("|")
        try:
            key = base64.b64decode(key_b64, validate=True)
        except (binascii.Error, ValueError):
            raise SdpError("a=crypto key is not base64") from None
        want = SRTP_KEY_LENGTHS.get(suite)
        if want is not None and len(key) != want:
            raise SdpError(f"a=crypto {suite} key||salt must be {want} bytes, got {len(key)}")
        lifetime = mki = None
        for part in rest:
            if _MKI.fullmatch(part) and mki is None:
                mki = part
            elif _LIFETIME.fullmatch(part) and lifetime is None and mki is None:
                lifetime = part
            else:
                raise SdpError(f"a=crypto bad lifetime or MKI: {part[:30]!r}")
        return cls(tag, suite, key, lifetime, mki, tuple(m.group(4).split()))


def _values(attrs: Attributes, name: str) -> list[str]:
    return [v for n, v in attrs if n == name and v is not None]


def _direction(attrs: Attributes) -> str | None:
    found = [n for n, v in attrs if n in DIRECTIONS and v is None]
    return found[-1] if found else None


def _number_attr(attrs: Attributes, name: str) -> int | None:
    """a=ptime / a=maxptime; some stacks write '20.0', anything unreadable counts as absent."""
    for v in _values(attrs, name):
        try:
            f = float(v.strip())
        except ValueError:
            continue
        if f.is_integer() and 0 < f < 10000:
            return int(f)
    return None


@dataclass
class MediaDescription:
    """One m= section; ``extra`` keeps i=/b=/k= and unknown lines verbatim."""

    media: str
    port: int
    proto: str
    formats: list[str]
    port_count: int | None = None
    connection: Connection | None = None
    attributes: Attributes = field(default_factory=list)
    extra: list[tuple[str, str]] = field(default_factory=list)

    def attr(self, name: str) -> str | None:
        vals = _values(self.attributes, name)
        return vals[0] if vals else None

    def has_attr(self, name: str) -> bool:
        return any(n == name for n, _ in self.attributes)

    @property
    def direction(self) -> str | None:
        return _direction(self.attributes)

    @property
    def ptime(self) -> int | None:
        return _number_attr(self.attributes, "ptime")

    @property
    def maxptime(self) -> int | None:
        return _number_attr(self.attributes, "maxptime")

    @property
    def rtcp(self) -> tuple[int, str | None] | None:
        """RFC 3605 a=rtcp:port [IN IP4 addr]; None when absent or unreadable."""
        value = self.attr("rtcp")
        if value is None:
            return None
        parts = value.split()
        if not parts or not _PORT.fullmatch(parts[0]) or "/" in parts[0]:
            return None
        port = int(parts[0])
        if not 0 < port < 65536:
            return None
        return port, parts[3] if len(parts) == 4 else None

    def cryptos(self) -> tuple[list[CryptoAttribute], list[str]]:
        """The ``a=crypto`` lines in order, and why each unreadable one was left out."""
        good: list[CryptoAttribute] = []
        bad: list[str] = []
        for v in _values(self.attributes, "crypto"):
            try:
                good.append(CryptoAttribute.parse(v))
            except SdpError as exc:
                bad.append(str(exc))
        return good, bad

    def codecs(self) -> list[SdpCodec]:
        """Payload types in m= order with names; unknown dynamic PTs are left out."""
        rtpmap: dict[int, tuple[str, int, int]] = {}
        for v in _values(self.attributes, "rtpmap"):
            m = _RTPMAP.fullmatch(v.strip())
            if m:
                chans = int(m.group(4)) if m.group(4) else 1
                rtpmap.setdefault(int(m.group(1)), (m.group(2), int(m.group(3)), chans))
        fmtp: dict[int, str] = {}
        for v in _values(self.attributes, "fmtp"):
            num, _, params = v.strip().partition(" ")
            if _NUM.fullmatch(num) and len(num) <= 3:
                fmtp.setdefault(int(num), params.strip())
        out = []
        for f in self.formats:
            if not _NUM.fullmatch(f) or len(f) > 3 or int(f) > 127:
                continue
            pt = int(f)
            info = rtpmap.get(pt) or STATIC_PAYLOAD_TYPES.get(pt)
            if info is not None:
                out.append(SdpCodec(pt, info[0], info[1], info[2], fmtp.get(pt)))
        return out

    def lines(self) -> list[str]:
        port = f"{self.port}/{self.port_count}" if self.port_count is not None else str(self.port)
        out = [f"m={self.media} {port} {self.proto}" + "".join(" " + f for f in self.formats)]
        out += _extra(self.extra, "i")
        if self.connection is not None:
            out.append(f"c={self.connection.to_str()}")
        out += _extra(self.extra, "b") + _extra(self.extra, "k")
        out += [f"{t}={v}" for t, v in self.extra if t not in "ibk"]
        out += [f"a={n}" if v is None else f"a={n}:{v}" for n, v in self.attributes]
        return out


def _extra(extra: list[tuple[str, str]], types: str) -> list[str]:
    return [f"{t}={v}" for t, v in extra if t in types]


@dataclass
class SessionDescription:
    """A whole SDP body; ``extra`` keeps i/u/e/p/b/t/r/z/k and unknown session lines."""

    origin: Origin
    session_name: str = "-"
    connection: Connection | None = None
    attributes: Attributes = field(default_factory=list)
    media: list[MediaDescription] = field(default_factory=list)
    extra: list[tuple[str, str]] = field(default_factory=lambda: [("t", "0 0")])

    def connection_for(self, index: int) -> Connection | None:
        """Media-level c= wins over the session-level one (RFC 4566 section 5.7)."""
        return self.media[index].connection or self.connection

    def direction_for(self, index: int) -> str:
        """Media-level direction, else session-level, else sendrecv (RFC 3264 5.1)."""
        return self.media[index].direction or _direction(self.attributes) or "sendrecv"

    def ptime_for(self, index: int) -> int | None:
        return self.media[index].ptime or _number_attr(self.attributes, "ptime")

    def to_str(self) -> str:
        out = ["v=0", f"o={self.origin.to_str()}", f"s={self.session_name}"]
        out += _extra(self.extra, "iuep")
        if self.connection is not None:
            out.append(f"c={self.connection.to_str()}")
        out += _extra(self.extra, "b") + _extra(self.extra, "trz") + _extra(self.extra, "k")
        out += [f"a={n}" if v is None else f"a={n}:{v}" for n, v in self.attributes]
        out += [f"{t}={v}" for t, v in self.extra if t not in "iuepbtrzk"]
        for m in self.media:
            out += m.lines()
        return "\r\n".join(out) + "\r\n"

    def to_bytes(self) -> bytes:
        return self.to_str().encode("utf-8")

    def copy(self) -> SessionDescription:
        return copy.deepcopy(self)


def parse_sdp(data: str | bytes) -> SessionDescription:
    """Parse an SDP body (CRLF or bare LF); unknown lines and attributes are kept."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = data.decode("latin-1")
    else:
        text = data
    lines = [ln for ln in re.split(r"\r\n|\n|\r", text) if ln.strip()]
    if not lines or lines[0].strip() != "v=0":
        raise SdpError("SDP must start with v=0")
    origin: Origin | None = None
    name: str | None = None
    conn: Connection | None = None
    attrs: Attributes = []
    extra: list[tuple[str, str]] = []
    media: list[MediaDescription] = []
    for line in lines[1:]:
        if len(line) < 2 or line[1] != "=" or not (line[0].isascii() and line[0].isalpha()):
            raise SdpError(f"not an SDP line: {line[:40]!r}")
        kind, value = line[0], line[2:]
        if kind == "m":
            media.append(_parse_m(value))
        elif kind == "a":
            n, sep, v = value.partition(":")
            (media[-1].attributes if media else attrs).append((n, v if sep else None))
        elif kind == "c":
            target = media[-1] if media else None
            if (target.connection if target else conn) is not None:
                raise SdpError("duplicate c= line")
            if target is not None:
                target.connection = Connection.parse(value)
            else:
                conn = Connection.parse(value)
        elif media:
            media[-1].extra.append((kind, value))
        elif kind == "o":
            if origin is not None:
                raise SdpError("duplicate o= line")
            origin = Origin.parse(value)
        elif kind == "s":
            if name is not None:
                raise SdpError("duplicate s= line")
            name = value
        elif kind == "v":
            raise SdpError("duplicate v= line")
        else:
            extra.append((kind, value))
    if origin is None or name is None:
        raise SdpError("SDP lacks o= or s=")
    for i, m in enumerate(media):
        if m.port != 0 and m.connection is None and conn is None:
            raise SdpError(f"no c= for active m= line {i} ({m.media})")
        m.extra.sort(key=lambda e: _MEDIA_ORDER.get(e[0], 3))
    # Senders get RFC 4566's line order wrong; keep what we serialise (stable per group).
    extra.sort(key=lambda e: _SESSION_ORDER.get(e[0], 4))
    return SessionDescription(origin, name, conn, attrs, media, extra)


# RFC 4566 section 5 order, in the groups `to_str` writes them.
_SESSION_ORDER = {"i": 0, "u": 0, "e": 0, "p": 0, "b": 1, "t": 2, "r": 2, "z": 2, "k": 3}
_MEDIA_ORDER = {"i": 0, "b": 1, "k": 2}


def _parse_m(value: str) -> MediaDescription:
    parts = value.split()
    if len(parts) < 3:
        raise SdpError(f"m= line too short: {value!r}")
    pm = _PORT.fullmatch(parts[1])
    if not pm or int(pm.group(1)) > 65535:
        raise SdpError(f"bad m= port: {parts[1]!r}")
    port = int(pm.group(1))
    count = int(pm.group(2)) if pm.group(2) else None
    if count == 0:
        raise SdpError("m= port count of zero")
    if port != 0 and len(parts) < 4:
        raise SdpError(f"m= line without formats: {value!r}")
    return MediaDescription(parts[0], port, parts[2], parts[3:], count)

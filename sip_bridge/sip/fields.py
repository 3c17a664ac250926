"""Structured SIP header values (RFC 3261 section 25): URIs, Via, name-addr, parameters.

Kept apart from message framing (:mod:`sip_bridge.sip.message`) because every layer
above (transactions, dialogs, routing) reads these, and the grammar is its own
body of rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = [
    "SCHEME_URI",
    "TOKEN",
    "NameAddr",
    "SipParseError",
    "SipUri",
    "Via",
    "is_digits",
]

TOKEN = re.compile(r"[A-Za-z0-9\-.!%*_+`'~]+")
SCHEME_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:\S+")
_HOSTNAME = re.compile(r"[A-Za-z0-9\-._]+")
_IPV6 = re.compile(r"[0-9A-Fa-f:.]+(%[A-Za-z0-9\-._~]+)?")
_PARAM_VALUE = re.compile(r'[^\s;,"<>]+')


def is_digits(text: str) -> bool:
    """ASCII digits only (str.isdigit also accepts superscripts that int() refuses)."""
    return text.isascii() and text.isdigit()


class SipParseError(ValueError):
    """Malformed SIP input; ``status`` is the response a server should send (400/413/505...)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


# --- URIs, Via, name-addr -------------------------------------------------------------


_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"', re.S)
_PARAM_PIECE = re.compile(r'[ \t]*;((?:[^;"]|"(?:[^"\\]|\\.)*")*)')


def _unquote(text: str) -> tuple[str, str]:
    """Read a quoted-string at the start of ``text``; return (unescaped, rest)."""
    m = _QUOTED.match(text)
    if not m:
        raise SipParseError("unterminated quoted string")
    return re.sub(r"\\(.)", r"\1", m.group(1), flags=re.S), text[m.end() :]


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _parse_params(text: str, what: str) -> dict[str, str | None]:
    """``;name[=value]`` pairs (names lowercased, values kept as written, quotes too)."""
    params: dict[str, str | None] = {}
    text = text.rstrip(" \t")
    pos = 0
    while pos < len(text):
        m = _PARAM_PIECE.match(text, pos)
        if not m:
            raise SipParseError(f"unexpected {text[pos : pos + 20]!r} in {what}")
        pos = m.end()
        name, eq, value = m.group(1).partition("=")
        name = name.strip(" \t").lower()
        value = value.strip(" \t")
        if not name and not eq:
            continue  # tolerate an empty ";;"
        if not TOKEN.fullmatch(name):
            raise SipParseError(f"bad parameter {m.group(1)!r} in {what}")
        if not eq:
            params[name] = None
        elif _QUOTED.fullmatch(value) or _PARAM_VALUE.fullmatch(value):
            params[name] = value
        else:
            raise SipParseError(f"bad value for parameter {name!r} in {what}")
    return params


def _format_params(params: dict[str, str | None]) -> str:
    return "".join(f";{k}" if v is None else f";{k}={v}" for k, v in params.items())


def _parse_hostport(text: str, what: str) -> tuple[str, int | None]:
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not _IPV6.fullmatch(host) or ":" not in host:
            raise SipParseError(f"bad IPv6 host in {what}")
    else:
        host, colon, port_text = text.partition(":")
        rest = colon + port_text
        if not _HOSTNAME.fullmatch(host):
            raise SipParseError(f"bad host {host!r} in {what}")
    if not rest:
        return host, None
    if not rest.startswith(":") or not is_digits(rest[1:]) or len(rest) > 6:
        raise SipParseError(f"bad port in {what}")
    port = int(rest[1:])
    if port > 65535:
        raise SipParseError(f"port {port} out of range in {what}")
    return host, port


def _format_hostport(host: str, port: int | None) -> str:
    h = f"[{host}]" if ":" in host else host
    return h if port is None else f"{h}:{port}"


@dataclass
class SipUri:
    """``sip:`` / ``sips:`` URI: user@host:port;params?headers (user may carry ;params)."""

    scheme: str
    user: str | None
    host: str
    port: int | None = None
    params: dict[str, str | None] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, s: str) -> SipUri:
        s = s.strip(" \t")
        scheme, colon, rest = s.partition(":")
        scheme = scheme.lower()
        if not colon or scheme not in ("sip", "sips"):
            raise SipParseError(f"unsupported URI scheme in {s[:40]!r}", 416)
        if rest.count("@") > 1 or any(c in rest for c in ' \t<>"'):
            raise SipParseError(f"malformed URI {s[:40]!r}")
        user: str | None = None
        if "@" in rest:
            user, _, rest = rest.partition("@")
            if not user:
                raise SipParseError("empty user part in URI")
        rest, _, hdrs = rest.partition("?")
        hostport, _, params = rest.partition(";")
        host, port = _parse_hostport(hostport, "URI")
        headers: dict[str, str] = {}
        for pair in filter(None, hdrs.split("&")):
            name, _, value = pair.partition("=")
            headers[name] = value
        return cls(scheme, user, host, port, _parse_params(";" + params, "URI"), headers)

    def to_str(self) -> str:
        user = f"{self.user}@" if self.user is not None else ""
        hdrs = "&".join(f"{k}={v}" for k, v in self.headers.items())
        return (
            f"{self.scheme}:{user}{_format_hostport(self.host, self.port)}"
            f"{_format_params(self.params)}{'?' + hdrs if hdrs else ''}"
        )

    @property
    def transport(self) -> str | None:
        value = self.params.get("transport")
        return value.lower() if value else None

    @property
    def lr(self) -> bool:
        return "lr" in self.params

    def __str__(self) -> str:
        return self.to_str()


_VIA_PROTO = re.compile(r"SIP[ \t]*/[ \t]*2\.0[ \t]*/[ \t]*([A-Za-z0-9\-.!%*_+`'~]+)[ \t]+", re.I)


@dataclass
class Via:
    """One Via value: ``SIP/2.0/UDP host:port;branch=z9hG4bK...;rport`` (param names lowercased)."""

    transport: str
    host: str
    port: int | None = None
    params: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def parse(cls, s: str) -> Via:
        s = s.strip(" \t")
        m = _VIA_PROTO.match(s)
        if not m:
            raise SipParseError(f"bad Via {s[:60]!r}")
        rest = s[m.end() :]
        sent_by, _, params = rest.partition(";")
        host, port = _parse_hostport(sent_by.strip(" \t"), "Via")
        return cls(m.group(1).upper(), host, port, _parse_params(";" + params, "Via"))

    def to_str(self) -> str:
        hostport = _format_hostport(self.host, self.port)
        return f"SIP/2.0/{self.transport} {hostport}{_format_params(self.params)}"

    @property
    def branch(self) -> str | None:
        return self.params.get("branch")

    @property
    def received(self) -> str | None:
        return self.params.get("received")

    @property
    def rport(self) -> int | None:
        """The filled-in rport (RFC 3581); None when absent or still empty."""
        value = self.params.get("rport")
        return int(value) if value and is_digits(value) else None

    def __str__(self) -> str:
        return self.to_str()


@dataclass
class NameAddr:
    """From/To/Contact/Route value: optional display name, URI text, header params (tag...)."""

    display: str | None
    uri: str
    params: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def parse(cls, s: str) -> NameAddr:
        s = s.strip(" \t")
        display: str | None = None
        if s.startswith('"'):
            display, s = _unquote(s)
            s = s.lstrip(" \t")
            if not s.startswith("<"):
                raise SipParseError("quoted display name without <URI>")
        if "<" in s:
            before, _, s = s.partition("<")
            if display is None and before.strip(" \t"):
                display = " ".join(before.split())
                if any(c in display for c in '"<>'):
                    raise SipParseError("bad display name")
            uri, closed, rest = s.partition(">")
            uri = uri.strip(" \t")
            if not closed or not SCHEME_URI.fullmatch(uri) or "<" in uri:
                raise SipParseError("bad <URI> in name-addr")
        else:  # addr-spec form: ;params belong to the header, not to the URI
            uri, semi, rest = s.partition(";")
            uri = uri.strip(" \t")
            rest = semi + rest
            if uri != "*" and (not SCHEME_URI.fullmatch(uri) or any(c in uri for c in ',?>"')):
                raise SipParseError(f"bad address {uri[:40]!r}")
        return cls(display, uri, _parse_params(rest, "address"))

    def to_str(self) -> str:
        if self.uri == "*" and self.display is None:
            return "*" + _format_params(self.params)
        name = _quote(self.display) + " " if self.display is not None else ""
        return f"{name}<{self.uri}>{_format_params(self.params)}"

    @property
    def tag(self) -> str | None:
        return self.params.get("tag")

    def __str__(self) -> str:
        return self.to_str()

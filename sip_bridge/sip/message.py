"""SIP messages (RFC 3261 sections 7 and 25): parse and serialize, sans-I/O.

Bytes in, :class:`SipRequest` / :class:`SipResponse` out, and back with ``to_bytes()``.
:func:`parse_message` takes one datagram; :class:`~sip_bridge.sip.framing.StreamFramer` cuts a
TCP/TLS byte stream into messages by Content-Length.  Every malformed input raises
:class:`SipParseError` (a ``ValueError`` carrying the status to answer with) and nothing
else, so a transport can reply 400/413/505 or drop the datagram without guessing.

Header names are case-insensitive and compact forms (``i``, ``v``, ``f``...) are stored under
their canonical long names; values are stored one per header line, as received (folding
undone), and :meth:`Headers.get_all` splits comma-separated list headers on demand.
IPv6 hosts are stored without brackets (what sockets want) and bracketed again on output.
"""

from __future__ import annotations

import functools
import re
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from sip_bridge.sip.fields import (
    SCHEME_URI,
    TOKEN,
    NameAddr,
    SipParseError,
    SipUri,
    Via,
    is_digits,
)

__all__ = [
    "Headers",
    "NameAddr",
    "SipMessage",
    "SipParseError",
    "SipRequest",
    "SipResponse",
    "SipUri",
    "Via",
    "make_response",
    "new_branch",
    "new_call_id",
    "new_tag",
    "parse_message",
    "reason_phrase",
    "split_list",
]

MAX_HEADER_SIZE = 16 * 1024
MAX_BODY_SIZE = 64 * 1024
_MAX_CSEQ = 2**31 - 1  # RFC 3261 8.1.1.5: the sequence number MUST be less than 2**31


def _words(text: str) -> list[str]:
    return text.split()


_CANONICAL = {
    n.lower(): n
    for n in _words(
        "Accept Accept-Contact Accept-Encoding Accept-Language Alert-Info Allow Allow-Events "
        "Authentication-Info Authorization Call-ID Call-Info Contact Content-Disposition "
        "Content-Encoding Content-Language Content-Length Content-Type CSeq Date Error-Info "
        "Event Expires From Identity In-Reply-To Max-Forwards Min-Expires Min-SE MIME-Version "
        "Organization P-Asserted-Identity P-Preferred-Identity Path Priority Privacy "
        "Proxy-Authenticate Proxy-Authorization Proxy-Require RAck Reason Record-Route "
        "Refer-To Referred-By Reject-Contact Replaces Reply-To Request-Disposition Require "
        "Retry-After Route RSeq Server Service-Route Session-Expires Subject "
        "Subscription-State Supported Timestamp To Unsupported User-Agent Via Warning "
        "WWW-Authenticate"
    )
}
_COMPACT = {
    "a": "Accept-Contact", "b": "Referred-By", "c": "Content-Type", "d": "Request-Disposition",
    "e": "Content-Encoding", "f": "From", "i": "Call-ID", "j": "Reject-Contact",
    "k": "Supported", "l": "Content-Length", "m": "Contact", "o": "Event", "r": "Refer-To",
    "s": "Subject", "t": "To", "u": "Allow-Events", "v": "Via", "x": "Session-Expires",
    "y": "Identity",
}  # fmt: skip
# Headers whose values are comma-separated lists (RFC 3261 7.3.1); others (Date,
# WWW-Authenticate, ...) may hold commas that are not separators.
_LIST_HEADERS = frozenset(
    n.lower()
    for n in _words(
        "Accept Accept-Contact Accept-Encoding Accept-Language Alert-Info Allow Allow-Events "
        "Call-Info Contact Content-Encoding Content-Language Error-Info In-Reply-To Path "
        "P-Asserted-Identity Proxy-Require Reason Record-Route Reject-Contact Require Route "
        "Service-Route Supported Unsupported Via Warning"
    )
)
_SINGLE = ("From", "To", "Call-ID", "CSeq", "Max-Forwards", "Content-Length")
_MANDATORY = ("Via", "From", "To", "Call-ID", "CSeq")

_CSEQ = re.compile(r"([0-9]+)[ \t]+([A-Za-z0-9\-.!%*_+`'~]+)")
_VERSION = re.compile(r"[A-Za-z]+/\d+\.\d+")
_BAD_CHARS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# A quoted-string may carry any control but CR/LF as a quoted-pair (RFC 3261 25.1,
# RFC 4475 3.1.1.2): such strings are blanked before the control-character check.
_QUOTED_WITH_PAIRS = re.compile(r'"(?:[^"\\\x00-\x08\x0a-\x1f\x7f]|\\[^\r\n])*"')
_HEAD_END = re.compile(rb"\r?\n\r?\n")


def canonical_name(name: str) -> str:
    """The canonical spelling of a header name (compact forms expanded)."""
    low = name.lower()
    if low in _COMPACT:
        return _COMPACT[low]
    return _CANONICAL.get(low, name)


@functools.lru_cache(maxsize=1024)
def _key(name: str) -> str:
    """The lookup key of a header name: asked dozens of times per message."""
    return canonical_name(name).lower()


def split_list(value: str) -> list[str]:
    """Split a list header on top-level commas (not inside quotes or <...>)."""
    out: list[str] = []
    start = 0
    quoted = escaped = False
    angle = 0
    for i, ch in enumerate(value):
        if quoted:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch == "<":
            angle += 1
        elif ch == ">" and angle:
            angle -= 1
        elif ch == "," and not angle:
            out.append(value[start:i])
            start = i + 1
    out.append(value[start:])
    return [part.strip(" \t") for part in out if part.strip(" \t")]


class Headers:
    """Ordered, case-insensitive SIP headers; one stored entry per header line."""

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        self._items: list[tuple[str, str]] = []
        self._keys: list[str] = []  # _key() of each item's name, for lookups without .lower()
        for name, value in items:
            self.add(name, value)

    @staticmethod
    def _check(name: str, value: str) -> str:
        if not TOKEN.fullmatch(name):
            raise ValueError(f"invalid header name {name!r}")
        if "\r" in value or "\n" in value:
            raise ValueError(f"line break in {name} header value")
        return canonical_name(name)

    def get(self, name: str) -> str | None:
        values = self.get_all(name)
        return values[0] if values else None

    def get_all(self, name: str) -> list[str]:
        key = _key(name)
        if key not in self._keys:
            return []
        items = self._items
        raw = [items[i][1] for i, k in enumerate(self._keys) if k == key]
        if key in _LIST_HEADERS:
            return [part for v in raw for part in split_list(v)]
        return raw

    def set(self, name: str, value: str) -> None:
        """Replace every line of ``name`` by one, at the position of the first."""
        canon = self._check(name, value)
        key = canon.lower()
        at = self._keys.index(key) if key in self._keys else len(self._items)
        self.remove(name)
        at = min(at, len(self._items))
        self._items.insert(at, (canon, value))
        self._keys.insert(at, key)

    def add(self, name: str, value: str) -> None:
        canon = self._check(name, value)
        self._items.append((canon, value))
        self._keys.append(canon.lower())

    def remove(self, name: str) -> None:
        key = _key(name)
        if key not in self._keys:
            return
        kept = [i for i, k in enumerate(self._keys) if k != key]
        self._items = [self._items[i] for i in kept]
        self._keys = [self._keys[i] for i in kept]

    def items(self) -> list[tuple[str, str]]:
        return list(self._items)

    def copy(self) -> Headers:
        new = Headers()
        new._items = list(self._items)
        new._keys = list(self._keys)
        return new

    def count(self, name: str) -> int:
        """Number of header lines (not list elements) for ``name``."""
        return self._keys.count(_key(name))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.count(name) > 0

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Headers) and self._items == other._items

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"


# --- messages ---------------------------------------------------------------------------


class _MessageMixin:
    """Accessors shared by requests and responses (headers re-parsed on each call)."""

    headers: Headers
    body: bytes

    @property
    def call_id(self) -> str:
        value = self.headers.get("Call-ID")
        if not value:
            raise SipParseError("missing Call-ID")
        return value

    @property
    def cseq(self) -> tuple[int, str]:
        value = self.headers.get("CSeq")
        if value is None:
            raise SipParseError("missing CSeq")
        m = _CSEQ.fullmatch(value)
        if not m:
            raise SipParseError(f"bad CSeq {value!r}")
        if len(m.group(1)) > 10 or int(m.group(1)) > _MAX_CSEQ:
            raise SipParseError(f"CSeq number {m.group(1)} too large")
        return int(m.group(1)), m.group(2)

    @property
    def via(self) -> list[Via]:
        return [Via.parse(v) for v in self.headers.get_all("Via")]

    @property
    def top_via(self) -> Via:
        value = self.headers.get("Via")
        if value is None:
            raise SipParseError("missing Via")
        return Via.parse(value)

    def _head_and_body(self, start: str) -> bytes:
        self.headers.set("Content-Length", str(len(self.body)))
        lines = [start, *(f"{n}: {v}" for n, v in self.headers.items()), "", ""]
        return "\r\n".join(lines).encode("utf-8") + self.body


@dataclass
class SipRequest(_MessageMixin):
    method: str
    uri: str
    headers: Headers
    body: bytes = b""

    def to_bytes(self) -> bytes:
        """Serialize (sets Content-Length to the body length in ``headers``)."""
        return self._head_and_body(f"{self.method} {self.uri} SIP/2.0")


@dataclass
class SipResponse(_MessageMixin):
    status: int
    reason: str
    headers: Headers
    body: bytes = b""

    def to_bytes(self) -> bytes:
        """Serialize (sets Content-Length to the body length in ``headers``)."""
        return self._head_and_body(f"SIP/2.0 {self.status} {self.reason}".rstrip(" "))


SipMessage = SipRequest | SipResponse


def _parse_head(head: bytes) -> tuple[str, Headers]:
    """Start line and headers of one message head (no terminating blank line)."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SipParseError("message head is not UTF-8") from exc
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    for line in lines:
        if _BAD_CHARS.search(_QUOTED_WITH_PAIRS.sub('""', line) if "\\" in line else line):
            raise SipParseError("control character in message head")
    entries: list[list[str]] = []
    for line in lines[1:]:
        if line[:1] in (" ", "\t"):  # folded continuation (RFC 3261 7.3.1)
            if not entries:
                raise SipParseError("continuation line before any header")
            if line.strip(" \t"):
                entries[-1][1] = (entries[-1][1] + " " + line.strip(" \t")).strip(" \t")
            continue
        name, colon, value = line.partition(":")
        name = name.rstrip(" \t")
        if not colon or not TOKEN.fullmatch(name):
            raise SipParseError(f"malformed header line {line[:40]!r}")
        entries.append([name, value.strip(" \t")])
    return lines[0], Headers((n, v) for n, v in entries)


def _content_length(value: str | None) -> int | None:
    if value is None:
        return None
    value = value.strip(" \t")
    if not is_digits(value) or len(value) > 10:
        raise SipParseError(f"bad Content-Length {value!r}")
    return int(value)


def _build(start: str, headers: Headers, body: bytes) -> SipMessage:
    """Validate the start line and mandatory headers, then make the message."""
    parts = re.split(r"[ \t]+", start.strip(" \t"), maxsplit=2)
    msg: SipMessage
    if _VERSION.fullmatch(parts[0]):
        if parts[0].upper() != "SIP/2.0":
            raise SipParseError(f"unsupported version {parts[0]!r}", 505)
        if len(parts) < 2 or not (is_digits(parts[1]) and len(parts[1]) == 3):
            raise SipParseError(f"bad status line {start[:60]!r}")
        status = int(parts[1])
        if not 100 <= status <= 699:
            raise SipParseError(f"status code {status} out of range")
        msg = SipResponse(status, parts[2].strip(" \t") if len(parts) > 2 else "", headers, body)
    else:
        if len(parts) != 3 or not TOKEN.fullmatch(parts[0]):
            raise SipParseError(f"bad request line {start[:60]!r}")
        if not _VERSION.fullmatch(parts[2]):
            raise SipParseError(f"bad request line {start[:60]!r}")
        if parts[2].upper() != "SIP/2.0":
            raise SipParseError(f"unsupported version {parts[2]!r}", 505)
        if not SCHEME_URI.fullmatch(parts[1]):
            raise SipParseError(f"bad Request-URI {parts[1][:40]!r}")
        msg = SipRequest(parts[0], parts[1], headers, body)
    for name in _MANDATORY:
        if not headers.get(name):
            raise SipParseError(f"missing {name} header")
    for name in _SINGLE:
        if len(set(headers.get_all(name))) > 1:
            raise SipParseError(f"more than one {name} header")
    _, method = msg.cseq
    if isinstance(msg, SipRequest) and method != msg.method:
        raise SipParseError(f"CSeq method {method!r} does not match {msg.method!r}")
    if not msg.via:  # parses every Via value, so a bad one is refused here
        raise SipParseError("missing Via header")
    for name in ("From", "To"):
        value = headers.get(name) or ""
        if NameAddr.parse(value).uri == "*":
            raise SipParseError(f"bad {name} header")
    max_forwards = headers.get("Max-Forwards")
    if max_forwards is not None and not (
        is_digits(max_forwards) and len(max_forwards) <= 10 and int(max_forwards) <= 255
    ):
        raise SipParseError(f"bad Max-Forwards {max_forwards!r}")
    return msg


def parse_message(data: bytes) -> SipMessage:
    """Parse one datagram: body by Content-Length, or the rest when it is missing."""
    data = data.lstrip(b"\r\n")
    if not data:
        raise SipParseError("empty message")
    m = _HEAD_END.search(data)
    head, rest = (data[: m.start()], data[m.end() :]) if m else (data.rstrip(b"\r\n"), b"")
    start, headers = _parse_head(head)
    length = _content_length(headers.get("Content-Length"))
    if length is not None:
        if length > len(rest):
            raise SipParseError(f"Content-Length {length} exceeds the {len(rest)} body bytes")
        rest = rest[:length]
    return _build(start, headers, bytes(rest))


# --- responses and identifiers ------------------------------------------------------------

_REASONS = {
    100: "Trying", 180: "Ringing", 181: "Call Is Being Forwarded", 182: "Queued",
    183: "Session Progress", 200: "OK", 202: "Accepted", 300: "Multiple Choices",
    301: "Moved Permanently", 302: "Moved Temporarily", 305: "Use Proxy",
    380: "Alternative Service", 400: "Bad Request", 401: "Unauthorized",
    403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 406: "Not Acceptable",
    407: "Proxy Authentication Required", 408: "Request Timeout", 410: "Gone",
    413: "Request Entity Too Large", 414: "Request-URI Too Long",
    415: "Unsupported Media Type", 416: "Unsupported URI Scheme", 420: "Bad Extension",
    421: "Extension Required", 423: "Interval Too Brief", 480: "Temporarily Unavailable",
    481: "Call/Transaction Does Not Exist", 482: "Loop Detected", 483: "Too Many Hops",
    484: "Address Incomplete", 485: "Ambiguous", 486: "Busy Here", 487: "Request Terminated",
    488: "Not Acceptable Here", 489: "Bad Event", 491: "Request Pending",
    500: "Server Internal Error", 501: "Not Implemented", 502: "Bad Gateway",
    503: "Service Unavailable", 504: "Server Time-out", 505: "Version Not Supported",
    513: "Message Too Large", 600: "Busy Everywhere", 603: "Decline",
    604: "Does Not Exist Anywhere", 606: "Not Acceptable",
}  # fmt: skip
_CLASS_REASONS = {1: "Trying", 2: "OK", 3: "Redirect", 4: "Client Error", 5: "Server Error"}


def reason_phrase(status: int) -> str:
    """The RFC 3261 reason phrase for ``status`` (a generic one for unknown codes)."""
    return _REASONS.get(status) or _CLASS_REASONS.get(status // 100, "Global Failure")


def make_response(
    req: SipRequest, status: int, reason: str | None = None, to_tag: str | None = None
) -> SipResponse:
    """RFC 3261 8.2.6.2: copy Via (all), From, To (+ tag), Call-ID, CSeq; empty body."""
    headers = Headers()
    for via in (v for n, v in req.headers.items() if n == "Via"):
        headers.add("Via", via)
    for name in ("From", "To", "Call-ID", "CSeq"):
        value = req.headers.get(name)
        if value is None:
            continue
        if name == "To" and to_tag is not None and NameAddr.parse(value).tag is None:
            value = f"{value};tag={to_tag}"
        headers.add(name, value)
    timestamp = req.headers.get("Timestamp")
    if status == 100 and timestamp is not None:  # RFC 3261 8.2.6.1
        headers.add("Timestamp", timestamp)
    headers.add("Content-Length", "0")
    return SipResponse(status, reason if reason is not None else reason_phrase(status), headers)


def new_branch() -> str:
    """A fresh RFC 3261 branch: the magic cookie plus 64 random bits."""
    return "z9hG4bK" + secrets.token_hex(8)


def new_tag() -> str:
    return secrets.token_hex(8)


def new_call_id(host: str) -> str:
    return f"{secrets.token_hex(16)}@{host}"

"""HTTP digest authentication for SIP (RFC 2617, RFC 7616, RFC 8760), sans-I/O.

Client side: :func:`parse_challenge` / :func:`choose_challenge` read ``WWW-Authenticate`` and
``Proxy-Authenticate`` values, and :class:`DigestClient` answers them (qop=auth or auth-int,
a fresh cnonce, nc counted per nonce).  Server side: :func:`make_challenge` issues nonces that
carry their own timestamp and an HMAC, so :func:`verify` tells fresh, stale and forged nonces
apart without keeping any per-nonce state.  Every malformed header raises :class:`DigestError`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum

__all__ = [
    "ALGORITHMS",
    "Challenge",
    "DigestClient",
    "DigestError",
    "Verdict",
    "choose_challenge",
    "digest_response",
    "make_challenge",
    "make_nonce",
    "parse_auth_params",
    "parse_challenge",
    "verify",
]

# Preference order when a server offers several challenges (RFC 8760 section 2.4).
ALGORITHMS = ("SHA-256", "SHA-256-sess", "MD5", "MD5-sess")
_HASHES = {"MD5": hashlib.md5, "SHA-256": hashlib.sha256}

_TOKEN = re.compile(r"[A-Za-z0-9\-.!%*_+`'~]+")
_SPACE = re.compile(r"[ \t\r\n]*")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"', re.S)
_UNESCAPE = re.compile(r"\\(.)", re.S)


class DigestError(ValueError):
    """A malformed or unusable challenge / Authorization header."""


def _canonical_algorithm(name: str) -> str:
    for known in ALGORITHMS:
        if known.lower() == name.lower():
            return known
    raise DigestError(f"unsupported digest algorithm {name!r}")


def parse_auth_params(value: str) -> tuple[str, dict[str, str]]:
    """Split ``Scheme name=value, name="quoted, value"`` into the scheme and lower-cased params."""
    m = _TOKEN.match(value, len(_SPACE.match(value).group()))  # type: ignore[union-attr]
    if m is None:
        raise DigestError("missing authentication scheme")
    scheme, pos = m.group(), m.end()
    params: dict[str, str] = {}
    expect_comma = False
    while True:
        pos = _SPACE.match(value, pos).end()  # type: ignore[union-attr]
        if pos >= len(value):
            break
        if expect_comma:
            if value[pos] != ",":
                raise DigestError(f"expected ',' at offset {pos} in {value[:60]!r}")
            pos += 1
            expect_comma = False
            continue
        if value[pos] == ",":  # empty list element (RFC 7230 7) is allowed
            pos += 1
            continue
        name_m = _TOKEN.match(value, pos)
        if name_m is None:
            raise DigestError(f"expected a parameter name at offset {pos}")
        pos = _SPACE.match(value, name_m.end()).end()  # type: ignore[union-attr]
        if pos >= len(value) or value[pos] != "=":
            raise DigestError(f"parameter {name_m.group()!r} has no value")
        pos = _SPACE.match(value, pos + 1).end()  # type: ignore[union-attr]
        quoted = _QUOTED.match(value, pos)
        if quoted is not None:
            text, pos = _UNESCAPE.sub(r"\1", quoted.group(1)), quoted.end()
        else:
            tok = _TOKEN.match(value, pos)
            if tok is None:
                raise DigestError(f"bad value for parameter {name_m.group()!r}")
            text, pos = tok.group(), tok.end()
        name = name_m.group().lower()
        if name in params:
            raise DigestError(f"duplicate parameter {name!r}")
        params[name] = text
        expect_comma = True
    return scheme, params


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class Challenge:
    """One ``Digest`` challenge; ``qop`` is empty for an RFC 2069-style server."""

    realm: str
    nonce: str
    algorithm: str = "MD5"
    qop: tuple[str, ...] = ()
    opaque: str | None = None
    stale: bool = False


def parse_challenge(value: str) -> Challenge:
    """Parse one ``WWW-Authenticate`` / ``Proxy-Authenticate`` value (Digest scheme only)."""
    scheme, params = parse_auth_params(value)
    if scheme.lower() != "digest":
        raise DigestError(f"not a Digest challenge: {scheme!r}")
    if "realm" not in params or "nonce" not in params:
        raise DigestError("Digest challenge without realm or nonce")
    qop = tuple(q.strip().lower() for q in params.get("qop", "").split(",") if q.strip())
    return Challenge(
        realm=params["realm"],
        nonce=params["nonce"],
        algorithm=_canonical_algorithm(params.get("algorithm", "MD5")),
        qop=qop,
        opaque=params.get("opaque"),
        stale=params.get("stale", "false").lower() == "true",
    )


def choose_challenge(values: Iterable[str]) -> Challenge:
    """The strongest usable Digest challenge among several header values (SHA-256 first)."""
    usable: list[Challenge] = []
    for value in values:
        try:
            usable.append(parse_challenge(value))
        except DigestError:
            continue  # other schemes or algorithms we cannot answer
    if not usable:
        raise DigestError("no usable Digest challenge")
    return min(usable, key=lambda c: ALGORITHMS.index(c.algorithm))


def _hash(algorithm: str, text: str) -> str:
    return _HASHES[algorithm.removesuffix("-sess")](text.encode("utf-8")).hexdigest()


def digest_response(
    *,
    algorithm: str,
    username: str,
    realm: str,
    password: str,
    method: str,
    uri: str,
    nonce: str,
    nc: str = "",
    cnonce: str = "",
    qop: str = "",
    body: bytes = b"",
) -> str:
    """The ``response`` value of RFC 7616 section 3.4.1 (RFC 2069 form when qop is empty)."""
    ha1 = _hash(algorithm, f"{username}:{realm}:{password}")
    if algorithm.endswith("-sess"):
        ha1 = _hash(algorithm, f"{ha1}:{nonce}:{cnonce}")
    a2 = f"{method}:{uri}"
    if qop == "auth-int":
        body_hash = _HASHES[algorithm.removesuffix("-sess")](body).hexdigest()
        a2 = f"{a2}:{body_hash}"
    ha2 = _hash(algorithm, a2)
    if not qop:
        return _hash(algorithm, f"{ha1}:{nonce}:{ha2}")
    return _hash(algorithm, f"{ha1}:{nonce}:{nc}:{cnonce}:{qop}:{ha2}")


@dataclass
class DigestClient:
    """Answers challenges for one user; counts nc per nonce so a reused nonce stays valid."""

    username: str
    password: str
    cnonce_source: Callable[[], str] = field(default=lambda: secrets.token_hex(12))
    _nc: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    def authorize(
        self,
        challenge: Challenge,
        method: str,
        uri: str,
        body: bytes = b"",
        *,
        prefer_int: bool = False,
    ) -> str:
        """The ``Authorization`` / ``Proxy-Authorization`` value for one request."""
        if challenge.qop and "auth" not in challenge.qop and "auth-int" not in challenge.qop:
            raise DigestError(f"no supported qop in {challenge.qop}")
        qop = ""
        if challenge.qop:
            want_int = "auth-int" in challenge.qop and (prefer_int or "auth" not in challenge.qop)
            qop = "auth-int" if want_int else "auth"
        count = self._nc.get(challenge.nonce, 0) + 1
        self._nc[challenge.nonce] = count
        nc = f"{count:08x}"
        cnonce = self.cnonce_source() if qop or challenge.algorithm.endswith("-sess") else ""
        response = digest_response(
            algorithm=challenge.algorithm,
            username=self.username,
            realm=challenge.realm,
            password=self.password,
            method=method,
            uri=uri,
            nonce=challenge.nonce,
            nc=nc,
            cnonce=cnonce,
            qop=qop,
            body=body,
        )
        parts = [
            f"username={_quote(self.username)}",
            f"realm={_quote(challenge.realm)}",
            f"nonce={_quote(challenge.nonce)}",
            f"uri={_quote(uri)}",
            f"response={_quote(response)}",
            f"algorithm={challenge.algorithm}",
        ]
        if cnonce:
            parts.append(f"cnonce={_quote(cnonce)}")
        if challenge.opaque is not None:
            parts.append(f"opaque={_quote(challenge.opaque)}")
        if qop:
            parts += [f"qop={qop}", f"nc={nc}"]
        return "Digest " + ", ".join(parts)


# --- server side -------------------------------------------------------------------------


class Verdict(Enum):
    OK = "ok"
    STALE = "stale"  # right password, expired nonce: challenge again with stale=true
    BAD = "bad"  # wrong password, forged nonce or malformed header


_NONCE_MAC_BYTES = 16
_CLOCK_SKEW = 5.0


def _nonce_mac(secret: bytes, realm: str, stamp: bytes) -> bytes:
    return hmac.new(secret, stamp + realm.encode("utf-8"), hashlib.sha256).digest()


def make_nonce(realm: str, now: float, secret: bytes) -> str:
    """A self-validating nonce: issue time (ms) plus an HMAC over it and the realm."""
    stamp = struct.pack(">Q", int(now * 1000))
    raw = stamp + _nonce_mac(secret, realm, stamp)[:_NONCE_MAC_BYTES]
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _nonce_time(nonce: str, realm: str, secret: bytes) -> float | None:
    """The nonce's issue time, or None when it was not made with ``secret`` for ``realm``."""
    try:
        raw = base64.urlsafe_b64decode(nonce + "=" * (-len(nonce) % 4))
    except ValueError:
        return None
    if len(raw) != 8 + _NONCE_MAC_BYTES:
        return None
    stamp, mac = raw[:8], raw[8:]
    if not hmac.compare_digest(mac, _nonce_mac(secret, realm, stamp)[:_NONCE_MAC_BYTES]):
        return None
    return float(struct.unpack(">Q", stamp)[0]) / 1000.0


def make_challenge(
    realm: str,
    now: float,
    secret: bytes,
    *,
    algorithm: str = "SHA-256",
    qop: str = "auth",
    stale: bool = False,
) -> str:
    """A ``WWW-Authenticate`` value whose nonce :func:`verify` can check statelessly."""
    algorithm = _canonical_algorithm(algorithm)
    parts = [
        f"realm={_quote(realm)}",
        f"nonce={_quote(make_nonce(realm, now, secret))}",
        f"algorithm={algorithm}",
        f"qop={_quote(qop)}",
    ]
    if stale:
        parts.append("stale=TRUE")
    return "Digest " + ", ".join(parts)


def verify(
    authorization_header: str,
    method: str,
    password_lookup: Callable[[str, str], str | None],
    now: float,
    *,
    secret: bytes,
    realm: str,
    max_age: float = 300.0,
    body: bytes = b"",
    request_uri: str | None = None,
) -> Verdict:
    """Check an ``Authorization`` value; ``password_lookup(username, realm)`` gives the password.

    Without per-nonce state a replay inside ``max_age`` cannot be told from a retransmission;
    that is the price of a stateless registrar, bounded by the nonce lifetime.
    """
    try:
        scheme, params = parse_auth_params(authorization_header)
        algorithm = _canonical_algorithm(params.get("algorithm", "MD5"))
    except DigestError:
        return Verdict.BAD
    needed = ("username", "realm", "nonce", "uri", "response")
    if scheme.lower() != "digest" or any(k not in params for k in needed):
        return Verdict.BAD
    if params["realm"] != realm or (request_uri is not None and params["uri"] != request_uri):
        return Verdict.BAD
    qop = params.get("qop", "")
    if qop not in ("", "auth", "auth-int") or (
        qop and ("nc" not in params or "cnonce" not in params)
    ):
        return Verdict.BAD
    issued = _nonce_time(params["nonce"], realm, secret)
    if issued is None or issued > now + _CLOCK_SKEW:
        return Verdict.BAD
    password = password_lookup(params["username"], realm)
    if password is None:
        return Verdict.BAD
    expected = digest_response(
        algorithm=algorithm,
        username=params["username"],
        realm=realm,
        password=password,
        method=method,
        uri=params["uri"],
        nonce=params["nonce"],
        nc=params.get("nc", ""),
        cnonce=params.get("cnonce", ""),
        qop=qop,
        body=body,
    )
    if not hmac.compare_digest(expected, params["response"].lower()):
        return Verdict.BAD
    return Verdict.STALE if now - issued > max_age else Verdict.OK

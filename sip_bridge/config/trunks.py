"""Trunks in the bridge's config: who may call us, and where we register.

A ``[[trunks]]`` entry describes one carrier trunk or PBX. With ``registrar`` set the
bridge keeps a registration there (digest credentials, refresh, backoff); ``acl`` lists
the source CIDRs whose INVITEs are the trunk's; ``inbound_auth`` makes the bridge
challenge the trunk's INVITEs with digest. Passwords never sit in the file itself: they
come from an environment variable or a file readable only by the bridge, so the config
can be shared and versioned.

Validation follows config.py's rule: every mistake names the file, the line, the key
(``trunks[1].acl``) and what is allowed.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sip_bridge.config.config_error import ConfigError
from sip_bridge.media.srtp import SRTP_MODES
from sip_bridge.sip.acl import SourceAcl
from sip_bridge.sip.fields import SipParseError, SipUri

__all__ = [
    "AUTH_ALGORITHMS",
    "TRUNK_KEYS",
    "TrunkConfig",
    "entry_key_line",
    "parse_trunks",
    "registrar_uri",
]

TRUNK_TRANSPORTS = ("udp", "tcp", "tls")

# key -> expected python type(s)
TRUNK_KEYS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "registrar": (str,),
    "username": (str,),
    "auth_username": (str,),
    "domain": (str,),
    "password_env": (str,),
    "password_file": (str,),
    "expires_s": (int,),
    "transport": (str,),
    "acl": (list,),
    "inbound_auth": (bool,),
    "realm": (str,),
    "auth_algorithms": (list,),
    "srtp": (str,),
    "srtp_without_tls": (bool,),
}
AUTH_ALGORITHMS = ("SHA-256", "MD5")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrunkConfig:
    name: str
    registrar: str = ""  # sip:host[:port]; empty: no registration (IP-authenticated trunk)
    username: str = ""  # the user part of our address-of-record (often the DID or account)
    auth_username: str = ""  # digest user name when it differs from ``username``
    domain: str = ""  # the AOR's domain; empty: the registrar's host
    password_env: str = ""
    password_file: str = ""
    expires_s: int = 3600
    transport: str = "udp"
    acl: tuple[str, ...] = ()  # source CIDRs whose INVITEs belong to this trunk
    inbound_auth: bool = False  # challenge this trunk's INVITEs (401, digest)
    realm: str = "sip-bridge"  # realm of our challenges
    # Challenges offered, in order (RFC 8760). Peers that read only the first challenge and
    # know only MD5 (sipp, some older PBXs) need ["MD5"].
    auth_algorithms: tuple[str, ...] = AUTH_ALGORITHMS
    # SDES-SRTP on this trunk's calls: off / optional / required. Its keys travel in the
    # SDP, so "required" wants transport = "tls" unless srtp_without_tls says otherwise.
    srtp: str = "optional"
    srtp_without_tls: bool = False
    password: str = ""  # resolved from password_env / password_file at load time

    @property
    def registers(self) -> bool:
        return bool(self.registrar)

    @property
    def digest_user(self) -> str:
        return self.auth_username or self.username

    @property
    def aor(self) -> str:
        """Our address-of-record at this trunk: sip:username@domain."""
        uri = SipUri.parse(registrar_uri(self.registrar))
        return f"sip:{self.username}@{self.domain or uri.host}"


def registrar_uri(value: str) -> str:
    """``host``, ``host:port`` or a full ``sip:``/``sips:`` URI, as a SIP URI."""
    value = value.strip()
    if value.lower().startswith(("sip:", "sips:")):
        return value
    return f"sip:{value}"


def _entry_lines(text: str, table: str) -> list[int]:
    """Line numbers of each ``[[table]]`` header, in order."""
    return [
        n
        for n, raw in enumerate(text.splitlines(), 1)
        if re.fullmatch(rf"\[\[\s*{table}\s*\]\]", raw.strip())
    ]


def entry_key_line(text: str, table: str, index: int, key: str | None) -> int | None:
    """Line of ``key`` inside the index-th ``[[table]]`` (or of its header): where an error
    in an array of tables (``[[trunks]]``, ``[[routes]]``) points."""
    headers = _entry_lines(text, table)
    if index >= len(headers):
        return None
    start = headers[index]
    if key is None:
        return start
    lines = text.splitlines()
    for n in range(start + 1, len(lines) + 1):
        line = lines[n - 1].strip()
        if line.startswith("["):
            break
        if re.match(rf"{re.escape(key)}\s*=", line):
            return n
    return start


def parse_trunks(value: Any, text: str, path: str) -> tuple[TrunkConfig, ...]:
    """Validate the ``trunks`` array of tables; ConfigError says where a mistake is."""

    def fail(index: int, key: str | None, message: str) -> ConfigError:
        dotted = f"trunks[{index + 1}]" + (f".{key}" if key else "")
        return ConfigError(path, entry_key_line(text, "trunks", index, key), dotted, message)

    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ConfigError(path, None, "trunks", "must be [[trunks]] tables")
    trunks: list[TrunkConfig] = []
    names: set[str] = set()
    for i, entry in enumerate(value):
        for key, v in entry.items():
            if key not in TRUNK_KEYS:
                raise fail(i, key, f"unknown key; allowed: {', '.join(sorted(TRUNK_KEYS))}")
            types = TRUNK_KEYS[key]
            if (isinstance(v, bool) and bool not in types) or not isinstance(v, types):
                want = " or ".join("list" if t is list else t.__name__ for t in types)
                raise fail(i, key, f"expected {want}, got {v!r}")
        if not entry.get("name"):
            raise fail(i, "name" if "name" in entry else None, "every trunk needs a name")
        name = entry["name"]
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            raise fail(i, "name", "use letters, digits, '_', '.', '-' (at most 64)")
        if name in names:
            raise fail(i, "name", f"duplicate trunk name {name!r}")
        names.add(name)
        acl = entry.get("acl", [])
        if not all(isinstance(c, str) for c in acl):
            raise fail(i, "acl", "must be a list of CIDR strings")
        try:
            SourceAcl(acl)
        except ValueError as exc:
            raise fail(i, "acl", str(exc)) from None
        algorithms = entry.get("auth_algorithms", list(AUTH_ALGORITHMS))
        if not algorithms or any(a not in AUTH_ALGORITHMS for a in algorithms):
            raise fail(i, "auth_algorithms", 'a non-empty list of "SHA-256", "MD5"')
        trunk = TrunkConfig(**{**entry, "acl": tuple(acl), "auth_algorithms": tuple(algorithms)})
        trunks.append(_check(trunk, i, path, fail))
    return tuple(trunks)


def _check(trunk: TrunkConfig, i: int, path: str, fail: Any) -> TrunkConfig:
    if trunk.transport not in TRUNK_TRANSPORTS:
        raise fail(i, "transport", f"{trunk.transport!r} is not one of udp, tcp, tls")
    if trunk.srtp not in SRTP_MODES:
        raise fail(i, "srtp", f"{trunk.srtp!r} is not one of {', '.join(SRTP_MODES)}")
    if trunk.srtp == "required" and trunk.transport != "tls" and not trunk.srtp_without_tls:
        raise fail(
            i,
            "srtp",
            'SDES keys travel in the SDP: use transport = "tls" with srtp = "required" '
            "(or set srtp_without_tls = true to accept keys in clear signalling)",
        )
    if trunk.srtp == "required" and trunk.transport != "tls":
        log.warning(
            "%s: trunk %s: SRTP keys (SDES) will travel in clear %s signalling",
            path,
            trunk.name,
            trunk.transport.upper(),
        )
    if not 60 <= trunk.expires_s <= 86400:
        raise fail(i, "expires_s", "must be 60..86400 s")
    if trunk.registers:
        try:
            uri = SipUri.parse(registrar_uri(trunk.registrar))
        except (SipParseError, ValueError) as exc:
            raise fail(i, "registrar", f"not a SIP address: {exc}") from None
        if uri.user:
            raise fail(i, "registrar", "give the registrar's host[:port], not a user address")
        if not trunk.username:
            raise fail(i, "username", "is required when registrar is set")
    needs_password = trunk.registers or trunk.inbound_auth
    if trunk.inbound_auth and not trunk.digest_user:
        raise fail(i, "username", "is required when inbound_auth = true")
    if trunk.password_env and trunk.password_file:
        raise fail(i, "password_file", "give password_env or password_file, not both")
    password = ""
    if trunk.password_env:
        env = os.environ.get(trunk.password_env)
        if env is None:
            raise fail(i, "password_env", f"environment variable {trunk.password_env} is not set")
        password = env
    elif trunk.password_file:
        f = Path(trunk.password_file)
        if not f.is_absolute():
            f = Path(path).resolve().parent / f  # relative to the config file
        try:
            password = f.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise fail(i, "password_file", f"cannot read {f}: {exc.strerror}") from None
    elif needs_password:
        what = "registrar is set" if trunk.registers else "inbound_auth = true"
        raise fail(i, None, f"password_env or password_file is required when {what}")
    if needs_password and not password:
        raise fail(i, "password_env" if trunk.password_env else "password_file", "is empty")
    if not trunk.registers and not trunk.acl and not trunk.inbound_auth:
        raise fail(i, "acl", "a trunk needs registrar, acl or inbound_auth to mean anything")
    return TrunkConfig(**{**trunk.__dict__, "password": password})

"""Who may call the bridge: per-trunk source ACLs, digest challenges and a rate limit.

The policy is pure (an INVITE, its source and a clock in; an :class:`~sip_bridge.sip.ua.Admission`
out), so the UA answers with a proper server transaction: 401 with a challenge, 403 for
sources no trunk owns, 503 + Retry-After for a source over its INVITE rate.

Rules, in order:

1. The trunks that may own this source: those whose ``acl`` matches it, those that register
   and whose registrar this source is, and those with ``inbound_auth`` and no ``acl``
   (a PBX or softphone with no fixed address, which must prove itself with digest).
   One of them needs no digest: admitted as that trunk, whatever its call rate.
2. Any other source over its INVITE rate (``[inbound]`` token bucket): 503 + Retry-After.
   A source refused ``silence_after`` times (any refusal: 503, 403, 401) without being
   admitted as a trunk in between is not answered at all until it has been quiet for
   ``silence_s``: the UA drops its datagrams unread (:meth:`InboundPolicy.silenced`).
3. No trunks configured: everyone else may call (the embedded default listens on loopback).
4. No owner: 403. Otherwise the INVITE must carry
   digest credentials of one of them: none (or an expired nonce) gets 401 with a challenge
   per realm and algorithm (``auth_algorithms``); wrong ones get 403, and so does an
   unknown user name in our realm (a 401 there would tell scanners which names exist).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable

from sip_bridge.config.loader import InboundConfig
from sip_bridge.config.trunks import TrunkConfig
from sip_bridge.sip.acl import RateLimiter, Silencer, SourceAcl, normalize_ip
from sip_bridge.sip.digest import DigestError, Verdict, make_challenge, parse_auth_params, verify
from sip_bridge.sip.message import SipRequest, SipUri
from sip_bridge.sip.ua import Address, Admission

__all__ = ["InboundPolicy"]

NONCE_MAX_AGE_S = 300.0


class InboundPolicy:
    """The admission policy of one bridge; call it as the UA's ``admit``."""

    def __init__(
        self,
        trunks: Iterable[TrunkConfig],
        inbound: InboundConfig,
        now: float,
        *,
        retry_after_s: int = 5,
        secret: bytes | None = None,
    ) -> None:
        self.trunks = tuple(trunks)
        self._acls = {t.name: SourceAcl(list(t.acl)) for t in self.trunks if t.acl}
        self._registrars: dict[str, set[str]] = {t.name: set() for t in self.trunks}
        self._limiter = (
            RateLimiter(inbound.rate_per_s, inbound.burst, now) if inbound.rate_per_s > 0 else None
        )
        self.retry_after_s = retry_after_s
        self._secret = secret if secret is not None else secrets.token_bytes(32)
        self.counts = {"admitted": 0, "challenged": 0, "forbidden": 0, "rate_limited": 0}
        self._silencer = (
            Silencer(inbound.silence_after, inbound.silence_s) if inbound.silence_after else None
        )

    def adopt(self, old: InboundPolicy) -> None:
        """After a reload: keep what the old policy learned of registrars' addresses (for
        trunks still here) and its counters, so status figures do not restart."""
        for name, addresses in old._registrars.items():
            if name in self._registrars:
                self._registrars[name] = set(addresses)
        self.counts.update(old.counts)
        if self._silencer is not None and old._silencer is not None:
            self._silencer._table = old._silencer._table  # a flood stays silenced
            self._silencer.dropped = old._silencer.dropped

    @property
    def silenced_count(self) -> int:
        """Datagrams dropped unread from sources refused too often in a row."""
        return self._silencer.dropped if self._silencer is not None else 0

    def silenced(self, ip: str, now: float) -> bool:
        """The UA asks before parsing: drop this source's datagram unread?"""
        return self._silencer is not None and self._silencer.silenced(ip, now)

    def set_registrar_addresses(self, trunk: str, addresses: Iterable[str]) -> None:
        """Where the trunk's registrar resolved to: its INVITEs come from there."""
        self._registrars[trunk] = {normalize_ip(a) for a in addresses}

    def __call__(self, req: SipRequest, source: Address, now: float) -> Admission:
        verdict = self._judge(req, source, now)
        if self._silencer is not None:
            if verdict.status:
                self._silencer.refused(source[0], now)
            elif verdict.trunk is not None:  # a trunk's own or authenticated: a clean slate
                self._silencer.admitted(source[0])
        return verdict

    def _judge(self, req: SipRequest, source: Address, now: float) -> Admission:
        ip = source[0]
        owners = self._owners(ip) if self.trunks else []
        for trunk in owners:
            if not trunk.inbound_auth:  # a trunk's own address: never rate limited
                self.counts["admitted"] += 1
                return Admission(trunk=trunk.name, srtp=trunk.srtp)
        if self._limiter is not None and not self._limiter.allow(ip, now):
            self.counts["rate_limited"] += 1
            return Admission(503, (("Retry-After", str(self.retry_after_s)),))
        if not self.trunks:
            self.counts["admitted"] += 1
            return Admission()
        if not owners:
            self.counts["forbidden"] += 1
            return Admission(403)
        return self._digest(req, owners, now)

    def _owners(self, ip: str) -> list[TrunkConfig]:
        key = normalize_ip(ip)
        owners = []
        for t in self.trunks:
            acl = self._acls.get(t.name)
            if acl is not None:
                if acl.allows(ip):
                    owners.append(t)
            elif key in self._registrars.get(t.name, ()) or t.inbound_auth:
                owners.append(t)
        return owners

    def _digest(self, req: SipRequest, owners: list[TrunkConfig], now: float) -> Admission:
        stale = False
        for value in req.headers.get_all("Authorization"):
            try:
                _, params = parse_auth_params(value)
            except DigestError:
                continue
            if not _same_target(params.get("uri", ""), req.uri):
                continue  # credentials made for another request
            realm, user = params.get("realm"), params.get("username")
            if any(t.realm == realm for t in owners) and not any(
                t.realm == realm and t.digest_user == user for t in owners
            ):
                # An unknown user name in our realm gets what a wrong password gets: were it
                # challenged again, a scanner (svcrack) could tell which user names exist.
                self.counts["forbidden"] += 1
                return Admission(403)
            for trunk in owners:
                if params.get("username") != trunk.digest_user or params.get("realm") != (
                    trunk.realm
                ):
                    continue
                verdict = verify(
                    value,
                    "INVITE",
                    _password_of(trunk),
                    now,
                    secret=self._secret,
                    realm=trunk.realm,
                    max_age=NONCE_MAX_AGE_S,
                )
                if verdict is Verdict.OK:
                    self.counts["admitted"] += 1
                    return Admission(trunk=trunk.name, srtp=trunk.srtp)
                if verdict is Verdict.BAD:
                    self.counts["forbidden"] += 1
                    return Admission(403)
                stale = True
        self.counts["challenged"] += 1
        # One challenge per realm and algorithm, in the trunk's order (RFC 8760: SHA-256
        # before MD5 by default; a peer takes the first it supports).
        offers = dict.fromkeys((t.realm, alg) for t in owners for alg in t.auth_algorithms)
        challenges = tuple(
            (
                "WWW-Authenticate",
                make_challenge(realm, now, self._secret, algorithm=alg, stale=stale),
            )
            for realm, alg in offers
        )
        return Admission(401, challenges)


def _password_of(trunk: TrunkConfig) -> Callable[[str, str], str | None]:
    def lookup(user: str, realm: str) -> str | None:
        return trunk.password if user == trunk.digest_user and realm == trunk.realm else None

    return lookup


def _same_target(digest_uri: str, request_uri: str) -> bool:
    """The digest ``uri`` names this request's target (RFC 3261 22.4 wants it equal to the
    Request-URI; sipp and some PBXs send just ``sip:host:port``, so host and port suffice)."""
    if digest_uri == request_uri:
        return True
    try:
        a, b = SipUri.parse(digest_uri), SipUri.parse(request_uri)
    except ValueError:
        return False
    return (a.host.lower(), a.port or 5060) == (b.host.lower(), b.port or 5060)

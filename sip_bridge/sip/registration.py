"""REGISTER client (RFC 3261 section 10) as a sans-I/O state machine.

:class:`Registration` builds REGISTER requests and reads the responses; the caller sends
each request through a client transaction, feeds back the final response (or the
transaction's timeout) and asks :meth:`Registration.next_deadline` when to call
:meth:`Registration.next_request` again.  It handles digest challenges (401/407, stale
nonces), 423 Interval Too Brief, refreshes before expiry and exponential backoff on errors.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from enum import StrEnum

from sip_bridge.sip.digest import Challenge, DigestClient, DigestError, choose_challenge
from sip_bridge.sip.fields import NameAddr, SipParseError, SipUri
from sip_bridge.sip.message import (
    Headers,
    SipRequest,
    SipResponse,
    new_branch,
    new_call_id,
    new_tag,
)

__all__ = ["RegState", "Registration", "refresh_delay"]

BACKOFF_MIN = 30.0
BACKOFF_MAX = 1800.0
MAX_AUTH_ROUNDS = 3  # challenges answered per REGISTER attempt before giving up


class RegState(StrEnum):
    UNREGISTERED = "unregistered"
    REGISTERING = "registering"
    REGISTERED = "registered"
    FAILED = "failed"
    BACKOFF = "backoff"


def refresh_delay(expires: float) -> float:
    """Refresh ahead of expiry: min(80 %, expires - 30 s), but never before half-time."""
    return max(min(expires * 0.8, expires - 30.0), expires / 2)


class Registration:
    """Keeps one contact registered for one address-of-record.

    ``password_source`` is the password, or a callable ``realm -> password`` (so a secret
    store can answer per realm).  ``jitter`` maps a backoff delay to the delay actually
    used; it defaults to a random 75..100 % so many clients do not retry in lockstep.
    While a refresh is outstanding the state reads ``registering`` and ``expires_at`` still
    gives the old binding's expiry.
    """

    def __init__(
        self,
        aor: str,
        registrar_uri: str,
        contact: str,
        username: str,
        password_source: str | Callable[[str], str],
        expires: int = 3600,
        now: float = 0.0,
        *,
        transport: str = "UDP",
        jitter: Callable[[float], float] | None = None,
        cnonce_source: Callable[[], str] | None = None,
    ) -> None:
        self.aor = aor
        self.registrar_uri = registrar_uri
        self.contact = contact
        self.username = username
        self._password_source = password_source
        self.requested_expires = expires
        self._expires = expires
        self._transport = transport.upper()
        self._jitter = jitter or (lambda d: d * (0.75 + 0.25 * secrets.randbelow(1001) / 1000))
        self._cnonce_source = cnonce_source
        contact_uri = SipUri.parse(contact)
        self._sent_by = contact_uri.host + (f":{contact_uri.port}" if contact_uri.port else "")
        self.call_id = new_call_id(contact_uri.host)
        self._from_tag = new_tag()
        self._cseq = 0
        self.state = RegState.UNREGISTERED
        self.expires_at: float | None = None
        self.last_error: str | None = None
        self._due: float | None = now  # when the next REGISTER should go out
        self._in_flight: SipRequest | None = None
        self._want_registered = True
        self._challenge: Challenge | None = None
        self._proxy_auth = False
        self._client: DigestClient | None = None
        self._auth_rounds = 0
        self._failures = 0

    # --- inputs -----------------------------------------------------------------------

    def next_request(self, now: float) -> SipRequest | None:
        """The REGISTER to send now, if one is due and none is outstanding."""
        if self._in_flight is not None or self._due is None or now < self._due:
            return None
        self._due = None
        self.state = RegState.REGISTERING
        self._in_flight = self._build()
        return self._in_flight

    def on_response(self, resp: SipResponse, now: float) -> None:
        """Feed a final response to the outstanding REGISTER (others are ignored)."""
        req = self._in_flight
        if req is None or resp.status < 200 or not self._matches(resp, req):
            return
        self._in_flight = None
        unregistering = not self._want_registered
        if 200 <= resp.status < 300:
            self._on_success(resp, now, req.headers.get("Expires") == "0")
        elif resp.status in (401, 407):
            self._on_challenge(resp, now)
        elif resp.status == 423:
            self._on_too_brief(resp, now)
        elif unregistering:
            self._finish_unregister(f"{resp.status} {resp.reason}")
        else:
            self._backoff(now, f"{resp.status} {resp.reason}", _retry_after(resp))

    def on_timeout(self, now: float) -> None:
        """The client transaction of the outstanding REGISTER timed out (Timer F)."""
        if self._in_flight is None:
            return
        self._in_flight = None
        if not self._want_registered:
            self._finish_unregister("timeout")
        else:
            self._backoff(now, "timeout", None)

    def unregister(self, now: float) -> None:
        """Remove the binding (Expires: 0) once any outstanding REGISTER has completed."""
        self._want_registered = False
        self._auth_rounds = 0
        if self.state in (RegState.REGISTERED, RegState.REGISTERING):
            self._due = now
        else:
            self._finish_unregister(None)

    def register(self, now: float) -> None:
        """(Re)start registering, e.g. after ``failed`` once the operator fixed the password."""
        self._want_registered = True
        self._failures = 0
        self._auth_rounds = 0
        self._due = now

    def next_deadline(self) -> float | None:
        """When :meth:`next_request` will next have something to send (None: nothing planned)."""
        return None if self._in_flight is not None else self._due

    # --- internals --------------------------------------------------------------------

    def _password(self, realm: str) -> str:
        source = self._password_source
        return source if isinstance(source, str) else source(realm)

    def _build(self) -> SipRequest:
        self._cseq += 1
        expires = self._expires if self._want_registered else 0
        headers = Headers()
        headers.add("Via", f"SIP/2.0/{self._transport} {self._sent_by};branch={new_branch()};rport")
        headers.add("Max-Forwards", "70")
        headers.add("From", f"<{self.aor}>;tag={self._from_tag}")
        headers.add("To", f"<{self.aor}>")
        headers.add("Call-ID", self.call_id)
        headers.add("CSeq", f"{self._cseq} REGISTER")
        headers.add("Contact", f"<{self.contact}>")
        headers.add("Expires", str(expires))
        if self._challenge is not None and self._client is not None:
            name = "Proxy-Authorization" if self._proxy_auth else "Authorization"
            value = self._client.authorize(self._challenge, "REGISTER", self.registrar_uri)
            headers.add(name, value)
        return SipRequest("REGISTER", self.registrar_uri, headers)

    def _matches(self, resp: SipResponse, req: SipRequest) -> bool:
        try:
            return resp.call_id == req.call_id and resp.cseq == req.cseq
        except SipParseError:
            return False

    def _on_success(self, resp: SipResponse, now: float, unregistering: bool) -> None:
        self._failures = 0
        self._auth_rounds = 0
        self.last_error = None
        if unregistering:
            self._finish_unregister(None)
            return
        granted = self._granted_expires(resp)
        if granted <= 0:
            self._backoff(now, "registrar granted no binding", None)
            return
        self.state = RegState.REGISTERED
        self.expires_at = now + granted
        # unregister() called while this REGISTER was outstanding: remove the binding now
        self._due = now + refresh_delay(granted) if self._want_registered else now

    def _granted_expires(self, resp: SipResponse) -> int:
        """Our Contact's expires param, else the Expires header, else what we asked for."""
        for value in resp.headers.get_all("Contact"):
            try:
                addr = NameAddr.parse(value)
            except SipParseError:
                continue
            if addr.uri == self.contact and _is_int(addr.params.get("expires")):
                return int(addr.params["expires"] or 0)
        header = resp.headers.get("Expires")
        return int(header) if _is_int(header) and header else self._expires

    def _on_challenge(self, resp: SipResponse, now: float) -> None:
        proxy = resp.status == 407
        name = "Proxy-Authenticate" if proxy else "WWW-Authenticate"
        try:
            challenge = choose_challenge(resp.headers.get_all(name))
        except DigestError as exc:
            self._fail(f"{resp.status}: {exc}")
            return
        if self._auth_rounds > 0 and not challenge.stale:  # our fresh answer was refused
            self._fail(f"{resp.status} {resp.reason}: credentials rejected")
            return
        self._auth_rounds += 1
        if challenge.qop and not {"auth", "auth-int"} & set(challenge.qop):
            self._fail(f"{resp.status}: no supported qop in {challenge.qop}")
            return
        if self._auth_rounds > MAX_AUTH_ROUNDS:
            self._fail(f"{resp.status} {resp.reason}: too many challenges")
            return
        try:
            password = self._password(challenge.realm)
        except LookupError as exc:
            self._fail(f"no password for realm {challenge.realm!r}: {exc}")
            return
        self._client = DigestClient(self.username, password)
        if self._cnonce_source is not None:
            self._client.cnonce_source = self._cnonce_source
        self._challenge = challenge
        self._proxy_auth = proxy
        self.state = RegState.REGISTERING
        self._due = now

    def _on_too_brief(self, resp: SipResponse, now: float) -> None:
        minimum = resp.headers.get("Min-Expires")
        if not _is_int(minimum) or not minimum or int(minimum) <= self._expires:
            self._backoff(now, "423 without a usable Min-Expires", None)
            return
        self._expires = int(minimum)
        self.state = RegState.REGISTERING
        self._due = now

    def _backoff(self, now: float, error: str, retry_after: float | None) -> None:
        delay = min(BACKOFF_MIN * 2**self._failures, BACKOFF_MAX)
        self._failures += 1
        self._auth_rounds = 0
        self.last_error = error
        self.state = RegState.BACKOFF
        self._due = now + (retry_after if retry_after is not None else self._jitter(delay))

    def _fail(self, error: str) -> None:
        self.last_error = error
        self.state = RegState.FAILED
        self._due = None
        self._auth_rounds = 0

    def _finish_unregister(self, error: str | None) -> None:
        self.state = RegState.UNREGISTERED
        self.expires_at = None
        self._due = None
        if error is not None:
            self.last_error = error


def _is_int(value: str | None) -> bool:
    return value is not None and value.strip().isdigit()


def _retry_after(resp: SipResponse) -> float | None:
    """RFC 3261 20.33: Retry-After on 503/5xx overrides our own backoff."""
    value = resp.headers.get("Retry-After")
    if value is None:
        return None
    seconds = value.split(";")[0].split("(")[0].strip()
    return float(seconds) if seconds.isdigit() and resp.status >= 500 else None

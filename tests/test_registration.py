"""REGISTER client driven against a fake registrar (make_response + digest server side)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from sip_bridge.sip.digest import Verdict, make_challenge, parse_auth_params, verify
from sip_bridge.sip.message import SipRequest, SipResponse, make_response, parse_message
from sip_bridge.sip.registration import Registration, RegState, refresh_delay

AOR = "sip:alice@sip.example.com"
REGISTRAR = "sip:sip.example.com"
CONTACT = "sip:alice@192.0.2.10:5070"
REALM = "sip.example.com"
SECRET = b"s3cret"


@dataclass
class FakeRegistrar:
    """Challenges, checks digest credentials statelessly, enforces Min-Expires."""

    password: str = "wonderland"
    algorithm: str = "SHA-256"
    min_expires: int = 60
    max_age: float = 300.0
    seen: list[SipRequest] = field(default_factory=list)

    def handle(self, req: SipRequest, now: float) -> SipResponse:
        req = parse_message(req.to_bytes())  # type: ignore[assignment]  # wire round trip
        self.seen.append(req)
        auth = req.headers.get("Authorization")
        if auth is None:
            return self._challenge(req, now, stale=False)
        verdict = verify(
            auth,
            "REGISTER",
            lambda user, realm: self.password if user == "alice" else None,
            now,
            secret=SECRET,
            realm=REALM,
            max_age=self.max_age,
            request_uri=req.uri,
        )
        if verdict is not Verdict.OK:
            return self._challenge(req, now, stale=verdict is Verdict.STALE)
        expires = int(req.headers.get("Expires") or "3600")
        if 0 < expires < self.min_expires:
            resp = make_response(req, 423)
            resp.headers.add("Min-Expires", str(self.min_expires))
            return resp
        resp = make_response(req, 200, to_tag="reg")
        if expires:
            resp.headers.add("Contact", f"<{CONTACT}>;expires={expires}")
        return resp

    def _challenge(self, req: SipRequest, now: float, stale: bool) -> SipResponse:
        resp = make_response(req, 401, to_tag="reg")
        value = make_challenge(REALM, now, SECRET, algorithm=self.algorithm, stale=stale)
        resp.headers.add("WWW-Authenticate", value)
        return resp


NO_PASSWORDS: dict[str, str] = {}


def state_of(reg: Registration) -> RegState:
    """Read the state through a call so mypy does not narrow it across actions."""
    return reg.state


def make_reg(expires: int = 3600, now: float = 0.0, password: str = "wonderland") -> Registration:
    return Registration(
        AOR, REGISTRAR, CONTACT, "alice", password, expires, now, jitter=lambda d: d
    )


def exchange(reg: Registration, registrar: FakeRegistrar, now: float) -> SipResponse | None:
    """Send the due REGISTER (if any) and feed back the registrar's answer."""
    req = reg.next_request(now)
    if req is None:
        return None
    resp = registrar.handle(req, now)
    reg.on_response(resp, now)
    return resp


@pytest.mark.parametrize("algorithm", ["MD5", "SHA-256"])
def test_register_with_challenge(algorithm: str) -> None:
    registrar = FakeRegistrar(algorithm=algorithm)
    reg = make_reg()
    assert state_of(reg) is RegState.UNREGISTERED and reg.next_deadline() == 0.0
    first = exchange(reg, registrar, 0.0)
    assert first is not None and first.status == 401
    assert state_of(reg) is RegState.REGISTERING and reg.next_deadline() == 0.0
    second = exchange(reg, registrar, 0.0)
    assert second is not None and second.status == 200
    assert state_of(reg) is RegState.REGISTERED
    assert reg.expires_at == 3600.0
    assert reg.last_error is None
    a, b = registrar.seen
    assert a.call_id == b.call_id == reg.call_id
    assert (a.cseq, b.cseq) == ((1, "REGISTER"), (2, "REGISTER"))
    assert a.top_via.branch != b.top_via.branch
    assert b.headers.get("From") == a.headers.get("From")
    for name in ("Via", "From", "To", "Max-Forwards", "Contact", "Expires"):
        assert b.headers.get(name), name
    assert b.headers.get("Expires") == "3600"
    assert b.top_via.transport == "UDP" and b.top_via.host == "192.0.2.10"
    params = parse_auth_params(b.headers.get("Authorization") or "")[1]
    assert params["algorithm"] == algorithm and params["uri"] == REGISTRAR


def test_refresh_timing_and_preemptive_credentials() -> None:
    registrar = FakeRegistrar(max_age=10_000.0)
    reg = make_reg(expires=3600)
    exchange(reg, registrar, 0.0)
    exchange(reg, registrar, 0.0)
    assert reg.next_deadline() == 2880.0  # min(0.8 * 3600, 3600 - 30)
    assert reg.next_request(2879.0) is None
    resp = exchange(reg, registrar, 2880.0)
    assert resp is not None and resp.status == 200  # cached challenge, nc=2, no new 401
    assert state_of(reg) is RegState.REGISTERED and reg.expires_at == 2880.0 + 3600
    nc = parse_auth_params(registrar.seen[-1].headers.get("Authorization") or "")[1]["nc"]
    assert nc == "00000002"
    assert refresh_delay(100) == 70.0  # expires - 30 wins for short intervals
    assert refresh_delay(40) == 20.0  # never earlier than half-time


def test_registrar_granted_interval_wins() -> None:
    reg = make_reg(expires=3600)
    req = reg.next_request(0.0)
    assert req is not None
    resp = make_response(req, 200)
    resp.headers.add("Contact", f"<{CONTACT}>;expires=600")
    resp.headers.add("Contact", "<sip:other@192.0.2.99>;expires=7200")
    reg.on_response(resp, 5.0)
    assert reg.expires_at == 605.0 and reg.next_deadline() == 5.0 + 480.0


def test_interval_too_brief_retries_with_min_expires() -> None:
    registrar = FakeRegistrar(min_expires=300)
    reg = make_reg(expires=60)
    exchange(reg, registrar, 0.0)  # 401
    resp = exchange(reg, registrar, 0.0)
    assert resp is not None and resp.status == 423
    assert state_of(reg) is RegState.REGISTERING
    resp = exchange(reg, registrar, 0.0)
    assert resp is not None and resp.status == 200
    assert registrar.seen[-1].headers.get("Expires") == "300"
    assert reg.expires_at == 300.0


def test_backoff_sequence_on_server_errors_and_timeouts() -> None:
    reg = make_reg()
    now = 0.0
    delays = []
    for i in range(9):
        req = reg.next_request(now)
        assert req is not None
        if i % 3 == 0:
            reg.on_timeout(now)
        elif i % 3 == 1:
            reg.on_response(make_response(req, 503), now)
        else:
            reg.on_response(make_response(req, 403), now)
        assert state_of(reg) is RegState.BACKOFF
        deadline = reg.next_deadline()
        assert deadline is not None and reg.next_request(deadline - 0.001) is None
        delays.append(deadline - now)
        now = deadline
    assert delays == [30, 60, 120, 240, 480, 960, 1800, 1800, 1800]
    assert reg.last_error == "403 Forbidden"
    # success resets the backoff
    req = reg.next_request(now)
    assert req is not None
    reg.on_response(make_response(req, 200), now)
    assert state_of(reg) is RegState.REGISTERED
    req = reg.next_request(reg.next_deadline() or 0.0)
    assert req is not None
    reg.on_timeout(10_000.0)
    assert reg.next_deadline() == 10_030.0


def test_backoff_jitter_and_retry_after() -> None:
    reg = Registration(AOR, REGISTRAR, CONTACT, "alice", "pw", jitter=lambda d: d * 0.5)
    req = reg.next_request(0.0)
    assert req is not None
    reg.on_response(make_response(req, 500), 0.0)
    assert reg.next_deadline() == 15.0 and reg.last_error == "500 Server Internal Error"
    req = reg.next_request(15.0)
    assert req is not None
    resp = make_response(req, 503)
    resp.headers.add("Retry-After", "120 (maintenance)")
    reg.on_response(resp, 15.0)
    assert reg.next_deadline() == 135.0
    default = Registration(AOR, REGISTRAR, CONTACT, "alice", "pw")
    req = default.next_request(0.0)
    assert req is not None
    default.on_timeout(0.0)
    deadline = default.next_deadline()
    assert deadline is not None and 22.5 <= deadline <= 30.0


def test_stale_nonce_is_answered_again() -> None:
    registrar = FakeRegistrar(max_age=100.0)
    reg = make_reg(expires=3600)
    exchange(reg, registrar, 0.0)
    exchange(reg, registrar, 0.0)
    resp = exchange(reg, registrar, 2880.0)  # cached nonce now far too old
    assert resp is not None and resp.status == 401
    assert "stale=TRUE" in (resp.headers.get("WWW-Authenticate") or "")
    assert state_of(reg) is RegState.REGISTERING
    resp = exchange(reg, registrar, 2880.0)
    assert resp is not None and resp.status == 200 and state_of(reg) is RegState.REGISTERED


def test_wrong_password_fails_after_one_retry() -> None:
    registrar = FakeRegistrar()
    reg = make_reg(password="looking-glass")
    exchange(reg, registrar, 0.0)
    resp = exchange(reg, registrar, 0.0)
    assert resp is not None and resp.status == 401
    assert state_of(reg) is RegState.FAILED
    assert reg.last_error is not None and "rejected" in reg.last_error
    assert reg.next_deadline() is None and reg.next_request(1e9) is None
    assert len(registrar.seen) == 2
    # the operator fixes nothing and asks again: same outcome, still bounded
    reg.register(10.0)
    exchange(reg, registrar, 10.0)
    exchange(reg, registrar, 10.0)
    assert state_of(reg) is RegState.FAILED and len(registrar.seen) == 4


def test_password_callable_per_realm_and_unknown_realm() -> None:
    registrar = FakeRegistrar()
    asked: list[str] = []

    def source(realm: str) -> str:
        asked.append(realm)
        return {"sip.example.com": "wonderland"}[realm]

    reg = Registration(AOR, REGISTRAR, CONTACT, "alice", source, jitter=lambda d: d)
    exchange(reg, registrar, 0.0)
    exchange(reg, registrar, 0.0)
    assert state_of(reg) is RegState.REGISTERED and asked == [REALM]

    other = Registration(AOR, REGISTRAR, CONTACT, "alice", lambda realm: NO_PASSWORDS[realm])
    exchange(other, registrar, 0.0)
    assert state_of(other) is RegState.FAILED and "no password" in (other.last_error or "")


def test_unregister_sends_expires_zero() -> None:
    registrar = FakeRegistrar()
    reg = make_reg()
    exchange(reg, registrar, 0.0)
    exchange(reg, registrar, 0.0)
    reg.unregister(100.0)
    assert reg.next_deadline() == 100.0
    resp = exchange(reg, registrar, 100.0)
    assert resp is not None and resp.status == 200
    last = registrar.seen[-1]
    assert last.headers.get("Expires") == "0" and last.call_id == reg.call_id
    assert state_of(reg) is RegState.UNREGISTERED and reg.expires_at is None
    assert reg.next_deadline() is None


def test_unregister_while_register_outstanding() -> None:
    reg = make_reg()
    req = reg.next_request(0.0)
    assert req is not None
    reg.unregister(1.0)
    assert reg.next_request(1.0) is None  # one transaction at a time
    reg.on_response(make_response(req, 200), 2.0)
    assert state_of(reg) is RegState.REGISTERED
    bye = reg.next_request(2.0)
    assert bye is not None and bye.headers.get("Expires") == "0"
    reg.on_response(make_response(bye, 200), 2.5)
    assert state_of(reg) is RegState.UNREGISTERED


def test_ignores_provisional_and_unrelated_responses() -> None:
    reg = make_reg()
    req = reg.next_request(0.0)
    assert req is not None
    reg.on_response(make_response(req, 100), 0.0)
    stray = make_response(req, 200)
    stray.headers.set("CSeq", "99 REGISTER")
    reg.on_response(stray, 0.0)
    assert state_of(reg) is RegState.REGISTERING
    reg.on_response(make_response(req, 200), 0.0)
    assert state_of(reg) is RegState.REGISTERED


def test_proxy_challenge_uses_proxy_authorization_and_prefers_sha256() -> None:
    reg = make_reg()
    req = reg.next_request(0.0)
    assert req is not None
    resp = make_response(req, 407)
    resp.headers.add("Proxy-Authenticate", make_challenge(REALM, 0.0, SECRET, algorithm="MD5"))
    resp.headers.add("Proxy-Authenticate", make_challenge(REALM, 0.0, SECRET))
    reg.on_response(resp, 0.0)
    retry = reg.next_request(0.0)
    assert retry is not None and retry.cseq == (2, "REGISTER")
    assert retry.headers.get("Authorization") is None
    value = retry.headers.get("Proxy-Authorization") or ""
    assert parse_auth_params(value)[1]["algorithm"] == "SHA-256"
    lookup = {"alice": "wonderland"}.get
    ok = verify(value, "REGISTER", lambda u, r: lookup(u), 0.0, secret=SECRET, realm=REALM)
    assert ok is Verdict.OK


def test_challenge_with_only_unsupported_qop_fails_cleanly() -> None:
    reg = make_reg()
    req = reg.next_request(0.0)
    assert req is not None
    resp = make_response(req, 401)
    resp.headers.add("WWW-Authenticate", 'Digest realm="r", nonce="n", qop="auth-conf"')
    reg.on_response(resp, 0.0)
    assert state_of(reg) is RegState.FAILED and "qop" in (reg.last_error or "")
    assert reg.next_request(0.0) is None

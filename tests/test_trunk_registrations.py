"""Trunk registrations through real client transactions, against a scripted registrar."""

from __future__ import annotations

from sip_bridge.config.trunks import TrunkConfig
from sip_bridge.sip.digest import Verdict, make_challenge, verify
from sip_bridge.sip.message import SipRequest, SipResponse, make_response, parse_message
from sip_bridge.sip.transaction import SendMessage
from sip_bridge.sip.trunk_registrations import RegistrationChanged, TrunkRegistrations

TRUNK = TrunkConfig(
    "carrier", registrar="192.0.2.1:5080", username="4420", password="pw", expires_s=600
)
REGISTRAR = ("192.0.2.1", 5080)


def _regs(now: float = 0.0) -> TrunkRegistrations:
    regs = TrunkRegistrations((TRUNK, TrunkConfig("ip-only", acl=("192.0.2.0/24",))),
                              "198.51.100.7", {"udp": 5060, "tcp": 5060}, now,
                              jitter=lambda d: d)  # fmt: skip
    assert regs.target("carrier") == ("192.0.2.1", 5080, "udp")
    regs.set_destination("carrier", REGISTRAR)
    return regs


def _sent(events: list[SendMessage | RegistrationChanged]) -> list[SipRequest]:
    out = []
    for ev in events:
        if isinstance(ev, SendMessage):
            assert ev.destination == REGISTRAR and ev.transport == "udp"
            msg = parse_message(ev.data)
            assert isinstance(msg, SipRequest)
            out.append(msg)
    return out


def _changes(events: list[SendMessage | RegistrationChanged]) -> list[tuple[str, str | None]]:
    return [(e.state, e.error) for e in events if isinstance(e, RegistrationChanged)]


def _reply(regs: TrunkRegistrations, resp: SipResponse, now: float) -> list[SipRequest]:
    wire = parse_message(resp.to_bytes())
    assert isinstance(wire, SipResponse) and regs.owns(wire)
    return _sent(regs.receive(wire, REGISTRAR, "udp", now))


def test_challenge_then_registered_then_refreshed_before_expiry() -> None:
    regs = _regs()
    assert len(regs) == 1  # the IP-authenticated trunk does not register
    events = regs.tick(0.0)
    (first,) = _sent(events)
    assert _changes(events) == [("registering", None)]
    assert first.headers.get("Contact") == "<sip:4420@198.51.100.7:5060;transport=udp>"
    assert first.headers.get("To") == "<sip:4420@192.0.2.1>"
    assert first.headers.get("Expires") == "600"
    challenge = make_response(first, 401, to_tag="r")
    challenge.headers.add("WWW-Authenticate", make_challenge("carrier", 0.0, b"k", qop="auth"))
    (second,) = _reply(regs, challenge, 0.1)
    auth = second.headers.get("Authorization") or ""
    lookup = lambda user, realm: "pw" if user == "4420" else None  # noqa: E731
    assert verify(auth, "REGISTER", lookup, 0.2, secret=b"k", realm="carrier") is Verdict.OK
    ok = make_response(second, 200, to_tag="r")
    ok.headers.add("Contact", f"{second.headers.get('Contact')};expires=600")
    assert _reply(regs, ok, 0.2) == []
    (status,) = regs.status(0.2)
    assert status["state"] == "registered" and status["expires_in_s"] == 600.0
    assert status["aor"] == "sip:4420@192.0.2.1" and status["last_error"] is None
    sent: list[SipRequest] = []
    at = 0.0
    while not sent:  # Timer K of the finished transactions fires first: nothing to send
        deadline = regs.next_deadline()
        assert deadline is not None
        at = deadline
        sent = _sent(regs.tick(at))
    assert 300 <= at <= 600 - 30  # refreshed ahead of expiry
    (refresh,) = sent
    assert refresh.call_id == first.call_id and refresh.cseq[0] > second.cseq[0]


def test_no_answer_backs_off_and_says_why() -> None:
    regs = _regs()
    assert len(_sent(regs.tick(0.0))) == 1
    now, retransmissions = 0.0, 0
    changes: list[tuple[str, str | None]] = []
    while not changes or changes[-1][0] != "backoff":
        deadline = regs.next_deadline()
        assert deadline is not None and deadline < 60
        now = deadline
        events = regs.tick(now)
        retransmissions += len(_sent(events))
        changes += _changes(events)
    assert changes[-1] == ("backoff", "timeout") and 31 <= now <= 33  # Timer F = 64*T1
    assert retransmissions >= 6  # Timer E kept retransmitting the REGISTER
    assert regs.status(now)[0]["last_error"] == "timeout"
    later = regs.next_deadline()
    assert later is not None and later - now >= 30  # exponential backoff starts at 30 s


def test_unregister_all_sends_expires_zero() -> None:
    regs = _regs()
    (first,) = _sent(regs.tick(0.0))
    ok = make_response(first, 200, to_tag="r")
    ok.headers.add("Expires", "600")
    _reply(regs, ok, 0.1)
    (bye,) = _sent(regs.unregister_all(1.0))
    assert bye.headers.get("Expires") == "0"
    assert regs.pending == 1
    _reply(regs, make_response(bye, 200, to_tag="r"), 1.1)
    assert regs.status(1.1)[0]["state"] == "unregistered"

"""RFC 4028 session timers in the bridge UA: hand-written INVITEs, a fake clock, no sockets.

Every test reads the bytes the UA sends (422 + Min-SE, Session-Expires on the 200, our
UPDATE/re-INVITE refreshes, the BYE when nobody refreshes), not only its events.
"""

from __future__ import annotations

import pytest

from sip_bridge.config.loader import SipConfig, TimersConfig
from sip_bridge.sip.message import SipRequest, SipResponse, make_response, new_branch, parse_message
from sip_bridge.sip.session_timer import (
    IntervalTooSmall,
    SessionTimer,
    negotiate,
    parse_session_expires,
)
from sip_bridge.sip.ua import BridgeUA, CallEnded, CallOffered, Send, UaEvent

BRIDGE_IP = "203.0.113.5"
CALLER = ("192.0.2.10", 5062)
CONFIG = SipConfig(
    listen="0.0.0.0:5060",
    external_address=BRIDGE_IP,
    max_calls=10,
    user_agent="sip-bridge-test",
    timers=TimersConfig(t1=0.01, t2=0.04, t4=0.05),
)
SDP = (
    "v=0\r\no=- 1694 2048 IN IP4 192.168.1.20\r\ns=-\r\nc=IN IP4 192.168.1.20\r\nt=0 0\r\n"
    "m=audio 40000 RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
    "a=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n"
)
ALLOW_ALL = "INVITE,ACK,BYE,CANCEL,OPTIONS,INFO,UPDATE"
TIMER = "Supported: timer\r\n"


def invite(extra: str = "", allow: str = ALLOW_ALL) -> bytes:
    """A caller's INVITE (behind NAT) with ``extra`` header lines."""
    return (
        f"INVITE sip:bot@{BRIDGE_IP} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 192.168.1.20:5062;branch={new_branch()};rport\r\n"
        "Contact: <sip:alice@192.168.1.20:5062>\r\n"
        "Max-Forwards: 70\r\n"
        f"To: <sip:bot@{BRIDGE_IP}>\r\n"
        "From: <sip:alice@example.com>;tag=6c5f2a\r\n"
        "Call-ID: st1@192.168.1.20\r\n"
        "CSeq: 1 INVITE\r\n"
        f"Allow: {allow}\r\n"
        f"{extra}Content-Type: application/sdp\r\n"
        f"Content-Length: {len(SDP)}\r\n\r\n{SDP}"
    ).encode()


def in_dialog(method: str, ok: SipResponse, cseq: int, extra: str = "", body: str = "") -> bytes:
    """A request from the caller inside the dialog the bridge's 200 ``ok`` created."""
    ctype = "Content-Type: application/sdp\r\n" if body else ""
    return (
        f"{method} sip:bridge@{BRIDGE_IP}:5060 SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 192.168.1.20:5062;branch={new_branch()};rport\r\n"
        "Max-Forwards: 70\r\n"
        f"To: {ok.headers.get('To')}\r\n"
        "From: <sip:alice@example.com>;tag=6c5f2a\r\n"
        f"Call-ID: {ok.call_id}\r\n"
        f"CSeq: {cseq} {method}\r\n"
        "Contact: <sip:alice@192.168.1.20:5062>\r\n"
        f"{extra}{ctype}Content-Length: {len(body)}\r\n\r\n{body}"
    ).encode()


def sent(events: list[UaEvent]) -> list[SipRequest | SipResponse]:
    return [parse_message(e.data) for e in events if isinstance(e, Send)]


def responses(events: list[UaEvent], status: int) -> list[SipResponse]:
    return [m for m in sent(events) if isinstance(m, SipResponse) and m.status == status]


def requests(events: list[UaEvent], method: str) -> list[SipRequest]:
    return [m for m in sent(events) if isinstance(m, SipRequest) and m.method == method]


def ended(events: list[UaEvent]) -> list[CallEnded]:
    return [e for e in events if isinstance(e, CallEnded)]


def run_until(ua: BridgeUA, end: float) -> list[UaEvent]:
    """Tick at every deadline up to ``end``, as the asyncio layer would."""
    out: list[UaEvent] = []
    while (d := ua.next_deadline()) is not None and d <= end:
        out += ua.tick(d)
    return out + ua.tick(end)


def established(ua: BridgeUA, data: bytes) -> SipResponse:
    """Offer, answer at t=0, ACK at t=0.01; returns the bridge's 200."""
    events = ua.receive_bytes(data, CALLER, "udp", 0.0)
    [offered] = [e for e in events if isinstance(e, CallOffered)]
    [ok] = responses(ua.answer(offered.call_id, 30000, 0.0), 200)
    assert not ua.receive_bytes(in_dialog("ACK", ok, 1), CALLER, "udp", 0.01)
    return ok


def reply(req: SipRequest, status: int, now: float, ua: BridgeUA, extra: str = "") -> list[UaEvent]:
    """The caller answers one of our in-dialog requests."""
    resp = make_response(req, status)
    if extra:
        name, _, value = extra.partition(":")
        resp.headers.add(name, value.strip())
    return ua.receive_bytes(resp.to_bytes(), CALLER, "udp", now)


def bye_at(ua: BridgeUA, start: float, end: float) -> float:
    """The time of the first BYE the UA sends in (start, end], stepping 10 ms."""
    t = start
    while t <= end:
        t = round(t + 0.01, 2)
        events = run_until(ua, t)
        if requests(events, "BYE"):
            [gone] = ended(events)
            assert (gone.by, gone.reason) == ("timeout", "session timer expired")
            return t
        assert not ended(events)
    raise AssertionError("no BYE")


# ---------------------------------------------------------------------------- negotiation


def test_parse_and_negotiate_pure() -> None:
    assert parse_session_expires("1800;refresher=UAC") == (1800, "uac")
    assert parse_session_expires(" 90 ") == (90, None)
    for bad in ("", "abc", "90;refresher=me", "-5"):
        with pytest.raises(ValueError):
            parse_session_expires(bad)
    timer = SessionTimer(90, "uac", True)
    assert (timer.refresh_after, timer.expire_after) == (45.0, 60.0)  # 90 - 90/3
    assert SessionTimer(1800, "uas", False).expire_after == 1768.0  # 1800 - 32
    req = parse_message(invite("Session-Expires: 100\r\nMin-SE: 120\r\n" + TIMER))
    assert isinstance(req, SipRequest)
    with pytest.raises(IntervalTooSmall) as exc:
        negotiate(req, 90)  # the caller's own Min-SE counts too
    assert exc.value.min_se == 120


def test_interval_below_min_se_gets_422_with_min_se() -> None:
    ua = BridgeUA(CONFIG, 5060, BRIDGE_IP, 0.0)
    events = ua.receive_bytes(invite("x: 60\r\n" + TIMER), CALLER, "udp", 0.0)  # compact form
    [too_small] = responses(events, 422)
    assert too_small.headers.get("Min-SE") == "90"
    assert not [e for e in events if isinstance(e, CallOffered)]
    assert ua.active_calls == 0
    # A bridge configured with a lower minimum takes the same request.
    low = BridgeUA(CONFIG, 5060, BRIDGE_IP, 0.0, min_se=30)
    ok = established(low, invite("x: 60\r\n" + TIMER))
    assert ok.headers.get("Session-Expires") == "60;refresher=uac"


def test_refresher_uac_refreshed_by_reinvite_keeps_the_call() -> None:
    ua = BridgeUA(CONFIG, 5060, BRIDGE_IP, 0.0)
    ok = established(ua, invite("Session-Expires: 90;refresher=uac\r\n" + TIMER))
    assert ok.headers.get("Session-Expires") == "90;refresher=uac"
    assert ok.headers.get_all("Require") == ["timer"]
    assert "timer" in ok.headers.get_all("Supported")
    assert not run_until(ua, 40.0)  # nothing to send: the caller refreshes
    refresh = in_dialog("INVITE", ok, 2, "Session-Expires: 90;refresher=uac\r\n" + TIMER, SDP)
    events = ua.receive_bytes(refresh, CALLER, "udp", 40.0)
    [ok2] = responses(events, 200)
    assert ok2.headers.get("Session-Expires") == "90;refresher=uac"
    assert not ua.receive_bytes(in_dialog("ACK", ok2, 2), CALLER, "udp", 40.01)
    assert not run_until(ua, 99.9)  # past the first expiry (60 s): the refresh reset it
    assert ua.active_calls == 1
    # An UPDATE without SDP refreshes too.
    events = ua.receive_bytes(in_dialog("UPDATE", ok, 3, TIMER), CALLER, "udp", 99.9)
    [ok3] = responses(events, 200)
    assert ok3.headers.get("Session-Expires") == "90;refresher=uac" and not ok3.body
    assert bye_at(ua, 99.9, 170.0) == 159.9  # 99.9 + 90 - 30


def test_no_refresh_sends_bye_at_se_minus_a_third() -> None:
    ua = BridgeUA(CONFIG, 5060, BRIDGE_IP, 0.0)
    ok = established(ua, invite("Session-Expires: 90\r\n" + TIMER))
    assert ok.headers.get("Session-Expires") == "90;refresher=uac"  # caller's job by default
    assert bye_at(ua, 0.0, 70.0) == 60.0
    assert ua.active_calls == 0
    bye = requests(run_until(ua, 60.1), "BYE")[0]  # retransmitted until answered
    reply(bye, 200, 60.2, ua)
    run_until(ua, 100.0)
    assert ua.ending_calls == 0 and ua.transactions == 0 and ua.next_deadline() is None


def test_long_interval_expires_32_s_early() -> None:
    ua = BridgeUA(CONFIG, 5060, BRIDGE_IP, 0.0)
    established(ua, invite("Session-Expires: 1800;refresher=uac\r\n" + TIMER))
    assert not run_until(ua, 1767.9)
    assert bye_at(ua, 1767.9, 1770.0) == 1768.0


def test_refresh_below_min_se_is_refused_and_the_call_stays() -> None:
    ua = BridgeUA(CONFIG, 5060, BRIDGE_IP, 0.0)
    ok = established(ua, invite("Session-Expires: 90\r\n" + TIMER))
    events = ua.receive_bytes(in_dialog("UPDATE", ok, 2, "x: 30\r\n" + TIMER), CALLER, "udp", 5)
    [too_small] = responses(events, 422)
    assert too_small.headers.get("Min-SE") == "90"
    assert ua.active_calls == 1
    assert bye_at(ua, 5.0, 70.0) == 60.0  # the refused refresh did not reset the timer


def test_refresher_uas_sends_update_at_half_and_its_200_keeps_the_call() -> None:
    ua = BridgeUA(CONFIG, 5060, BRIDGE_IP, 0.0)
    ok = established(ua, invite("Session-Expires: 120;refresher=uas\r\n" + TIMER))
    assert ok.headers.get("Session-Expires") == "120;refresher=uas"
    assert not run_until(ua, 59.99)
    [update] = requests(run_until(ua, 60.0), "UPDATE")
    # the refresher named in our own request's terms: its UAC, us (RFC 4028 7.4)
    assert update.headers.get("Session-Expires") == "120;refresher=uac"
    assert "timer" in update.headers.get_all("Supported") and not update.body
    assert update.headers.get("To") == ok.headers.get("From")  # inside the dialog
    reply(update, 200, 60.05, ua, "Session-Expires: 120;refresher=uac")  # still us
    assert not requests(run_until(ua, 120.0), "BYE")
    [again] = requests(run_until(ua, 120.05), "UPDATE")  # 60.05 + 60
    assert again.cseq[0] == update.cseq[0] + 1
    assert not ended(reply(again, 491, 120.1, ua))  # glare: not fatal, the timer decides
    assert ua.active_calls == 1  # first expiry (88 s) long passed
    assert bye_at(ua, 120.1, 210.0) == 148.05  # not refreshed: ends at 60.05 + 88


def test_refresher_uas_without_update_uses_reinvite_and_acks_its_200() -> None:
    ua = BridgeUA(CONFIG, 5060, BRIDGE_IP, 0.0)
    allow = "INVITE,ACK,BYE,CANCEL,OPTIONS"
    ok = established(ua, invite("Session-Expires: 90;refresher=uas\r\n" + TIMER, allow))
    [reinvite] = requests(run_until(ua, 45.0), "INVITE")
    assert reinvite.body == ok.body  # our current SDP, unchanged
    assert reinvite.headers.get("Session-Expires") == "90;refresher=uac"
    glare = in_dialog("INVITE", ok, 2, TIMER, SDP)  # the caller re-INVITEs at the same time
    assert responses(ua.receive_bytes(glare, CALLER, "udp", 45.05), 491)
    events = reply(reinvite, 200, 45.1, ua, "Session-Expires: 90;refresher=uac")
    [ack] = requests(events, "ACK")
    assert ack.cseq == (reinvite.cseq[0], "ACK") and not ack.body
    assert ack.top_via.branch != reinvite.top_via.branch
    [ack2] = requests(reply(reinvite, 200, 45.2, ua), "ACK")  # retransmitted 200: ACK again
    assert ack2.cseq == ack.cseq
    assert requests(run_until(ua, 90.1), "INVITE")  # the next refresh, 45 s after the 200
    assert ua.active_calls == 1


def test_a_peer_that_takes_over_refreshing_stops_our_updates() -> None:
    ua = BridgeUA(CONFIG, 5060, BRIDGE_IP, 0.0)
    established(ua, invite("Session-Expires: 90;refresher=uas\r\n" + TIMER))
    [update] = requests(run_until(ua, 45.0), "UPDATE")
    # refresher=uas of our UPDATE: the peer will refresh from now on
    reply(update, 200, 45.1, ua, "Session-Expires: 90;refresher=uas")
    events = run_until(ua, 45.1 + 57.9)
    assert not requests(events, "UPDATE") and not ended(events)
    assert bye_at(ua, 103.0, 200.0) == 45.1 + 60.0  # unrefreshed by the peer: SE - SE/3


def test_refresh_answered_481_ends_the_call() -> None:
    ua = BridgeUA(CONFIG, 5060, BRIDGE_IP, 0.0)
    established(ua, invite("Session-Expires: 90;refresher=uas\r\n" + TIMER))
    [update] = requests(run_until(ua, 45.0), "UPDATE")
    events = reply(update, 481, 45.1, ua)
    [gone] = ended(events)
    assert (gone.by, gone.reason) == ("timeout", "session refresh failed")
    assert requests(events, "BYE")


# ---------------------------------------------------------------------------- old callers


def test_caller_without_timer_support_makes_us_the_refresher() -> None:
    """A proxy put Session-Expires in; the caller cannot refresh, so we do (no Require)."""
    ua = BridgeUA(CONFIG, 5060, BRIDGE_IP, 0.0)
    ok = established(ua, invite("Session-Expires: 90;refresher=uac\r\n"))
    assert ok.headers.get("Session-Expires") == "90;refresher=uas"
    assert "Require" not in ok.headers
    [update] = requests(run_until(ua, 45.0), "UPDATE")
    reply(update, 200, 45.1, ua)  # no Session-Expires in the 200: keep ours
    assert not ended(run_until(ua, 90.0))
    [again] = requests(run_until(ua, 90.1), "UPDATE")
    assert again.headers.get("Session-Expires") == "90;refresher=uac"
    # Unanswered: the transaction times out (64*T1) and we hang up (RFC 4028 10).
    [gone] = ended(run_until(ua, 91.0))
    assert (gone.by, gone.reason) == ("timeout", "session refresh failed")


def test_no_session_expires_means_no_timer() -> None:
    ua = BridgeUA(CONFIG, 5060, BRIDGE_IP, 0.0)
    ok = established(ua, invite(TIMER))
    assert "Session-Expires" not in ok.headers and "Require" not in ok.headers
    assert "timer" in ok.headers.get_all("Supported")
    run_until(ua, 1.0)
    assert ua.next_deadline() is None and ua.active_calls == 1


def test_require_timer_is_accepted_not_420() -> None:
    ua = BridgeUA(CONFIG, 5060, BRIDGE_IP, 0.0)
    events = ua.receive_bytes(invite("Require: timer\r\nx: 90\r\n"), CALLER, "udp", 0.0)
    assert not responses(events, 420)
    assert [e for e in events if isinstance(e, CallOffered)]

"""Blind transfer (REFER, RFC 3515) from the bridge UA: hand-written NOTIFYs, a fake clock,
no sockets.  Every test reads the bytes the UA sends (the REFER, the answers to NOTIFYs,
the BYE) as well as its TransferProgress events."""

from __future__ import annotations

from test_ua import (
    BRIDGE_IP,
    CALLER,
    assert_clean,
    established,
    in_dialog,
    invite_text,
    make_ua,
    of_type,
    offer_call,
    requests,
    responses,
    run_until,
)

from sip_bridge.config.loader import SipConfig
from sip_bridge.sip.message import NameAddr, SipRequest, SipResponse, make_response, parse_message
from sip_bridge.sip.ua import BridgeUA, CallEnded, Send, TransferProgress, UaEvent

ALICE_CONTACT = "sip:alice-0x5581@192.168.1.20:5062;transport=udp"


def notify(
    ok: SipResponse,
    cseq: int,
    frag: str,
    state: str = "active;expires=60",
    event: str = "refer",
) -> bytes:
    """The transferee's NOTIFY in the call's dialog, carrying ``frag`` as message/sipfrag."""
    return (
        f"NOTIFY sip:bridge@{BRIDGE_IP}:5060;transport=udp SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 192.168.1.20:5062;branch=z9hG4bKn{cseq};rport\r\n"
        "Max-Forwards: 70\r\n"
        f"To: {ok.headers.get('To')}\r\n"
        'From: "Alice" <sip:alice@example.com>;tag=6c5f2a\r\n'
        f"Call-ID: {ok.call_id}\r\n"
        f"CSeq: {cseq} NOTIFY\r\n"
        f"Contact: <{ALICE_CONTACT}>\r\n"
        f"Event: {event}\r\n"
        f"Subscription-State: {state}\r\n"
        "Content-Type: message/sipfrag;version=2.0\r\n"
        f"Content-Length: {len(frag)}\r\n\r\n{frag}"
    ).encode()


def start_transfer(ua: BridgeUA, target: str = "1001") -> tuple[str, SipResponse, SipRequest]:
    """An established call and the REFER the bridge sends for it; (Call-ID, its 200, REFER)."""
    call_id, ok = established(ua)
    events = ua.transfer(call_id, target, 1.0)
    [refer] = requests(events, "REFER")
    [send] = of_type(events, Send)
    assert send.destination == CALLER  # private Contact behind NAT: back where it came from
    assert not of_type(events, TransferProgress)
    return call_id, ok, refer


def refer_less_invite() -> SipRequest:
    """An INVITE of another call: a 200 to it (no To tag) frames an out-of-dialog NOTIFY."""
    msg = parse_message(invite_text(call_id="other-call").encode())
    assert isinstance(msg, SipRequest)
    return msg


def answer_refer(ua: BridgeUA, refer: SipRequest, status: int, now: float) -> list[UaEvent]:
    resp = make_response(refer, status)
    return ua.receive_bytes(resp.to_bytes(), CALLER, "udp", now)


def progress(events: list[UaEvent]) -> list[tuple[int, str, bool]]:
    return [(p.status, p.outcome, p.final) for p in of_type(events, TransferProgress)]


def test_refer_is_sent_in_the_dialog_with_refer_to_and_referred_by() -> None:
    ua = make_ua()
    call_id, ok, refer = start_transfer(ua)
    assert refer.uri == ALICE_CONTACT  # the remote target
    assert refer.call_id == call_id and refer.cseq[1] == "REFER"
    assert (
        NameAddr.parse(refer.headers.get("From") or "").tag
        == NameAddr.parse(ok.headers.get("To") or "").tag
    )
    assert NameAddr.parse(refer.headers.get("To") or "").tag == "6c5f2a"
    # a bare number goes to the caller's host (From: sip:alice@example.com)
    assert refer.headers.get("Refer-To") == "<sip:1001@example.com>"
    assert refer.headers.get("Referred-By") == f"<sip:bot@{BRIDGE_IP}>"
    assert refer.headers.get("Contact") == f"<sip:bridge@{BRIDGE_IP}:5060;transport=udp>"
    assert "NOTIFY" in refer.headers.get_all("Allow")
    # a SIP URI target is used as it is
    ua2 = make_ua()
    call2, _ = established(ua2)
    [refer2] = requests(ua2.transfer(call2, "sip:sales@pbx.example.com", 1.0), "REFER")
    assert refer2.headers.get("Refer-To") == "<sip:sales@pbx.example.com>"


def test_202_and_notifies_100_180_200_report_in_order_then_caller_hangs_up() -> None:
    ua = make_ua()
    _, ok, refer = start_transfer(ua)
    out = answer_refer(ua, refer, 202, 1.1)
    frags = [
        ("SIP/2.0 100 Trying\r\n", "active;expires=60"),
        ("SIP/2.0 180 Ringing\r\n", "active;expires=60"),
        ("SIP/2.0 200 OK\r\n", "terminated;reason=noresource"),
    ]
    for i, (frag, state) in enumerate(frags):
        events = ua.receive_bytes(notify(ok, 2 + i, frag, state), CALLER, "udp", 1.2 + i)
        assert [r.status for r in responses(events)] == [200]  # each NOTIFY answered 200
        [answered] = responses(events)
        assert answered.cseq == (2 + i, "NOTIFY")
        out += events
    assert progress(out) == [
        (202, "trying", False),
        (100, "trying", False),
        (180, "ringing", False),
        (200, "succeeded", True),
    ]
    assert {p.target for p in of_type(out, TransferProgress)} == {"sip:1001@example.com"}
    # the transferee hangs up on us, as it should after a successful transfer
    events = ua.receive_bytes(in_dialog("BYE", ok, 9), CALLER, "udp", 4.0)
    assert [r.status for r in responses(events)] == [200]
    [gone] = of_type(events, CallEnded)
    assert gone.by == "remote"
    assert not of_type(events, TransferProgress)
    assert_clean(ua)


def test_no_bye_after_success_makes_the_bridge_hang_up() -> None:
    ua = make_ua()
    _, ok, refer = start_transfer(ua)
    answer_refer(ua, refer, 202, 1.1)
    frag = "SIP/2.0 200 OK\r\n"
    events = ua.receive_bytes(notify(ok, 2, frag, "terminated"), CALLER, "udp", 2.0)
    assert progress(events) == [(200, "succeeded", True)]
    assert not requests(run_until(ua, 5.9), "BYE")  # 4 s of grace for the transferee's BYE
    events = run_until(ua, 6.1)
    bye = requests(events, "BYE")[0]  # then its retransmissions
    assert bye.uri == ALICE_CONTACT
    [gone] = of_type(events, CallEnded)
    assert (gone.by, gone.reason) == ("local", "transferred")
    assert_clean(ua)


def test_refer_declined_603_fails_and_the_call_goes_on() -> None:
    ua = make_ua()
    call_id, _, refer = start_transfer(ua)
    events = answer_refer(ua, refer, 603, 1.1)
    [p] = of_type(events, TransferProgress)
    assert (p.status, p.outcome, p.final) == (603, "failed", True)
    assert "603" in p.reason
    later = run_until(ua, 60.0)
    assert not of_type(later, TransferProgress) and not requests(later, "BYE")
    assert ua.active_calls == 1
    # another transfer may follow a failed one
    assert requests(ua.transfer(call_id, "1002", 61.0), "REFER")


def test_notify_486_fails_the_transfer() -> None:
    ua = make_ua()
    _, ok, refer = start_transfer(ua)
    out = answer_refer(ua, refer, 202, 1.1)
    out += ua.receive_bytes(notify(ok, 2, "SIP/2.0 100 Trying\r\n"), CALLER, "udp", 1.2)
    frag = "SIP/2.0 486 Busy Here\r\n"
    events = ua.receive_bytes(notify(ok, 3, frag, "terminated"), CALLER, "udp", 2.0)
    assert [r.status for r in responses(events)] == [200]
    assert progress(out + events) == [
        (202, "trying", False),
        (100, "trying", False),
        (486, "failed", True),
    ]
    assert of_type(events, TransferProgress)[0].reason == "486 Busy Here"
    assert not requests(run_until(ua, 60.0), "BYE") and ua.active_calls == 1


def test_no_final_notify_in_20_s_fails_with_status_0() -> None:
    ua = make_ua()
    _, ok, refer = start_transfer(ua)  # the REFER goes out at 1.0
    answer_refer(ua, refer, 202, 1.1)
    ua.receive_bytes(notify(ok, 2, "SIP/2.0 180 Ringing\r\n"), CALLER, "udp", 1.5)
    assert not of_type(run_until(ua, 20.9), TransferProgress)  # the target keeps ringing
    [p] = of_type(run_until(ua, 21.1), TransferProgress)
    assert (p.status, p.outcome, p.final) == (0, "failed", True)
    assert "20 s" in p.reason
    # a late NOTIFY belongs to a subscription we gave up on
    late = ua.receive_bytes(notify(ok, 3, "SIP/2.0 200 OK\r\n"), CALLER, "udp", 34.0)
    assert [r.status for r in responses(late)] == [481]
    assert not of_type(late, TransferProgress) and ua.active_calls == 1


def test_the_wait_for_a_final_report_is_configurable() -> None:
    ua = make_ua()
    ua.transfer_timeout_s = 6.0  # [transfer] timeout_s
    _, _, refer = start_transfer(ua)
    answer_refer(ua, refer, 202, 1.1)
    assert not of_type(run_until(ua, 6.9), TransferProgress)
    [p] = of_type(run_until(ua, 7.1), TransferProgress)
    assert (p.status, p.final) == (0, True) and "6 s" in p.reason


def test_a_refer_nobody_answers_fails_at_the_transfer_timeout_not_timer_f() -> None:
    """With RFC 3261 timers (T1 = 0.5 s) the REFER's Timer F is 32 s: the caller must be
    taken back at transfer_timeout_s (20 s) instead."""
    ua = make_ua(SipConfig())
    start_transfer(ua)
    events = run_until(ua, 20.9)
    assert len(requests(events, "REFER")) >= 3 and not of_type(events, TransferProgress)
    [p] = of_type(run_until(ua, 21.1), TransferProgress)
    assert (p.status, p.outcome, p.final) == (0, "failed", True)
    assert not of_type(run_until(ua, 40.0), TransferProgress)  # Timer F later: no second one


def test_unanswered_refer_times_out_408() -> None:
    ua = make_ua()
    start_transfer(ua)
    events = run_until(ua, 5.0)  # Timer F = 64*T1 = 0.64 s here
    assert len(requests(events, "REFER")) >= 3  # retransmitted meanwhile (UDP)
    assert progress(events) == [(408, "failed", True)]
    assert ua.active_calls == 1


def test_notify_without_our_subscription_or_with_another_event() -> None:
    ua = make_ua()
    call_id, ok = established(ua)
    frag = "SIP/2.0 100 Trying\r\n"
    events = ua.receive_bytes(notify(ok, 2, frag), CALLER, "udp", 1.0)
    assert [r.status for r in responses(events)] == [481]  # no REFER sent: no subscription
    events = ua.receive_bytes(notify(ok, 3, frag, event="dialog"), CALLER, "udp", 1.0)
    [r] = responses(events)
    assert r.status == 489 and r.headers.get("Allow-Events") == "refer"
    # out of dialog (no To tag): 481
    stray_ok = make_response(refer_less_invite(), 200)
    stray = notify(stray_ok, 1, frag)
    assert [r.status for r in responses(ua.receive_bytes(stray, CALLER, "udp", 1.0))] == [481]
    # with a transfer running, an unknown event is still 489 and changes nothing
    [refer] = requests(ua.transfer(call_id, "1001", 2.0), "REFER")
    events = ua.receive_bytes(notify(ok, 4, frag, event="talk"), CALLER, "udp", 2.1)
    assert [r.status for r in responses(events)] == [489] and not progress(events)
    # an id naming another REFER: 481
    other = f"refer;id={refer.cseq[0] + 7}"
    events = ua.receive_bytes(notify(ok, 5, frag, event=other), CALLER, "udp", 2.2)
    assert [r.status for r in responses(events)] == [481] and not progress(events)
    own = f"refer;id={refer.cseq[0]}"
    events = ua.receive_bytes(notify(ok, 6, frag, event=own), CALLER, "udp", 2.3)
    assert [r.status for r in responses(events)] == [200]
    assert progress(events) == [(100, "trying", False)]


def test_transfer_refused_before_any_refer() -> None:
    ua = make_ua()
    assert ua.transfer("no-such-call", "1001", 0.0) == []
    offered, _ = offer_call(ua, invite_text())
    [p] = ua.transfer(offered.call_id, "1001", 0.1)
    assert isinstance(p, TransferProgress) and (p.outcome, p.status, p.final) == ("failed", 0, True)
    assert "not established" in p.reason
    ua2 = make_ua()
    call_id, _ = established(ua2)
    [bad] = ua2.transfer(call_id, "the sales desk", 1.0)
    assert isinstance(bad, TransferProgress) and bad.outcome == "failed"
    assert requests(ua2.transfer(call_id, "1001", 1.0), "REFER")
    [busy] = ua2.transfer(call_id, "1002", 1.1)
    assert isinstance(busy, TransferProgress) and "already in progress" in busy.reason


def test_caller_bye_during_the_transfer_reports_it_unknown() -> None:
    ua = make_ua()
    _, ok, refer = start_transfer(ua)
    answer_refer(ua, refer, 202, 1.1)
    events = ua.receive_bytes(in_dialog("BYE", ok, 9), CALLER, "udp", 1.5)
    assert [r.status for r in responses(events)] == [200]
    assert progress(events) == [(0, "failed", True)]
    assert isinstance(events[-1], CallEnded)
    assert_clean(ua)


def test_a_transfer_asked_for_before_the_ack_goes_out_with_the_ack() -> None:
    """The agent starts with our 200; its REFER must wait for the caller's ACK, not fail."""
    ua = make_ua()
    offered, _ = offer_call(ua, invite_text())
    [ok] = responses(ua.answer(offered.call_id, 30000, 0.1), 200)
    assert ua.transfer(offered.call_id, "1001", 0.11) == []  # held until the ACK
    events = ua.receive_bytes(in_dialog("ACK", ok, 1), CALLER, "udp", 0.12)
    [refer] = requests(events, "REFER")
    assert (refer.headers.get("Refer-To") or "").startswith("<sip:1001@")
    assert not progress(events)


def test_a_held_transfer_fails_when_the_ack_never_comes() -> None:
    ua = make_ua()
    offered, _ = offer_call(ua, invite_text())
    ua.answer(offered.call_id, 30000, 0.1)
    assert ua.transfer(offered.call_id, "1001", 0.11) == []
    events = run_until(ua, 40.0)  # Timer L: no ACK, BYE
    assert progress(events) == [(0, "failed", True)]
    assert [e.reason for e in of_type(events, CallEnded)] == ["no ACK"]
    assert requests(events, "BYE") and not requests(events, "REFER")


def test_our_own_hangup_during_a_transfer_reports_it_unknown() -> None:
    ua = make_ua()
    call_id, _, refer = start_transfer(ua)
    answer_refer(ua, refer, 202, 1.1)
    events = ua.hangup(call_id, 1.5, "call length limit")
    assert progress(events) == [(0, "failed", True)]
    [ended] = of_type(events, CallEnded)
    assert (ended.reason, ended.by) == ("call length limit", "local")
    [p] = of_type(events, TransferProgress)
    assert events.index(p) < events.index(ended)  # the agent hears the outcome first
    assert requests(events, "BYE")
    assert_clean(ua)

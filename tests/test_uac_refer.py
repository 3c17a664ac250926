"""Our outbound call being transferred (RFC 3515 transferee): REFER in, NOTIFYs out."""

from __future__ import annotations

from sip_bridge.sip.message import (
    Headers,
    SipRequest,
    SipResponse,
    Via,
    make_response,
    new_branch,
    parse_message,
)
from sip_bridge.sip.offer_answer import MediaConfig
from sip_bridge.sip.transaction import SendMessage
from sip_bridge.sip.transfer import Refer
from sip_bridge.sip.uac import CallAnswered, OutboundCall, ReferReceived, UacEvent

PEER = ("192.0.2.10", 5060)
LOCAL = ("192.0.2.1", 5070)
SDP = (
    b"v=0\r\no=peer 1 1 IN IP4 192.0.2.10\r\ns=-\r\nc=IN IP4 192.0.2.10\r\nt=0 0\r\n"
    b"m=audio 30000 RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
    b"a=rtpmap:101 telephone-event/8000\r\na=ptime:20\r\n"
)


def _sent(events: list[UacEvent]) -> list[SipRequest | SipResponse]:
    return [parse_message(e.data) for e in events if isinstance(e, SendMessage)]


def _answered() -> tuple[OutboundCall, SipRequest]:
    call = OutboundCall("sip:voice@192.0.2.10", LOCAL, PEER, MediaConfig("192.0.2.1", 40000))
    (invite,) = _sent(call.start(0.0))
    assert isinstance(invite, SipRequest)
    ok = make_response(invite, 200, to_tag="peer1")
    ok.headers.add("Contact", "<sip:voice@192.0.2.10:5060>")
    ok.headers.add("Content-Type", "application/sdp")
    ok.body = SDP
    assert any(isinstance(e, CallAnswered) for e in call.receive(ok.to_bytes(), PEER, 1.0))
    assert "REFER" in invite.headers.get_all("Allow")  # we say we take it
    return call, invite


def _refer(invite: SipRequest, cseq: int, *refer_to: str) -> bytes:
    """The bridge's REFER in our dialog (it is the UAS of our INVITE: tags swap)."""
    h = Headers()
    h.add("Via", Via("UDP", "192.0.2.10", 5060, {"branch": new_branch()}).to_str())
    h.add("Max-Forwards", "70")
    h.add("From", "<sip:voice@192.0.2.10>;tag=peer1")
    h.add("To", invite.headers.get("From") or "")
    h.add("Call-ID", invite.call_id)
    h.add("CSeq", f"{cseq} REFER")
    h.add("Contact", "<sip:voice@192.0.2.10:5060>")
    for value in refer_to:
        h.add("Refer-To", value)
    h.add("Referred-By", "<sip:voice@192.0.2.10>")
    return SipRequest("REFER", "sip:sip-bridge@192.0.2.1:5070", h).to_bytes()


def test_a_refer_is_accepted_and_reported() -> None:
    call, invite = _answered()
    events = call.receive(_refer(invite, 5, "<sip:agent@127.0.0.1:5070>"), PEER, 2.0)
    (resp,) = _sent(events)
    assert isinstance(resp, SipResponse) and resp.status == 202
    assert ReferReceived("sip:agent@127.0.0.1:5070", "<sip:voice@192.0.2.10>") in events


def test_notifies_tell_the_bridge_how_the_new_call_goes() -> None:
    """What our NOTIFYs say is what the bridge's own transfer logic reads."""
    call, invite = _answered()
    call.receive(_refer(invite, 5, "<sip:agent@127.0.0.1:5070>"), PEER, 2.0)
    bridge_side = Refer("c1", "sip:agent@127.0.0.1:5070", 5)
    outcomes = []
    for status, reason in ((100, "Trying"), (180, "Ringing"), (486, "Busy Here")):
        (notify,) = _sent(call.notify_refer(status, reason, 3.0))
        assert isinstance(notify, SipRequest) and notify.method == "NOTIFY"
        assert notify.headers.get("Event") == "refer;id=5"
        assert notify.headers.get("Content-Type") == "message/sipfrag;version=2.0"
        assert notify.body == f"SIP/2.0 {status} {reason}\r\n".encode()
        assert notify.uri == "sip:voice@192.0.2.10:5060"  # in the dialog, to its Contact
        answer = bridge_side.on_notify(
            notify.headers.get("Event") or "",
            notify.headers.get("Subscription-State") or "",
            notify.headers.get("Content-Type") or "",
            notify.body,
        )
        assert answer.status == 200
        outcomes.append(answer.progress.outcome if answer.progress else None)
    assert outcomes == ["trying", "ringing", "failed"]
    assert call.notify_refer(200, "OK", 4.0) == []  # the subscription is over


def test_bad_refers_are_refused() -> None:
    call, invite = _answered()
    for cseq, targets, status in (
        (5, (), 400),  # no Refer-To
        (6, ("<sip:a@192.0.2.5>", "<sip:b@192.0.2.5>"), 400),  # two
        (7, ("<http://example.com>",), 400),  # not a SIP or tel URI
    ):
        (resp,) = _sent(call.receive(_refer(invite, cseq, *targets), PEER, 2.0))
        assert isinstance(resp, SipResponse) and resp.status == status
    call.receive(_refer(invite, 8, "<tel:+15551234>"), PEER, 2.0)
    (resp,) = _sent(call.receive(_refer(invite, 9, "<sip:c@192.0.2.5>"), PEER, 2.1))
    assert isinstance(resp, SipResponse) and resp.status == 491  # one transfer at a time

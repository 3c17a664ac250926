"""The outbound call state machine, driven by hand-built peer responses and a fake clock."""

from __future__ import annotations

from sip_bridge.sip.message import SipRequest, SipResponse, make_response, parse_message
from sip_bridge.sip.offer_answer import MediaConfig
from sip_bridge.sip.transaction import SendMessage
from sip_bridge.sip.uac import (
    CallAnswered,
    CallEnded,
    CallFailed,
    CallProgress,
    OutboundCall,
    UacEvent,
    UacState,
)

PEER = ("192.0.2.10", 5060)
LOCAL = ("192.0.2.1", 5070)
ANSWER_SDP = (
    b"v=0\r\no=peer 1 1 IN IP4 192.0.2.10\r\ns=-\r\nc=IN IP4 192.0.2.10\r\nt=0 0\r\n"
    b"m=audio 30000 RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
    b"a=rtpmap:101 telephone-event/8000\r\na=ptime:20\r\n"
)


def _call(timeout: float = 30.0) -> tuple[OutboundCall, SipRequest]:
    call = OutboundCall(
        "sip:echo@192.0.2.10",
        LOCAL,
        PEER,
        MediaConfig("192.0.2.1", 40000),
        answer_timeout_s=timeout,
    )
    events = call.start(0.0)
    sent = _sent(events)
    assert len(sent) == 1 and isinstance(sent[0], SipRequest) and sent[0].method == "INVITE"
    assert sent[0].headers.get("Content-Type") == "application/sdp"
    assert b"m=audio 40000 RTP/AVP 0 8 101" in sent[0].body
    return call, sent[0]


def _state(call: OutboundCall) -> UacState:
    return call.state  # a call, so mypy does not narrow across the calls that change it


def _sent(events: list[UacEvent]) -> list[SipRequest | SipResponse]:
    return [parse_message(e.data) for e in events if isinstance(e, SendMessage)]


def _reply(invite: SipRequest, status: int, body: bytes = b"") -> bytes:
    resp = make_response(invite, status, to_tag="peer1" if status > 100 else None)
    resp.headers.add("Contact", "<sip:echo@192.0.2.10:5062>")
    if body:
        resp.headers.add("Content-Type", "application/sdp")
        resp.body = body
    return resp.to_bytes()


def _answered(call: OutboundCall, invite: SipRequest) -> list[UacEvent]:
    events = call.receive(_reply(invite, 200, ANSWER_SDP), PEER, 1.0)
    assert _state(call) is UacState.CONFIRMED
    return events


def test_answered_call_acks_the_2xx_from_the_dialog_and_reports_the_media() -> None:
    call, invite = _call()
    progress = call.receive(_reply(invite, 180), PEER, 0.5)
    assert CallProgress(180, "Ringing") in progress
    events = _answered(call, invite)
    answered = [e for e in events if isinstance(e, CallAnswered)]
    assert len(answered) == 1
    media = answered[0].media
    assert (media.remote_address, media.remote_port, media.codec) == ("192.0.2.10", 30000, "PCMU")
    assert media.telephone_event_pt == 101 and media.ptime == 20
    (ack,) = _sent(events)
    assert isinstance(ack, SipRequest) and ack.method == "ACK"
    assert ack.uri == "sip:echo@192.0.2.10:5062"  # the remote target from the 2xx Contact
    assert ack.cseq == (invite.cseq[0], "ACK")
    assert ack.top_via.branch != invite.top_via.branch  # a 2xx ACK is its own transaction
    assert "tag=peer1" in (ack.headers.get("To") or "")
    sends = [e for e in events if isinstance(e, SendMessage)]
    assert sends[0].destination == ("192.0.2.10", 5062)


def test_busy_here_fails_the_call_and_the_layer_acks_it() -> None:
    call, invite = _call()
    events = call.receive(_reply(invite, 486), PEER, 0.3)
    assert CallFailed(486, "Busy Here") in events
    (ack,) = _sent(events)
    assert isinstance(ack, SipRequest) and ack.method == "ACK"
    assert ack.top_via.branch == invite.top_via.branch  # non-2xx ACK: same transaction
    assert _state(call) is UacState.ENDED
    assert call.hangup(0.4) == []


def test_retransmitted_200_is_acked_again_with_the_same_ack() -> None:
    call, invite = _call()
    first = _sent(_answered(call, invite))
    again = call.receive(_reply(invite, 200, ANSWER_SDP), PEER, 1.5)
    assert not any(isinstance(e, CallAnswered) for e in again)  # reported once
    second = _sent(again)
    assert len(second) == 1 and second[0].to_bytes() == first[0].to_bytes()
    assert call.acks_sent == 2


def test_unanswered_call_is_cancelled_at_the_timeout_and_487_fails_it() -> None:
    call, invite = _call(timeout=5.0)
    call.receive(_reply(invite, 180), PEER, 0.2)
    deadline = call.next_deadline()
    assert deadline is not None and deadline <= 5.0
    assert _sent(call.tick(4.9)) == []
    (cancel,) = _sent(call.tick(5.0))
    assert isinstance(cancel, SipRequest) and cancel.method == "CANCEL"
    assert cancel.top_via.branch == invite.top_via.branch
    assert cancel.cseq == (invite.cseq[0], "CANCEL")
    assert _state(call) is UacState.CANCELLING
    call.receive(make_response(cancel, 200).to_bytes(), PEER, 5.1)
    events = call.receive(_reply(invite, 487), PEER, 5.1)
    assert CallFailed(487, "Request Terminated") in events
    assert _state(call) is UacState.ENDED


def test_hangup_sends_bye_and_its_200_ends_the_call() -> None:
    call, invite = _call()
    _answered(call, invite)
    (bye,) = _sent(call.hangup(10.0))
    assert isinstance(bye, SipRequest) and bye.method == "BYE"
    assert bye.uri == "sip:echo@192.0.2.10:5062"
    assert bye.call_id == invite.call_id and bye.cseq[0] == invite.cseq[0] + 1
    assert _state(call) is UacState.TERMINATING
    events = call.receive(make_response(bye, 200).to_bytes(), PEER, 10.1)
    assert [e for e in events if isinstance(e, CallEnded)] == [CallEnded("BYE answered 200")]
    assert _state(call) is UacState.ENDED


def test_peer_bye_is_answered_and_ends_the_call() -> None:
    call, invite = _call()
    _answered(call, invite)
    bye = (
        f"BYE sip:sip-bridge@192.0.2.1:5070 SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 192.0.2.10:5062;branch=z9hG4bKpeerbye1\r\n"
        f"From: <sip:echo@192.0.2.10>;tag=peer1\r\n"
        f"To: {invite.headers.get('From')}\r\n"
        f"Call-ID: {invite.call_id}\r\nCSeq: 7 BYE\r\nContent-Length: 0\r\n\r\n"
    ).encode()
    events = call.receive(bye, ("192.0.2.10", 5062), 3.0)
    assert CallEnded("remote hung up") in events
    (ok,) = _sent(events)
    assert isinstance(ok, SipResponse) and ok.status == 200


def test_dtmf_goes_out_as_sip_info_dtmf_relay() -> None:
    call, invite = _call()
    _answered(call, invite)
    (info,) = _sent(call.send_dtmf_info("#", 2.0))
    assert isinstance(info, SipRequest) and info.method == "INFO"
    assert info.headers.get("Content-Type") == "application/dtmf-relay"
    assert info.body == b"Signal=#\r\nDuration=160\r\n"


def test_bad_sdp_answer_is_acked_then_byed() -> None:
    call, invite = _call()
    events = call.receive(_reply(invite, 200, b"v=0\r\nnonsense\r\n"), PEER, 1.0)
    methods = [m.method for m in _sent(events) if isinstance(m, SipRequest)]
    assert methods == ["ACK", "BYE"]
    failed = [e for e in events if isinstance(e, CallFailed)]
    assert len(failed) == 1 and failed[0].status == 488


def test_garbage_is_ignored() -> None:
    call, _ = _call()
    assert call.receive(b"\x00\xffnot sip", PEER, 0.1) == []
    assert _state(call) is UacState.CALLING

"""RFC 4028 session timers and the peer's re-INVITE/UPDATE on our outbound calls.

Sans-I/O: hand-built peer responses and requests, an explicit clock, and assertions on
the requests and responses the call puts on the wire.
"""

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
from sip_bridge.sip.sdp import parse_sdp
from sip_bridge.sip.transaction import SendMessage
from sip_bridge.sip.uac import (
    CallAnswered,
    CallEnded,
    CallFailed,
    MediaChanged,
    OutboundCall,
    UacEvent,
    UacState,
)

PEER = ("192.0.2.10", 5060)
PEER_CONTACT = ("192.0.2.10", 5062)
LOCAL = ("192.0.2.1", 5070)


def _sdp(direction: str = "sendrecv", version: int = 1, host: str = "192.0.2.10") -> bytes:
    return (
        f"v=0\r\no=peer 1 {version} IN IP4 {host}\r\ns=-\r\nc=IN IP4 {host}\r\nt=0 0\r\n"
        f"m=audio 30000 RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
        f"a=rtpmap:101 telephone-event/8000\r\na=ptime:20\r\na={direction}\r\n"
    ).encode()


def _sent(events: list[UacEvent]) -> list[SipRequest | SipResponse]:
    return [parse_message(e.data) for e in events if isinstance(e, SendMessage)]


def _requests(events: list[UacEvent], method: str) -> list[SipRequest]:
    return [m for m in _sent(events) if isinstance(m, SipRequest) and m.method == method]


def _responses(events: list[UacEvent]) -> list[SipResponse]:
    return [m for m in _sent(events) if isinstance(m, SipResponse)]


def _state(call: OutboundCall) -> UacState:
    return call.state


def _start(session_expires: int = 1800) -> tuple[OutboundCall, SipRequest]:
    call = OutboundCall(
        "sip:echo@192.0.2.10",
        LOCAL,
        PEER,
        MediaConfig("192.0.2.1", 40000),
        session_expires=session_expires,
    )
    (invite,) = _requests(call.start(0.0), "INVITE")
    return call, invite


def _ok(invite: SipRequest, *, se: str | None, allow: str = "INVITE, ACK, BYE, UPDATE") -> bytes:
    resp = make_response(invite, 200, to_tag="peer1")
    resp.headers.add("Contact", "<sip:echo@192.0.2.10:5062>")
    resp.headers.add("Allow", allow)
    if se is not None:
        resp.headers.add("Session-Expires", se)
        resp.headers.add("Require", "timer")
    resp.headers.add("Content-Type", "application/sdp")
    resp.body = _sdp()
    return resp.to_bytes()


def _answered(
    se: str | None = "90;refresher=uac", allow: str = "INVITE, ACK, BYE, UPDATE"
) -> tuple[OutboundCall, SipRequest]:
    call, invite = _start()
    events = call.receive(_ok(invite, se=se, allow=allow), PEER, 1.0)
    assert any(isinstance(e, CallAnswered) for e in events)
    assert _state(call) is UacState.CONFIRMED
    return call, invite


def _peer_request(
    call: OutboundCall,
    invite: SipRequest,
    method: str,
    cseq: int,
    *,
    body: bytes = b"",
    se: str | None = None,
    contact: str = "<sip:echo@192.0.2.10:5062>",
) -> bytes:
    """An in-dialog request from the peer (it is the UAS of our INVITE, so tags swap)."""
    headers = Headers()
    headers.add("Via", Via("UDP", "192.0.2.10", 5062, {"branch": new_branch()}).to_str())
    headers.add("Max-Forwards", "70")
    headers.add("From", "<sip:echo@192.0.2.10>;tag=peer1")
    headers.add("To", invite.headers.get("From") or "")
    headers.add("Call-ID", invite.call_id)
    headers.add("CSeq", f"{cseq} {method}")
    headers.add("Contact", contact)
    headers.add("Supported", "timer")
    if se is not None:
        headers.add("Session-Expires", se)
    if body:
        headers.add("Content-Type", "application/sdp")
    return SipRequest(method, "sip:sip-bridge@192.0.2.1:5070", headers, body).to_bytes()


def _ack_for(resp: SipResponse, body: bytes = b"") -> bytes:
    """The peer's ACK for our 2xx to its re-INVITE (its own branch, the INVITE's CSeq)."""
    headers = Headers()
    headers.add("Via", Via("UDP", "192.0.2.10", 5062, {"branch": new_branch()}).to_str())
    for name in ("From", "To", "Call-ID"):
        headers.add(name, resp.headers.get(name) or "")
    headers.add("CSeq", f"{resp.cseq[0]} ACK")
    if body:
        headers.add("Content-Type", "application/sdp")
    return SipRequest("ACK", "sip:sip-bridge@192.0.2.1:5070", headers, body).to_bytes()


def test_invite_asks_for_a_session_timer() -> None:
    _, invite = _start()
    assert invite.headers.get("Session-Expires") == "1800"
    assert invite.headers.get("Min-SE") == "90"
    assert "timer" in invite.headers.get_all("Supported")
    assert "UPDATE" in invite.headers.get_all("Allow")
    _, plain = _start(session_expires=0)
    assert plain.headers.get("Session-Expires") is None and plain.headers.get("Min-SE") is None


def test_422_retries_once_with_the_peers_min_se() -> None:
    call, invite = _start()
    too_small = make_response(invite, 422, to_tag="peer1")
    too_small.headers.add("Min-SE", "3600")
    events = call.receive(too_small.to_bytes(), PEER, 0.2)
    assert not any(isinstance(e, CallFailed) for e in events)
    (ack,) = _requests(events, "ACK")  # the transaction layer ACKs the 422
    assert ack.cseq == (invite.cseq[0], "ACK")
    (retry,) = _requests(events, "INVITE")
    assert retry.headers.get("Session-Expires") == "3600"
    assert retry.headers.get("Min-SE") == "3600"
    assert retry.cseq == (invite.cseq[0] + 1, "INVITE")
    assert retry.call_id == invite.call_id
    assert retry.headers.get("From") == invite.headers.get("From")
    assert retry.top_via.branch != invite.top_via.branch
    assert _state(call) is UacState.CALLING
    again = make_response(retry, 422, to_tag="peer2")
    again.headers.add("Min-SE", "7200")
    events = call.receive(again.to_bytes(), PEER, 0.4)
    assert [e.status for e in events if isinstance(e, CallFailed)] == [422]  # once only
    assert _requests(events, "INVITE") == []


def test_refresher_uac_sends_update_at_half_the_interval_and_restarts() -> None:
    call, _ = _answered("90;refresher=uac")
    assert call.timer is not None and call.timer.refresher == "uac"
    assert call.session_deadline == 1.0 + 45.0
    assert _requests(call.tick(45.9), "UPDATE") == []
    (update,) = _requests(call.tick(46.0), "UPDATE")
    assert update.uri == "sip:echo@192.0.2.10:5062"
    assert update.headers.get("Session-Expires") == "90;refresher=uac"
    assert update.headers.get("Min-SE") == "90"
    assert "timer" in update.headers.get_all("Supported")
    assert update.body == b""
    ok = make_response(update, 200)
    ok.headers.add("Session-Expires", "90;refresher=uac")
    ok.headers.add("Require", "timer")
    assert call.receive(ok.to_bytes(), PEER_CONTACT, 46.1) == []
    assert call.session_deadline == 46.1 + 45.0  # the timer restarted
    (second,) = _requests(call.tick(91.1), "UPDATE")
    assert second.cseq[0] == update.cseq[0] + 1


def test_refresher_uac_without_update_sends_reinvite_with_our_offer_and_acks_it() -> None:
    call, invite = _answered("90;refresher=uac", allow="INVITE, ACK, BYE")
    first_sdp = parse_sdp(invite.body)
    (reinvite,) = _requests(call.tick(46.0), "INVITE")
    assert reinvite.headers.get("Session-Expires") == "90;refresher=uac"
    offer = parse_sdp(reinvite.body)
    assert offer.origin.session_id == first_sdp.origin.session_id
    assert offer.origin.version == first_sdp.origin.version + 1
    assert offer.media[0].port == 40000 and offer.direction_for(0) == "sendrecv"
    ok = make_response(reinvite, 200)
    ok.headers.add("Contact", "<sip:echo@192.0.2.10:5062>")
    ok.headers.add("Session-Expires", "120;refresher=uac")
    ok.headers.add("Content-Type", "application/sdp")
    ok.body = _sdp(version=2)
    events = call.receive(ok.to_bytes(), PEER_CONTACT, 46.2)
    (ack,) = _requests(events, "ACK")
    assert ack.cseq == (reinvite.cseq[0], "ACK")
    assert not any(isinstance(e, MediaChanged) for e in events)  # same media as before
    assert call.timer is not None and call.timer.interval == 120
    assert call.session_deadline == 46.2 + 60.0
    again = call.receive(ok.to_bytes(), PEER_CONTACT, 46.7)  # our ACK got lost
    assert [m.to_bytes() for m in _requests(again, "ACK")] == [ack.to_bytes()]


def test_refresh_491_glare_retries_later_and_a_timeout_ends_the_call() -> None:
    call, _ = _answered("90;refresher=uac", allow="INVITE, ACK, BYE")
    (reinvite,) = _requests(call.tick(46.0), "INVITE")
    glare = make_response(reinvite, 491)
    events = call.receive(glare.to_bytes(), PEER_CONTACT, 46.1)
    assert _requests(events, "ACK")  # the layer ACKs the non-2xx
    deadline = call.session_deadline
    assert deadline is not None and 46.1 + 2.1 <= deadline <= 46.1 + 4.0
    (retry,) = _requests(call.tick(50.2), "INVITE")
    assert retry.cseq[0] == reinvite.cseq[0] + 1
    ended: list[UacEvent] = []
    now = 50.2
    byes: list[SipRequest] = []
    while not byes and now < 90:  # no answer at all: Timer B, then BYE
        now += 0.5
        ended = call.tick(now)
        byes = _requests(ended, "BYE")
    assert byes and now < 1.0 + 90  # before the session would expire anyway
    events = call.receive(make_response(byes[0], 200).to_bytes(), PEER_CONTACT, now + 0.1)
    assert CallEnded("session refresh timed out") in events


def test_update_refused_falls_back_to_reinvite() -> None:
    call, _ = _answered("90;refresher=uac")
    (update,) = _requests(call.tick(46.0), "UPDATE")
    events = call.receive(make_response(update, 501).to_bytes(), PEER_CONTACT, 46.1)
    (reinvite,) = _requests(events, "INVITE")
    assert reinvite.headers.get("Session-Expires") == "90;refresher=uac"
    assert b"m=audio 40000" in reinvite.body


def test_refresher_uas_without_refresh_sends_bye_at_the_expiry() -> None:
    call, _ = _answered("90;refresher=uas")
    expiry = 1.0 + 90 - min(32, 90 / 3)  # 61.0
    assert call.session_deadline == expiry
    assert _requests(call.tick(60.9), "BYE") == []
    assert _requests(call.tick(60.9), "UPDATE") == []  # never ours to refresh
    (bye,) = _requests(call.tick(expiry), "BYE")
    assert bye.uri == "sip:echo@192.0.2.10:5062"
    events = call.receive(make_response(bye, 200).to_bytes(), PEER_CONTACT, expiry + 0.1)
    assert CallEnded("session expired") in events
    assert _state(call) is UacState.ENDED


def test_no_session_expires_in_the_2xx_means_no_timer() -> None:
    call, _ = _answered(se=None)
    assert call.timer is None
    assert call.session_deadline is None
    assert _sent(call.tick(10_000.0)) == []
    assert _state(call) is UacState.CONFIRMED


def test_peer_refresh_reinvite_restarts_the_timer_and_gets_a_200_with_sdp() -> None:
    call, invite = _answered("90;refresher=uas")
    req = _peer_request(call, invite, "INVITE", 2, body=_sdp(), se="90;refresher=uac")
    events = call.receive(req, PEER_CONTACT, 50.0)
    (ok,) = [r for r in _responses(events) if r.status == 200]
    assert ok.headers.get("Session-Expires") == "90;refresher=uac"
    assert "timer" in ok.headers.get_all("Require")
    assert ok.headers.get("Contact") == "<sip:sip-bridge@192.0.2.1:5070>"
    answer = parse_sdp(ok.body)
    assert answer.media[0].port == 40000 and answer.direction_for(0) == "sendrecv"
    assert not any(isinstance(e, MediaChanged) for e in events)  # nothing changed
    assert call.session_deadline == 50.0 + 60.0  # restarted: expiry SE - 30 from now
    assert call.receive(_ack_for(ok), PEER_CONTACT, 50.1) == []
    assert _sent(call.tick(100.0)) == []  # the old expiry (61.0) is gone
    (bye,) = _requests(call.tick(110.0), "BYE")  # nobody refreshed since 50.0
    assert bye.call_id == invite.call_id


def test_hold_reinvite_is_answered_recvonly_and_reported() -> None:
    call, invite = _answered("90;refresher=uac")
    hold = _peer_request(call, invite, "INVITE", 2, body=_sdp("sendonly", 2))
    events = call.receive(hold, PEER_CONTACT, 5.0)
    (ok,) = [r for r in _responses(events) if r.status == 200]
    assert parse_sdp(ok.body).direction_for(0) == "recvonly"
    assert ok.headers.get("Session-Expires") == "90;refresher=uas"  # we still refresh
    (changed,) = [e for e in events if isinstance(e, MediaChanged)]
    assert changed.media.direction == "recvonly" and not changed.media.can_send
    call.receive(_ack_for(ok), PEER_CONTACT, 5.1)
    off = _peer_request(call, invite, "INVITE", 3, body=_sdp("inactive", 3))
    events = call.receive(off, PEER_CONTACT, 6.0)
    (ok,) = [r for r in _responses(events) if r.status == 200]
    assert parse_sdp(ok.body).direction_for(0) == "inactive"
    call.receive(_ack_for(ok), PEER_CONTACT, 6.1)
    moved = _peer_request(call, invite, "UPDATE", 4, body=_sdp("sendrecv", 4, "192.0.2.99"))
    events = call.receive(moved, PEER_CONTACT, 7.0)
    (ok,) = _responses(events)
    assert ok.status == 200 and parse_sdp(ok.body).direction_for(0) == "sendrecv"
    (changed,) = [e for e in events if isinstance(e, MediaChanged)]
    assert changed.media.remote_address == "192.0.2.99" and changed.media.direction == "sendrecv"


def test_reinvite_without_sdp_gets_our_offer_and_the_ack_carries_the_answer() -> None:
    call, invite = _answered("90;refresher=uac")
    req = _peer_request(call, invite, "INVITE", 2, contact="<sip:echo@192.0.2.10:5064>")
    events = call.receive(req, PEER_CONTACT, 5.0)
    (ok,) = [r for r in _responses(events) if r.status == 200]
    offer = parse_sdp(ok.body)
    assert offer.direction_for(0) == "sendrecv" and offer.media[0].port == 40000
    assert offer.origin.version == parse_sdp(invite.body).origin.version + 1
    events = call.receive(_ack_for(ok, _sdp("sendonly", 2, "192.0.2.77")), PEER_CONTACT, 5.1)
    (changed,) = [e for e in events if isinstance(e, MediaChanged)]
    assert changed.media.remote_address == "192.0.2.77" and changed.media.direction == "recvonly"
    (update,) = _requests(call.tick(50.0), "UPDATE")
    assert update.uri == "sip:echo@192.0.2.10:5064"  # the re-INVITE's Contact is the target


def test_peer_update_with_too_small_interval_gets_422_and_glare_gets_491() -> None:
    call, invite = _answered("90;refresher=uac", allow="INVITE, ACK, BYE")
    small = _peer_request(call, invite, "UPDATE", 2, se="30")
    (resp,) = _responses(call.receive(small, PEER_CONTACT, 5.0))
    assert resp.status == 422 and resp.headers.get("Min-SE") == "90"
    _requests(call.tick(46.0), "INVITE")  # our refresh re-INVITE is pending
    theirs = _peer_request(call, invite, "INVITE", 3, body=_sdp())
    (resp,) = [r for r in _responses(call.receive(theirs, PEER_CONTACT, 46.1)) if r.status > 100]
    assert resp.status == 491

"""RFC 3261 section 17 transactions, driven by a fake clock: every timer path, no sockets."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sip_bridge.sip.message import (
    SipRequest,
    SipResponse,
    make_response,
    parse_message,
)
from sip_bridge.sip.timers import TimerConfig, TimerQueue, is_reliable
from sip_bridge.sip.transaction import (
    AckReceived,
    AckTimeout,
    Event,
    RequestReceived,
    ResponseReceived,
    SendMessage,
    StrayResponse,
    TransactionError,
    TransactionLayer,
    TransactionTimeout,
    TxState,
)

CALLER = ("192.0.2.10", 5062)
BRIDGE = ("192.0.2.1", 5060)


def request(
    method: str = "INVITE",
    branch: str = "z9hG4bKaaa",
    cseq: int = 1,
    call_id: str = "call-1",
    from_tag: str = "ft1",
    to_tag: str | None = None,
    sent_by: str = "192.0.2.10:5062",
    transport: str = "UDP",
    cseq_method: str | None = None,
) -> SipRequest:
    to = "<sip:bot@192.0.2.1>" + (f";tag={to_tag}" if to_tag else "")
    body = b"v=0\r\n" if method == "INVITE" else b""
    raw = (
        f"{method} sip:bot@192.0.2.1 SIP/2.0\r\n"
        f"Via: SIP/2.0/{transport} {sent_by};branch={branch};rport\r\n"
        f"Via: SIP/2.0/UDP 198.51.100.7;branch=z9hG4bKproxy\r\n"
        "Max-Forwards: 70\r\n"
        "Route: <sip:proxy.example;lr>\r\n"
        f'From: "Caller" <sip:alice@example.com>;tag={from_tag}\r\n'
        f"To: {to}\r\n"
        f"Call-ID: {call_id}\r\n"
        f"CSeq: {cseq} {cseq_method or method}\r\n"
        "Contact: <sip:alice@192.0.2.10:5062>\r\n"
        + ("Content-Type: application/sdp\r\n" if body else "")
        + f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    msg = parse_message(raw)
    assert isinstance(msg, SipRequest)
    return msg


def sends(events: list[Event]) -> list[SendMessage]:
    return [e for e in events if isinstance(e, SendMessage)]


def one_send(events: list[Event], index: int = 0) -> SendMessage:
    e = events[index]
    assert isinstance(e, SendMessage)
    return e


def status_of(data: bytes) -> int:
    msg = parse_message(data)
    assert isinstance(msg, SipResponse)
    return msg.status


def run(layer: TransactionLayer, until: float) -> list[tuple[float, Event]]:
    """Call tick exactly at each deadline up to ``until``; events with their times."""
    out: list[tuple[float, Event]] = []
    while (due := layer.next_deadline()) is not None and due <= until:
        out += [(due, e) for e in layer.tick(due)]
    return out


def times_sent(timed: list[tuple[float, Event]]) -> list[float]:
    return [round(t, 6) for t, e in timed if isinstance(e, SendMessage)]


def new_invite_tx(layer: TransactionLayer, transport: str = "UDP") -> str:
    events = layer.receive(request(transport=transport), CALLER, transport, 0.0)
    (received,) = [e for e in events if isinstance(e, RequestReceived)]
    return received.tx_id


# ---------------------------------------------------------------------------- timers


def test_timer_config_derives_rfc_defaults() -> None:
    t = TimerConfig()
    assert (t.a, t.e, t.g) == (0.5, 0.5, 0.5)
    assert t.timer_b == t.timer_f == t.timer_h == t.timer_l == t.timer_m == 32.0
    assert (t.timer_d(False), t.timer_d(True)) == (32.0, 0.0)
    assert (t.timer_i(False), t.timer_i(True)) == (5.0, 0.0)
    assert (t.timer_j(False), t.timer_j(True)) == (32.0, 0.0)
    assert (t.timer_k(False), t.timer_k(True)) == (5.0, 0.0)
    assert [t.backoff(x) for x in (0.5, 1.0, 2.0, 4.0)] == [1.0, 2.0, 4.0, 4.0]
    custom = TimerConfig(t1=0.1, t2=1.0, h=3.0)
    assert custom.timer_b == pytest.approx(6.4) and custom.timer_h == 3.0
    with pytest.raises(ValueError):
        TimerConfig(t1=5.0, t2=4.0)
    assert is_reliable("tcp") and is_reliable("TLS") and not is_reliable("UDP")


def test_timer_queue_rearm_cancel_and_drain() -> None:
    q = TimerQueue()
    q.arm("x", "A", 1.0)
    q.arm("x", "A", 2.0)  # moved: the 1.0 entry is stale
    q.arm("y", "B", 1.5)
    q.cancel("y", "B")
    assert q.next_deadline() == 2.0
    assert q.pop_due(1.9) is None
    assert q.pop_due(2.0) == ("x", "A", 2.0)
    assert q.next_deadline() is None and len(q) == 0 and q.heap_size == 0


# ---------------------------------------------------------------------------- INVITE server


def test_invite_server_sends_100_and_absorbs_retransmissions() -> None:
    layer = TransactionLayer()
    events = layer.receive(request(), CALLER, "UDP", 0.0)
    trying = one_send(events)
    assert status_of(trying.data) == 100
    assert trying.destination == CALLER and trying.transport == "UDP"
    assert isinstance(events[1], RequestReceived) and events[1].request.method == "INVITE"
    tx_id = events[1].tx_id
    again = layer.receive(request(), CALLER, "UDP", 0.3)
    assert again == [trying]  # the 100 replayed, no TU event
    ringing = make_response(events[1].request, 180, to_tag="tt")
    assert status_of(one_send(layer.send_response(tx_id, ringing, 0.4)).data) == 180
    (replay,) = layer.receive(request(), CALLER, "UDP", 0.6)
    assert isinstance(replay, SendMessage) and status_of(replay.data) == 180  # latest 1xx
    assert layer.state(tx_id) is TxState.PROCEEDING and len(layer) == 1
    assert layer.next_deadline() is None  # Proceeding waits for the TU, no timer


def test_486_retransmitted_with_backoff_until_ack_then_timer_i() -> None:
    layer = TransactionLayer()
    tx_id = new_invite_tx(layer)
    inv = request()
    busy = make_response(inv, 486, to_tag="tt")
    first = one_send(layer.send_response(tx_id, busy, 0.0))
    timed = run(layer, 10.0)
    # Timer G: T1, 2T1, 4T1, then capped at T2 = 4 s
    assert times_sent(timed) == [0.5, 1.5, 3.5, 7.5]
    assert all(isinstance(e, SendMessage) and e.data == first.data for _, e in timed)
    (replay,) = layer.receive(request(), CALLER, "UDP", 10.0)  # INVITE again: 486 again
    assert isinstance(replay, SendMessage) and replay.data == first.data
    ack = request("ACK", to_tag="tt", cseq_method="ACK")
    assert layer.receive(ack, CALLER, "UDP", 10.0) == []  # absorbed, hop-by-hop
    assert layer.state(tx_id) is TxState.CONFIRMED
    assert layer.receive(ack, CALLER, "UDP", 11.0) == []
    assert layer.receive(request(), CALLER, "UDP", 11.0) == []  # Confirmed absorbs all
    assert layer.next_deadline() == pytest.approx(15.0)  # Timer I = T4
    assert run(layer, 100.0) == []
    assert len(layer) == 0 and layer.pending_timers == 0


def test_486_never_acked_is_freed_by_timer_h() -> None:
    layer = TransactionLayer()
    tx_id = new_invite_tx(layer)
    layer.send_response(tx_id, make_response(request(), 486, to_tag="tt"), 0.0)
    timed = run(layer, 100.0)
    assert times_sent(timed) == [0.5, 1.5, 3.5, 7.5, 11.5, 15.5, 19.5, 23.5, 27.5, 31.5]
    t, last = timed[-1]
    assert t == 32.0 and isinstance(last, TransactionTimeout)
    assert last.tx_id == tx_id and last.timer == "H" and "ACK" in last.reason
    assert len(layer) == 0 and layer.next_deadline() is None


def test_refuse_once_sends_one_response_and_keeps_nothing() -> None:
    """RFC 3261 26.3.2.4: a stranger's INVITE is refused without state or retransmissions."""
    layer = TransactionLayer()
    tx_id = new_invite_tx(layer)
    [sent] = layer.refuse_once(tx_id, make_response(request(), 403, to_tag="tt"))
    assert isinstance(sent, SendMessage) and status_of(sent.data) == 403
    assert sent.destination == CALLER
    assert len(layer) == 0 and layer.next_deadline() is None and run(layer, 100.0) == []
    # its ACK matches nothing (the UA drops it); a retransmission is judged again
    ack = layer.receive(request("ACK", cseq_method="ACK"), CALLER, "UDP", 0.6)
    assert [type(e) for e in ack] == [AckReceived] and len(layer) == 0
    again = layer.receive(request(), CALLER, "UDP", 0.7)
    assert [type(e) for e in again] == [SendMessage, RequestReceived]
    with pytest.raises(TransactionError):
        layer.refuse_once(tx_id, make_response(request(), 403))  # already forgotten
    tx2 = next(e for e in again if isinstance(e, RequestReceived)).tx_id
    with pytest.raises(TransactionError):
        layer.refuse_once(tx2, make_response(request(), 200, to_tag="tt"))


def test_2xx_retransmitted_until_ack_in_accepted_state() -> None:
    layer = TransactionLayer()
    tx_id = new_invite_tx(layer)
    ok = make_response(request(), 200, to_tag="tt")
    first = one_send(layer.send_response(tx_id, ok, 0.0))
    assert layer.state(tx_id) is TxState.ACCEPTED
    assert times_sent(run(layer, 2.0)) == [0.5, 1.5]
    assert layer.receive(request(), CALLER, "UDP", 2.0) == []  # RFC 6026: INVITE absorbed
    ack = request("ACK", branch="z9hG4bKnewack", to_tag="tt", cseq_method="ACK")
    (got,) = layer.receive(ack, CALLER, "UDP", 2.2)
    assert got == AckReceived(tx_id, ack, CALLER)
    assert layer.receive(ack, CALLER, "UDP", 2.3) == []  # duplicate ACK absorbed
    rest = run(layer, 100.0)
    assert rest == []  # no more 2xx, no AckTimeout; freed by Timer L
    assert len(layer) == 0 and layer.pending_timers == 0
    (late,) = layer.receive(ack, CALLER, "UDP", 40.0)
    assert late == AckReceived(None, ack, CALLER)  # the dialog layer decides
    assert first.data.startswith(b"SIP/2.0 200")


def test_2xx_without_ack_gives_ack_timeout_after_64_t1() -> None:
    layer = TransactionLayer()
    tx_id = new_invite_tx(layer)
    ok = make_response(request(), 200, to_tag="tt")
    layer.send_response(tx_id, ok, 0.0)
    timed = run(layer, 100.0)
    assert times_sent(timed) == [0.5, 1.5, 3.5, 7.5, 11.5, 15.5, 19.5, 23.5, 27.5, 31.5]
    assert timed[-1] == (32.0, AckTimeout(tx_id, ok))
    assert len(layer) == 0
    # an ACK with the wrong To tag does not stop a live 2xx
    tx2 = layer.receive(request(branch="z9hG4bKbbb", call_id="c2"), CALLER, "UDP", 50.0)[1]
    assert isinstance(tx2, RequestReceived)
    layer.send_response(tx2.tx_id, make_response(tx2.request, 200, to_tag="right"), 50.0)
    bad = request("ACK", "z9hG4bKx", call_id="c2", to_tag="wrong", cseq_method="ACK")
    assert layer.receive(bad, CALLER, "UDP", 50.1) == [AckReceived(None, bad, CALLER)]
    assert times_sent(run(layer, 50.5)) == [50.5]


def test_send_response_rejects_bad_tu_calls() -> None:
    layer = TransactionLayer()
    with pytest.raises(TransactionError):
        layer.send_response("s999", make_response(request(), 200), 0.0)
    tx_id = new_invite_tx(layer)
    layer.send_response(tx_id, make_response(request(), 486, to_tag="t"), 0.0)
    with pytest.raises(TransactionError):
        layer.send_response(tx_id, make_response(request(), 200, to_tag="t"), 0.1)


# ---------------------------------------------------------------------------- non-INVITE server


def test_non_invite_server_replays_and_timer_j() -> None:
    layer = TransactionLayer()
    bye = request("BYE", branch="z9hG4bKbye", cseq=2, to_tag="tt")
    (got,) = layer.receive(bye, CALLER, "UDP", 0.0)
    assert isinstance(got, RequestReceived)
    assert layer.receive(bye, CALLER, "UDP", 0.2) == []  # Trying: nothing to replay yet
    (prov,) = layer.send_response(got.tx_id, make_response(bye, 100), 0.3)
    assert layer.receive(bye, CALLER, "UDP", 0.4) == [prov]  # Proceeding: latest 1xx
    (final,) = layer.send_response(got.tx_id, make_response(bye, 200), 0.5)
    assert layer.state(got.tx_id) is TxState.COMPLETED
    assert layer.receive(bye, CALLER, "UDP", 1.0) == [final]  # Completed: final again
    assert run(layer, 32.4) == [] and len(layer) == 1
    assert run(layer, 32.5) == [] and len(layer) == 0  # Timer J = 64*T1 after the final
    (fresh,) = layer.receive(bye, CALLER, "UDP", 40.0)
    assert isinstance(fresh, RequestReceived)  # after J a copy is a new request


def test_branch_and_sent_by_and_method_separate_transactions() -> None:
    layer = TransactionLayer()
    a = layer.receive(request(), CALLER, "UDP", 0.0)
    b = layer.receive(request(sent_by="192.0.2.99:5062"), ("192.0.2.99", 5062), "UDP", 0.0)
    c = layer.receive(request(branch="z9hG4bKother"), CALLER, "UDP", 0.0)
    ids = {e.tx_id for e in a + b + c if isinstance(e, RequestReceived)}
    assert len(ids) == 3 and len(layer) == 3


def test_rfc2543_peer_without_magic_cookie_is_matched() -> None:
    layer = TransactionLayer()
    old = request(branch="1234")
    events = layer.receive(old, CALLER, "UDP", 0.0)
    tx_id = next(e.tx_id for e in events if isinstance(e, RequestReceived))
    (replay,) = layer.receive(request(branch="1234"), CALLER, "UDP", 0.5)
    assert isinstance(replay, SendMessage) and status_of(replay.data) == 100
    layer.send_response(tx_id, make_response(old, 603, to_tag="tt"), 1.0)
    ack = request("ACK", branch="1234", to_tag="tt", cseq_method="ACK")
    assert layer.receive(ack, CALLER, "UDP", 1.1) == []
    assert layer.state(tx_id) is TxState.CONFIRMED


def test_malformed_messages_are_dropped() -> None:
    layer = TransactionLayer()
    no_cseq = request()
    no_cseq.headers.remove("CSeq")
    assert layer.receive(no_cseq, CALLER, "UDP", 0.0) == []
    resp = make_response(request(), 200)
    resp.headers.remove("Via")
    assert layer.receive(resp, CALLER, "UDP", 0.0) == []
    assert len(layer) == 0


# ---------------------------------------------------------------------------- INVITE client


def outgoing(
    method: str = "INVITE", branch: str = "z9hG4bKout", transport: str = "UDP"
) -> SipRequest:
    return request(method, branch=branch, sent_by="192.0.2.1:5060", transport=transport)


def response_to(req: SipRequest, status: int, to_tag: str | None = "uas") -> SipResponse:
    """What the far end sends back (through the parser, like the wire)."""
    msg = parse_message(make_response(req, status, to_tag=to_tag).to_bytes())
    assert isinstance(msg, SipResponse)
    return msg


def test_invite_client_retransmits_on_timer_a_and_times_out_on_b() -> None:
    layer = TransactionLayer()
    inv = outgoing()
    tx_id, events = layer.send_request(inv, CALLER, "UDP", 0.0)
    first = one_send(events)
    assert first == SendMessage(inv.to_bytes(), CALLER, "UDP")
    timed = run(layer, 100.0)
    # Timer A doubles without a cap: T1, 2T1, 4T1, 8T1, 16T1, 32T1
    assert times_sent(timed) == [0.5, 1.5, 3.5, 7.5, 15.5, 31.5]
    assert all(e.data == first.data for _, e in timed if isinstance(e, SendMessage))
    t, last = timed[-1]
    assert t == 32.0 and isinstance(last, TransactionTimeout)
    assert last.timer == "B" and last.tx_id == tx_id and "INVITE" in last.reason
    assert len(layer) == 0 and layer.pending_timers == 0


def test_invite_client_non_2xx_is_acked_by_the_transaction() -> None:
    layer = TransactionLayer()
    inv = outgoing()
    tx_id, _ = layer.send_request(inv, CALLER, "UDP", 0.0)
    ringing = response_to(inv, 180)
    assert layer.receive(ringing, CALLER, "UDP", 0.2) == [ResponseReceived(tx_id, ringing)]
    assert layer.next_deadline() == pytest.approx(180.2)  # A and B stopped, C started
    busy = response_to(inv, 486)
    events = layer.receive(busy, CALLER, "UDP", 1.0)
    assert events[1] == ResponseReceived(tx_id, busy)
    ack_send = events[0]
    assert isinstance(ack_send, SendMessage) and ack_send.destination == CALLER
    ack = parse_message(ack_send.data)
    assert isinstance(ack, SipRequest) and ack.method == "ACK" and ack.uri == inv.uri
    assert ack.headers.get_all("Via") == inv.headers.get_all("Via")[:1]  # top Via only
    assert ack.top_via.branch == inv.top_via.branch
    assert ack.cseq == (1, "ACK") and ack.call_id == inv.call_id
    assert ack.headers.get("To") == busy.headers.get("To")  # with the UAS tag
    assert ack.headers.get("From") == inv.headers.get("From")
    assert ack.headers.get_all("Route") == inv.headers.get_all("Route")
    assert ack.headers.get("Contact") is None and ack.body == b""
    # the 486 again (our ACK was lost): ACK again, the TU hears nothing
    assert layer.receive(busy, CALLER, "UDP", 2.0) == [ack_send]
    assert layer.state(tx_id) is TxState.COMPLETED
    assert run(layer, 32.9) == [] and len(layer) == 1
    assert run(layer, 33.0) == [] and len(layer) == 0  # Timer D = 32 s


def test_invite_client_2xx_retransmissions_reach_the_ua_until_timer_m() -> None:
    layer = TransactionLayer()
    inv = outgoing()
    tx_id, _ = layer.send_request(inv, CALLER, "UDP", 0.0)
    ok = response_to(inv, 200)
    assert layer.receive(ok, CALLER, "UDP", 0.1) == [ResponseReceived(tx_id, ok)]
    assert layer.state(tx_id) is TxState.ACCEPTED
    assert layer.receive(ok, CALLER, "UDP", 0.6) == [ResponseReceived(tx_id, ok)]  # re-ACK
    assert layer.receive(response_to(inv, 180), CALLER, "UDP", 0.7) == []
    assert run(layer, 100.0) == [] and len(layer) == 0  # Timer M
    assert layer.receive(ok, CALLER, "UDP", 40.0) == [StrayResponse(ok, CALLER)]
    ack = outgoing("ACK", branch="z9hG4bKack2xx")
    assert layer.send_stateless(ack, CALLER, "UDP") == [SendMessage(ack.to_bytes(), CALLER, "UDP")]
    with pytest.raises(TransactionError):
        layer.send_request(ack, CALLER, "UDP", 41.0)


def test_invite_stuck_after_provisional_is_cancelled_by_timer_c() -> None:
    """RFC 3261 leaves Proceeding without a timer; Timer C keeps state bounded."""
    layer = TransactionLayer(TimerConfig(c=60.0))
    inv = outgoing()
    tx_id, _ = layer.send_request(inv, CALLER, "UDP", 0.0)
    layer.receive(response_to(inv, 100), CALLER, "UDP", 0.1)
    layer.receive(response_to(inv, 180), CALLER, "UDP", 10.0)  # a non-100 1xx restarts C
    assert layer.next_deadline() == pytest.approx(70.0)
    timed = run(layer, 70.0)
    cancel = parse_message(one_send([e for _, e in timed]).data)
    assert isinstance(cancel, SipRequest) and cancel.method == "CANCEL"
    assert layer.cancel(tx_id, 71.0)[1] == []  # already cancelled: nothing sent twice
    # neither the 487 nor the CANCEL's 200 ever comes: both end 64*T1 later
    ends = [(t, e) for t, e in run(layer, 200.0) if isinstance(e, TransactionTimeout)]
    assert [(t, e.tx_id, e.timer) for t, e in ends if e.tx_id == tx_id] == [(102.0, tx_id, "C")]
    assert len(ends) == 2 and len(layer) == 0


def test_send_request_needs_an_rfc3261_branch_and_unique_key() -> None:
    layer = TransactionLayer()
    with pytest.raises(TransactionError):
        layer.send_request(outgoing(branch="nocookie"), CALLER, "UDP", 0.0)
    layer.send_request(outgoing(), CALLER, "UDP", 0.0)
    with pytest.raises(TransactionError):
        layer.send_request(outgoing(), CALLER, "UDP", 0.0)


# ---------------------------------------------------------------------------- non-INVITE client


def test_non_invite_client_timer_e_capped_at_t2_and_f_timeout() -> None:
    layer = TransactionLayer()
    tx_id, _ = layer.send_request(outgoing("OPTIONS"), CALLER, "UDP", 0.0)
    timed = run(layer, 100.0)
    assert times_sent(timed) == [0.5, 1.5, 3.5, 7.5, 11.5, 15.5, 19.5, 23.5, 27.5, 31.5]
    assert timed[-1][0] == 32.0
    assert timed[-1][1] == TransactionTimeout(tx_id, "F", timed[-1][1].reason)  # type: ignore[union-attr]
    assert len(layer) == 0


def test_non_invite_client_proceeding_final_and_timer_k() -> None:
    layer = TransactionLayer()
    bye = outgoing("BYE")
    tx_id, _ = layer.send_request(bye, CALLER, "UDP", 0.0)
    assert times_sent(run(layer, 0.5)) == [0.5]  # Trying: E armed again for 2*T1
    trying = response_to(bye, 100)
    assert layer.receive(trying, CALLER, "UDP", 0.6) == [ResponseReceived(tx_id, trying)]
    # E fires at 1.5 in Proceeding and from then on every T2
    assert times_sent(run(layer, 10.0)) == [1.5, 5.5, 9.5]
    ok = response_to(bye, 200)
    assert layer.receive(ok, CALLER, "UDP", 10.0) == [ResponseReceived(tx_id, ok)]
    assert layer.receive(ok, CALLER, "UDP", 10.5) == []  # retransmitted final absorbed
    assert run(layer, 14.9) == [] and len(layer) == 1
    assert run(layer, 15.0) == [] and len(layer) == 0  # Timer K = T4


def test_stray_response() -> None:
    layer = TransactionLayer()
    resp = response_to(outgoing("OPTIONS", branch="z9hG4bKnobody"), 200)
    assert layer.receive(resp, CALLER, "UDP", 0.0) == [StrayResponse(resp, CALLER)]
    # same branch, other CSeq method: also no match (17.1.3)
    layer.send_request(outgoing("OPTIONS"), CALLER, "UDP", 0.0)
    bye_resp = response_to(outgoing("BYE"), 200)
    assert layer.receive(bye_resp, CALLER, "UDP", 0.1) == [StrayResponse(bye_resp, CALLER)]


# ---------------------------------------------------------------------------- CANCEL


def deliver(
    events: list[Event], to: TransactionLayer, source: tuple[str, int], now: float
) -> list[Event]:
    """Carry every SendMessage over a perfect 'wire' (bytes through the parser)."""
    out: list[Event] = []
    for e in sends(events):
        out += to.receive(parse_message(e.data), source, e.transport, now)
    return out


def test_cancel_flow_between_two_layers() -> None:
    uac, uas = TransactionLayer(), TransactionLayer()
    inv = outgoing()
    inv_tx, ev = uac.send_request(inv, CALLER, "UDP", 0.0)
    at_uas = deliver(ev, uas, BRIDGE, 0.0)
    server_inv = next(e for e in at_uas if isinstance(e, RequestReceived))
    at_uac = deliver(at_uas, uac, CALLER, 0.0)  # the automatic 100 Trying
    assert [type(e) for e in at_uac] == [ResponseReceived]
    assert uac.state(inv_tx) is TxState.PROCEEDING
    cancel_tx, ev = uac.cancel(inv_tx, 1.0)
    assert cancel_tx is not None and cancel_tx != inv_tx
    cancel = parse_message(one_send(ev).data)
    assert isinstance(cancel, SipRequest) and cancel.method == "CANCEL"
    assert cancel.top_via.branch == inv.top_via.branch and cancel.cseq == (1, "CANCEL")
    assert cancel.uri == inv.uri and cancel.headers.get("To") == inv.headers.get("To")
    (got_cancel,) = deliver(ev, uas, BRIDGE, 1.0)
    assert isinstance(got_cancel, RequestReceived) and got_cancel.request.method == "CANCEL"
    assert got_cancel.invite_tx_id == server_inv.tx_id  # own transaction, same branch
    assert got_cancel.tx_id != server_inv.tx_id and len(uas) == 2
    # the UAS core: 200 to the CANCEL, 487 to the INVITE
    ev = uas.send_response(got_cancel.tx_id, make_response(got_cancel.request, 200), 1.0)
    ev += uas.send_response(
        server_inv.tx_id, make_response(server_inv.request, 487, to_tag="uas"), 1.0
    )
    at_uac = deliver(ev, uac, CALLER, 1.0)
    responses = [e for e in at_uac if isinstance(e, ResponseReceived)]
    assert [(r.tx_id, r.response.status) for r in responses] == [(cancel_tx, 200), (inv_tx, 487)]
    # the INVITE client transaction ACKed the 487 itself; the UAS absorbs it
    assert deliver(at_uac, uas, BRIDGE, 1.0) == []
    assert uas.state(server_inv.tx_id) is TxState.CONFIRMED
    for layer in (uac, uas):
        run(layer, 100.0)
        assert len(layer) == 0 and layer.pending_timers == 0


def test_cancel_is_queued_until_a_provisional_and_dropped_after_a_final() -> None:
    layer = TransactionLayer()
    inv = outgoing()
    inv_tx, _ = layer.send_request(inv, CALLER, "UDP", 0.0)
    cancel_tx, ev = layer.cancel(inv_tx, 0.1)
    assert cancel_tx is not None and ev == [] and cancel_tx not in layer
    assert layer.cancel(inv_tx, 0.2) == (cancel_tx, [])  # idempotent
    ringing = response_to(inv, 180)
    ev = layer.receive(ringing, CALLER, "UDP", 0.3)
    assert ev[0] == ResponseReceived(inv_tx, ringing)
    sent = parse_message(one_send(ev, 1).data)
    assert isinstance(sent, SipRequest) and sent.method == "CANCEL"
    assert layer.state(cancel_tx) is TxState.TRYING
    # a second INVITE whose final arrives before any 1xx: the queued CANCEL is dropped
    inv2 = outgoing(branch="z9hG4bKout2")
    inv2_tx, _ = layer.send_request(inv2, CALLER, "UDP", 1.0)
    queued, _ = layer.cancel(inv2_tx, 1.1)
    ev = layer.receive(response_to(inv2, 486), CALLER, "UDP", 1.2)
    assert [type(e) for e in ev] == [SendMessage, ResponseReceived]  # the ACK, no CANCEL
    assert queued not in layer
    assert layer.cancel(inv2_tx, 1.3) == (None, [])  # nothing left to cancel
    assert layer.cancel("nope", 1.3) == (None, [])


# ---------------------------------------------------------------------------- reliable transports


def test_tcp_disables_retransmissions_but_keeps_timeouts() -> None:
    layer = TransactionLayer()
    # server INVITE rejected: no Timer G, Timer H still guards the ACK; ACK frees at once
    tx_id = new_invite_tx(layer, "TCP")
    layer.send_response(tx_id, make_response(request(transport="TCP"), 486, to_tag="t"), 0.0)
    assert layer.next_deadline() == 32.0
    ack = request("ACK", to_tag="t", transport="TCP", cseq_method="ACK")
    assert layer.receive(ack, CALLER, "TCP", 1.0) == [] and len(layer) == 0  # Timer I = 0
    # server INVITE accepted: no 2xx retransmission, AckTimeout still reported
    tx_id = new_invite_tx(layer, "TCP")
    ok = make_response(request(transport="TCP"), 200, to_tag="t2")
    layer.send_response(tx_id, ok, 0.0)
    assert run(layer, 100.0) == [(32.0, AckTimeout(tx_id, ok))]
    # server non-INVITE: Timer J = 0
    (got,) = layer.receive(request("OPTIONS", transport="TCP"), CALLER, "TCP", 0.0)
    assert isinstance(got, RequestReceived)
    layer.send_response(got.tx_id, make_response(got.request, 200), 0.0)
    assert len(layer) == 0
    # client INVITE: no Timer A, Timer B; client non-INVITE: no E, F; final frees (K = 0)
    inv_tx, _ = layer.send_request(outgoing(transport="TCP"), CALLER, "TCP", 0.0)
    opt = outgoing("OPTIONS", branch="z9hG4bKopt", transport="TCP")
    opt_tx, _ = layer.send_request(opt, CALLER, "TCP", 0.0)
    timed = run(layer, 100.0)
    assert [t for t, _ in timed] == [32.0, 32.0]
    assert {(e.tx_id, e.timer) for _, e in timed if isinstance(e, TransactionTimeout)} == {
        (inv_tx, "B"),
        (opt_tx, "F"),
    }
    layer.send_request(opt, CALLER, "TCP", 200.0)
    layer.receive(response_to(opt, 200), CALLER, "TCP", 200.1)
    # client INVITE non-2xx over TCP: ACK sent, Timer D = 0
    inv = outgoing(branch="z9hG4bKtcp2", transport="TCP")
    layer.send_request(inv, CALLER, "TCP", 200.0)
    ev = layer.receive(response_to(inv, 603), CALLER, "TCP", 200.2)
    assert [type(e) for e in ev] == [SendMessage, ResponseReceived]
    assert len(layer) == 0 and layer.next_deadline() is None


# ---------------------------------------------------------------------------- bounded state


def test_thousand_never_acked_rejections_leave_nothing_after_timer_h() -> None:
    layer = TransactionLayer()
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(1000):  # a scanner: INVITE, never ACKs our 486
            inv = request(branch=f"z9hG4bKscan{i}", call_id=f"scan-{i}", from_tag=f"f{i}")
            events = layer.receive(inv, ("203.0.113.5", 5060 + i % 7), "UDP", i * 0.001)
            tx_id = next(e.tx_id for e in events if isinstance(e, RequestReceived))
            layer.send_response(tx_id, make_response(inv, 486, to_tag=f"t{i}"), i * 0.001)
            del inv, events
        assert len(layer) == 1000
        peak = tracemalloc.get_traced_memory()[0] - base
        timeouts = [e for _, e in run(layer, 1.0 + 32.0) if isinstance(e, TransactionTimeout)]
        assert len(timeouts) == 1000 and {e.timer for e in timeouts} == {"H"}
        del timeouts
        gc.collect()
        left = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(layer) == 0 and layer.pending_timers == 0 and layer.next_deadline() is None
    assert peak > 1_000_000  # 1,000 live transactions hold real memory...
    assert left < min(peak / 50, 64 * 1024)  # ...and it is all given back


# ---------------------------------------------------------------------------- interleavings

_STEP = st.tuples(
    st.sampled_from(["invite", "ack", "tick", "answer"]), st.floats(0.0, 3.0, allow_nan=False)
)


@settings(max_examples=150, deadline=None)
@given(final=st.sampled_from([486, 200]), steps=st.lists(_STEP, max_size=25), tcp=st.booleans())
def test_server_invite_survives_any_interleaving(
    final: int, steps: list[tuple[str, float]], tcp: bool
) -> None:
    """Retransmissions, ACKs and timer ticks in any order: one request for the TU, only
    the final after it is sent, exactly one ending, and nothing left afterwards."""
    transport = "TCP" if tcp else "UDP"
    layer = TransactionLayer()
    inv = request(transport=transport)
    events = layer.receive(inv, CALLER, transport, 0.0)
    tx_id = next(e.tx_id for e in events if isinstance(e, RequestReceived))
    ack_branch = "z9hG4bKaaa" if final >= 300 else "z9hG4bK2xxack"
    ack = request("ACK", branch=ack_branch, to_tag="tt", transport=transport, cseq_method="ACK")
    resp = make_response(inv, final, to_tag="tt")
    now, answered, acked = 0.0, False, False
    for action, dt in steps:
        now += dt
        if action == "invite" and not tcp and layer.state(tx_id) is not None:
            # (a reliable transport never retransmits; after the end a copy is new)
            events += layer.receive(request(transport=transport), CALLER, transport, now)
        elif action == "ack" and answered:
            acked = acked or layer.state(tx_id) is not None
            events += layer.receive(ack, CALLER, transport, now)
        elif action == "tick":
            events += layer.tick(now)
        elif action == "answer" and not answered:
            answered = True
            events += layer.send_response(tx_id, resp, now)
            final_at = len(events)
    if not answered:
        events += layer.send_response(tx_id, resp, now)
        final_at = len(events)
    events += [e for _, e in run(layer, now + 100.0)]
    assert sum(isinstance(e, RequestReceived) for e in events) == 1
    after = sends(events[final_at - 1 :])
    assert all(status_of(e.data) == final for e in after)  # never a 1xx after the final
    if tcp:
        assert len(after) == 1  # no retransmission on a reliable transport
    endings = [e for e in events if isinstance(e, TransactionTimeout | AckTimeout)]
    acks = [e for e in events if isinstance(e, AckReceived) and e.tx_id == tx_id]
    assert len(endings) == (0 if acked else 1)
    assert len(acks) == (1 if acked and final < 300 else 0)
    assert len(layer) == 0 and layer.pending_timers == 0


@settings(max_examples=150, deadline=None)
@given(arrivals=st.lists(st.sampled_from([100, 180, 486]), min_size=1, max_size=12))
def test_client_invite_absorbs_duplicate_responses(arrivals: list[int]) -> None:
    """Provisionals and a possibly repeated 486 in any order: the TU sees the final once,
    every copy of it is ACKed, and nothing after the final reaches the TU."""
    layer = TransactionLayer()
    inv = outgoing()
    layer.send_request(inv, CALLER, "UDP", 0.0)
    seen: list[int] = []
    acks = 0
    for i, status in enumerate(arrivals):
        for e in layer.receive(response_to(inv, status), CALLER, "UDP", 0.01 * i):
            if isinstance(e, ResponseReceived):
                seen.append(e.response.status)
            elif isinstance(e, SendMessage):
                acks += 1
                assert parse_message(e.data).method == "ACK"  # type: ignore[union-attr]
    finals = arrivals.count(486)
    expected = arrivals[: arrivals.index(486) + 1] if finals else arrivals
    assert seen == expected
    assert acks == finals
    run(layer, 1000.0)
    assert len(layer) == 0


def test_late_tick_sends_one_copy_not_a_burst() -> None:
    """An event loop that wakes late must not flood the peer with catch-up copies."""
    layer = TransactionLayer()
    layer.send_request(outgoing(), CALLER, "UDP", 0.0)
    assert layer.next_deadline() == 0.5
    assert len(sends(layer.tick(9.0))) == 1  # A was due at 0.5, 1.5, 3.5 and 7.5
    assert layer.next_deadline() == pytest.approx(10.0)  # next interval counted from now
    assert layer.tick(9.5) == []

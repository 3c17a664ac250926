"""The bridge UA driven like real phones drive it: hand-written INVITEs, a fake clock, no
sockets.  Every test checks the bytes the UA sends back, not only its events."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import TypeVar

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sip_bridge.config.loader import SipConfig, TimersConfig
from sip_bridge.sip.message import NameAddr, SipRequest, SipResponse, new_branch, parse_message
from sip_bridge.sip.sdp import parse_sdp
from sip_bridge.sip.ua import (
    BridgeUA,
    CallEnded,
    CallEstablished,
    CallOffered,
    DtmfInfo,
    MediaUpdated,
    Send,
    UaEvent,
)

BRIDGE_IP = "203.0.113.5"
T = TypeVar("T")
CALLER = ("192.0.2.10", 5062)  # public address the caller's packets come from (NAT)
T1 = 0.01
CONFIG = SipConfig(
    listen="0.0.0.0:5060",
    external_address=BRIDGE_IP,
    max_calls=10,
    retry_after_s=7,
    user_agent="sip-bridge-test",
    timers=TimersConfig(t1=T1, t2=0.04, t4=0.05),
)

BARESIP_SDP = (
    "v=0\r\n"
    "o=- 1694 2048 IN IP4 192.168.1.20\r\n"
    "s=-\r\n"
    "c=IN IP4 192.168.1.20\r\n"
    "t=0 0\r\n"
    "m=audio 40000 RTP/AVP 0 8 96\r\n"
    "a=rtpmap:0 PCMU/8000\r\n"
    "a=rtpmap:8 PCMA/8000\r\n"
    "a=rtpmap:96 telephone-event/8000\r\n"
    "a=fmtp:96 0-15\r\n"
    "a=ptime:20\r\n"
    "a=sendrecv\r\n"
)

LINPHONE_SDP = (
    "v=0\r\n"
    "o=alice 3141 2718 IN IP4 192.0.2.11\r\n"
    "s=Talk\r\n"
    "c=IN IP4 192.0.2.11\r\n"
    "t=0 0\r\n"
    "a=rtcp-xr:rcvr-rtt=all:10000 stat-summary=loss,dup,jitt,TTL voip-metrics\r\n"
    "m=audio 7078 RTP/AVP 96 0 8 101 97\r\n"
    "a=rtpmap:96 opus/48000/2\r\n"
    "a=fmtp:96 useinbandfec=1\r\n"
    "a=rtpmap:101 telephone-event/48000\r\n"
    "a=rtpmap:97 telephone-event/8000\r\n"
    "a=rtcp-fb:* trr-int 5000\r\n"
)


def invite_text(
    call_id: str = "c1@192.168.1.20",
    branch: str = "z9hG4bKbare1",
    sdp: str | None = BARESIP_SDP,
    record_route: str | None = None,
    extra: str = "",
    cseq: int = 1,
    to_tag: str | None = None,
) -> str:
    """An INVITE as baresip writes it (behind NAT: private Via/Contact, rport)."""
    body = sdp or ""
    rr = f"Record-Route: {record_route}\r\n" if record_route else ""
    ctype = "Content-Type: application/sdp\r\n" if sdp else ""
    to = f"<sip:bot@{BRIDGE_IP}>" + (f";tag={to_tag}" if to_tag else "")
    return (
        f"INVITE sip:bot@{BRIDGE_IP} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 192.168.1.20:5062;branch={branch};rport\r\n"
        f"{rr}"
        "Contact: <sip:alice-0x5581@192.168.1.20:5062;transport=udp>\r\n"
        "Max-Forwards: 70\r\n"
        f"To: {to}\r\n"
        'From: "Alice" <sip:alice@example.com>;tag=6c5f2a\r\n'
        f"Call-ID: {call_id}\r\n"
        f"CSeq: {cseq} INVITE\r\n"
        "Allow: INVITE,ACK,BYE,CANCEL,OPTIONS,NOTIFY,SUBSCRIBE,INFO,MESSAGE,UPDATE,REFER\r\n"
        "Supported: replaces,norefersub\r\n"
        "User-Agent: baresip v3.10.1 (x86_64/linux)\r\n"
        f"{extra}{ctype}"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    )


def in_dialog(
    method: str,
    ok: SipResponse,
    cseq: int,
    body: str = "",
    ctype: str = "application/sdp",
    branch: str | None = None,
    contact: str = "<sip:alice-0x5581@192.168.1.20:5062;transport=udp>",
) -> bytes:
    """A request from the caller inside the dialog the bridge's 2xx ``ok`` created."""
    to = ok.headers.get("To")
    head = (
        f"{method} sip:bridge@{BRIDGE_IP}:5060;transport=udp SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 192.168.1.20:5062;branch={branch or new_branch()};rport\r\n"
        "Max-Forwards: 70\r\n"
        f"To: {to}\r\n"
        'From: "Alice" <sip:alice@example.com>;tag=6c5f2a\r\n'
        f"Call-ID: {ok.call_id}\r\n"
        f"CSeq: {cseq} {method}\r\n"
        f"Contact: {contact}\r\n"
    )
    if body:
        head += f"Content-Type: {ctype}\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n{body}".encode()


def sent(events: list[UaEvent]) -> list[SipRequest | SipResponse]:
    return [parse_message(e.data) for e in events if isinstance(e, Send)]


def responses(events: list[UaEvent], status: int | None = None) -> list[SipResponse]:
    out = [m for m in sent(events) if isinstance(m, SipResponse)]
    return [r for r in out if status is None or r.status == status]


def requests(events: list[UaEvent], method: str) -> list[SipRequest]:
    return [m for m in sent(events) if isinstance(m, SipRequest) and m.method == method]


def of_type(events: list[UaEvent], kind: type[T]) -> list[T]:
    return [e for e in events if isinstance(e, kind)]


def make_ua(config: SipConfig = CONFIG, answer_timeout_s: float = 30.0) -> BridgeUA:
    return BridgeUA(config, 5060, BRIDGE_IP, 0.0, answer_timeout_s=answer_timeout_s)


def run_until(ua: BridgeUA, end: float) -> list[UaEvent]:
    """Tick at every deadline up to ``end``, as the asyncio layer would."""
    out: list[UaEvent] = []
    while (d := ua.next_deadline()) is not None and d <= end:
        out += ua.tick(d)
    out += ua.tick(end)
    return out


def offer_call(ua: BridgeUA, text: str, now: float = 0.0) -> tuple[CallOffered, list[UaEvent]]:
    return offer_call_from(ua, text, CALLER, now)


def offer_call_from(
    ua: BridgeUA, text: str, source: tuple[str, int], now: float = 0.0
) -> tuple[CallOffered, list[UaEvent]]:
    events = ua.receive_bytes(text.encode(), source, "udp", now)
    offered = of_type(events, CallOffered)
    assert len(offered) == 1
    return offered[0], events


def established(ua: BridgeUA, text: str | None = None) -> tuple[str, SipResponse]:
    """A call answered and ACKed; returns its Call-ID and the bridge's 200."""
    offered, _ = offer_call(ua, text or invite_text())
    events = ua.answer(offered.call_id, 30000, 0.1)
    [ok] = responses(events, 200)
    assert not ua.receive_bytes(in_dialog("ACK", ok, 1), CALLER, "udp", 0.12)
    return offered.call_id, ok


def assert_clean(ua: BridgeUA) -> None:
    run_until(ua, 1000.0)
    assert ua.active_calls == 0
    assert ua.ending_calls == 0
    assert ua.transactions == 0
    assert ua.next_deadline() is None


# ---------------------------------------------------------------------------- basic calls


def test_basic_call_answered_then_caller_hangs_up() -> None:
    ua = make_ua()
    text = invite_text(record_route="<sip:198.51.100.1;lr;ftag=6c5f2a>")
    offered, events = offer_call(ua, text)
    [trying] = responses(events, 100)
    via = trying.top_via
    assert via.params["received"] == "192.0.2.10" and via.params["rport"] == "5062"
    assert offered.from_uri == "sip:alice@example.com"
    assert offered.to_uri == f"sip:bot@{BRIDGE_IP}"
    assert offered.request_uri == f"sip:bot@{BRIDGE_IP}"
    assert offered.source == CALLER and offered.offer is not None
    assert ua.active_calls == 1

    events = ua.answer(offered.call_id, 30000, 0.2)
    [send] = [e for e in events if isinstance(e, Send)]
    assert send.destination == CALLER and send.transport == "udp"
    [ok] = responses(events, 200)
    to_tag = NameAddr.parse(ok.headers.get("To") or "").tag
    assert to_tag
    assert ok.headers.get("Contact") == f"<sip:bridge@{BRIDGE_IP}:5060;transport=udp>"
    assert ok.headers.get_all("Record-Route") == ["<sip:198.51.100.1;lr;ftag=6c5f2a>"]
    assert "INVITE" in ok.headers.get_all("Allow") and "UPDATE" in ok.headers.get_all("Allow")
    assert "Supported" in ok.headers
    assert ok.headers.get("Server") == "sip-bridge-test"
    assert ok.headers.get("Content-Type") == "application/sdp"
    assert ok.top_via.params["received"] == "192.0.2.10"
    sdp = parse_sdp(ok.body)
    assert sdp.origin.address == BRIDGE_IP and sdp.connection is not None
    assert sdp.connection.address == BRIDGE_IP
    assert "0.0.0.0" not in ok.body.decode()
    m = sdp.media[0]
    assert m.port == 30000 and m.formats == ["0", "96"]  # PCMU + offer's event PT
    assert ("rtpmap", "96 telephone-event/8000") in m.attributes
    [est] = of_type(events, CallEstablished)
    assert est.media.remote_address == "192.168.1.20" and est.media.remote_port == 40000
    assert est.media.codec == "PCMU" and est.media.telephone_event_pt == 96

    assert not ua.receive_bytes(in_dialog("ACK", ok, 1), CALLER, "udp", 0.25)
    assert not run_until(ua, 5.0)  # ACKed: no 2xx retransmissions

    events = ua.receive_bytes(in_dialog("BYE", ok, 2), CALLER, "udp", 6.0)
    [bye_ok] = responses(events, 200)
    assert bye_ok.cseq == (2, "BYE")
    assert of_type(events, CallEnded) == [CallEnded(offered.call_id, "caller hung up", "remote")]
    assert ua.active_calls == 0
    assert_clean(ua)


def test_hangup_from_bridge_sends_bye_through_route_set() -> None:
    ua = make_ua()
    text = invite_text(record_route="<sip:198.51.100.1:5070;lr>")
    call_id, ok = established(ua, text)
    events = ua.hangup(call_id, 1.0, "agent done")
    assert of_type(events, CallEnded) == [CallEnded(call_id, "agent done", "local")]
    assert ua.active_calls == 0 and ua.ending_calls == 1
    [send] = [e for e in events if isinstance(e, Send)]
    assert send.destination == ("198.51.100.1", 5070)  # the loose-routing proxy
    [bye] = requests(events, "BYE")
    assert bye.uri == "sip:alice-0x5581@192.168.1.20:5062;transport=udp"
    assert bye.headers.get_all("Route") == ["<sip:198.51.100.1:5070;lr>"]
    assert (
        NameAddr.parse(bye.headers.get("From") or "").tag
        == NameAddr.parse(ok.headers.get("To") or "").tag
    )
    assert NameAddr.parse(bye.headers.get("To") or "").tag == "6c5f2a"
    assert bye.top_via.host == BRIDGE_IP and bye.top_via.port == 5060
    assert bye.headers.get("User-Agent") == "sip-bridge-test"
    # BYE is retransmitted until answered (Timer E)
    assert requests(run_until(ua, 1.0 + T1), "BYE")
    resp = (
        f"SIP/2.0 200 OK\r\nVia: {bye.headers.get('Via')}\r\nFrom: {bye.headers.get('From')}\r\n"
        f"To: {bye.headers.get('To')}\r\nCall-ID: {call_id}\r\nCSeq: {bye.cseq[0]} BYE\r\n"
        "Content-Length: 0\r\n\r\n"
    )
    assert not ua.receive_bytes(resp.encode(), ("198.51.100.1", 5070), "udp", 1.05)
    assert ua.ending_calls == 0
    assert_clean(ua)


def test_hangup_without_route_set_reaches_natted_caller_at_its_source() -> None:
    ua = make_ua()
    call_id, _ = established(ua)
    events = ua.hangup(call_id, 1.0)
    [send] = [e for e in events if isinstance(e, Send)]
    # the Contact (192.168.1.20) is private and not where packets come from: use the source
    assert send.destination == CALLER
    run_until(ua, 1.0 + 64 * T1 + 1)  # BYE never answered: Timer F frees it
    assert_clean(ua)


def test_hangup_before_ack_waits_for_the_ack() -> None:
    ua = make_ua()
    offered, _ = offer_call(ua, invite_text())
    [ok] = responses(ua.answer(offered.call_id, 30000, 0.1), 200)
    events = ua.hangup(offered.call_id, 0.11)
    assert of_type(events, CallEnded) and not requests(events, "BYE")
    events = ua.receive_bytes(in_dialog("ACK", ok, 1), CALLER, "udp", 0.12)
    assert len(requests(events, "BYE")) == 1
    assert_clean(ua)


# ---------------------------------------------------------------------------- CANCEL


def test_cancel_of_a_pending_invite() -> None:
    ua = make_ua()
    offered, _ = offer_call(ua, invite_text())
    cancel = (
        invite_text(sdp=None)
        .replace("INVITE sip:", "CANCEL sip:")
        .replace("CSeq: 1 INVITE", "CSeq: 1 CANCEL")
    )
    events = ua.receive_bytes(cancel.encode(), CALLER, "udp", 0.5)
    assert [r.cseq for r in responses(events, 200)] == [(1, "CANCEL")]
    [terminated] = responses(events, 487)
    assert terminated.cseq == (1, "INVITE")
    assert NameAddr.parse(terminated.headers.get("To") or "").tag
    assert of_type(events, CallEnded) == [CallEnded(offered.call_id, "cancelled", "remote")]
    assert ua.active_calls == 0
    assert ua.answer(offered.call_id, 30000, 0.6) == []  # too late: a no-op
    # the 487 is retransmitted until the caller ACKs it (the transaction does that)
    assert responses(run_until(ua, 0.5 + T1), 487)
    ack = (
        invite_text(sdp=None)
        .replace("INVITE sip:", "ACK sip:")
        .replace("CSeq: 1 INVITE", "CSeq: 1 ACK")
        .replace(f"<sip:bot@{BRIDGE_IP}>", terminated.headers.get("To") or "")
    )
    assert not ua.receive_bytes(ack.encode(), CALLER, "udp", 0.6)
    assert_clean(ua)


def test_ring_sends_180_with_the_dialog_tag_then_200_keeps_it() -> None:
    ua = make_ua()
    offered, _ = offer_call(ua, invite_text())
    [ringing] = responses(ua.ring(offered.call_id, 0.1), 180)
    tag = NameAddr.parse(ringing.headers.get("To") or "").tag
    assert tag and ringing.headers.get("Contact")
    [ok] = responses(ua.answer(offered.call_id, 30000, 0.2), 200)
    assert NameAddr.parse(ok.headers.get("To") or "").tag == tag
    assert ua.ring(offered.call_id, 0.3) == []  # answered: nothing more to ring


def test_cancel_for_unknown_transaction_is_481() -> None:
    ua = make_ua()
    cancel = (
        invite_text(sdp=None, branch="z9hG4bKnone")
        .replace("INVITE sip:", "CANCEL sip:")
        .replace("CSeq: 1 INVITE", "CSeq: 1 CANCEL")
    )
    events = ua.receive_bytes(cancel.encode(), CALLER, "udp", 0.0)
    assert [r.status for r in responses(events)] == [481]
    assert_clean(ua)


# ---------------------------------------------------------------------------- offers


def test_delayed_offer_answer_in_ack() -> None:
    ua = make_ua()
    offered, _ = offer_call(ua, invite_text(sdp=None))
    assert offered.offer is None
    events = ua.answer(offered.call_id, 30002, 0.1)
    assert not of_type(events, CallEstablished)  # wait for the ACK's answer
    [ok] = responses(events, 200)
    our_offer = parse_sdp(ok.body)
    assert our_offer.origin.address == BRIDGE_IP
    assert our_offer.connection is not None and our_offer.connection.address == BRIDGE_IP
    assert our_offer.media[0].port == 30002
    assert our_offer.media[0].formats == ["0", "8", "101"]
    answer_sdp = (
        "v=0\r\no=- 1 1 IN IP4 192.0.2.10\r\ns=-\r\nc=IN IP4 192.0.2.10\r\nt=0 0\r\n"
        "m=audio 41000 RTP/AVP 8 101\r\na=rtpmap:8 PCMA/8000\r\n"
        "a=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n"
    )
    events = ua.receive_bytes(in_dialog("ACK", ok, 1, answer_sdp), CALLER, "udp", 0.15)
    [est] = of_type(events, CallEstablished)
    assert est.media.codec == "PCMA" and est.media.remote_port == 41000
    assert est.media.telephone_event_pt == 101
    assert ua.active_calls == 1


def test_delayed_offer_without_answer_in_ack_is_hung_up() -> None:
    ua = make_ua()
    offered, _ = offer_call(ua, invite_text(sdp=None))
    [ok] = responses(ua.answer(offered.call_id, 30002, 0.1), 200)
    events = ua.receive_bytes(in_dialog("ACK", ok, 1), CALLER, "udp", 0.15)
    assert len(requests(events, "BYE")) == 1
    [ended] = of_type(events, CallEnded)
    assert ended.by == "local" and "SDP answer" in ended.reason
    assert not of_type(events, CallEstablished)
    assert_clean(ua)


def test_unserviceable_offer_gets_488_with_warning() -> None:
    ua = make_ua()
    sdp = BARESIP_SDP.replace("m=audio 40000 RTP/AVP 0 8 96", "m=audio 40000 RTP/AVP 18 96")
    sdp = sdp.replace("a=rtpmap:0 PCMU/8000\r\na=rtpmap:8 PCMA/8000\r\n", "")
    events = ua.receive_bytes(invite_text(sdp=sdp).encode(), CALLER, "udp", 0.0)
    [rejected] = responses(events, 488)
    assert (rejected.headers.get("Warning") or "").startswith("305 ")
    assert "G729" in (rejected.headers.get("Warning") or "")
    assert not of_type(events, CallOffered) and ua.active_calls == 0
    bad = ua.receive_bytes(
        invite_text(sdp="v=0\r\nbogus\r\n", call_id="c2", branch="z9hG4bK2").encode(),
        CALLER,
        "udp",
        0.0,
    )
    assert [r.status for r in responses(bad) if r.status >= 200] == [400]
    xml = invite_text(call_id="c3", branch="z9hG4bK3").replace(
        "Content-Type: application/sdp", "Content-Type: application/xml"
    )
    refused = responses(ua.receive_bytes(xml.encode(), CALLER, "udp", 0.0), 415)
    assert refused[0].headers.get("Accept") == "application/sdp"
    assert_clean(ua)


def test_linphone_over_tcp_opus_first_and_two_event_rates() -> None:
    ua = make_ua()
    text = (
        f"INVITE sip:bot@{BRIDGE_IP};transport=tcp SIP/2.0\r\n"
        "Via: SIP/2.0/TCP 192.0.2.11:39873;alias;branch=z9hG4bK.lin1;rport\r\n"
        "From: <sip:alice@example.com>;tag=Lq3k\r\n"
        f"To: sip:bot@{BRIDGE_IP}\r\n"
        "CSeq: 20 INVITE\r\n"
        "Call-ID: lin-1\r\n"
        "Max-Forwards: 70\r\n"
        "Supported: replaces, outbound, gruu, path\r\n"
        "Allow: INVITE, ACK, CANCEL, OPTIONS, BYE, REFER, NOTIFY, MESSAGE, SUBSCRIBE, INFO\r\n"
        "Content-Type: application/sdp\r\n"
        f"Content-Length: {len(LINPHONE_SDP)}\r\n"
        'Contact: <sip:alice@192.0.2.11:39873;transport=tcp>;+sip.instance="<urn:uuid:1>"\r\n'
        "User-Agent: Linphone Desktop/5.2.6 (Debian) LinphoneSDK/5.3.72\r\n\r\n"
        f"{LINPHONE_SDP}"
    )
    msg = parse_message(text.encode())
    src = ("192.0.2.11", 39873)
    events = ua.receive_message(msg, src, "tcp", 0.0)
    [offered] = of_type(events, CallOffered)
    events = ua.answer(offered.call_id, 30004, 0.1)
    [ok] = responses(events, 200)
    assert [e.transport for e in events if isinstance(e, Send)] == ["tcp"]
    assert ok.headers.get("Contact") == f"<sip:bridge@{BRIDGE_IP}:5060;transport=tcp>"
    m = parse_sdp(ok.body).media[0]
    assert m.formats == ["0", "97"]  # PCMU, and the 8 kHz telephone-event PT
    assert not run_until(ua, 64 * T1 - 0.01)  # reliable transport: no 2xx retransmission...
    events = ua.tick(64 * T1 + 1)  # ...and no ACK at all ends in BYE
    [bye] = requests(events, "BYE")
    assert bye.top_via.transport == "TCP"
    assert [e.destination for e in events if isinstance(e, Send)] == [src]
    assert of_type(events, CallEnded) == [CallEnded("lin-1", "no ACK", "timeout")]


# ---------------------------------------------------------------------------- limits


def test_503_with_retry_after_at_max_calls() -> None:
    ua = make_ua(replace(CONFIG, max_calls=1))
    offer_call(ua, invite_text())
    events = ua.receive_bytes(
        invite_text(call_id="c2", branch="z9hG4bK2").encode(), CALLER, "udp", 0.0
    )
    [busy] = responses(events, 503)
    assert busy.headers.get("Retry-After") == "7"
    assert not of_type(events, CallOffered) and ua.active_calls == 1

    zero = make_ua(replace(CONFIG, max_calls=0))
    events = zero.receive_bytes(invite_text().encode(), CALLER, "udp", 0.0)
    assert [r.status for r in responses(events)] == [100, 503]
    assert not of_type(events, CallOffered)
    assert_clean(zero)


def test_shedding_refuses_new_calls_and_probes_and_leaves_calls_in_progress() -> None:
    """[load] over budget: a new INVITE and an out-of-dialog OPTIONS (the dispatcher's
    probe) get 503 + Retry-After; the call already up still gets its re-INVITE, in-dialog
    OPTIONS and BYE answered. Back under budget, new calls are offered again."""
    ua = make_ua()
    call_id, ok = established(ua)
    ua.shedding = True
    events = ua.receive_bytes(
        invite_text(call_id="c2", branch="z9hG4bK2").encode(), CALLER, "udp", 1.0
    )
    [busy] = responses(events, 503)
    assert busy.headers.get("Retry-After") == "7"
    assert not of_type(events, CallOffered) and ua.shed_count == 1
    [probe] = responses(ua.receive_bytes(options_text(), CALLER, "udp", 1.1))
    assert probe.status == 503 and probe.headers.get("Retry-After") == "7"
    [alive] = responses(ua.receive_bytes(in_dialog("OPTIONS", ok, 7), CALLER, "udp", 1.2))
    assert alive.status == 200
    assert ua.active_calls == 1
    ua.shedding = False
    probe_2 = options_text().replace(b"z9hG4bKopt1", b"z9hG4bKopt2")  # a new transaction
    [again] = responses(ua.receive_bytes(probe_2, CALLER, "udp", 1.3))
    assert again.status == 200
    offered, _ = offer_call(ua, invite_text(call_id="c3", branch="z9hG4bK3"), now=1.4)
    assert offered.call_id == "c3" and ua.shed_count == 1
    events = ua.receive_bytes(in_dialog("BYE", ok, 8), CALLER, "udp", 1.5)
    assert [r.status for r in responses(events)] == [200]
    assert of_type(events, CallEnded)[0].call_id == call_id


def test_lost_ack_retransmits_200_then_byes_after_64_t1() -> None:
    ua = make_ua()
    offered, _ = offer_call(ua, invite_text())
    ua.answer(offered.call_id, 30000, 0.0)
    events = run_until(ua, 64 * T1 - 0.001)
    assert len(responses(events, 200)) >= 5  # T1, 2T1, 4T1... capped at T2
    assert not of_type(events, CallEnded)
    events = run_until(ua, 64 * T1 + 0.001)
    assert len(requests(events, "BYE")) == 1
    assert of_type(events, CallEnded) == [CallEnded(offered.call_id, "no ACK", "timeout")]
    assert_clean(ua)


def test_retransmitted_invite_creates_one_call() -> None:
    ua = make_ua()
    data = invite_text().encode()
    events = ua.receive_bytes(data, CALLER, "udp", 0.0)
    events += ua.receive_bytes(data, CALLER, "udp", 0.5)  # Timer A retransmission
    assert len(of_type(events, CallOffered)) == 1
    assert len(responses(events, 100)) == 2  # the 100 Trying is replayed
    [ok] = responses(ua.answer("c1@192.168.1.20", 30000, 0.6), 200)
    late = ua.receive_bytes(data, CALLER, "udp", 0.7)
    assert not of_type(late, CallOffered) and ua.active_calls == 1
    assert (
        not responses(late, 200)
        or NameAddr.parse(responses(late, 200)[0].headers.get("To") or "").tag
        == NameAddr.parse(ok.headers.get("To") or "").tag
    )


def test_answer_timeout_frees_an_unanswered_call() -> None:
    ua = make_ua(answer_timeout_s=2.0)
    offered, _ = offer_call(ua, invite_text())
    events = run_until(ua, 2.0)
    assert [r.status for r in responses(events)] == [480]
    assert of_type(events, CallEnded) == [CallEnded(offered.call_id, "not answered", "timeout")]
    assert_clean(ua)


def test_thousand_rejected_never_acked_invites_leave_nothing_behind() -> None:
    """A scanner's flood: 500 calls offered then rejected (486), 500 refused at max_calls
    (503); nobody ever ACKs.  After Timer H nothing is left."""
    ua = make_ua(replace(CONFIG, max_calls=500))
    offered: list[CallOffered] = []
    finals: list[int] = []
    for i in range(1000):
        text = invite_text(call_id=f"scan-{i}", branch=f"z9hG4bKscan{i}")
        events = ua.receive_bytes(text.encode(), ("198.51.100.66", 5060 + i % 50), "udp", i * 1e-4)
        offered += of_type(events, CallOffered)
        finals += [r.status for r in responses(events) if r.status >= 200]
    assert len(offered) == 500 and ua.active_calls == 500
    assert finals == [503] * 500
    for o in offered:
        finals += [r.status for r in responses(ua.reject(o.call_id, 486, 0.1)) if r.status >= 200]
    assert finals == [503] * 500 + [486] * 500
    assert ua.active_calls == 0 and ua.transactions == 1000
    events = run_until(ua, 0.1 + 64 * T1 + 0.01)
    assert {r.status for r in responses(events)} <= {486, 503}  # only retransmissions
    assert not of_type(events, CallOffered)
    assert ua.active_calls == 0 and ua.transactions == 0 and ua.ending_calls == 0
    assert ua.next_deadline() is None


def test_ipv6_caller_gets_bracketed_contact_and_ip6_sdp() -> None:
    v6 = "2001:db8::5"
    ua = BridgeUA(replace(CONFIG, external_address=v6), 5080, v6, 0.0)
    sdp = BARESIP_SDP.replace("IN IP4 192.168.1.20", "IN IP6 2001:db8::10")
    text = invite_text(sdp=sdp).replace("192.168.1.20:5062", "[2001:db8::10]:5062")
    offered, _ = offer_call_from(ua, text, ("2001:db8::10", 5062))
    [ok] = responses(ua.answer(offered.call_id, 30000, 0.1), 200)
    assert ok.headers.get("Contact") == f"<sip:bridge@[{v6}]:5080;transport=udp>"
    answer_sdp = parse_sdp(ok.body)
    assert answer_sdp.connection is not None
    assert (answer_sdp.connection.addrtype, answer_sdp.connection.address) == ("IP6", v6)
    assert not ua.receive_bytes(in_dialog("ACK", ok, 1), ("2001:db8::10", 5062), "udp", 0.2)
    [bye] = requests(ua.hangup(offered.call_id, 1.0), "BYE")
    assert bye.top_via.host == v6 and bye.top_via.port == 5080
    assert "[2001:db8::5]:5080" in (bye.headers.get("Via") or "")


# ---------------------------------------------------------------------------- other requests


def options_text(extra: str = "") -> bytes:
    return (
        f"OPTIONS sip:bot@{BRIDGE_IP} SIP/2.0\r\n"
        "Via: SIP/2.0/UDP 198.51.100.1:5060;branch=z9hG4bKopt1\r\n"
        "Max-Forwards: 70\r\n"
        "From: <sip:monitor@198.51.100.1>;tag=mon\r\n"
        f"To: <sip:bot@{BRIDGE_IP}>\r\n"
        "Call-ID: opt-1\r\n"
        "CSeq: 7 OPTIONS\r\n"
        f"{extra}Content-Length: 0\r\n\r\n"
    ).encode()


def test_options_200_lists_capabilities() -> None:
    ua = make_ua()
    events = ua.receive_bytes(options_text(), ("198.51.100.1", 5060), "udp", 0.0)
    [ok] = responses(events, 200)
    assert ok.headers.get_all("Allow") == [
        "INVITE", "ACK", "BYE", "CANCEL", "OPTIONS", "UPDATE", "INFO", "NOTIFY"
    ]  # fmt: skip
    assert "message/sipfrag" in ok.headers.get_all("Accept")
    assert "application/sdp" in ok.headers.get_all("Accept")
    assert "Supported" in ok.headers
    assert NameAddr.parse(ok.headers.get("To") or "").tag
    assert_clean(ua)


def test_header_checks_420_405_and_max_forwards_0_is_answered() -> None:
    ua = make_ua()
    src = ("198.51.100.1", 5060)
    [r] = responses(ua.receive_bytes(options_text("Require: 100rel, foo\r\n"), src, "udp", 0))
    assert r.status == 420 and r.headers.get_all("Unsupported") == ["100rel", "foo"]
    mf0 = options_text().replace(b"Max-Forwards: 70", b"Max-Forwards: 0")
    mf0 = mf0.replace(b"z9hG4bKopt1", b"z9hG4bKopt2")
    # an endpoint never forwards: Max-Forwards 0 is answered (RFC 4475 3.3.11), not 483
    assert [r.status for r in responses(ua.receive_bytes(mf0, src, "udp", 0))] == [200]
    refer = options_text().replace(b"OPTIONS", b"REFER").replace(b"z9hG4bKopt1", b"z9hG4bKr")
    [r] = responses(ua.receive_bytes(refer, src, "udp", 0))
    assert r.status == 405 and "INVITE" in r.headers.get_all("Allow")
    assert_clean(ua)


def test_481_for_unknown_dialogs() -> None:
    ua = make_ua()
    _, ok = established(ua)
    fake = replace(ok, headers=ok.headers.copy())
    fake.headers.set("Call-ID", "unknown-call")
    for method in ("BYE", "INFO", "UPDATE", "INVITE"):
        events = ua.receive_bytes(in_dialog(method, fake, 5), CALLER, "udp", 1.0)
        assert [r.status for r in responses(events) if r.status >= 200] == [481], method
    # BYE without a To tag matches no dialog either
    bye = invite_text(sdp=None, branch="z9hG4bKb").replace("INVITE", "BYE").encode()
    assert [r.status for r in responses(ua.receive_bytes(bye, CALLER, "udp", 1.0))] == [481]
    assert ua.active_calls == 1


def test_in_dialog_cseq_must_grow_and_info_dtmf() -> None:
    ua = make_ua()
    call_id, ok = established(ua)
    events = ua.receive_bytes(
        in_dialog("INFO", ok, 5, "Signal=5\r\nDuration=160\r\n", "application/dtmf-relay"),
        CALLER,
        "udp",
        1.0,
    )
    assert [r.status for r in responses(events)] == [200]
    assert of_type(events, DtmfInfo) == [DtmfInfo(call_id, "5")]
    events = ua.receive_bytes(
        in_dialog("INFO", ok, 6, "Signal=11\r\n", "application/dtmf-relay"), CALLER, "udp", 1.1
    )
    assert of_type(events, DtmfInfo) == [DtmfInfo(call_id, "#")]
    stale = ua.receive_bytes(in_dialog("INFO", ok, 6, "Signal=1\r\n"), CALLER, "udp", 1.2)
    assert [r.status for r in responses(stale)] == [500] and not of_type(stale, DtmfInfo)
    options = ua.receive_bytes(in_dialog("OPTIONS", ok, 7), CALLER, "udp", 1.3)
    assert [r.status for r in responses(options)] == [200]


def test_reinvite_hold_and_resume() -> None:
    ua = make_ua()
    call_id, ok = established(ua)
    first = parse_sdp(ok.body)
    hold_sdp = BARESIP_SDP.replace("a=sendrecv", "a=sendonly").replace(" 2048 ", " 2049 ")
    events = ua.receive_bytes(in_dialog("INVITE", ok, 2, hold_sdp), CALLER, "udp", 1.0)
    [held] = responses(events, 200)
    sdp = parse_sdp(held.body)
    assert sdp.media[0].direction == "recvonly"
    assert sdp.origin.session_id == first.origin.session_id
    assert sdp.origin.version == first.origin.version + 1
    assert sdp.origin.address == BRIDGE_IP
    [upd] = of_type(events, MediaUpdated)
    assert upd.call_id == call_id and upd.media.direction == "recvonly"
    assert not ua.receive_bytes(in_dialog("ACK", held, 2), CALLER, "udp", 1.01)
    # the same offer again: our answer is unchanged, so is its version
    again = ua.receive_bytes(in_dialog("INVITE", ok, 3, hold_sdp), CALLER, "udp", 2.0)
    [same] = responses(again, 200)
    assert parse_sdp(same.body).origin.version == sdp.origin.version
    assert not ua.receive_bytes(in_dialog("ACK", same, 3), CALLER, "udp", 2.01)
    # UPDATE resumes
    events = ua.receive_bytes(in_dialog("UPDATE", ok, 4, BARESIP_SDP), CALLER, "udp", 3.0)
    [resumed] = responses(events, 200)
    assert parse_sdp(resumed.body).media[0].direction == "sendrecv"
    assert parse_sdp(resumed.body).origin.version == sdp.origin.version + 1
    assert of_type(events, MediaUpdated)[0].media.direction == "sendrecv"
    assert ua.active_calls == 1


def test_refused_reinvite_keeps_the_call_and_its_target() -> None:
    ua = make_ua()
    call_id, ok = established(ua)
    g729 = BARESIP_SDP.replace("RTP/AVP 0 8 96", "RTP/AVP 18").replace(" 2048 ", " 2049 ")
    moved = "<sip:alice@192.0.2.99:5999>"
    events = ua.receive_bytes(in_dialog("INVITE", ok, 2, g729, contact=moved), CALLER, "udp", 1)
    [refused] = responses(events, 488)
    assert (refused.headers.get("Warning") or "").startswith("305 ")
    assert not of_type(events, MediaUpdated) and not of_type(events, CallEnded)
    events = ua.receive_bytes(in_dialog("UPDATE", ok, 3), CALLER, "udp", 2.0)
    [plain] = responses(events, 200)
    assert plain.body == b"" and not of_type(events, MediaUpdated)
    assert ua.active_calls == 1
    [bye] = requests(ua.hangup(call_id, 3.0), "BYE")
    assert bye.uri == "sip:alice-0x5581@192.168.1.20:5062;transport=udp"


def test_reinvite_without_sdp_gets_our_offer_and_ack_answer() -> None:
    ua = make_ua()
    call_id, ok = established(ua)
    events = ua.receive_bytes(in_dialog("INVITE", ok, 2), CALLER, "udp", 1.0)
    [reoffer] = responses(events, 200)
    assert parse_sdp(reoffer.body).origin.address == BRIDGE_IP
    answer_sdp = BARESIP_SDP.replace("40000", "40010").replace("0 8 96", "0 96")
    answer_sdp = answer_sdp.replace("a=rtpmap:8 PCMA/8000\r\n", "")
    events = ua.receive_bytes(in_dialog("ACK", reoffer, 2, answer_sdp), CALLER, "udp", 1.1)
    [upd] = of_type(events, MediaUpdated)
    assert upd.media.remote_port == 40010 and upd.call_id == call_id


# ---------------------------------------------------------------------------- robustness


def test_malformed_requests_get_400_or_nothing() -> None:
    ua = make_ua()
    bad_mf = invite_text().replace("Max-Forwards: 70", "Max-Forwards: lots").encode()
    [r] = responses(ua.receive_bytes(bad_mf, CALLER, "udp", 0.0))
    assert r.status == 400 and (r.headers.get("Warning") or "").startswith("399 ")
    assert r.call_id == "c1@192.168.1.20"
    v3 = invite_text().replace("SIP/2.0\r\n", "SIP/3.0\r\n", 1).encode()
    assert [r.status for r in responses(ua.receive_bytes(v3, CALLER, "udp", 0.0))] == [505]
    no_via = "\r\n".join(
        line for line in invite_text().split("\r\n") if not line.startswith("Via")
    ).encode()
    assert ua.receive_bytes(no_via, CALLER, "udp", 0.0) == []
    bad_resp = b"SIP/2.0 200 OK\r\nVia: nonsense\r\n\r\n"
    assert ua.receive_bytes(bad_resp, CALLER, "udp", 0.0) == []
    stray = (
        "SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 203.0.113.5;branch=z9hG4bKzz\r\n"
        "From: <sip:a@b>;tag=1\r\nTo: <sip:c@d>;tag=2\r\nCall-ID: x\r\nCSeq: 1 BYE\r\n\r\n"
    )
    assert ua.receive_bytes(stray.encode(), CALLER, "udp", 0.0) == []
    assert ua.active_calls == 0
    assert_clean(ua)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_garbage_never_raises_or_creates_state(data: bytes) -> None:
    ua = make_ua()
    events = ua.receive_bytes(data, CALLER, "udp", 0.0)
    assert not of_type(events, CallOffered)
    assert ua.active_calls == 0 and ua.transactions == 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_invites_never_raise_and_state_stays_bounded(data: st.DataObject) -> None:
    raw = bytearray(invite_text(record_route="<sip:198.51.100.1;lr>").encode())
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        action = data.draw(st.sampled_from(["flip", "delete", "insert"]))
        byte = data.draw(st.sampled_from(b'\x00\r\n:;<>@," =\xff0aZ'))
        if action == "flip":
            raw[pos] = byte
        elif action == "delete":
            del raw[pos]
        else:
            raw.insert(pos, byte)
    ua = make_ua()
    events = ua.receive_bytes(bytes(raw), CALLER, "udp", 0.0)
    for offered in of_type(events, CallOffered):
        ua.answer(offered.call_id, 30000, 0.0)
    assert_clean(ua)


def test_random_interleavings_of_a_call_stay_consistent() -> None:
    """Many calls, random app/caller actions: each CallOffered ends exactly once."""
    rng = random.Random(7)
    ua = make_ua(replace(CONFIG, max_calls=1000))
    offered: list[str] = []
    ended: list[str] = []
    now = 0.0
    for i in range(200):
        now += 0.01
        events = ua.receive_bytes(
            invite_text(call_id=f"r{i}", branch=f"z9hG4bKr{i}").encode(), CALLER, "udp", now
        )
        [o] = of_type(events, CallOffered)
        offered.append(o.call_id)
        choice = rng.choice(["answer", "reject", "hangup", "nothing"])
        if choice == "answer":
            events += ua.answer(o.call_id, 30000, now)
            if rng.random() < 0.5:
                events += ua.hangup(o.call_id, now)
        elif choice == "reject":
            events += ua.reject(o.call_id, 486, now)
        elif choice == "hangup":
            events += ua.hangup(o.call_id, now)
        ended += [e.call_id for e in of_type(events, CallEnded)]
        ended += [e.call_id for e in of_type(ua.tick(now), CallEnded)]
    ended += [e.call_id for e in of_type(run_until(ua, 1000.0), CallEnded)]
    assert sorted(ended) == sorted(offered)
    assert_clean(ua)

"""RFC 3261 section 12 dialogs: creation (UAS and UAC), in-dialog requests, CSeq rules."""

from __future__ import annotations

import pytest

from sip_bridge.sip.dialog import Dialog, DialogError
from sip_bridge.sip.message import NameAddr, SipRequest, SipResponse, make_response, parse_message

INVITE = (
    "INVITE sip:bot@203.0.113.5:5060 SIP/2.0\r\n"
    "Via: SIP/2.0/UDP 198.51.100.20;branch=z9hG4bKp2\r\n"
    "Via: SIP/2.0/UDP 198.51.100.10;branch=z9hG4bKp1\r\n"
    "Via: SIP/2.0/UDP 192.0.2.10:5062;branch=z9hG4bKua;rport\r\n"
    "Record-Route: <sip:198.51.100.20;lr>\r\n"
    "Record-Route: <sip:198.51.100.10;lr;ftag=abc>, <sip:edge.example.net;lr>\r\n"
    "Max-Forwards: 68\r\n"
    'From: "Alice" <sip:alice@example.com>;tag=alice-tag\r\n'
    "To: <sip:bot@example.com>\r\n"
    "Call-ID: dlg-1@192.0.2.10\r\n"
    "CSeq: 314 INVITE\r\n"
    "Contact: <sip:alice@192.0.2.10:5062;transport=udp>;expires=3600\r\n"
    "Content-Length: 0\r\n\r\n"
)


def invite(text: str = INVITE) -> SipRequest:
    msg = parse_message(text.encode())
    assert isinstance(msg, SipRequest)
    return msg


def uas(text: str = INVITE) -> Dialog:
    return Dialog.from_uas(
        invite(text), "bridge-tag", "<sip:bridge@203.0.113.5:5060>", "udp", "203.0.113.5:5060"
    )


def peer_request(method: str, cseq: int, from_tag: str = "alice-tag") -> SipRequest:
    raw = (
        f"{method} sip:bridge@203.0.113.5:5060 SIP/2.0\r\n"
        "Via: SIP/2.0/UDP 192.0.2.10:5062;branch=z9hG4bKx\r\n"
        f"From: <sip:alice@example.com>;tag={from_tag}\r\n"
        "To: <sip:bot@example.com>;tag=bridge-tag\r\n"
        "Call-ID: dlg-1@192.0.2.10\r\n"
        f"CSeq: {cseq} {method}\r\n"
        "Contact: <sip:alice@192.0.2.99:5070>\r\n"
        "Content-Length: 0\r\n\r\n"
    )
    return invite(raw)


def test_uas_dialog_from_invite_with_record_route() -> None:
    d = uas()
    assert d.id == ("dlg-1@192.0.2.10", "bridge-tag", "alice-tag")
    assert d.remote_target == "sip:alice@192.0.2.10:5062;transport=udp"
    # UAS keeps Record-Route order, comma-joined values split (RFC 3261 12.1.1)
    assert d.route_set == [
        "<sip:198.51.100.20;lr>",
        "<sip:198.51.100.10;lr;ftag=abc>",
        "<sip:edge.example.net;lr>",
    ]
    assert d.remote_cseq == 314
    assert d.local_uri == "<sip:bot@example.com>"
    assert d.remote_uri == '"Alice" <sip:alice@example.com>'
    assert 0 < d.local_cseq < 2**31


def test_in_dialog_request_loose_routing() -> None:
    d = uas()
    first = d.local_cseq
    bye = d.create_request("BYE")
    raw = parse_message(bye.to_bytes())
    assert isinstance(raw, SipRequest)
    assert raw.method == "BYE"
    assert raw.uri == "sip:alice@192.0.2.10:5062;transport=udp"  # remote target
    assert raw.headers.get_all("Route") == [
        "<sip:198.51.100.20;lr>",
        "<sip:198.51.100.10;lr;ftag=abc>",
        "<sip:edge.example.net;lr>",
    ]
    assert NameAddr.parse(raw.headers.get("From") or "").tag == "bridge-tag"
    assert NameAddr.parse(raw.headers.get("From") or "").uri == "sip:bot@example.com"
    assert NameAddr.parse(raw.headers.get("To") or "").tag == "alice-tag"
    assert raw.call_id == "dlg-1@192.0.2.10"
    assert raw.cseq == (first + 1, "BYE")
    assert raw.headers.get("Max-Forwards") == "70"
    assert raw.headers.get("Contact") == "<sip:bridge@203.0.113.5:5060>"
    via = raw.top_via
    assert (via.transport, via.host, via.port) == ("UDP", "203.0.113.5", 5060)
    assert via.branch is not None and via.branch.startswith("z9hG4bK")
    assert d.next_hop().host == "198.51.100.20"
    # every request gets a higher CSeq and a fresh branch
    info = d.create_request("INFO", b"Signal=5\r\n", "application/dtmf-relay")
    assert info.cseq == (first + 2, "INFO")
    assert info.top_via.branch != via.branch
    assert info.headers.get("Content-Type") == "application/dtmf-relay"
    assert info.body == b"Signal=5\r\n"


def test_no_route_set_targets_contact() -> None:
    text = INVITE.replace("Record-Route: <sip:198.51.100.20;lr>\r\n", "").replace(
        "Record-Route: <sip:198.51.100.10;lr;ftag=abc>, <sip:edge.example.net;lr>\r\n", ""
    )
    d = uas(text)
    req = d.create_request("BYE")
    assert req.headers.get("Route") is None
    assert d.next_hop().host == "192.0.2.10" and d.next_hop().port == 5062


def test_strict_router_goes_in_request_uri() -> None:
    text = INVITE.replace(
        "Record-Route: <sip:198.51.100.20;lr>", "Record-Route: <sip:198.51.100.20;maddr=x>"
    )
    req = uas(text).create_request("BYE")
    assert req.uri == "sip:198.51.100.20"  # maddr stripped (RFC 3261 12.2.1.1)
    routes = req.headers.get_all("Route")
    assert routes[-1] == "<sip:alice@192.0.2.10:5062;transport=udp>"
    assert routes[0] == "<sip:198.51.100.10;lr;ftag=abc>"


def test_remote_cseq_must_grow() -> None:
    d = uas()
    assert not d.accept_remote_cseq(peer_request("BYE", 314))  # equal: 500
    assert not d.accept_remote_cseq(peer_request("INFO", 10))  # lower: 500
    assert d.accept_remote_cseq(peer_request("INFO", 315))
    assert d.remote_cseq == 315
    assert not d.accept_remote_cseq(peer_request("INFO", 315))
    cancel = peer_request("CANCEL", 314)
    assert d.accept_remote_cseq(cancel)  # CANCEL/ACK reuse the INVITE's number
    assert d.remote_cseq == 315


def test_matching_and_target_refresh() -> None:
    d = uas()
    assert d.matches(peer_request("BYE", 400))
    assert not d.matches(peer_request("BYE", 400, from_tag="other"))
    d.refresh_target(peer_request("INFO", 400))  # INFO is not a target refresh
    assert d.remote_target == "sip:alice@192.0.2.10:5062;transport=udp"
    d.refresh_target(peer_request("INVITE", 401))
    assert d.remote_target == "sip:alice@192.0.2.99:5070"


def test_bad_contact_or_record_route_refused() -> None:
    with pytest.raises(DialogError) as no_contact:
        uas(
            INVITE.replace(
                "Contact: <sip:alice@192.0.2.10:5062;transport=udp>;expires=3600\r\n", ""
            )
        )
    assert no_contact.value.status == 400
    with pytest.raises(DialogError) as tel:
        uas(INVITE.replace("<sip:alice@192.0.2.10:5062;transport=udp>", "<tel:+15551234>"))
    assert tel.value.status == 416
    with pytest.raises(DialogError):
        uas(INVITE.replace("<sip:edge.example.net;lr>", "<http://edge>"))


def test_ack_and_cancel_are_not_built_here() -> None:
    with pytest.raises(ValueError):
        uas().create_request("ACK")


def test_ack_for_a_2xx_takes_the_invite_cseq_not_a_new_one() -> None:
    d = uas()
    invite = d.create_request("INVITE", b"v=0\r\n")
    ack = d.create_ack(invite.cseq[0])
    assert ack.method == "ACK" and ack.body == b""
    assert ack.cseq == (invite.cseq[0], "ACK")
    assert ack.uri == invite.uri  # the remote target, and the same route set
    assert ack.headers.get_all("Route") == invite.headers.get_all("Route")
    assert ack.top_via.branch != invite.top_via.branch  # a transaction of its own
    assert d.create_request("BYE").cseq == (invite.cseq[0] + 1, "BYE")  # no CSeq used up


def test_uac_dialog_reverses_record_route() -> None:
    ours = invite(
        INVITE.replace("tag=alice-tag", "tag=our-tag").replace(
            "Contact: <sip:alice@192.0.2.10:5062;transport=udp>", "Contact: <sip:bridge@192.0.2.10>"
        )
    )
    ok: SipResponse = make_response(ours, 200, to_tag="their-tag")
    ok.headers.add("Record-Route", "<sip:p1.example;lr>, <sip:p2.example;lr>")
    ok.headers.add("Contact", "<sip:bob@198.51.100.77:5080>")
    d = Dialog.from_uac(ours, ok, "udp", "192.0.2.10:5060")
    assert d.id == ("dlg-1@192.0.2.10", "our-tag", "their-tag")
    assert d.route_set == ["<sip:p2.example;lr>", "<sip:p1.example;lr>"]
    assert d.remote_target == "sip:bob@198.51.100.77:5080"
    bye = d.create_request("BYE")
    assert bye.cseq == (315, "BYE")
    assert NameAddr.parse(bye.headers.get("To") or "").tag == "their-tag"

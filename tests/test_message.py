"""Tests for sip_bridge.sip.message: RFC 3261 parse/serialize, header grammar, stream framing.

The example messages are hand-written in the style of the RFC 3665 call flows and the
RFC 4475 torture tests (compact forms, folding, odd spacing, escaped display names,
Via lists, IPv6); none is copied from those documents.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sip_bridge.sip.framing import StreamFramer
from sip_bridge.sip.message import (
    Headers,
    NameAddr,
    SipMessage,
    SipParseError,
    SipRequest,
    SipResponse,
    SipUri,
    Via,
    make_response,
    new_branch,
    new_call_id,
    new_tag,
    parse_message,
    reason_phrase,
    split_list,
)


def crlf(text: str) -> bytes:
    """Write messages readably with \\n, send them with CRLF as the wire does."""
    return text.replace("\n", "\r\n").encode()


SDP = (
    b"v=0\r\no=alice 2890844526 2890844526 IN IP4 192.0.2.10\r\ns=-\r\n"
    b"c=IN IP4 192.0.2.10\r\nt=0 0\r\nm=audio 49170 RTP/AVP 0 8 101\r\n"
    b"a=rtpmap:101 telephone-event/8000\r\n"
)

INVITE = (
    crlf(
        "INVITE sip:agent@bridge.example.com SIP/2.0\n"
        "Via: SIP/2.0/UDP pbx.example.com:5060;branch=z9hG4bK74bf9;received=192.0.2.1\n"
        "Max-Forwards: 70\n"
        'From: "Alice" <sip:alice@example.com>;tag=9fxced76sl\n'
        "To: <sip:agent@bridge.example.com>\n"
        "Call-ID: 3848276298220188511@pbx.example.com\n"
        "CSeq: 314159 INVITE\n"
        "Contact: <sip:alice@192.0.2.10:5060;transport=udp>\n"
        "Allow: INVITE, ACK, CANCEL, BYE, OPTIONS, REFER\n"
        "Content-Type: application/sdp\n"
        f"Content-Length: {len(SDP)}\n"
        "\n"
    )
    + SDP
)

# Torture-style: compact forms, lower/upper case names, folding, tabs, a quoted display
# name with escapes and a comma, Vias split across lines and headers, IPv6, unknown header.
TORTURE = crlf(
    "INVITE sip:vivekg@chair-dnrc.example.com;unknownparam SIP/2.0\n"
    "TO :\n"
    " sip:vivekg@chair-dnrc.example.com ;   tag    = 1918181833n\n"
    'from   : "J Rosenberg \\\\\\"Jr\\", Esq."       <sip:jdrosen@example.com>\n'
    "  ;\n"
    "  tag = 98asjd8\n"
    "MaX-fOrWaRdS: 0068\n"
    "Call-ID: wsinv.ndaksdj@192.0.2.1\n"
    "Content-Length   : 0\n"
    "cseq: 0009\n"
    "  INVITE\n"
    "Via  : SIP  /   2.0\n"
    " /UDP\n"
    "    192.0.2.2;rport;branch=390skdjuw\n"
    "v:  SIP/2.0/TCP [2001:db8::9:1]:5061;branch=z9hG4bKkdjuw;received=2001:db8::9:255,\n"
    "\tSIP/2.0/UDP 192.0.2.3:6060 ; branch = z9hG4bK1 ; ttl=1\n"
    "s: newfangled value\n"
    "\t continued newfangled value\n"
    "NewFangledHeader:   newfangled value\n"
    " continued newfangled value\n"
    'm: "Quoted, Name" <sip:services.example.com;lr;unknownwith=value;unknown-no-value>,\n'
    "  sip:second@[2001:db8::1]:5070;expires=30\n"
    "\n"
)

OK_200 = crlf(
    "SIP/2.0 200 OK\n"
    "Via: SIP/2.0/UDP proxy.example.com:5060;branch=z9hG4bK2d4790.1\n"
    "Via: SIP/2.0/UDP pbx.example.com:5060;branch=z9hG4bK74bf9;received=192.0.2.1\n"
    "Record-Route: <sip:proxy.example.com;lr>, <sip:edge.example.com;lr>\n"
    'From: "Alice" <sip:alice@example.com>;tag=9fxced76sl\n'
    "To: <sip:agent@bridge.example.com>;tag=8321234356\n"
    "Call-ID: 3848276298220188511@pbx.example.com\n"
    "CSeq: 314159 INVITE\n"
    "Contact: <sip:agent@198.51.100.7:5060>\n"
    "Content-Length: 0\n"
    "\n"
)

ACK = crlf(
    "ACK sip:agent@198.51.100.7:5060 SIP/2.0\n"
    "Via: SIP/2.0/UDP pbx.example.com:5060;branch=z9hG4bK74bd5\n"
    "Route: <sip:proxy.example.com;lr>\n"
    "Max-Forwards: 70\n"
    'From: "Alice" <sip:alice@example.com>;tag=9fxced76sl\n'
    "To: <sip:agent@bridge.example.com>;tag=8321234356\n"
    "Call-ID: 3848276298220188511@pbx.example.com\n"
    "CSeq: 314159 ACK\n"
    "Content-Length: 0\n"
    "\n"
)

BYE = crlf(
    "BYE sip:alice@192.0.2.10:5060;transport=udp SIP/2.0\n"
    "Via: SIP/2.0/UDP [::1]:5062;branch=z9hG4bKnashds7;rport\n"
    "Max-Forwards: 70\n"
    "From: <sip:agent@bridge.example.com>;tag=8321234356\n"
    'To: "Alice" <sip:alice@example.com>;tag=9fxced76sl\n'
    "Call-ID: 3848276298220188511@pbx.example.com\n"
    "CSeq: 1 BYE\n"
    "l: 0\n"
    "\n"
)

# Bare LF line endings and no Content-Length (allowed on datagrams).
OPTIONS = (
    b"OPTIONS sip:bridge.example.com SIP/2.0\n"
    b"v: SIP/2.0/UDP 203.0.113.5:5060;branch=z9hG4bKopt1\n"
    b"f: sip:scanner@203.0.113.5;tag=abc\n"
    b"t: sip:bridge.example.com\n"
    b"i: opt1@203.0.113.5\n"
    b"CSeq: 102 OPTIONS\n"
    b"k: replaces, timer\n"
    b"\n"
)

REGISTER_401 = crlf(
    "SIP/2.0 401 Unauthorized\n"
    "Via: SIP/2.0/TCP 192.0.2.20:49152;branch=z9hG4bKnashds7;received=192.0.2.20;rport=49152\n"
    "From: <sip:bridge@trunk.example.net>;tag=a73kszlfl\n"
    "To: <sip:bridge@trunk.example.net>;tag=1410948204\n"
    "Call-ID: 1j9FpLxk3uxtm8tn@192.0.2.20\n"
    "CSeq: 1 REGISTER\n"
    'WWW-Authenticate: Digest realm="trunk.example.net", qop="auth,auth-int",\n'
    ' nonce="ea9c8e88df84f1cec4341ae6cbe5a359", opaque="", algorithm=MD5\n'
    "Content-Length: 0\n"
    "\n"
)

ALL = [INVITE, TORTURE, OK_200, ACK, BYE, OPTIONS, REGISTER_401]


def request(data: bytes) -> SipRequest:
    msg = parse_message(data)
    assert isinstance(msg, SipRequest)
    return msg


def response(data: bytes) -> SipResponse:
    msg = parse_message(data)
    assert isinstance(msg, SipResponse)
    return msg


# --- parsing real-world shaped messages -------------------------------------------------


def test_invite_fields_and_body() -> None:
    msg = request(INVITE)
    assert (msg.method, msg.uri) == ("INVITE", "sip:agent@bridge.example.com")
    assert msg.call_id == "3848276298220188511@pbx.example.com"
    assert msg.cseq == (314159, "INVITE")
    assert msg.body == SDP
    assert msg.top_via.branch == "z9hG4bK74bf9"
    assert msg.top_via.received == "192.0.2.1"
    assert msg.headers.get_all("Allow") == ["INVITE", "ACK", "CANCEL", "BYE", "OPTIONS", "REFER"]
    assert NameAddr.parse(msg.headers.get("From") or "").tag == "9fxced76sl"
    assert NameAddr.parse(msg.headers.get("To") or "").tag is None


def test_torture_invite() -> None:
    msg = request(TORTURE)
    h = msg.headers
    names = [n for n, _ in h.items()]
    assert names == [
        "To", "From", "Max-Forwards", "Call-ID", "Content-Length", "CSeq", "Via", "Via",
        "Subject", "NewFangledHeader", "Contact",
    ]  # fmt: skip
    assert msg.cseq == (9, "INVITE")
    assert h.get("max-forwards") == "0068"
    frm = NameAddr.parse(h.get("f") or "")
    assert frm.display == 'J Rosenberg \\"Jr", Esq.'
    assert frm.uri == "sip:jdrosen@example.com" and frm.tag == "98asjd8"
    to = NameAddr.parse(h.get("To") or "")
    assert to.display is None and to.uri == "sip:vivekg@chair-dnrc.example.com"
    assert to.tag == "1918181833n"
    assert h.get("Subject") == "newfangled value continued newfangled value"
    assert h.get("NEWFANGLEDHEADER") == "newfangled value continued newfangled value"
    vias = msg.via
    assert [(v.transport, v.host, v.port) for v in vias] == [
        ("UDP", "192.0.2.2", None),
        ("TCP", "2001:db8::9:1", 5061),
        ("UDP", "192.0.2.3", 6060),
    ]
    assert vias[0].params == {"rport": None, "branch": "390skdjuw"}
    assert vias[1].received == "2001:db8::9:255"
    assert vias[2].params == {"branch": "z9hG4bK1", "ttl": "1"}
    contacts = [NameAddr.parse(c) for c in h.get_all("m")]
    assert contacts[0].display == "Quoted, Name"
    assert SipUri.parse(contacts[0].uri).lr
    assert contacts[1].uri == "sip:second@[2001:db8::1]:5070"
    assert contacts[1].params == {"expires": "30"}
    assert SipUri.parse(contacts[1].uri).host == "2001:db8::1"


def test_response_with_record_route() -> None:
    msg = response(OK_200)
    assert (msg.status, msg.reason) == (200, "OK")
    assert len(msg.via) == 2 and msg.top_via.host == "proxy.example.com"
    routes = [NameAddr.parse(r).uri for r in msg.headers.get_all("Record-Route")]
    assert routes == ["sip:proxy.example.com;lr", "sip:edge.example.com;lr"]
    assert msg.headers.get("Record-Route") == "<sip:proxy.example.com;lr>"


def test_bare_lf_compact_options_without_content_length() -> None:
    msg = request(OPTIONS)
    assert msg.call_id == "opt1@203.0.113.5"
    assert msg.headers.get_all("Supported") == ["replaces", "timer"]
    assert msg.body == b""
    assert NameAddr.parse(msg.headers.get("From") or "").tag == "abc"


def test_www_authenticate_commas_are_not_list_separators() -> None:
    msg = response(REGISTER_401)
    assert msg.status == 401
    (challenge,) = msg.headers.get_all("WWW-Authenticate")
    assert challenge.startswith('Digest realm="trunk.example.net", qop="auth,auth-int",')
    assert challenge.endswith("algorithm=MD5")
    assert msg.top_via.rport == 49152


def test_ipv6_via_with_empty_rport() -> None:
    msg = request(BYE)
    assert msg.top_via.host == "::1" and msg.top_via.port == 5062
    assert "rport" in msg.top_via.params and msg.top_via.params["rport"] is None
    assert msg.top_via.rport is None
    assert msg.headers.get("Content-Length") == "0"


@pytest.mark.parametrize("data", ALL)
def test_round_trip(data: bytes) -> None:
    msg = parse_message(data)
    wire = msg.to_bytes()
    again = parse_message(wire)
    assert again == msg
    assert again.to_bytes() == wire
    assert wire.count(b"\r\n\r\n") >= 1 and b"\n " not in wire  # no folding on output


def test_serialize_uses_canonical_names_and_sets_content_length() -> None:
    msg = request(OPTIONS)
    msg.body = b"hello"
    wire = msg.to_bytes()
    assert wire.startswith(b"OPTIONS sip:bridge.example.com SIP/2.0\r\nVia: SIP/2.0/UDP ")
    assert b"\r\nCall-ID: opt1@203.0.113.5\r\n" in wire
    assert b"\r\nSupported: replaces, timer\r\n" in wire
    assert wire.endswith(b"\r\nContent-Length: 5\r\n\r\nhello")


def test_leading_crlf_and_body_rules_on_datagrams() -> None:
    assert request(b"\r\n\r\n" + ACK).cseq == (314159, "ACK")
    no_length = INVITE.replace(f"Content-Length: {len(SDP)}\r\n".encode(), b"")
    assert request(no_length).body == SDP  # rest of the datagram
    assert request(INVITE + b"garbage after the body").body == SDP  # extra truncated


# --- error paths ------------------------------------------------------------------------


def drop(data: bytes, header: str) -> bytes:
    lines = data.split(b"\r\n")
    return b"\r\n".join(x for x in lines if not x.lower().startswith(header.lower().encode()))


def swap(data: bytes, old: str, new: str) -> bytes:
    assert old.encode() in data
    return data.replace(old.encode(), new.encode(), 1)


ERRORS = [
    (drop(ACK, "Via:"), 400, "Via"),
    (drop(ACK, "From:"), 400, "From"),
    (drop(ACK, "To:"), 400, "To"),
    (drop(ACK, "Call-ID:"), 400, "Call-ID"),
    (drop(ACK, "CSeq:"), 400, "CSeq"),
    (drop(OK_200, "CSeq:"), 400, "CSeq"),
    (swap(ACK, "CSeq: 314159 ACK", "CSeq: abc ACK"), 400, "CSeq"),
    (swap(ACK, "CSeq: 314159 ACK", "CSeq: 4294967296 ACK"), 400, "CSeq"),
    (swap(ACK, "CSeq: 314159 ACK", "CSeq: 314159 INVITE"), 400, "does not match"),
    (swap(ACK, "CSeq: 314159 ACK", "CSeq: 314159"), 400, "CSeq"),
    (swap(ACK, "SIP/2.0/UDP pbx", "SIP/2.0 pbx"), 400, "Via"),
    (swap(ACK, "pbx.example.com:5060;", "pbx.example.com:99999;"), 400, "port"),
    (swap(ACK, "pbx.example.com:5060;", "[::1:5060;"), 400, "IPv6"),
    (swap(ACK, "ACK sip:agent@198.51.100.7:5060 SIP/2.0", "ACK SIP/2.0"), 400, "request line"),
    (swap(ACK, "ACK sip:", "A<K sip:"), 400, "request line"),
    (swap(ACK, "sip:agent@198.51.100.7:5060 SIP", "agent SIP"), 400, "Request-URI"),
    (swap(ACK, " SIP/2.0\r\n", " SIP/3.0\r\n"), 505, "version"),
    (swap(OK_200, "SIP/2.0 200 OK", "SIP/7.1 200 OK"), 505, "version"),
    (swap(OK_200, "SIP/2.0 200 OK", "SIP/2.0 2000 OK"), 400, "status line"),
    (swap(OK_200, "SIP/2.0 200 OK", "SIP/2.0 099 OK"), 400, "out of range"),
    (swap(ACK, "Content-Length: 0", "Content-Length: 10"), 400, "exceeds"),
    (swap(ACK, "Content-Length: 0", "Content-Length: -1"), 400, "Content-Length"),
    (swap(ACK, "Max-Forwards: 70", "Max-Forwards: 256"), 400, "Max-Forwards"),
    (swap(ACK, "Call-ID: ", "Call-ID: x\r\ni: "), 400, "more than one Call-ID"),
    (swap(ACK, "Max-Forwards: 70", "Max-Forwards 70"), 400, "malformed header"),
    (swap(ACK, "Max-Forwards: 70", "Max-Forwards: 7\x010"), 400, "control character"),
    (swap(ACK, "Max-Forwards: 70", "Max-Forwards: 70\r"), 400, "control character"),
    (ACK.replace(b"Alice", b"Al\xffce"), 400, "UTF-8"),
    (b"ACK sip:a@b SIP/2.0\r\n folded-first: x\r\n\r\n", 400, "continuation"),
    (swap(ACK, '"Alice" <sip:', '"Alice <sip:'), 400, "quoted"),
    (swap(ACK, "<sip:agent@bridge.example.com>", "<sip:agent@bridge.example.com"), 400, "URI"),
    (b"\r\n\r\n", 400, "empty"),
]


@pytest.mark.parametrize(("data", "status", "words"), ERRORS)
def test_parse_errors(data: bytes, status: int, words: str) -> None:
    with pytest.raises(SipParseError) as info:
        parse_message(data)
    assert info.value.status == status
    assert words.lower() in str(info.value).lower()


# --- Headers ----------------------------------------------------------------------------


def test_headers_api() -> None:
    h = Headers([("v", "SIP/2.0/UDP a;branch=z9hG4bK1, SIP/2.0/UDP b;branch=z9hG4bK2")])
    h.add("VIA", "SIP/2.0/UDP c;branch=z9hG4bK3")
    h.add("x-custom", "1")
    assert h.get("via") == "SIP/2.0/UDP a;branch=z9hG4bK1"
    assert [Via.parse(v).host for v in h.get_all("Via")] == ["a", "b", "c"]
    assert len(h) == 3 and "VIA" in h and "i" not in h and h.count("via") == 2
    dup = h.copy()
    h.set("Via", "SIP/2.0/UDP d;branch=z9hG4bK4")
    assert h.items() == [("Via", "SIP/2.0/UDP d;branch=z9hG4bK4"), ("x-custom", "1")]
    assert dup.count("Via") == 2 and dup != h
    h.set("i", "id@host")  # absent: appended under the long name
    assert h.items()[-1] == ("Call-ID", "id@host")
    h.remove("X-CUSTOM")
    assert h.get("x-custom") is None and h.get_all("x-custom") == []
    with pytest.raises(ValueError, match="line break"):
        h.add("Subject", "a\r\nInjected: yes")
    with pytest.raises(ValueError, match="header name"):
        h.add("Bad Name", "x")


def test_split_list_respects_quotes_and_angles() -> None:
    value = '"Doe, John" <sip:jd@a.example;x=1,2>;q=0.5, sip:b@b.example , "q\\",x" <sip:c@c>'
    assert split_list(value) == [
        '"Doe, John" <sip:jd@a.example;x=1,2>;q=0.5',
        "sip:b@b.example",
        '"q\\",x" <sip:c@c>',
    ]
    assert split_list(" , ,") == []


# --- Via, NameAddr, SipUri --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "transport", "host", "port", "params"),
    [
        ("SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bKabc", "UDP", "10.0.0.1", 5060,
         {"branch": "z9hG4bKabc"}),
        ("sip/2.0/tls proxy.example.com;branch=z9hG4bK1;rport;received=1.2.3.4", "TLS",
         "proxy.example.com", None, {"branch": "z9hG4bK1", "rport": None,
                                     "received": "1.2.3.4"}),
        ("SIP / 2.0 / TCP [::1]:5061 ;BRANCH=z9hG4bKx ; rport=5061", "TCP", "::1", 5061,
         {"branch": "z9hG4bKx", "rport": "5061"}),
        ("SIP/2.0/WSS [fe80::1%25eth0]", "WSS", "fe80::1%25eth0", None, {}),
        ('SIP/2.0/UDP h;comment="a;b=c"', "UDP", "h", None, {"comment": '"a;b=c"'}),
    ],
)  # fmt: skip
def test_via_parse(
    text: str, transport: str, host: str, port: int | None, params: dict[str, str | None]
) -> None:
    via = Via.parse(text)
    assert (via.transport, via.host, via.port, via.params) == (transport, host, port, params)
    assert Via.parse(via.to_str()) == via


def test_via_to_str_brackets_ipv6() -> None:
    via = Via("UDP", "2001:db8::1", 5060, {"branch": "z9hG4bKq", "rport": None})
    assert via.to_str() == "SIP/2.0/UDP [2001:db8::1]:5060;branch=z9hG4bKq;rport"
    assert via.branch == "z9hG4bKq"


@pytest.mark.parametrize(
    "text",
    ["", "SIP/2.0/UDP", "SIP/2.0 host", "SIP/1.0/UDP host", "SIP/2.0/UDP host:port",
     "SIP/2.0/UDP ho st", "SIP/2.0/UDP [zz::1]", "SIP/2.0/UDP host;=x", "SIP/2.0/UDP h;a=<b>",
     'SIP/2.0/UDP h;a="open'],
)  # fmt: skip
def test_via_parse_rejects(text: str) -> None:
    with pytest.raises(SipParseError):
        Via.parse(text)


@pytest.mark.parametrize(
    ("text", "display", "uri", "params"),
    [
        ("<sip:a@b>", None, "sip:a@b", {}),
        ("sip:a@b;tag=1", None, "sip:a@b", {"tag": "1"}),
        ("Bob  Smith <sips:bob@b:5061;transport=tls>;tag=x;expires=3", "Bob Smith",
         "sips:bob@b:5061;transport=tls", {"tag": "x", "expires": "3"}),
        ('"" <sip:anon@anonymous.invalid>', "", "sip:anon@anonymous.invalid", {}),
        ('"A \\"quoted\\" \\\\ name"<sip:x@y>;tag=q', 'A "quoted" \\ name', "sip:x@y",
         {"tag": "q"}),
        ('<sip:x@y>;+sip.instance="<urn:uuid:f81d4fae-7dec>";reg-id=1', None, "sip:x@y",
         {"+sip.instance": '"<urn:uuid:f81d4fae-7dec>"', "reg-id": "1"}),
        ("*", None, "*", {}),
        ("tel:+15551234567;tag=t", None, "tel:+15551234567", {"tag": "t"}),
    ],
)  # fmt: skip
def test_name_addr_parse(
    text: str, display: str | None, uri: str, params: dict[str, str | None]
) -> None:
    na = NameAddr.parse(text)
    assert (na.display, na.uri, na.params) == (display, uri, params)
    assert NameAddr.parse(na.to_str()) == na


def test_name_addr_to_str_quotes_display() -> None:
    na = NameAddr('Doe, "J"', "sip:jd@example.com", {"tag": "1"})
    assert na.to_str() == '"Doe, \\"J\\"" <sip:jd@example.com>;tag=1'


@pytest.mark.parametrize(
    "text", ["", '"unterminated <sip:a@b>', '"name" sip:a@b', "<sip:a@b", "<nouri>",
             "<sip:a@b> junk", "sip:a@b?x=y", 'Bo"b <sip:a@b>', "<sip:a@b>;tag=a b"],
)  # fmt: skip
def test_name_addr_rejects(text: str) -> None:
    with pytest.raises(SipParseError):
        NameAddr.parse(text)


def test_sip_uri_parse() -> None:
    uri = SipUri.parse("SIP:alice;day=tuesday@Atlanta.example.com:5070;Transport=TCP;lr?X=1&y=2")
    assert uri.scheme == "sip" and uri.user == "alice;day=tuesday"
    assert (uri.host, uri.port) == ("Atlanta.example.com", 5070)
    assert uri.params == {"transport": "TCP", "lr": None}
    assert uri.transport == "tcp" and uri.lr
    assert uri.headers == {"X": "1", "y": "2"}
    assert SipUri.parse(uri.to_str()) == uri

    v6 = SipUri.parse("sips:[2001:db8::10]")
    assert (v6.scheme, v6.user, v6.host, v6.port, v6.transport, v6.lr) == (
        "sips", None, "2001:db8::10", None, None, False,
    )  # fmt: skip
    assert v6.to_str() == "sips:[2001:db8::10]"
    assert SipUri("sip", "bob:secret", "::1", 5060).to_str() == "sip:bob:secret@[::1]:5060"


@pytest.mark.parametrize(
    ("text", "status"),
    [("tel:+15551234567", 416), ("http://example.com", 416), ("sip:", 400), ("sip:@host", 400),
     ("sip:a@b@c", 400), ("sip:host:70000", 400), ("sip:host:x", 400), ("sip:[::1", 400),
     ("sip:a b@c", 400), ("nocolon", 416)],
)  # fmt: skip
def test_sip_uri_rejects(text: str, status: int) -> None:
    with pytest.raises(SipParseError) as info:
        SipUri.parse(text)
    assert info.value.status == status


# --- make_response and identifiers ------------------------------------------------------


def test_make_response_copies_dialog_headers() -> None:
    req = request(TORTURE)
    resp = make_response(req, 180, to_tag="abc")
    assert (resp.status, resp.reason) == (180, "Ringing")
    assert [n for n, _ in resp.headers.items()] == [
        "Via", "Via", "From", "To", "Call-ID", "CSeq", "Content-Length",
    ]  # fmt: skip
    assert [v.branch for v in resp.via] == [v.branch for v in req.via]
    assert NameAddr.parse(resp.headers.get("To") or "").tag == "1918181833n"  # kept
    assert resp.call_id == req.call_id and resp.cseq == req.cseq
    assert resp.headers.get("Content-Length") == "0" and resp.body == b""
    assert parse_message(resp.to_bytes()) == resp

    fresh = make_response(request(INVITE), 486, to_tag="t0")
    assert (fresh.status, fresh.reason) == (486, "Busy Here")
    assert NameAddr.parse(fresh.headers.get("To") or "").tag == "t0"
    assert NameAddr.parse(fresh.headers.get("From") or "").tag == "9fxced76sl"
    assert make_response(request(INVITE), 599, "Custom").reason == "Custom"
    assert make_response(request(INVITE), 100).headers.get("To") == (
        "<sip:agent@bridge.example.com>"
    )


def test_make_response_echoes_timestamp_on_100() -> None:
    req = request(swap(ACK, "Max-Forwards: 70", "Timestamp: 54.2"))
    assert make_response(req, 100).headers.get("Timestamp") == "54.2"
    assert make_response(req, 200).headers.get("Timestamp") is None


def test_reason_phrases() -> None:
    assert reason_phrase(200) == "OK" and reason_phrase(487) == "Request Terminated"
    assert reason_phrase(499) == "Client Error" and reason_phrase(699) == "Global Failure"


def test_identifiers_are_random_tokens() -> None:
    branches = {new_branch() for _ in range(100)}
    assert len(branches) == 100 and all(b.startswith("z9hG4bK") for b in branches)
    assert len({new_tag() for _ in range(100)}) == 100
    call_id = new_call_id("bridge.example.com")
    assert call_id.endswith("@bridge.example.com") and len(call_id) > 30
    via = Via.parse(f"SIP/2.0/UDP h;branch={new_branch()}")
    assert via.branch is not None and NameAddr.parse(f"<sip:a@b>;tag={new_tag()}").tag


# --- StreamFramer -----------------------------------------------------------------------

STREAM = [INVITE, OK_200, ACK, BYE, REGISTER_401]


def test_framer_coalesced_chunk_with_keepalives() -> None:
    framer = StreamFramer()
    blob = b"\r\n\r\n" + INVITE + b"\r\n" + OK_200 + ACK + b"\r\n\r\n"
    msgs = framer.feed(blob)
    assert msgs == [parse_message(INVITE), parse_message(OK_200), parse_message(ACK)]
    assert framer.buffered == 0


def test_framer_byte_by_byte() -> None:
    framer = StreamFramer()
    blob = b"".join(STREAM)
    out: list[SipMessage] = []
    for i in range(len(blob)):
        got = framer.feed(blob[i : i + 1])
        if got:  # a message completes exactly on its last byte
            assert blob[: i + 1].endswith(got[-1].body or b"\r\n\r\n")
        out += got
    assert out == [parse_message(m) for m in STREAM]
    assert framer.buffered == 0


def test_framer_requires_content_length_and_resets() -> None:
    framer = StreamFramer()
    with pytest.raises(SipParseError, match="Content-Length") as info:
        framer.feed(OPTIONS.replace(b"\n", b"\r\n"))
    assert info.value.status == 400
    with pytest.raises(SipParseError):  # stays broken: the boundaries are lost
        framer.feed(ACK)
    framer.reset()
    assert framer.feed(ACK) == [parse_message(ACK)]


def test_framer_size_caps() -> None:
    framer = StreamFramer(max_header=1024, max_body=100)
    with pytest.raises(SipParseError) as info:
        framer.feed(b"INVITE sip:a@b SIP/2.0\r\nX-Pad: " + b"a" * 2000)
    assert info.value.status == 413
    framer.reset()
    with pytest.raises(SipParseError) as info:
        framer.feed(swap(ACK, "Content-Length: 0", "Content-Length: 101"))
    assert info.value.status == 413
    framer.reset()
    assert framer.feed(ACK) == [parse_message(ACK)]  # within both caps


def test_framer_default_caps() -> None:
    framer = StreamFramer()
    assert framer.max_header == 16 * 1024 and framer.max_body == 64 * 1024
    with pytest.raises(SipParseError) as info:
        framer.feed(swap(ACK, "Content-Length: 0", f"Content-Length: {64 * 1024 + 1}"))
    assert info.value.status == 413


def test_framer_bad_message_after_good_one() -> None:
    framer = StreamFramer()
    bad = drop(BYE, "Call-ID:")
    got = framer.feed(ACK + bad + OK_200)
    assert got == [parse_message(ACK)]  # the good one first ...
    with pytest.raises(SipParseError, match="Call-ID"):
        framer.feed(b"")  # ... then the error
    assert framer.feed(b"") == [parse_message(OK_200)]  # framing was intact: go on


# --- fuzz -------------------------------------------------------------------------------


def check_parse(data: bytes) -> None:
    """Only SipParseError may escape; anything accepted must survive a round trip."""
    try:
        msg = parse_message(data)
    except SipParseError as exc:
        assert exc.status in (400, 413, 416, 505)
        return
    wire = msg.to_bytes()
    assert parse_message(wire) == msg


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_fuzz_random_bytes(data: bytes) -> None:
    check_parse(data)
    check_parse(b"INVITE sip:a@b SIP/2.0\r\n" + data)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(ALL)))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] = draw(st.sampled_from(b' \t\r\n:;,<>"\\@[]=/0aZ\x00\xff'))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 10))]
        else:
            del data[pos:]
    return bytes(data)


@settings(max_examples=600, deadline=None)
@given(mutated())
def test_fuzz_mutated_messages(data: bytes) -> None:
    check_parse(data)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=40), mutated())
def test_fuzz_framer_chunking(cuts: list[int], noise: bytes) -> None:
    blob = b"".join(STREAM)
    framer = StreamFramer()
    out: list[SipMessage] = []
    pos = 0
    for size in cuts * 20:
        out += framer.feed(blob[pos : pos + size])
        pos += size
        if pos >= len(blob):
            break
    out += framer.feed(blob[pos:])
    assert out == [parse_message(m) for m in STREAM]
    framer.reset()
    for chunk in (noise[: len(noise) // 2], noise[len(noise) // 2 :], b""):
        try:
            framer.feed(chunk)
        except SipParseError as exc:
            assert exc.status in (400, 413, 416, 505)

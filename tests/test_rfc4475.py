"""RFC 4475 torture messages (tests/data/rfc4475/*.dat) through the parser, the TCP framer and
the sans-I/O UA: each gets what the RFC asks for (parse, an error response, or a silent
drop) and nothing raises.  The expected behaviour per message is the table in
tests/data/rfc4475/README.md; ``EXPECT`` below is the same table in code."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

import pytest

from sip_bridge.config.loader import SipConfig, TimersConfig
from sip_bridge.sip.framing import StreamFramer
from sip_bridge.sip.message import (
    Headers,
    NameAddr,
    SipParseError,
    SipRequest,
    SipResponse,
    SipUri,
    parse_message,
)
from sip_bridge.sip.ua import BridgeUA, CallOffered, Send, UaEvent

DATA = Path(__file__).parent / "data" / "rfc4475"
SOURCE = ("127.0.0.1", 5070)
CONFIG = SipConfig(
    listen="127.0.0.1:5060",
    external_address="127.0.0.1",
    user_agent="sip-bridge-test",
    timers=TimersConfig(t1=0.01, t2=0.04, t4=0.05),
)
CALL = "call"  # the UA offers the call to the app (no final response yet)
DROP = None  # nothing is sent back
FRAMES = "frames"  # the TCP framer cuts the stream where parse_message does
# name -> (section, parser: status of the SipParseError or None when it parses,
#          UA answer to the UDP datagram, what the TCP framer does)
EXPECT: dict[str, tuple[str, int | None, int | str | None, str]] = {
    # 3.1.1 valid messages
    "wsinv": ("3.1.1.1", None, 481, FRAMES),
    "intmeth": ("3.1.1.2", None, 501, FRAMES),
    "esc01": ("3.1.1.3", None, CALL, FRAMES),
    "escnull": ("3.1.1.4", None, 405, FRAMES),
    "esc02": ("3.1.1.5", None, 501, FRAMES),
    "lwsdisp": ("3.1.1.6", None, 200, FRAMES),
    "longreq": ("3.1.1.7", None, CALL, FRAMES),
    "dblreq": ("3.1.1.8", None, 405, "two"),
    "semiuri": ("3.1.1.9", None, 200, FRAMES),
    "transports": ("3.1.1.10", None, 200, FRAMES),
    "mpart01": ("3.1.1.11", None, 405, FRAMES),
    "unreason": ("3.1.1.12", None, DROP, FRAMES),
    "noreason": ("3.1.1.13", None, DROP, FRAMES),
    # 3.1.2 invalid messages
    "badinv01": ("3.1.2.1", 400, 400, "error"),
    "clerr": ("3.1.2.2", 400, 400, "waits"),
    "ncl": ("3.1.2.3", 400, 400, "error"),
    "scalar02": ("3.1.2.4", 400, 400, "error"),
    "scalarlg": ("3.1.2.5", 400, DROP, "error"),
    "quotbal": ("3.1.2.6", 400, 400, "error"),
    "ltgtruri": ("3.1.2.7", 400, 400, "error"),
    "lwsruri": ("3.1.2.8", 400, 400, "error"),
    "lwsstart": ("3.1.2.9", None, CALL, FRAMES),  # liberal: extra SP ignored
    "trws": ("3.1.2.10", None, 200, FRAMES),  # liberal: trailing SP ignored
    "escruri": ("3.1.2.11", None, CALL, FRAMES),  # liberal: escaped headers ignored
    "baddate": ("3.1.2.12", None, CALL, FRAMES),  # Date is never read
    "regbadct": ("3.1.2.13", None, 405, FRAMES),  # REGISTER refused before Contact is read
    "badaspec": ("3.1.2.14", None, 200, FRAMES),  # liberal: spaces inside <> ignored
    "baddn": ("3.1.2.15", None, 200, FRAMES),  # liberal: unquoted display name kept
    "badvers": ("3.1.2.16", 505, 505, "error"),
    "mismatch01": ("3.1.2.17", 400, 400, "error"),
    "mismatch02": ("3.1.2.18", 400, 400, "error"),
    "bigcode": ("3.1.2.19", 400, DROP, "error"),
    # 3.2 transaction layer
    "badbranch": ("3.2.1", None, 200, FRAMES),
    # 3.3 application layer
    "insuf": ("3.3.1", 400, DROP, "error"),  # no Call-ID/From/To to build a response with
    "unkscm": ("3.3.2", None, 416, FRAMES),
    "novelsc": ("3.3.3", None, 416, FRAMES),
    "unksm2": ("3.3.4", None, 405, FRAMES),
    "bext01": ("3.3.5", None, 420, FRAMES),
    "invut": ("3.3.6", None, 415, FRAMES),
    "regaut01": ("3.3.7", None, 405, FRAMES),
    "multi01": ("3.3.8", 400, 400, "error"),
    "mcl01": ("3.3.9", 400, 400, "error"),
    "bcast": ("3.3.10", None, DROP, FRAMES),
    "zeromf": ("3.3.11", None, 200, FRAMES),  # an endpoint: Max-Forwards 0 is not a loop
    "cparam01": ("3.3.12", None, 405, FRAMES),
    "cparam02": ("3.3.13", None, 405, FRAMES),
    "regescrt": ("3.3.14", None, 405, FRAMES),
    "sdp01": ("3.3.15", None, 406, FRAMES),
    # 3.4 backward compatibility
    "inv2543": ("3.4.1", None, CALL, "error"),  # no Content-Length: unframeable on a stream
}
NAMES = sorted(EXPECT, key=lambda n: [int(p) for p in EXPECT[n][0].split(".")])


def load(name: str) -> bytes:
    return (DATA / f"{name}.dat").read_bytes()


def request(name: str) -> SipRequest:
    msg = parse_message(load(name))
    assert isinstance(msg, SipRequest)
    return msg


def make_ua() -> BridgeUA:
    return BridgeUA(CONFIG, 5060, "127.0.0.1", 0.0)


def finals(events: list[UaEvent]) -> list[SipResponse]:
    """The final responses the UA sent back to the source.

    Each parses, except where it echoes a header the request had malformed (badinv01's
    Via, scalar02's CSeq, quotbal's To): those are read with the lenient rules a sender
    uses to match its transaction, and must still carry the echoed lines verbatim.
    """
    out = []
    for ev in events:
        if not isinstance(ev, Send):
            continue
        assert ev.destination == SOURCE
        try:
            msg = parse_message(ev.data)
        except SipParseError:
            head = ev.data.split(b"\r\n\r\n", 1)[0].decode()
            status = int(head[8:11])
            assert head.startswith("SIP/2.0 ") and 400 <= status < 600, head
            fields = [line.split(":", 1) for line in head.split("\r\n")[1:]]
            msg = SipResponse(status, head[12:], Headers((n, v.strip()) for n, v in fields))
            for name in ("Via", "From", "To", "Call-ID", "CSeq"):
                assert msg.headers.get(name), name
        assert isinstance(msg, SipResponse), msg
        if msg.status >= 200:
            out.append(msg)
    return out


def outcome(events: list[UaEvent]) -> int | str | None:
    statuses = [r.status for r in finals(events)]
    offered = [e for e in events if isinstance(e, CallOffered)]
    assert len(statuses) + len(offered) <= 1, (statuses, offered)
    return statuses[0] if statuses else CALL if offered else DROP


def test_every_message_is_in_the_table() -> None:
    assert sorted(p.stem for p in DATA.glob("*.dat")) == sorted(EXPECT)
    readme = (DATA / "README.md").read_text()
    for name, (section, *_rest) in EXPECT.items():
        assert f"| {section} | `{name}` |" in readme, name


@pytest.mark.parametrize("name", NAMES)
def test_parser(name: str) -> None:
    status = EXPECT[name][1]
    if status is None:
        parse_message(load(name))
    else:
        with pytest.raises(SipParseError) as exc:
            parse_message(load(name))
        assert exc.value.status == status


@pytest.mark.parametrize("name", NAMES)
def test_ua_answers_the_datagram(name: str) -> None:
    ua = make_ua()
    events = ua.receive_bytes(load(name), SOURCE, "udp", 0.0)
    assert outcome(events) == EXPECT[name][2]
    for now in (1.0, 40.0, 100.0):  # timers run out without raising; nothing is left
        ua.tick(now)
    assert ua.transactions == 0 and ua.active_calls == 0


@pytest.mark.parametrize("name", NAMES)
def test_tcp_framing(name: str) -> None:
    data, framing, answer = load(name), EXPECT[name][3], EXPECT[name][2]
    framer = StreamFramer()
    if framing == "error":
        with pytest.raises(SipParseError):
            framer.feed(data)
            framer.feed(b"")  # an error after a good message surfaces here
        return
    messages = framer.feed(data)
    if framing == "waits":  # clerr: the body may still come; nothing to do yet
        assert messages == [] and framer.buffered == len(data)
        return
    if framing == "two":  # dblreq: on a stream the trailing INVITE is a message of its own
        assert [m.cseq[1] for m in messages if isinstance(m, SipRequest)] == ["REGISTER", "INVITE"]
        messages = messages[:1]
    [msg] = messages
    assert msg == parse_message(data)
    assert outcome(make_ua().receive_message(msg, SOURCE, "tcp", 0.0)) == answer


# --------------------------------------------------------------- fields the RFC stresses


def test_wsinv_folding_and_whitespace() -> None:
    msg = request("wsinv")
    assert msg.method == "INVITE"
    uri = SipUri.parse(msg.uri)
    assert (uri.user, uri.host, uri.params) == (
        "vivekg",
        "chair-dnrc.example.com",
        {"unknownparam": None},
    )
    to = NameAddr.parse(msg.headers.get("To") or "")
    assert to.uri == "sip:vivekg@chair-dnrc.example.com" and to.tag == "1918181833n"
    frm = NameAddr.parse(msg.headers.get("From") or "")
    assert frm.display == 'J Rosenberg \\"' and frm.tag == "98asjd8"
    assert msg.cseq == (9, "INVITE") and msg.headers.get("Max-Forwards") == "0068"
    assert [(v.transport, v.host, v.branch) for v in msg.via] == [
        ("UDP", "192.0.2.2", "390skdjuw"),
        ("TCP", "spindle.example.com", "z9hG4bK9ikj8"),
        ("UDP", "192.168.255.111", "z9hG4bK30239"),
    ]
    assert msg.headers.get("Subject") == ""
    assert msg.headers.get("NewFangledHeader") == "newfangled value continued newfangled value"
    assert msg.headers.get("UnknownHeaderWithUnusualValue") == ";;,,;;,;"
    [contact] = msg.headers.get_all("Contact")
    c = NameAddr.parse(contact)
    assert c.display == 'Quoted string ""' and c.uri == "sip:jdrosen@example.com"
    assert c.params == {"newparam": "newvalue", "secondparam": None, "q": "0.33"}
    assert len(msg.body) == 150 and msg.body.startswith(b"v=0\r\n")


def test_intmeth_token_characters_and_quoted_controls() -> None:
    msg = request("intmeth")
    assert msg.method == "!interesting-Method0123456789_*+`.%indeed'~"
    assert msg.cseq == (139122385, msg.method)
    assert msg.top_via.branch == "z9hG4bK-.!%66*_+`'~"
    to = NameAddr.parse(msg.headers.get("To") or "")
    assert to.display == "BEL:\x07 NUL:\x00 DEL:\x7f"
    frm = NameAddr.parse(msg.headers.get("From") or "")
    assert frm.display == "token1~` token2'+_ token3*%!.-"
    assert frm.params["fromparam''~+*_!.-%"] == '"работающий"'
    assert frm.tag == "_token~1'+`*%!-."
    assert msg.call_id == "intmeth.word%ZK-!.*_+'@word`~)(><:\\/\"][?}{"
    assert msg.headers.get("extensionHeader-!.%*+_`'~") == "\ufeff大停電"


def test_escapes_are_kept_and_do_not_split_uris() -> None:
    esc01 = request("esc01")
    ruri = SipUri.parse(esc01.uri)
    assert (ruri.user, ruri.host) == ("sips%3Auser%40example.com", "example.net")
    assert unquote(ruri.user or "") == "sips:user@example.com"
    to = SipUri.parse(NameAddr.parse(esc01.headers.get("To") or "").uri)
    assert unquote(to.user or "") == "user"
    contact = SipUri.parse(NameAddr.parse(esc01.headers.get("Contact") or "").uri)
    assert contact.params == {"%6c%72": None, "n%61me": "v%61lue%25%34%31"}
    escnull = request("escnull")
    users = [SipUri.parse(NameAddr.parse(c).uri).user for c in escnull.headers.get_all("Contact")]
    assert [unquote(u or "") for u in users] == ["\x00", "\x00\x00"]  # two distinct contacts
    semi = SipUri.parse(request("semiuri").uri)
    assert (semi.user, semi.host) == ("user;par=u%40example.net", "example.com")


def test_esc02_percent_is_not_an_escape_outside_uris() -> None:
    msg = request("esc02")
    assert msg.method == "RE%47IST%45R" and msg.cseq == (29344, "RE%47IST%45R")
    assert len(msg.headers.get_all("Contact")) == 2
    assert msg.headers.get("C%6Fntact") == "<sip:alias2@host2.example.com>"
    assert NameAddr.parse(msg.headers.get("To") or "").display == "%Z%45"


def test_long_values_and_many_vias() -> None:
    msg = request("longreq")
    vias = msg.via
    assert len(vias) == 34
    assert [v.host for v in vias[:33]] == [f"sip{i}.example.com" for i in range(33, 0, -1)]
    assert vias[33].received == "192.0.2.5" and len(vias[33].branch or "") == 4 + 200 + 11
    frm = NameAddr.parse(msg.headers.get("From") or "")
    assert frm.tag == "12" + "982" * 50 + "424"
    to = SipUri.parse(NameAddr.parse(msg.headers.get("To") or "").uri)
    assert to.port == 6000 and len(to.params) == 3


def test_datagram_noise_and_multipart_framing() -> None:
    dbl = request("dblreq")
    assert dbl.method == "REGISTER" and dbl.body == b""  # the INVITE after it is noise
    mp = request("mpart01")
    assert len(mp.body) == 553 and b"\x00" in mp.body
    assert mp.body.endswith(b"--7a9cbec02ceef655--\r\n")
    assert [v.transport for v in request("transports").via] == [
        "UDP",
        "SCTP",
        "TLS",
        "UNKNOWN",
        "TCP",
    ]
    accept = request("semiuri").headers.get_all("Accept")
    assert accept[-1] == "message/sipfrag" and len(accept) == 6


def test_responses_reason_phrases() -> None:
    unreason = parse_message(load("unreason"))
    assert isinstance(unreason, SipResponse) and unreason.status == 200
    assert unreason.reason == "= 2**3 * 5**2 но сто девяносто девять - простое"
    noreason = parse_message(load("noreason"))
    assert isinstance(noreason, SipResponse) and (noreason.status, noreason.reason) == (100, "")


def test_error_answers_name_the_transaction() -> None:
    """The 400/505 copy the request's Via, so the sender's transaction can match them."""
    for name in ("badinv01", "lwsruri", "badvers", "mcl01"):
        [resp] = finals(make_ua().receive_bytes(load(name), SOURCE, "udp", 0.0))
        raw_via = [v for n, v in resp.headers.items() if n == "Via"]
        assert raw_via and raw_via[0].startswith(("SIP/2.0", "SIP/7.0")), name
        assert resp.headers.get("Warning"), name


def test_application_answers_carry_their_explanations() -> None:
    [r416] = finals(make_ua().receive_bytes(load("unkscm"), SOURCE, "udp", 0.0))
    assert r416.status == 416
    [r420] = finals(make_ua().receive_bytes(load("bext01"), SOURCE, "udp", 0.0))
    assert r420.headers.get_all("Unsupported") == [
        "nothingSupportsThis",
        "nothingSupportsThisEither",
    ]
    [r415] = finals(make_ua().receive_bytes(load("invut"), SOURCE, "udp", 0.0))
    assert "application/sdp" in r415.headers.get_all("Accept")
    [r406] = finals(make_ua().receive_bytes(load("sdp01"), SOURCE, "udp", 0.0))
    assert "application/sdp" in r406.headers.get_all("Accept")
    [r501] = finals(make_ua().receive_bytes(load("intmeth"), SOURCE, "udp", 0.0))
    assert "INVITE" in r501.headers.get_all("Allow")

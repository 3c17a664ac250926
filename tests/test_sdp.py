"""Tests for sip_bridge.sip.sdp: RFC 4566 parse/serialize, RFC 3264 offer/answer.

The offers are written by hand in the shape real softphones, PBXs and carriers send.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sip_bridge.sip.offer_answer import (
    MediaConfig,
    accept_answer,
    answer,
    answered_media,
    bump_version,
    make_offer,
)
from sip_bridge.sip.sdp import (
    Connection,
    MediaDescription,
    NoCommonCodec,
    Origin,
    SdpCodec,
    SdpError,
    SessionDescription,
    parse_sdp,
)

LOCAL = MediaConfig(address="198.51.100.7", rtp_port=20000)


def crlf(text: str) -> str:
    return text.replace("\n", "\r\n")


BARESIP = crlf("""v=0
o=- 1580137321 2914219262 IN IP4 192.168.1.50
s=-
c=IN IP4 192.168.1.50
t=0 0
m=audio 10000 RTP/AVP 96 9 0 8 101
b=AS:128
a=rtpmap:96 opus/48000/2
a=fmtp:96 stereo=1;sprop-stereo=1
a=rtpmap:9 G722/8000
a=rtpmap:0 PCMU/8000
a=rtpmap:8 PCMA/8000
a=rtpmap:101 telephone-event/8000
a=fmtp:101 0-15
a=rtcp-rsize
a=ptime:20
a=sendrecv
""")

LINPHONE = crlf("""v=0
o=alice 3016 1817 IN IP4 192.168.0.23
s=Talk
c=IN IP4 192.168.0.23
t=0 0
a=rtcp-xr:rcvr-rtt=all:10000 stat-summary=loss,dup,jitt,TTL voip-metrics
m=audio 7078 RTP/AVP 96 97 98 0 8 18 101 99 100
a=rtpmap:96 opus/48000/2
a=fmtp:96 useinbandfec=1
a=rtpmap:97 speex/16000
a=fmtp:97 vbr=on
a=rtpmap:98 speex/8000
a=fmtp:98 vbr=on
a=fmtp:18 annexb=yes
a=rtpmap:101 telephone-event/48000
a=rtpmap:99 telephone-event/16000
a=rtpmap:100 telephone-event/8000
a=rtcp-fb:* trr-int 1000
m=video 9078 RTP/AVP 96
a=rtpmap:96 VP8/90000
a=rtcp-fb:* nack pli
""")

ASTERISK = crlf("""v=0
o=- 1883724519 1883724519 IN IP4 10.0.0.5
s=Asterisk
c=IN IP4 10.0.0.5
t=0 0
m=audio 17856 RTP/AVP 8 0 3 101
a=rtpmap:8 PCMA/8000
a=rtpmap:0 PCMU/8000
a=rtpmap:3 GSM/8000
a=rtpmap:101 telephone-event/8000
a=fmtp:101 0-16
a=ptime:20
a=maxptime:150
a=sendrecv
""")

# A trunk behind a session border controller that leaks its private media address and
# lists static PTs without rtpmap lines.
CARRIER = crlf("""v=0
o=Sonus_UAC 533393 266071 IN IP4 172.16.20.4
s=SIP Media Capabilities
c=IN IP4 172.16.20.4
t=0 0
m=audio 30172 RTP/AVP 18 0 101
a=rtpmap:101 telephone-event/8000
a=fmtp:101 0-15
a=ptime:30
a=sendrecv
""")

MEDIA_LEVEL_C = """v=0
o=user 1 1 IN IP4 203.0.113.9
s=call
t=0 0
m=audio 40000 RTP/AVP 0
c=IN IP4 203.0.113.10
a=rtcp:40001 IN IP4 203.0.113.10
"""  # bare LF on purpose

IPV6 = crlf("""v=0
o=- 42 42 IN IP6 2001:db8::1
s=-
c=IN IP6 2001:db8::1
t=0 0
m=audio 5004 RTP/AVP 8 101
a=rtpmap:101 telephone-event/8000
a=fmtp:101 0-16
""")

HOLD = crlf("""v=0
o=- 1883724519 1883724520 IN IP4 10.0.0.5
s=Asterisk
c=IN IP4 10.0.0.5
t=0 0
a=sendonly
m=audio 17856 RTP/AVP 0 101
a=rtpmap:0 PCMU/8000
a=rtpmap:101 telephone-event/8000
""")

TE_96_AND_101 = crlf("""v=0
o=FreeSWITCH 1700000000 1700000001 IN IP4 203.0.113.20
s=FreeSWITCH
c=IN IP4 203.0.113.20
t=0 0
m=audio 24000 RTP/AVP 102 0 8 101 96
a=rtpmap:102 opus/48000/2
a=rtpmap:0 PCMU/8000
a=rtpmap:8 PCMA/8000
a=rtpmap:101 telephone-event/48000
a=fmtp:101 0-16
a=rtpmap:96 telephone-event/8000
a=fmtp:96 0-15
a=ptime:20
""")

G729_ONLY = crlf("""v=0
o=- 7 7 IN IP4 203.0.113.30
s=-
c=IN IP4 203.0.113.30
t=0 0
m=audio 6000 RTP/AVP 18 101
a=rtpmap:18 G729/8000
a=fmtp:18 annexb=no
a=rtpmap:101 telephone-event/8000
""")

ALL_OFFERS = [BARESIP, LINPHONE, ASTERISK, CARRIER, MEDIA_LEVEL_C, IPV6, HOLD, TE_96_AND_101]


def audio(sdp: SessionDescription) -> MediaDescription:
    return next(m for m in sdp.media if m.media == "audio" and m.port)


# --------------------------------------------------------------------------- parsing


def test_parse_baresip_fields() -> None:
    sd = parse_sdp(BARESIP.encode())
    assert sd.origin == Origin("-", "1580137321", 2914219262, "192.168.1.50")
    assert sd.session_name == "-"
    assert sd.connection == Connection("192.168.1.50")
    m = sd.media[0]
    assert (m.media, m.port, m.proto) == ("audio", 10000, "RTP/AVP")
    assert m.formats == ["96", "9", "0", "8", "101"]
    assert m.extra == [("b", "AS:128")]
    assert m.codecs() == [
        SdpCodec(96, "opus", 48000, 2, "stereo=1;sprop-stereo=1"),
        SdpCodec(9, "G722", 8000),
        SdpCodec(0, "PCMU", 8000),
        SdpCodec(8, "PCMA", 8000),
        SdpCodec(101, "telephone-event", 8000, 1, "0-15"),
    ]
    assert m.ptime == 20
    assert m.direction == "sendrecv"
    assert m.has_attr("rtcp-rsize")


@pytest.mark.parametrize("text", ALL_OFFERS)
def test_round_trip_is_byte_exact_with_crlf(text: str) -> None:
    sd = parse_sdp(text)
    assert sd.to_str() == crlf(text.replace("\r\n", "\n"))
    assert parse_sdp(sd.to_bytes()) == sd


def test_static_payload_types_without_rtpmap() -> None:
    m = parse_sdp(CARRIER).media[0]
    assert [(c.payload_type, c.name) for c in m.codecs()] == [
        (18, "G729"),
        (0, "PCMU"),
        (101, "telephone-event"),
    ]


def test_unknown_dynamic_pt_and_non_rtp_formats_are_skipped() -> None:
    sd = parse_sdp("v=0\no=- 1 1 IN IP4 h\ns=-\nc=IN IP4 h\nm=audio 1 RTP/AVP 97 0 200 x\n")
    assert [c.payload_type for c in sd.media[0].codecs()] == [0]


def test_lf_and_crlf_mixed_and_blank_lines() -> None:
    text = "v=0\r\no=- 1 1 IN IP4 h\n\ns=x\r\nc=IN IP4 1.2.3.4\nt=0 0\r\nm=audio 9 RTP/AVP 0\n"
    sd = parse_sdp(text)
    assert sd.media[0].port == 9
    assert sd.connection_for(0) == Connection("1.2.3.4")


def test_unknown_lines_and_attributes_are_kept() -> None:
    text = crlf(
        "v=0\no=- 1 1 IN IP4 h\ns=-\ni=info\nu=http://x\ne=a@b\nc=IN IP4 h\nb=CT:64\n"
        "t=0 0\nr=7d 1h 0 25h\nk=prompt\na=group:BUNDLE 0\ny=unknown\n"
        "m=audio 9 RTP/AVP 0\ni=media info\nb=AS:64\na=x-custom:1 2\na=flag\n"
    )
    sd = parse_sdp(text)
    assert ("y", "unknown") in sd.extra
    assert ("group", "BUNDLE 0") in sd.attributes
    assert sd.media[0].attributes == [("x-custom", "1 2"), ("flag", None)]
    assert sd.to_str() == text


def test_media_level_connection_wins() -> None:
    text = crlf(
        "v=0\no=- 1 1 IN IP4 h\ns=-\nc=IN IP4 10.0.0.1\nt=0 0\n"
        "m=audio 1000 RTP/AVP 0\nc=IN IP4 10.0.0.2\nm=audio 2000 RTP/AVP 0\n"
    )
    sd = parse_sdp(text)
    assert sd.connection_for(0) == Connection("10.0.0.2")
    assert sd.connection_for(1) == Connection("10.0.0.1")


def test_multicast_ttl_and_port_count() -> None:
    sd = parse_sdp("v=0\no=- 1 1 IN IP4 h\ns=-\nc=IN IP4 224.2.1.1/127\nm=audio 49170/2 RTP/AVP 0")
    assert sd.connection is not None and sd.connection.host == "224.2.1.1"
    assert sd.media[0].port_count == 2
    assert "m=audio 49170/2 RTP/AVP 0" in sd.to_str()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("o=- 1 1 IN IP4 h\ns=-\n", "no v="),
        ("v=1\no=- 1 1 IN IP4 h\ns=-\n", "v=1"),
        ("v=0\ns=-\n", "no o="),
        ("v=0\no=- 1 1 IN IP4 h\n", "no s="),
        ("v=0\no=- 1 IN IP4 h\ns=-\n", "o= 5 fields"),
        ("v=0\no=- 1 x IN IP4 h\ns=-\n", "o= version not a number"),
        ("v=0\no=- 1 1 IN IP4 h\no=- 1 1 IN IP4 h\ns=-\n", "two o="),
        ("v=0\no=- 1 1 IN IP4 h\ns=-\nm=audio 9 RTP/AVP 0\n", "no c= anywhere"),
        ("v=0\no=- 1 1 IN IP4 h\ns=-\nc=IN IP4\nm=audio 9 RTP/AVP 0\n", "c= 2 fields"),
        ("v=0\no=- 1 1 IN IP4 h\ns=-\nc=IN IP4 h\nc=IN IP4 h\n", "two c="),
        ("v=0\no=- 1 1 IN IP4 h\ns=-\nc=IN IP4 h\nm=audio 70000 RTP/AVP 0\n", "port>65535"),
        ("v=0\no=- 1 1 IN IP4 h\ns=-\nc=IN IP4 h\nm=audio -1 RTP/AVP 0\n", "negative port"),
        ("v=0\no=- 1 1 IN IP4 h\ns=-\nc=IN IP4 h\nm=audio x RTP/AVP 0\n", "port not a number"),
        ("v=0\no=- 1 1 IN IP4 h\ns=-\nc=IN IP4 h\nm=audio 9/0 RTP/AVP 0\n", "port count 0"),
        ("v=0\no=- 1 1 IN IP4 h\ns=-\nc=IN IP4 h\nm=audio 9 RTP/AVP\n", "no formats"),
        ("v=0\no=- 1 1 IN IP4 h\ns=-\nc=IN IP4 h\nm=audio\n", "m= too short"),
        ("v=0\no=- 1 1 IN IP4 h\ns=-\ngarbage\n", "not a type=value line"),
        ("v=0\no=- 1 1 IN IP4 h\ns=-\n1=x\n", "type not a letter"),
    ],
)
def test_malformed_raises_sdp_error(text: str, why: str) -> None:
    with pytest.raises(SdpError) as info:
        parse_sdp(text)
    assert info.value.status == 400, why


def test_rejected_stream_needs_no_connection() -> None:
    sd = parse_sdp("v=0\no=- 1 1 IN IP4 h\ns=-\nm=video 0 RTP/AVP\n")
    assert sd.media[0].port == 0 and sd.media[0].formats == []


# --------------------------------------------------------------------------- answering


def negotiate(text: str, local: MediaConfig = LOCAL) -> tuple[SessionDescription, MediaDescription]:
    offer = parse_sdp(text)
    ans = answer(offer, local, session_id=77)
    # what we send must itself be valid SDP that parses back identically
    assert parse_sdp(ans.to_bytes()) == ans
    assert len(ans.media) == len(offer.media)
    return ans, audio(ans)


def test_answer_baresip_picks_first_supported_in_offer_order() -> None:
    ans, m = negotiate(BARESIP)
    assert m.formats == ["0", "101"]
    assert ("fmtp", "101 0-15") in m.attributes
    assert m.port == 20000 and m.ptime == 20 and m.direction == "sendrecv"
    assert ans.connection == Connection("198.51.100.7")
    assert (ans.origin.address, ans.origin.session_id, ans.origin.version) == (
        "198.51.100.7",
        "77",
        0,
    )
    neg = answered_media(parse_sdp(BARESIP), ans)
    assert (neg.remote_address, neg.remote_port) == ("192.168.1.50", 10000)
    assert (neg.payload_type, neg.codec, neg.clock_rate) == (0, "PCMU", 8000)
    assert neg.telephone_event_pt == neg.recv_telephone_event_pt == 101
    assert neg.can_send and neg.can_receive and neg.remote_is_private


def test_answer_linphone_rejects_video_in_place_and_picks_te_8000() -> None:
    ans, m = negotiate(LINPHONE)
    assert m.formats == ["0", "100"]
    assert not any(v and "telephone-event/48000" in v for _, v in m.attributes)
    video = ans.media[1]
    assert (video.media, video.port, video.proto, video.formats) == ("video", 0, "RTP/AVP", ["96"])
    assert "m=video 0 RTP/AVP 96\r\n" in ans.to_str()
    assert answered_media(parse_sdp(LINPHONE), ans).telephone_event_pt == 100


def test_answer_asterisk_offer_order_vs_local_preference() -> None:
    _, m = negotiate(ASTERISK)
    assert m.formats == ["8", "101"]
    assert ("fmtp", "101 0-16") in m.attributes
    prefer_ulaw = MediaConfig("198.51.100.7", 20000, codecs=("PCMU", "PCMA"), prefer_local=True)
    _, m = negotiate(ASTERISK, prefer_ulaw)
    assert m.formats == ["0", "101"]
    alaw_only = MediaConfig("198.51.100.7", 20000, codecs=("PCMA",))
    _, m = negotiate(BARESIP, alaw_only)
    assert m.formats == ["8", "101"]


def test_answer_carrier_private_address_and_ptime_30() -> None:
    ans, m = negotiate(CARRIER)
    assert m.formats == ["0", "101"] and m.ptime == 30
    neg = answered_media(parse_sdp(CARRIER), ans)
    assert neg.remote_address == "172.16.20.4" and neg.remote_is_private
    assert neg.ptime == 30
    # our advertised address is the configured one, never the peer's or a wildcard
    assert "c=IN IP4 198.51.100.7\r\n" in ans.to_str()
    assert "0.0.0.0" not in ans.to_str()


def test_answer_media_level_connection_and_rtcp() -> None:
    ans, m = negotiate(MEDIA_LEVEL_C)
    assert m.formats == ["0"]  # no telephone-event offered: none answered
    neg = answered_media(parse_sdp(MEDIA_LEVEL_C), ans)
    assert (neg.remote_address, neg.remote_port) == ("203.0.113.10", 40000)
    assert (neg.rtcp_port, neg.rtcp_address) == (40001, "203.0.113.10")
    assert neg.telephone_event_pt is None and neg.ptime == 20


def test_answer_ipv6() -> None:
    dual = MediaConfig("198.51.100.7", 20000, address6="2001:db8::7")
    ans, m = negotiate(IPV6, dual)
    assert ans.connection == Connection("2001:db8::7", "IP6")
    assert ans.origin.addrtype == "IP6"
    assert "c=IN IP6 2001:db8::7\r\n" in ans.to_str()
    assert m.formats == ["8", "101"]
    neg = answered_media(parse_sdp(IPV6), ans)
    assert neg.remote_address == "2001:db8::1"
    v6_only = MediaConfig("2001:db8::9", 20000)
    ans, _ = negotiate(IPV6, v6_only)
    assert ans.connection == Connection("2001:db8::9", "IP6")
    # an IPv4-only bridge still answers with its own (IPv4) address
    ans, _ = negotiate(IPV6)
    assert ans.connection == Connection("198.51.100.7", "IP4")


@pytest.mark.parametrize(
    ("offered", "answered", "send", "recv"),
    [
        ("sendrecv", "sendrecv", True, True),
        ("sendonly", "recvonly", False, True),
        ("recvonly", "sendonly", True, False),
        ("inactive", "inactive", False, False),
    ],
)
def test_direction_mirroring(offered: str, answered: str, send: bool, recv: bool) -> None:
    text = ASTERISK.replace("a=sendrecv", f"a={offered}")
    ans, m = negotiate(text)
    assert m.direction == answered
    neg = answered_media(parse_sdp(text), ans)
    assert (neg.can_send, neg.can_receive) == (send, recv)
    assert neg.direction == answered


def test_session_level_sendonly_hold() -> None:
    ans, m = negotiate(HOLD)
    assert m.direction == "recvonly"
    neg = answered_media(parse_sdp(HOLD), ans)
    assert not neg.can_send and neg.can_receive
    # a media-level direction overrides the session-level one
    _, m = negotiate(HOLD.replace("a=rtpmap:0", "a=sendrecv\r\na=rtpmap:0"))
    assert m.direction == "sendrecv"


def test_old_style_hold_with_null_address() -> None:
    text = ASTERISK.replace("c=IN IP4 10.0.0.5", "c=IN IP4 0.0.0.0")
    ans, m = negotiate(text)
    assert m.direction == "recvonly"
    assert not answered_media(parse_sdp(text), ans).can_send


def test_telephone_event_at_96_and_101() -> None:
    _, m = negotiate(TE_96_AND_101)
    assert m.formats == ["0", "96"]  # 101 is the 48 kHz one paired with Opus
    assert ("rtpmap", "96 telephone-event/8000") in m.attributes
    assert ("fmtp", "96 0-15") in m.attributes
    both_8k = TE_96_AND_101.replace("101 telephone-event/48000", "101 telephone-event/8000")
    _, m = negotiate(both_8k)
    assert m.formats == ["0", "101"]  # first in the offer's m= order


def test_telephone_event_disabled() -> None:
    _, m = negotiate(BARESIP, MediaConfig("198.51.100.7", 20000, telephone_event=False))
    assert m.formats == ["0"]


@pytest.mark.parametrize(
    ("offered", "expect"), [("10", 10), ("40", 40), ("60", 60), ("25", 20), ("20.0", 20)]
)
def test_ptime_choice(offered: str, expect: int) -> None:
    _, m = negotiate(BARESIP.replace("a=ptime:20", f"a=ptime:{offered}"))
    assert m.ptime == expect
    assert m.attr("ptime") == str(expect)


def test_maxptime_caps_ptime() -> None:
    text = CARRIER.replace("a=ptime:30", "a=ptime:60\r\na=maxptime:40")
    _, m = negotiate(text)
    assert m.ptime == 40


def test_rtcp_mux_echoed_only_when_enabled() -> None:
    text = BARESIP.replace("a=rtcp-rsize", "a=rtcp-mux")
    _, m = negotiate(text)
    assert not m.has_attr("rtcp-mux")
    muxing = MediaConfig("198.51.100.7", 20000, rtcp_mux=True)
    ans, m = negotiate(text, muxing)
    assert m.has_attr("rtcp-mux")
    assert answered_media(parse_sdp(text), ans).rtcp_mux


def test_g729_only_is_488_with_warning() -> None:
    with pytest.raises(NoCommonCodec) as info:
        answer(parse_sdp(G729_ONLY), LOCAL)
    err = info.value
    assert err.status == 488 and err.warn_code == 305
    warning = err.warning("bridge.example.com")
    assert warning.startswith('305 bridge.example.com "')
    assert "G729/8000" in warning and warning.endswith('"')
    assert warning.count('"') == 2


def test_no_audio_or_only_srtp_or_stereo() -> None:
    video_only = LINPHONE.split("m=audio")[0] + "m=video" + LINPHONE.split("m=video")[1]
    with pytest.raises(NoCommonCodec) as info:
        answer(parse_sdp(video_only), LOCAL)
    assert info.value.warn_code == 304
    with pytest.raises(NoCommonCodec) as info:
        answer(parse_sdp(ASTERISK.replace("RTP/AVP", "RTP/SAVP")), LOCAL)
    assert info.value.warn_code == 302
    stereo = ASTERISK.replace("PCMA/8000", "PCMA/8000/2").replace("8 0 3", "8 3")
    with pytest.raises(NoCommonCodec):
        answer(parse_sdp(stereo), LOCAL)


def test_first_usable_audio_stream_is_taken_the_rest_rejected() -> None:
    text = crlf(
        "v=0\no=- 1 1 IN IP4 h\ns=-\nc=IN IP4 192.0.2.1\nt=0 0\n"
        "m=audio 0 RTP/AVP 0\nm=audio 1000 RTP/AVP 18\nm=audio 2000 RTP/AVP 8\n"
        "m=audio 3000 RTP/AVP 0\nm=application 4000 UDP/BFCP *\n"
    )
    ans, _ = negotiate(text)
    assert [m.port for m in ans.media] == [0, 0, 20000, 0, 0]
    assert ans.media[4].formats == ["*"]
    assert answered_media(parse_sdp(text), ans).remote_port == 2000


def test_reinvite_keeps_session_id_and_bumps_version_only_on_change() -> None:
    first = answer(parse_sdp(ASTERISK), LOCAL, session_id=9, version=3)
    same = answer(parse_sdp(ASTERISK), LOCAL, previous=first)
    assert (same.origin.session_id, same.origin.version) == ("9", 3)
    assert same == first
    held = answer(parse_sdp(ASTERISK.replace("sendrecv", "sendonly")), LOCAL, previous=first)
    assert (held.origin.session_id, held.origin.version) == ("9", 4)


def test_local_config_validation() -> None:
    for bad in ("0.0.0.0", "::", "", "a b"):
        with pytest.raises(ValueError):
            MediaConfig(bad, 20000)
    with pytest.raises(ValueError):
        MediaConfig("192.0.2.1", 0)
    with pytest.raises(ValueError):
        MediaConfig("192.0.2.1", 20000, codecs=("G729",))
    with pytest.raises(ValueError):
        MediaConfig("192.0.2.1", 20000, ptime=25)
    assert MediaConfig("pbx.example.com", 20000, codecs=("pcma",)).codecs == ("PCMA",)


# --------------------------------------------------------------------------- offering


OUR_OFFER = make_offer(LOCAL, session_id=1234, version=0)


def test_make_offer_content() -> None:
    assert OUR_OFFER.to_str() == crlf(
        "v=0\no=sip-bridge 1234 0 IN IP4 198.51.100.7\ns=sip-bridge\n"
        "c=IN IP4 198.51.100.7\nt=0 0\nm=audio 20000 RTP/AVP 0 8 101\n"
        "a=rtpmap:0 PCMU/8000\na=rtpmap:8 PCMA/8000\na=rtpmap:101 telephone-event/8000\n"
        "a=fmtp:101 0-16\na=ptime:20\na=sendrecv\n"
    )
    held = make_offer(LOCAL, 1234, 1, direction="sendonly")
    assert audio(held).direction == "sendonly"
    v6 = make_offer(MediaConfig("2001:db8::7", 20000), 1)
    assert "c=IN IP6 2001:db8::7\r\n" in v6.to_str()
    with pytest.raises(ValueError):
        make_offer(LOCAL, 1, direction="both")


def test_bump_version_copies() -> None:
    bumped = bump_version(OUR_OFFER)
    assert bumped.origin.version == 1 and OUR_OFFER.origin.version == 0
    assert bumped.origin.session_id == OUR_OFFER.origin.session_id
    assert bump_version(bumped).origin.version == 2


def peer_answer(body: str) -> SessionDescription:
    return parse_sdp(
        crlf("v=0\no=peer 5 5 IN IP4 192.0.2.50\ns=-\nc=IN IP4 192.0.2.50\nt=0 0\n") + crlf(body)
    )


def test_delayed_offer_round_trip_with_our_own_answerer() -> None:
    peer = MediaConfig("192.0.2.50", 30000, codecs=("PCMA", "PCMU"), prefer_local=True)
    ans = answer(parse_sdp(OUR_OFFER.to_bytes()), peer, session_id=5)
    neg = accept_answer(OUR_OFFER, parse_sdp(ans.to_bytes()))
    assert (neg.remote_address, neg.remote_port, neg.payload_type, neg.codec) == (
        "192.0.2.50",
        30000,
        8,
        "PCMA",
    )
    assert neg.telephone_event_pt == 101 and neg.direction == "sendrecv" and neg.ptime == 20


def test_accept_answer_te_pt_differs_and_direction() -> None:
    ans = peer_answer(
        "m=audio 31000 RTP/AVP 0 96\na=rtpmap:96 telephone-event/8000\na=ptime:30\na=recvonly\n"
    )
    neg = accept_answer(OUR_OFFER, ans)
    assert neg.telephone_event_pt == 96 and neg.recv_telephone_event_pt == 101
    assert neg.ptime == 30
    assert neg.direction == "sendonly" and neg.can_send and not neg.can_receive


def test_accept_answer_multiple_codecs_takes_answer_order() -> None:
    neg = accept_answer(OUR_OFFER, peer_answer("m=audio 31000 RTP/AVP 8 0\n"))
    assert neg.payload_type == 8 and neg.telephone_event_pt is None


@pytest.mark.parametrize(
    "body",
    [
        "m=audio 31000 RTP/AVP 18\n",  # codec we did not offer
        "m=audio 31000 RTP/AVP 0 100\na=rtpmap:100 telephone-event/16000\n",
        "m=audio 31000 RTP/AVP 0\nm=video 0 RTP/AVP 31\n",  # extra m= line
        "m=video 31000 RTP/AVP 31\n",  # media type changed
        "m=audio 31000 RTP/SAVP 0\n",  # transport changed
        "m=audio 31000 RTP/AVP 96\na=rtpmap:96 telephone-event/8000\n",  # DTMF only
    ],
)
def test_accept_answer_rejects_invalid(body: str) -> None:
    with pytest.raises(SdpError) as info:
        accept_answer(OUR_OFFER, peer_answer(body))
    assert not isinstance(info.value, NoCommonCodec)


def test_accept_answer_rejected_audio_is_no_common_codec() -> None:
    with pytest.raises(NoCommonCodec):
        accept_answer(OUR_OFFER, peer_answer("m=audio 0 RTP/AVP 0\n"))


# --------------------------------------------------------------------------- properties

_TOKEN = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=8)
_FREE = st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters="\r\n"), max_size=12
)
_ATTR = st.tuples(_TOKEN.filter(lambda s: ":" not in s), st.none() | _FREE)


@st.composite
def descriptions(draw: st.DrawFn) -> SessionDescription:
    def extra(types: str, rank: str) -> list[tuple[str, str]]:
        lines = draw(st.lists(st.tuples(st.sampled_from(types), _FREE), max_size=4))
        return sorted(lines, key=lambda kv: rank.index(kv[0]) if kv[0] in rank else len(rank))

    media = []
    for _ in range(draw(st.integers(0, 3))):
        conn = draw(st.none() | st.builds(Connection, _TOKEN, _TOKEN, _TOKEN))
        media.append(
            MediaDescription(
                draw(_TOKEN),
                draw(st.integers(0, 65535)),
                draw(_TOKEN),
                draw(st.lists(_TOKEN, min_size=1, max_size=4)),
                draw(st.none() | st.integers(1, 99)),
                conn,
                draw(st.lists(_ATTR, max_size=4)),
                extra("ibkxy", "ibk"),
            )
        )
    origin = Origin(
        draw(_TOKEN),
        str(draw(st.integers(0, 2**63))),
        draw(st.integers(0, 2**63)),
        draw(_TOKEN),
        draw(_TOKEN),
        draw(_TOKEN),
    )
    return SessionDescription(
        origin,
        draw(_FREE),
        Connection(draw(_TOKEN)),
        draw(st.lists(_ATTR, max_size=4)),
        media,
        extra("iuepbtrzkxy", "iuepbtrzk"),
    )


@settings(max_examples=300, deadline=None)
@given(descriptions())
def test_serialize_parse_round_trip(sd: SessionDescription) -> None:
    assert parse_sdp(sd.to_bytes()) == sd
    assert parse_sdp(sd.to_str()).to_str() == sd.to_str()


def _exercise(data: str | bytes) -> None:
    """Parse and negotiate; anything other than SdpError propagates and fails the test."""
    try:
        sd = parse_sdp(data)
    except SdpError:
        return
    with contextlib.suppress(SdpError):
        answered_media(sd, answer(sd, LOCAL, session_id=1))
    with contextlib.suppress(SdpError):
        accept_answer(OUR_OFFER, sd)
    assert parse_sdp(sd.to_str()) == sd


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=300) | st.binary(max_size=300))
def test_fuzz_random_text_only_raises_sdp_error(data: str | bytes) -> None:
    _exercise(data)


_LINE_HEADS = [
    "v=0", "o=- 1 1 IN IP4 ", "s=", "c=IN IP4 ", "c=IN IP6 ", "t=0 0", "m=audio ", "m=video ",
    "m=audio 4000 RTP/AVP ", "m=audio 4000 RTP/AVP 0 ", "m=video 0 RTP/AVP ",
    "a=rtpmap:", "a=fmtp:", "a=ptime:", "a=maxptime:", "a=rtcp:", "a=sendonly", "a=recvonly",
    "a=inactive", "a=rtcp-mux", "b=AS:", "x=",
]  # fmt: skip
_PIECES = st.sampled_from(
    ["0", "8", "18", "96", "101", "127", "128", "65535", "70000", "RTP/AVP", "RTP/SAVP",
     "PCMU/8000", "PCMA/8000/2", "telephone-event/8000", "telephone-event/48000", "0-16",
     "0.0.0.0", "::", "192.0.2.1", " ", "/", ":", "-1", "20", "1e9", "nan", "\t", "\u00b2"]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(_LINE_HEADS), st.lists(_PIECES, max_size=6)),
        max_size=14,
    )
)
def test_fuzz_structured_only_raises_sdp_error(lines: list[tuple[str, list[str]]]) -> None:
    text = "v=0\no=- 1 1 IN IP4 h\ns=-\nc=IN IP4 192.0.2.9\n" + "\n".join(
        head + " ".join(pieces) for head, pieces in lines
    )
    _exercise(text)

"""Which SRTP mode an incoming call gets: its trunk's ``srtp``, else ``[sip] srtp``.

Driven through the sans-I/O UA (the helpers of tests/test_ua.py): a trunk that requires
SRTP refuses a plain RTP offer with 488 even when the bridge's default is "optional", and
answers a secure offer (or a delayed offer) with RTP/SAVP and our own key.
"""

from __future__ import annotations

from dataclasses import replace

from test_ua import BARESIP_SDP, CONFIG, invite_text, make_ua, offer_call, responses

from sip_bridge.sip.sdp import parse_sdp
from sip_bridge.sip.ua import Admission, BridgeUA

CALLER = ("192.168.1.20", 5060)
KEY = "WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz"  # 30 bytes, base64: RFC 4568's example
SAVP_SDP = BARESIP_SDP.replace("RTP/AVP", "RTP/SAVP") + (
    f"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{KEY}\r\n"
)


def _status(ua: BridgeUA, sdp: str | None) -> int | None:
    events = ua.receive_bytes(invite_text(sdp=sdp).encode(), CALLER, "udp", 0.0)
    finals = [r.status for r in responses(events) if r.status >= 200]
    return finals[0] if finals else None


def test_sip_srtp_required_refuses_plain_rtp_and_answers_savp() -> None:
    ua = make_ua(replace(CONFIG, srtp="required"))
    events = ua.receive_bytes(invite_text().encode(), CALLER, "udp", 0.0)
    [refused] = [r for r in responses(events) if r.status >= 200]
    assert refused.status == 488 and (refused.headers.get("Warning") or "").startswith("302 ")
    offered, _ = offer_call(make_ua(replace(CONFIG, srtp="required")), invite_text(sdp=SAVP_SDP))
    assert offered.offer is not None


def test_sip_srtp_off_refuses_a_secure_only_offer() -> None:
    assert _status(make_ua(replace(CONFIG, srtp="off")), SAVP_SDP) == 488
    assert _status(make_ua(replace(CONFIG, srtp="off")), BARESIP_SDP) is None  # offered


def test_the_trunks_mode_wins_over_the_default() -> None:
    ua = make_ua(replace(CONFIG, srtp="optional"))
    ua.admit = lambda req, source, now: Admission(trunk="carrier", srtp="required")
    assert _status(ua, BARESIP_SDP) == 488
    ua = make_ua(replace(CONFIG, srtp="required"))
    ua.admit = lambda req, source, now: Admission(trunk="pbx", srtp="off")
    assert _status(ua, BARESIP_SDP) is None  # this trunk sends plain RTP, and that is fine


def test_answers_carry_our_own_key_and_a_delayed_offer_is_secure() -> None:
    ua = make_ua(replace(CONFIG, srtp="required"))
    offered, _ = offer_call(ua, invite_text(sdp=SAVP_SDP))
    [ok] = responses(ua.answer(offered.call_id, 30000, 0.1), 200)
    sdp = parse_sdp(ok.body)
    [audio] = sdp.media
    assert audio.proto == "RTP/SAVP"
    text = ok.body.decode()
    assert "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" in text and KEY not in text

    ua = make_ua(replace(CONFIG, srtp="required"))
    offered, _ = offer_call(ua, invite_text(call_id="c2@x", sdp=None))
    [ok] = responses(ua.answer(offered.call_id, 30002, 0.1), 200)
    [audio] = parse_sdp(ok.body).media
    assert audio.proto == "RTP/SAVP" and b"a=crypto:" in ok.body

"""SDES-SRTP: a=crypto in SDP (RFC 4568), offer/answer by mode, libsrtp round trips, and a
call's media over loopback UDP where tampered, replayed and plain packets are dropped."""

from __future__ import annotations

import asyncio
import base64
import os
import random
from pathlib import Path

import numpy as np
import pytest

from agent import CallInfo, EchoAgent
from resample import ulaw_decode, ulaw_encode
from sip_bridge.config.loader import ConfigError, load_config, parse_config_text
from sip_bridge.media.call_media import CallMedia, MediaParams
from sip_bridge.media.rtp import RtpPacket, RtpSender
from sip_bridge.media.rtp_ports import RtpPortPool
from sip_bridge.media.srtp import SrtpContext, SrtpKeys
from sip_bridge.sip.offer_answer import (
    MediaConfig,
    accept_answer,
    answer,
    answered_media,
    make_offer,
)
from sip_bridge.sip.sdp import CryptoAttribute, NoCommonCodec, SdpError, parse_sdp

KEY = bytes(range(30))
KEY_B64 = base64.b64encode(KEY).decode()
S80, S32 = "AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32"


def _offer(proto: str = "RTP/SAVP", *cryptos: str) -> str:
    lines = [
        "v=0", "o=peer 1 1 IN IP4 192.0.2.5", "s=-", "c=IN IP4 192.0.2.5", "t=0 0",
        f"m=audio 40000 {proto} 0 101", "a=rtpmap:0 PCMU/8000",
        "a=rtpmap:101 telephone-event/8000", *[f"a=crypto:{c}" for c in cryptos],
        "a=sendrecv",
    ]  # fmt: skip
    return "\r\n".join(lines) + "\r\n"


def _local(srtp: str = "optional") -> MediaConfig:
    return MediaConfig("198.51.100.7", 20000, srtp=srtp)


# ------------------------------------------------------------------ a=crypto lines


def test_crypto_lines_parse_and_serialise_back() -> None:
    c = CryptoAttribute.parse(f"1 {S80} inline:{KEY_B64}|2^20|1:4")
    assert (c.tag, c.suite, c.key_salt, c.lifetime, c.mki) == (1, S80, KEY, "2^20", "1:4")
    assert not c.supported  # MKI: libsrtp through pylibsrtp cannot do it
    assert CryptoAttribute.parse(c.to_str()) == c
    plain = CryptoAttribute.parse(f"7 {S32} inline:{KEY_B64}")
    assert plain.supported and plain.to_str() == f"7 {S32} inline:{KEY_B64}"
    other = CryptoAttribute.parse(f"2 AES_256_CM_HMAC_SHA1_80 inline:{KEY_B64 * 2}")
    assert not other.supported  # a suite we do not do: readable, not acceptable
    assert not CryptoAttribute.parse(f"3 {S80} inline:{KEY_B64} UNENCRYPTED_SRTP").supported


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (f"{S80} inline:{KEY_B64}", "needs"),  # no tag
        (f"x1 {S80} inline:{KEY_B64}", "needs"),
        (f"1 {S80} {KEY_B64}", "inline"),
        (f"1 {S80} uri:{KEY_B64}", "inline"),
        (f"1 {S80} inline:", "inline"),
        (f"1 {S80} inline:not*base64!", "base64"),
        (f"1 {S80} inline:{base64.b64encode(bytes(16)).decode()}", "30 bytes, got 16"),
        (f"1 {S80} inline:{KEY_B64}|2^x", "lifetime or MKI"),
        (f"1 {S80} inline:{KEY_B64}|1:2|3:4", "lifetime or MKI"),
        (f"1 {S80} inline:{KEY_B64};inline:{KEY_B64}", "several keys"),
    ],
)
def test_bad_crypto_lines_say_what_is_wrong(value: str, words: str) -> None:
    with pytest.raises(SdpError) as err:
        CryptoAttribute.parse(value)
    assert words in str(err.value)
    m = parse_sdp(_offer("RTP/SAVP", value)).media[0]
    assert m.cryptos() == ([], [str(err.value)])  # left out of the stream, with the reason


# ------------------------------------------------------------------ offer/answer by mode


def test_answer_picks_the_first_usable_crypto_and_sends_its_own_fresh_key() -> None:
    offer = parse_sdp(
        _offer(
            "RTP/SAVP",
            f"1 {S80} inline:bad",  # malformed
            f"2 AES_256_CM_HMAC_SHA1_80 inline:{KEY_B64 * 2}",  # unsupported suite
            f"3 {S80} inline:{KEY_B64}|1:4",  # MKI
            f"4 {S32} inline:{KEY_B64}",
            f"5 {S80} inline:{KEY_B64}",
        )
    )
    local = _local()
    ans = answer(offer, local)
    m = ans.media[0]
    assert m.proto == "RTP/SAVP"
    [ours], _ = m.cryptos()
    assert (ours.tag, ours.suite) == (4, S32) and ours.key_salt != KEY
    neg = answered_media(offer, ans)
    assert neg.srtp == SrtpKeys(S32, ours.key_salt, KEY, 4)
    # a second call (a new MediaConfig) gets another key; the same call keeps its own
    again = answer(offer, _local()).media[0].cryptos()[0][0]
    assert again.key_salt != ours.key_salt
    assert answer(offer, local).media[0].cryptos()[0][0].key_salt == ours.key_salt
    assert KEY_B64 not in repr(neg.srtp) and "srtp_key" not in repr(local)  # no keys in logs


def test_optional_answers_plain_rtp_and_best_effort_crypto_on_avp() -> None:
    plain = answer(parse_sdp(_offer("RTP/AVP")), _local())
    assert plain.media[0].proto == "RTP/AVP" and not plain.media[0].has_attr("crypto")
    assert answered_media(parse_sdp(_offer("RTP/AVP")), plain).srtp is None
    best = parse_sdp(_offer("RTP/AVP", f"1 {S80} inline:{KEY_B64}"))
    ans = answer(best, _local())
    assert ans.media[0].proto == "RTP/AVP" and ans.media[0].has_attr("crypto")
    assert answered_media(best, ans).srtp is not None


@pytest.mark.parametrize(
    ("mode", "sdp", "words"),
    [
        ("required", _offer("RTP/AVP"), "no usable a=crypto"),
        ("required", _offer("RTP/SAVP", f"1 {S80} inline:short"), "base64"),
        ("optional", _offer("RTP/SAVP"), "no usable a=crypto"),
        ("optional", _offer("RTP/SAVPF", f"1 F8_128_HMAC_SHA1_80 inline:{KEY_B64}"), "unsup"),
        ("off", _offer("RTP/SAVP", f"1 {S80} inline:{KEY_B64}"), "only secure"),
    ],
)
def test_offers_we_cannot_serve_securely_get_488(mode: str, sdp: str, words: str) -> None:
    with pytest.raises(NoCommonCodec) as err:
        answer(parse_sdp(sdp), _local(mode))
    assert err.value.status == 488 and err.value.warn_code == 302
    assert words in err.value.warning()


def test_off_ignores_best_effort_crypto_and_required_accepts_savpf() -> None:
    ans = answer(parse_sdp(_offer("RTP/AVP", f"1 {S80} inline:{KEY_B64}")), _local("off"))
    assert not ans.media[0].has_attr("crypto")
    offer = parse_sdp(_offer("RTP/SAVPF", f"9 {S80} inline:{KEY_B64}"))
    ans = answer(offer, _local("required"))
    assert ans.media[0].proto == "RTP/SAVPF"
    assert answered_media(offer, ans).srtp is not None


def test_required_offers_savp_and_checks_the_answer() -> None:
    uac, uas = _local("required"), _local("optional")
    offer = make_offer(uac, 1234)
    m = offer.media[0]
    assert m.proto == "RTP/SAVP"
    cryptos, bad = m.cryptos()
    assert not bad and [(c.tag, c.suite) for c in cryptos] == [(1, S80), (2, S32)]
    assert cryptos[0].key_salt != cryptos[1].key_salt  # one key per suite
    assert make_offer(uac, 1234, 1).media[0].cryptos()[0] == cryptos  # re-offer: same keys
    ans = answer(offer, uas)
    mine = accept_answer(offer, ans).srtp
    theirs = answered_media(offer, ans).srtp
    assert mine is not None and theirs is not None
    assert (mine.local_key, mine.remote_key) == (theirs.remote_key, theirs.local_key)
    assert mine.suite == S80
    plain = parse_sdp(ans.to_str().replace("a=crypto", "a=x-crypto"))
    with pytest.raises(NoCommonCodec, match="no a=crypto matching ours"):
        accept_answer(offer, plain)


# ------------------------------------------------------------------ libsrtp round trips


def _pair(suite: str = S80) -> tuple[SrtpContext, SrtpContext]:
    a, b = os.urandom(30), os.urandom(30)
    return SrtpContext(SrtpKeys(suite, a, b)), SrtpContext(SrtpKeys(suite, b, a))


@pytest.mark.parametrize("suite", [S80, S32])
def test_protect_unprotect_round_trip_rtp_and_rtcp(suite: str) -> None:
    us, peer = _pair(suite)
    sender = RtpSender(0, rng=random.Random(1))
    for k in range(5):
        rtp = sender.next_packet(bytes([k]) * 160, 160)
        wire = us.protect(rtp)
        assert wire is not None and wire != rtp and rtp[12:] not in wire
        assert len(wire) == len(rtp) + (10 if suite == S80 else 4)
        assert peer.unprotect(wire) == rtp
    sr = b"\x80\xc8\x00\x06" + sender.ssrc.to_bytes(4, "big") + bytes(20)
    wire = peer.protect_rtcp(sr)
    assert wire is not None and us.unprotect(wire) == sr  # rtcp-mux: told apart by PT
    assert us.unprotect_rtcp(peer.protect_rtcp(sr) or b"") == sr
    assert peer.counters() == {
        "srtp_protected": 2, "srtp_unprotected": 5, "srtp_auth_fail": 0, "srtp_replay": 0,
    }  # fmt: skip


def test_tampered_replayed_plain_and_junk_packets_are_dropped_and_counted() -> None:
    us, peer = _pair()
    sender = RtpSender(0, rng=random.Random(2))
    first = us.protect(sender.next_packet(b"\x01" * 160, 160))
    assert first is not None and peer.unprotect(first) is not None
    tampered = bytearray(us.protect(sender.next_packet(b"\x02" * 160, 160)) or b"")
    tampered[40] ^= 0x01
    assert peer.unprotect(bytes(tampered)) is None
    assert peer.unprotect(first) is None  # replay
    plain = sender.next_packet(b"\x03" * 160, 160)
    assert peer.unprotect(plain) is None  # SRTP-less injection
    for junk in (b"", b"\x80", bytes(12), os.urandom(3000)):
        assert peer.unprotect(junk) is None  # never raises
    assert peer.unprotect_rtcp(b"\x80\xc8\x00\x01" + bytes(4)) is None
    c = peer.counters()
    assert c["srtp_replay"] == 1 and c["srtp_auth_fail"] == 7 and c["srtp_unprotected"] == 1


# ------------------------------------------------------------------ a call's media path


async def _srtp_call() -> tuple[CallMedia, list[bytes], dict[str, int], SrtpContext]:
    loop = asyncio.get_running_loop()
    host = "127.0.0.1"
    got: list[bytes] = []

    class Phone(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
            got.append(data)

    phone_t, _ = await loop.create_datagram_endpoint(Phone, local_addr=(host, 0))
    thief_t, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, (host, 0))
    ours, theirs = os.urandom(30), os.urandom(30)
    phone = SrtpContext(SrtpKeys(S80, theirs, ours))
    params = MediaParams(
        host, phone_t.get_extra_info("sockname")[1], latch=True, local_host=host,
        srtp=SrtpKeys(S80, ours, theirs),
    )  # fmt: skip
    low = random.Random().randrange(30000, 60000, 2)
    media = CallMedia(EchoAgent(delay_s=0.1), RtpPortPool(low, low + 199), params, CallInfo("s"))
    dest = (host, await media.start())
    sender = RtpSender(0, rng=random.Random(3))
    tone = (9000 * np.sin(2 * np.pi * 800 * np.arange(160 * 60) / 8000)).astype(np.int16)
    sent = {"tampered": 0, "replayed": 0, "injected": 0}
    sent["phone_port"] = phone_t.get_extra_info("sockname")[1]
    t0 = loop.time()
    for k in range(60):
        await asyncio.sleep(max(0.0, t0 + 0.02 * k - loop.time()))
        payload = ulaw_encode(tone[160 * k : 160 * k + 160]).tobytes()
        pkt = phone.protect(sender.next_packet(payload, 160))
        assert pkt is not None
        if k % 10 == 5:  # a forgery first (after the real one it would count as a replay)
            bad = bytearray(pkt)
            bad[20] ^= 0x40  # a payload bit: the auth tag no longer matches
            phone_t.sendto(bytes(bad), dest)
        phone_t.sendto(pkt, dest)
        if k % 10 == 5:
            phone_t.sendto(pkt, dest)  # the same packet again
            loud = ulaw_encode(np.full(160, 30000, np.int16)).tobytes()
            fake = RtpPacket(0, sender.sequence, sender.timestamp, sender.ssrc, loud)
            thief_t.sendto(fake.serialize(), dest)  # plain RTP from elsewhere: no takeover
            sent["tampered"] += 1
            sent["replayed"] += 1
            sent["injected"] += 1
    await asyncio.sleep(0.3)
    await media.close("test over")
    phone_t.close()
    thief_t.close()
    heard = [phone.unprotect(d) for d in got]
    return media, [h for h in heard if h is not None], sent, phone


def test_a_call_with_srtp_echoes_in_clear_only_to_its_peer_and_drops_the_rest() -> None:
    media, heard, sent, phone = asyncio.run(_srtp_call())
    st = media.stats
    assert heard, "nothing came back"
    assert phone.auth_fail == 0  # every packet the bridge sent was SRTP with its key
    rtp = [RtpPacket.parse(h) for h in heard if h[1] & 0x7F == 0]
    pcm = np.concatenate([ulaw_decode(p.payload) for p in rtp]).astype(np.float64)
    loud = pcm[np.abs(pcm) > 3000]
    assert loud.size > 160 * 20
    seg = pcm[np.flatnonzero(np.abs(pcm) > 3000)[0] + 800 :][: 160 * 20]
    spec = np.abs(np.fft.rfft(seg * np.hanning(seg.size)))
    assert abs(int(np.argmax(spec)) * 8000 / seg.size - 800) < 10
    assert np.abs(pcm).max() < 12000  # the thief's full-scale frames never played
    assert st.srtp_auth_fail == sent["tampered"] + sent["injected"]
    assert st.srtp_replay == sent["replayed"]
    assert st.srtp_unprotected == st.packets_in == 60
    assert st.srtp_protected >= len(rtp)
    assert st.latched and st.remote == ("127.0.0.1", sent["phone_port"])
    assert st.wrong_source == 0  # the thief's packets failed SRTP before any source check


def test_srtp_mode_config_keys_are_checked_with_file_line_and_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert parse_config_text('[sip]\nsrtp = "required"\n').sip.srtp == "required"
    with pytest.raises(ConfigError) as err:
        parse_config_text('[sip]\nsrtp = "maybe"\n', "b.toml")
    assert (err.value.path, err.value.line, err.value.key) == ("b.toml", 2, "sip.srtp")
    trunk = '[[trunks]]\nname = "c"\nacl = ["192.0.2.0/24"]\nsrtp = "required"\n'
    path = tmp_path / "bridge.toml"
    path.write_text(trunk)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert (err.value.line, err.value.key) == (4, "trunks[1].srtp")
    assert str(path) in str(err.value) and "tls" in str(err.value)
    for extra in ('transport = "tls"\n', "srtp_without_tls = true\n"):
        caplog.clear()
        path.write_text(trunk + extra)
        assert load_config(path).trunks[0].srtp == "required"
        warned = "SRTP keys (SDES) will travel in clear UDP" in caplog.text
        assert warned == ("without" in extra), caplog.text
    path.write_text(trunk.replace("required", "mandatory"))
    with pytest.raises(ConfigError, match=r"trunks\[1\].srtp: 'mandatory' is not one of"):
        load_config(path)


def test_random_crypto_lines_raise_only_sdp_error() -> None:
    rng = random.Random(4568)
    parts = ["1", "x", S80, S32, "inline:", KEY_B64, "|", "2^31", "1:4", ";", " ", "é", "=="]
    for _ in range(3000):
        value = "".join(rng.choice(parts) for _ in range(rng.randrange(1, 9)))
        try:
            c = CryptoAttribute.parse(value)
        except SdpError:
            continue
        assert CryptoAttribute.parse(c.to_str()) == c

"""SDES-SRTP with a real peer: baresip (Debian `baresip-core` 1.0.0, its `srtp` module).

baresip's account runs ``mediaenc=srtp-mand``: it offers and answers RTP/SAVP with
``a=crypto`` only and drops any packet that fails SRTP authentication, so the tone it
hears back proves the bridge sent SRTP with the key its answer gave. baresip calls the
bridge over TLS (SDES keys must not travel in clear SIP), and the bridge calls baresip
(``sip-bridge call`` with ``srtp = "required"``). Audio is checked by frequency both ways;
forged and plain RTP sent to the bridge's port during the call are dropped and counted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import ipaddress
import os
import socket
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sip_bridge.config.config_types import TlsConfig
from sip_bridge.media.rtp import RtpPacket
from sip_bridge.script.caller import CallOptions, place_call
from testkit.peers.baresip import Baresip
from testkit.peers.support import (
    HearingBridgeThread,
    assert_tone,
    bridge_config,
    dominant_hz,
    free_udp_port,
    loud_runs,
    read_wav,
    steady_tone,
    wait_until,
    write_tone,
)

HOST = "127.0.0.1"
SRTP_ON = r"SRTP is Enabled \(cryptosuite=AES_CM_128_HMAC_SHA1_80\)"


def _self_signed(d: Path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key (baresip 1.0.0 does not check it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)])
    now = datetime.datetime.now(datetime.UTC)
    san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(san, critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = d / "bridge.cert", d / "bridge.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path)


def _free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _forge(port: int) -> int:
    """Plain RTP and SRTP-looking packets with a wrong tag at the bridge's RTP port."""
    loud = bytes([0x80]) * 160  # mu-law near full scale: audible if it ever got through
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for k in range(5):
            s.sendto(RtpPacket(0, 1000 + k, 160 * k, 0x1234, loud).serialize(), (HOST, port))
            s.sendto(RtpPacket(0, 2000 + k, 0, 0x5678, loud).serialize() + os.urandom(10),
                     (HOST, port))  # fmt: skip
    return 10


def test_baresip_calls_over_tls_with_srtp_and_forged_packets_are_dropped(tmp_path: Path) -> None:
    tone = tmp_path / "tone.wav"
    write_tone(tone, 1000, seconds=10.0)
    cert, key = _self_signed(tmp_path)
    tls_port = _free_tcp_port()
    cfg = bridge_config()
    tls = TlsConfig(port=tls_port, certificate=cert, private_key=key)
    bridge = HearingBridgeThread(
        dataclasses.replace(cfg, sip=dataclasses.replace(cfg.sip, tls=tls))
    )
    bridge.start()
    try:
        phone = Baresip(tmp_path / "baresip", tone, mediaenc="srtp-mand")
        try:
            mark = phone.send(f"/dial sip:echo@{HOST}:{tls_port};transport=tls")
            phone.wait_for(SRTP_ON, start=mark)
            phone.wait_for("Call established", start=mark)
            time.sleep(2.0)
            [before] = bridge.live_stats()
            forged = _forge(before.local_port)
            wait_until(lambda: bridge.live_stats()[0].srtp_auth_fail >= forged)
            time.sleep(1.5)
            [st] = bridge.live_stats()
            mark = phone.send("/hangup")
            phone.wait_for("terminated", start=mark)
        finally:
            phone.close()
        heard = bridge.heard()
    finally:
        bridge.stop()
    assert "transport=tls" in phone.reader.text()
    # Every forgery was dropped; more failures can only be strays from outside the call (a
    # shared machine's earlier peer still sending to a reused port): baresip lost nothing.
    assert st.srtp_auth_fail >= forged and st.srtp_replay == 0
    assert st.jitter.lost == 0 and st.jitter.duplicates == 0
    # every packet the bridge took in (RTP, and SRTCP once baresip's first report is due)
    # passed SRTP authentication; it sent only SRTP
    assert st.packets_in + st.rtcp.rtcp_in == st.srtp_unprotected
    assert st.srtp_unprotected > before.srtp_unprotected + 50
    assert st.srtp_protected >= st.packets_out > 100
    assert st.wrong_ssrc == 0 and st.malformed == 0  # the forgeries never reached RTP parsing
    # The bridge heard baresip's tone (decrypted), and no forged full-scale frame...
    runs = loud_runs(heard)
    longest = max(runs, key=lambda r: r[1] - r[0])
    assert longest[1] - longest[0] >= 100, runs
    seg = steady_tone(heard, longest)
    assert abs(dominant_hz(seg) - 1000) < 10 and abs(heard).max() < 0.5
    # ...and baresip (srtp-mand: it drops what fails authentication) heard the echo.
    assert_tone(phone.heard(), 1000)


def test_bridge_calls_baresip_offering_srtp(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours.wav", tmp_path / "theirs.wav"
    record = tmp_path / "heard.wav"
    write_tone(ours, 500, seconds=4.0)
    write_tone(theirs, 1100, seconds=8.0)
    phone = Baresip(tmp_path / "baresip", theirs, autoanswer=True, mediaenc="srtp-mand")
    low = free_udp_port(even=True)
    try:
        opts = CallOptions(
            phone.uri, ours, record, duration_s=3.0, rtp_ports=(low, low + 1),
            local_host=HOST, srtp="required",
        )  # fmt: skip
        result = asyncio.run(asyncio.wait_for(place_call(opts), 30))
        phone.wait_for("terminated")
    finally:
        phone.close()
    assert result.answered and result.media is not None, result
    assert result.media.srtp is not None and result.media.srtp.suite.endswith("_80")
    phone.wait_for(SRTP_ON)
    assert_tone(record, 1100)
    x = read_wav(phone.heard())
    assert loud_runs(x), "baresip heard nothing"
    assert_tone(phone.heard(), 500)

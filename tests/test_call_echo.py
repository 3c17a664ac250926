"""A whole call through the running bridge: SIP over UDP, a tone on RTP, the echo decoded.

The test is a minimal phone: it sends an INVITE with its own RTP port in the
SDP, ACKs the 200, streams a 1 kHz PCMU tone with 20 ms pacing, records what
comes back, and hangs up. It checks what was heard: the tone's frequency and
level, and that it starts the configured echo delay after ours.
"""

from __future__ import annotations

import asyncio
import random
import socket
from dataclasses import replace

import numpy as np

from resample import ulaw_decode, ulaw_encode
from sip_bridge.config.loader import BridgeConfig
from sip_bridge.media.rtp import RtpPacket, RtpSender
from sip_bridge.server import BridgeServer
from sip_bridge.sip.message import SipResponse, parse_message
from sip_bridge.sip.sdp import parse_sdp
from testkit.phone import phone_request

ECHO_DELAY_S = 0.4


def _request(method: str, port: int, local: int, rtp: int, cseq: int, to_tag: str = "") -> bytes:
    return phone_request(
        method, port, local, cseq, rtp=rtp, to_tag=to_tag, call_id="echo-test-call",
        telephone_event=True,
    )  # fmt: skip


async def _recv_final(sock: socket.socket) -> SipResponse:
    loop = asyncio.get_running_loop()
    while True:
        msg = parse_message(await asyncio.wait_for(loop.sock_recv(sock, 65535), 5))
        if isinstance(msg, SipResponse) and msg.status >= 200:
            return msg


def test_caller_hears_its_tone_echoed_after_the_configured_delay() -> None:
    """...while 200 garbage datagrams hit the SIP port and the call's RTP port."""
    base = BridgeConfig.line_check()
    config = replace(
        base,
        sip=replace(base.sip, listen="127.0.0.1:0"),
        rtp=replace(base.rtp, ports="44000-44099"),
        agent=replace(base.agent, echo_delay_s=ECHO_DELAY_S),
    )

    async def main() -> tuple[np.ndarray, np.ndarray, float]:
        server = BridgeServer(config)
        await server.start()
        loop = asyncio.get_running_loop()
        sip = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rtp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            for s in (sip, rtp):
                s.bind(("127.0.0.1", 0))
                s.setblocking(False)
            local, rtp_port = sip.getsockname()[1], rtp.getsockname()[1]
            sip.sendto(
                _request("INVITE", server.port, local, rtp_port, 1), ("127.0.0.1", server.port)
            )
            ok = await _recv_final(sip)
            assert ok.status == 200
            to_tag = (ok.headers.get("To") or "").split("tag=")[1]
            answer = parse_sdp(ok.body)
            conn = answer.connection_for(0)
            assert conn is not None and conn.host == "127.0.0.1"
            bridge_rtp = ("127.0.0.1", answer.media[0].port)
            sip.sendto(
                _request("ACK", server.port, local, rtp_port, 1, to_tag), ("127.0.0.1", server.port)
            )
            # 1.5 s of tone, then 1 s of silence, paced on absolute 20 ms deadlines.
            t = np.arange(int(8000 * 1.5)) / 8000
            tone = (0.25 * 32767 * np.sin(2 * np.pi * 1000 * t)).astype(np.int16)
            audio = np.concatenate([tone, np.zeros(8000, np.int16)])
            sender = RtpSender(0, rng=random.Random(1))
            received: list[tuple[float, np.ndarray]] = []

            async def listen() -> None:
                while True:
                    data = await loop.sock_recv(rtp, 2048)
                    pkt = RtpPacket.parse(data)
                    if pkt.payload_type == 0:
                        got = ulaw_decode(np.frombuffer(pkt.payload, np.uint8))
                        received.append((loop.time(), got))

            listener = asyncio.create_task(listen())
            # Hostile noise at both ports mid-call: it must not disturb the call.
            rng = random.Random(7)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as noise:
                for n in range(200):
                    junk = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300)))
                    if n % 4 == 0:  # SIP-looking garbage too
                        junk = b"INVITE sip:x SIP/2.0\r\nVia: ???\r\n\r\n" + junk
                    noise.sendto(junk, ("127.0.0.1", server.port))
                    noise.sendto(junk, bridge_rtp)
            t0 = loop.time()
            for k in range(len(audio) // 160):
                await asyncio.sleep(max(0.0, t0 + 0.02 * k - loop.time()))
                frame = ulaw_encode(audio[k * 160 : (k + 1) * 160]).tobytes()
                rtp.sendto(sender.next_packet(frame, 160), bridge_rtp)
            await asyncio.sleep(0.3)
            listener.cancel()
            sip.sendto(
                _request("BYE", server.port, local, rtp_port, 2, to_tag), ("127.0.0.1", server.port)
            )
            assert (await _recv_final(sip)).status == 200
            # One call, set up and ended once; the garbage created nothing.
            assert server.stats == {"offered": 1, "established": 1, "ended": 1}
            assert server.ua is not None and server.ua.active_calls == 0
        finally:
            sip.close()
            rtp.close()
            await server.stop()
        times = np.array([r[0] - t0 for r in received])
        pcm = np.concatenate([r[1] for r in received]) if received else np.zeros(0, np.int16)
        frames = np.array([r[1] for r in received]) if received else np.zeros((0, 160))
        rms = np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1)) if len(frames) else times
        onset = float(times[np.argmax(rms > 0.1 * 0.25 * 32767 / np.sqrt(2))]) if len(rms) else -1
        return pcm, rms, onset

    pcm, rms, onset = asyncio.run(main())
    assert rms.max() > 0, "no echo came back"
    # The echo starts the configured delay after our tone (plus jitter buffer and pacing).
    assert ECHO_DELAY_S <= onset <= ECHO_DELAY_S + 0.15, onset
    # ...and it is our tone: 1 kHz, at the level we sent (-15 dBFS peak), cleanly.
    loud = pcm[np.repeat(rms > 0.5 * rms.max(), 160)].astype(np.float64) / 32767
    spec = np.abs(np.fft.rfft(loud * np.hanning(len(loud))))
    freq = np.argmax(spec) * 8000 / len(loud)
    assert abs(freq - 1000) < 5, freq
    level = np.sqrt(2 * np.mean(loud**2))
    assert abs(20 * np.log10(level / 0.25)) < 1.0
    band = spec[int(950 * len(loud) / 8000) : int(1050 * len(loud) / 8000)]
    assert 10 * np.log10(np.sum(band**2) / (np.sum(spec**2) - np.sum(band**2))) > 25

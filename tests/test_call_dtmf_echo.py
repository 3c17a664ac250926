"""Keys through the running bridge: a phone presses RFC 4733 digits, the echo presses them back.

SIP over UDP from a raw socket (an INVITE offering telephone-event); the phone's media is an
in-process CallMedia whose agent presses ``159#`` at the start and keeps the key presses it
hears. The bridge's echo agent must press back every key, in order, as RFC 4733 events.
"""

from __future__ import annotations

import asyncio
import random
import socket
from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from agent import Agent, AgentEvent, AgentOutput, CallInfo, DtmfEvent
from sip_bridge.config.loader import BridgeConfig
from sip_bridge.media.call_media import CallMedia, MediaParams, reserve_rtp_port
from sip_bridge.media.rtp_ports import RtpPortPool
from sip_bridge.server import BridgeServer
from sip_bridge.sip.message import SipResponse, parse_message
from sip_bridge.sip.sdp import parse_sdp
from testkit.phone import phone_request

KEYS = "159#"


class KeyPhone(Agent):
    name = "phone"

    def __init__(self) -> None:
        self.heard: list[DtmfEvent] = []

    async def start(self, call: CallInfo, output: AgentOutput) -> None:
        output.send_dtmf(KEYS)

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        pass

    def on_event(self, event: AgentEvent) -> None:
        if isinstance(event, DtmfEvent):
            self.heard.append(event)


async def _final(sock: socket.socket) -> SipResponse:
    loop = asyncio.get_running_loop()
    while True:
        msg = parse_message(await asyncio.wait_for(loop.sock_recv(sock, 65535), 5))
        if isinstance(msg, SipResponse) and msg.status >= 200:
            return msg


def test_phone_keys_come_back_as_rfc4733_from_the_echo() -> None:
    base = BridgeConfig.line_check()
    config = replace(
        base,
        sip=replace(base.sip, listen="127.0.0.1:0"),
        rtp=replace(base.rtp, ports="44200-44299"),
    )

    async def main() -> tuple[KeyPhone, CallMedia, dict[str, int]]:
        server = BridgeServer(config)
        await server.start()
        sip = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sip.bind(("127.0.0.1", 0))
        sip.setblocking(False)
        local = sip.getsockname()[1]
        low = random.Random().randrange(30000, 60000, 2)
        pool = RtpPortPool(low, low + 199)
        lease = await reserve_rtp_port(pool, "127.0.0.1")
        phone = KeyPhone()
        media: CallMedia | None = None
        bridge = ("127.0.0.1", server.port)

        def req(method: str, cseq: int, tag: str = "") -> bytes:
            return phone_request(
                method, server.port, local, cseq, rtp=lease.port, to_tag=tag,
                call_id="dtmf-echo-call", telephone_event=True,
            )  # fmt: skip

        try:
            sip.sendto(req("INVITE", 1), bridge)
            ok = await _final(sip)
            assert ok.status == 200
            tag = (ok.headers.get("To") or "").split("tag=")[1]
            answer = parse_sdp(ok.body)
            assert "telephone-event/8000" in ok.body.decode()
            sip.sendto(req("ACK", 1, tag), bridge)
            params = MediaParams("127.0.0.1", answer.media[0].port, telephone_event_pt=101)
            media = CallMedia(phone, pool, params, lease=lease)
            await media.start()
            deadline = asyncio.get_running_loop().time() + 5
            while len(phone.heard) < len(KEYS) and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            sip.sendto(req("BYE", 2, tag), bridge)
            assert (await _final(sip)).status == 200
            stats = dict(server.stats)
        finally:
            if media is not None:
                await media.close("test over")
            else:
                await lease.aclose()
            sip.close()
            await server.stop()
        return phone, media, stats

    phone, media, stats = asyncio.run(main())
    assert [e.digit for e in phone.heard] == list(KEYS)
    assert all(e.duration_ms == 100.0 for e in phone.heard)  # the echo's 100 ms presses
    assert media.stats.dtmf_digits_sent == len(KEYS)
    assert stats == {"offered": 1, "established": 1, "ended": 1}

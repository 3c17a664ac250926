"""CallMedia.update() mid-call over real loopback UDP: hold, unhold, a new remote port.

What a re-INVITE changes must take effect on the wire without dropping the call: on hold
no RTP leaves for a whole second, after it RTP resumes with the marker bit and a timestamp
that kept running; after a port change RTP arrives at the new port only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import socket

import pytest

from agent import CallInfo, EchoAgent
from sip_bridge.config.loader import BridgeConfig
from sip_bridge.media.call_media import CallMedia, MediaParams
from sip_bridge.media.rtp import RtpPacket, RtpSender, looks_like_rtcp
from sip_bridge.media.rtp_ports import RtpPortPool
from sip_bridge.media.rtp_receiver import LATCH_PACKETS
from sip_bridge.server import BridgeServer
from sip_bridge.sip.message import SipResponse, parse_message
from testkit.phone import phone_request

HOST = "127.0.0.1"
FRAME = 160


def _pool() -> RtpPortPool:
    low = random.Random().randrange(30000, 60000, 2)
    return RtpPortPool(low, low + 199)


class Sock(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.rtp: list[tuple[float, RtpPacket]] = []

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if not looks_like_rtcp(data):
            self.rtp.append((asyncio.get_running_loop().time(), RtpPacket.parse(data)))


async def _phone() -> tuple[asyncio.DatagramTransport, Sock, int]:
    loop = asyncio.get_running_loop()
    t, s = await loop.create_datagram_endpoint(Sock, local_addr=(HOST, 0))
    return t, s, t.get_extra_info("sockname")[1]


async def _media(port: int) -> tuple[CallMedia, MediaParams]:
    params = MediaParams(HOST, port, local_host=HOST)
    media = CallMedia(EchoAgent(delay_s=0.1), _pool(), params, CallInfo(call_id="u"))
    await media.start()
    return media, params


def test_hold_stops_rtp_and_unhold_resumes_with_marker() -> None:
    async def main() -> None:
        t, phone, port = await _phone()
        media, params = await _media(port)
        try:
            await asyncio.sleep(0.3)
            assert len(phone.rtp) >= 5  # sending silence before the hold
            media.update(dataclasses.replace(params, send=False))  # peer sent a=sendonly
            await asyncio.sleep(0.05)  # a packet already in flight may still land
            n = len(phone.rtp)
            last = phone.rtp[-1][1]
            await asyncio.sleep(1.0)
            assert len(phone.rtp) == n, "RTP sent while on hold"
            assert media.stats.sending is False
            held_at = asyncio.get_running_loop().time()
            media.update(params)
            await asyncio.sleep(0.2)
            resumed = [p for tm, p in phone.rtp[n:]]
            assert len(resumed) >= 3
            first = resumed[0]
            assert first.marker
            assert not any(p.marker for p in resumed[1:])
            assert first.sequence == (last.sequence + 1) & 0xFFFF  # no sequence gap
            gap = ((first.timestamp - last.timestamp) & 0xFFFF_FFFF) / 8000
            assert 1.0 <= gap <= 1.0 + (asyncio.get_running_loop().time() - held_at) + 0.3
            assert media.stats.sending is True
        finally:
            await media.close()
            t.close()

    asyncio.run(main())


def test_remote_port_change_moves_rtp() -> None:
    async def main() -> None:
        t1, old, port1 = await _phone()
        t2, new, port2 = await _phone()
        media, params = await _media(port1)
        try:
            await asyncio.sleep(0.2)
            assert old.rtp and not new.rtp
            media.update(dataclasses.replace(params, remote_port=port2))
            await asyncio.sleep(0.05)
            n_old = len(old.rtp)
            await asyncio.sleep(0.4)
            assert len(old.rtp) == n_old
            assert len(new.rtp) >= 10
            assert media.stats.remote == (HOST, port2)
            # the new address is the one audio is accepted from now
            sender = RtpSender(0, rng=random.Random(5))
            for _ in range(5):
                t1.sendto(sender.next_packet(b"\xff" * FRAME, FRAME), (HOST, media.local_port))
                t2.sendto(sender.next_packet(b"\xff" * FRAME, FRAME), (HOST, media.local_port))
            await asyncio.sleep(0.1)
            assert media.stats.packets_accepted == 5
            assert media.stats.wrong_source == 5
        finally:
            await media.close()
            t1.close()
            t2.close()

    asyncio.run(main())


def test_not_receiving_ignores_audio_and_latch_relatches_after_move() -> None:
    async def main() -> None:
        t1, _, port1 = await _phone()
        t2, new, _ = await _phone()
        media, params = await _media(port1)
        sender = RtpSender(0, rng=random.Random(9))
        dest = (HOST, media.local_port)
        try:
            media.update(dataclasses.replace(params, receive=False))  # peer: a=recvonly
            for _ in range(5):
                t1.sendto(sender.next_packet(b"\xff" * FRAME, FRAME), dest)
            await asyncio.sleep(0.1)
            assert media.stats.packets_in == 5 and media.stats.packets_accepted == 0
            assert media.stats.receiving is False
            # back to sendrecv, latching, with an SDP address nobody sends from
            media.update(dataclasses.replace(params, remote_port=9, latch=True))
            for _ in range(5):
                t2.sendto(sender.next_packet(b"\xff" * FRAME, FRAME), dest)
            await asyncio.sleep(0.2)
            st = media.stats
            # the first LATCH_PACKETS - 1 prove the new source before we latch onto it
            assert st.packets_accepted == 5 - (LATCH_PACKETS - 1) and st.latched
            assert st.remote == (HOST, t2.get_extra_info("sockname")[1])
            assert new.rtp  # our RTP followed the latch
        finally:
            await media.close()
            t1.close()
            t2.close()

    asyncio.run(main())


def test_ptime_change_is_refused_and_nothing_applied() -> None:
    async def main() -> None:
        t, _, port = await _phone()
        media, params = await _media(port)
        try:
            with pytest.raises(ValueError, match="ptime"):
                media.update(dataclasses.replace(params, ptime_ms=30, send=False))
            assert media.params == params and media.stats.sending
        finally:
            await media.close()
            t.close()

    asyncio.run(main())


def _sip(
    method: str, server: int, local: int, cseq: int, rtp: int, direction: str, tag: str
) -> bytes:
    return phone_request(
        method, server, local, cseq, rtp=rtp, to_tag=tag, call_id="reinvite-test",
        direction=direction or None, sdp_version=cseq,
    )  # fmt: skip


def test_server_applies_reinvite_hold_and_new_port() -> None:
    low = random.Random().randrange(30000, 60000, 2)
    base = BridgeConfig.line_check()
    config = dataclasses.replace(
        base,
        sip=dataclasses.replace(base.sip, listen="127.0.0.1:0"),
        rtp=dataclasses.replace(base.rtp, ports=f"{low}-{low + 99}"),
    )

    async def main() -> None:
        server = BridgeServer(config)
        await server.start()
        loop = asyncio.get_running_loop()
        sip = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        ta, a, port_a = await _phone()
        tb, b, port_b = await _phone()
        dest = ("127.0.0.1", server.port)

        async def final() -> SipResponse:
            while True:
                raw = await asyncio.wait_for(loop.sock_recv(sip, 65535), 5)
                msg = parse_message(raw)
                if isinstance(msg, SipResponse) and msg.status >= 200:
                    return msg

        async def invite(cseq: int, rtp: int, direction: str, tag: str) -> SipResponse:
            sip.sendto(_sip("INVITE", server.port, local, cseq, rtp, direction, tag), dest)
            ok = await final()
            assert ok.status == 200
            tag = tag or (ok.headers.get("To") or "").split("tag=")[1]
            sip.sendto(_sip("ACK", server.port, local, cseq, rtp, direction, tag), dest)
            return ok

        try:
            sip.bind(("127.0.0.1", 0))
            sip.setblocking(False)
            local = sip.getsockname()[1]
            ok = await invite(1, port_a, "sendrecv", "")
            tag = (ok.headers.get("To") or "").split("tag=")[1]
            await asyncio.sleep(0.4)
            assert len(a.rtp) >= 5 and not b.rtp
            ok = await invite(2, port_b, "sendonly", tag)  # hold, and move to port B
            assert b"a=recvonly" in ok.body
            await asyncio.sleep(0.1)
            n_a = len(a.rtp)
            await asyncio.sleep(1.0)
            assert len(a.rtp) == n_a and not b.rtp, "RTP while on hold"
            await invite(3, port_b, "sendrecv", tag)  # unhold
            await asyncio.sleep(0.4)
            assert len(a.rtp) == n_a
            assert len(b.rtp) >= 5 and b.rtp[0][1].marker
            sip.sendto(_sip("BYE", server.port, local, 4, port_b, "", tag), dest)
            assert (await final()).status == 200
            assert server.stats == {"offered": 1, "established": 1, "ended": 1}
        finally:
            sip.close()
            ta.close()
            tb.close()
            await server.stop()

    asyncio.run(main())

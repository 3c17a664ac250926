"""CallMedia's RTCP over real loopback UDP: reports both ways, RTT, rtcp-mux, BYE on close.

A test phone sends paced RTP with every 10th packet left out, receives the session's
sender reports, answers with a receiver report that echoes LSR/DLSR, and checks what the
session says about the phone's stream and what the session made of the phone's report.
``rtcp_rand=lambda: 0.0`` makes the schedule predictable: first report ~1.0 s after start.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from agent import CallInfo, EchoAgent
from sip_bridge.media.call_media import CallMedia, MediaParams
from sip_bridge.media.rtcp import (
    Bye,
    ReceiverReport,
    ReportBlock,
    RtcpPacket,
    SenderReport,
    SourceDescription,
    ntp_middle32,
    parse_compound,
    serialize_compound,
)
from sip_bridge.media.rtp import RtpPacket, RtpSender, looks_like_rtcp
from sip_bridge.media.rtp_ports import RtpPortPool

HOST = "127.0.0.1"
FRAME = 160
PHONE_SSRC = 0x1234_5678


def _pool() -> RtpPortPool:
    low = random.Random().randrange(30000, 60000, 2)
    return RtpPortPool(low, low + 199)


class Sock(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.rtp: list[RtpPacket] = []
        self.rtcp: list[tuple[float, list[RtcpPacket]]] = []

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        now = asyncio.get_running_loop().time()
        if looks_like_rtcp(data):
            self.rtcp.append((now, parse_compound(data)))
        else:
            self.rtp.append(RtpPacket.parse(data))


def _sender_reports(sock: Sock) -> list[tuple[float, SenderReport]]:
    return [(t, p) for t, c in sock.rtcp for p in c if isinstance(p, SenderReport)]


async def _wait(cond: object, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond() and loop.time() < end:  # type: ignore[operator]
        await asyncio.sleep(0.02)


async def _scenario(mux: bool) -> None:
    loop = asyncio.get_running_loop()
    rtp_t, rtp = await loop.create_datagram_endpoint(Sock, local_addr=(HOST, 0))
    rtp_port = rtp_t.get_extra_info("sockname")[1]
    rtcp_t, rtcp = rtp_t, rtp
    if not mux:
        rtcp_t, rtcp = await loop.create_datagram_endpoint(Sock, local_addr=(HOST, 0))
    rtcp_port = rtcp_t.get_extra_info("sockname")[1]
    params = MediaParams(HOST, rtp_port, local_host=HOST, rtcp_port=rtcp_port, rtcp_mux=mux)
    media = CallMedia(
        EchoAgent(delay_s=0.1),
        _pool(),
        params,
        CallInfo(call_id="rtcp"),
        cname="sip-bridge@test",
        rtcp_rand=lambda: 0.0,
    )
    port = await media.start()
    dest = (HOST, port)
    rtcp_dest = dest if mux else (HOST, port + 1)
    sender = RtpSender(0, ssrc=PHONE_SSRC, sequence=65500, rng=random.Random(3))
    first_seq = sender.sequence
    t0 = loop.time()
    sent = 0
    try:
        for k in range(75):  # 1.5 s; the first SR comes at ~1.0 s
            await asyncio.sleep(max(0.0, t0 + k * 0.02 - loop.time()))
            data = sender.next_packet(b"\xff" * FRAME, FRAME)
            if k % 10 != 9:
                rtp_t.sendto(data, dest)
                sent += 1
        await _wait(lambda: _sender_reports(rtcp), 3.0)
        reports = _sender_reports(rtcp)
        assert reports, "no sender report from the session"
        arrived, sr = reports[0]
        assert sr.ssrc == media.sender.ssrc
        assert 0 < sr.packet_count <= media.stats.packets_out
        assert sr.octet_count == sr.packet_count * FRAME
        sdes = [p for _, c in rtcp.rtcp for p in c if isinstance(p, SourceDescription)]
        assert sdes[0].chunks[0].cname == "sip-bridge@test"
        block = next(b for b in sr.reports if b.ssrc == PHONE_SSRC)
        expected = (block.highest_seq - first_seq) + 1  # seq wrapped past 65535: extended
        assert block.highest_seq > 65535
        lost = sum(1 for i in range(expected) if i % 10 == 9)
        assert expected >= 30
        assert block.cumulative_lost == lost
        assert abs(block.fraction_lost - (lost << 8) // expected) <= 1
        assert 0.05 < block.fraction_lost / 256 < 0.15
        assert block.jitter / 8000 < 0.03  # paced sender on loopback
        # The phone's view of the session's stream, echoing LSR with DLSR = its own hold time.
        await asyncio.sleep(0.05)
        dlsr = int((loop.time() - arrived) * 65536)
        rr = ReportBlock(sr.ssrc, 64, 7, 1234, 800, ntp_middle32(sr.ntp_timestamp), dlsr)
        rtcp_t.sendto(serialize_compound([ReceiverReport(PHONE_SSRC, (rr,))]), rtcp_dest)
        await _wait(lambda: media.stats.rtcp.last_report_at is not None, 1.0)
        st = media.stats.rtcp
        assert st.rtcp_in >= 1 and st.rtcp_out >= 1
        assert st.fraction_lost_pct == 25.0
        assert st.cumulative_lost == 7
        assert st.jitter_ms == pytest.approx(100.0)
        assert st.rtt_ms is not None and 0.0 <= st.rtt_ms < 200.0
        before = len(rtcp.rtcp)
    finally:
        await media.close("done")
    await _wait(lambda: len(rtcp.rtcp) > before, 1.0)
    last = rtcp.rtcp[-1][1]
    assert any(isinstance(p, Bye) and media.sender.ssrc in p.ssrcs for p in last)
    assert media.stats.packets_accepted == sent
    rtp_t.close()
    rtcp_t.close()


@pytest.mark.parametrize("mux", [False, True], ids=["port+1", "rtcp-mux"])
def test_reports_both_ways_rtt_and_bye(mux: bool) -> None:
    asyncio.run(_scenario(mux))


def test_peer_bye_and_garbage_are_counted() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        t, _ = await loop.create_datagram_endpoint(Sock, local_addr=(HOST, 0))
        params = MediaParams(HOST, t.get_extra_info("sockname")[1], local_host=HOST)
        media = CallMedia(EchoAgent(delay_s=0.1), _pool(), params, CallInfo(call_id="b"))
        port = await media.start()
        try:
            t.sendto(b"\x80\xc9\x00\x09" + bytes(4), (HOST, port + 1))  # length past the end
            bye = serialize_compound([ReceiverReport(PHONE_SSRC), Bye((PHONE_SSRC,), b"bye")])
            t.sendto(bye, (HOST, port + 1))
            await _wait(lambda: media.stats.rtcp.peer_bye, 1.0)
            st = media.stats.rtcp
            assert st.peer_bye and st.rtcp_in == 1 and st.rtcp_malformed == 1
            assert st.rtt_ms is None and st.last_report_at is None
        finally:
            await media.close()
            t.close()

    asyncio.run(main())

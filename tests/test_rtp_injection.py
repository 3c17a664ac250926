"""RTP injection against a live call: a stranger's packets never take the call over.

An in-process bridge answers a packet-level caller (testkit/wire_caller.py) with the echo
agent; the caller says a 700 Hz tone. An attacker on another loopback port and another
127.0.0.x address sends RTP with the call's own SSRC, sequence numbers ahead, twice the
packet rate, carrying a loud 1900 Hz tone. After latching (or with latching off) the echo
must stay the caller's 700 Hz, the bridge must keep sending to the caller, and the call's
``wrong_source`` counter must count every injected packet.

The rule for latching (sip_bridge/media/rtp_receiver.py): packets from the SDP's address are
always the peer's; another source is latched onto, before latching only, after
LATCH_PACKETS packets in sequence. ``symmetric = "auto"`` latches only when the SDP address
is private. The race before latching is tested too: with latching off (what "auto" does
for a public SDP address) a first-sending attacker is ignored; with latching on, the SDP
address takes the call back, and only a NATed caller can lose it to an attacker who
streams first (pinned below: that takes SRTP).
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from resample.g711 import ulaw_encode
from sip_bridge.config.loader import BridgeConfig
from sip_bridge.media.call_media import CallMedia
from sip_bridge.media.rtp import RtpPacket
from sip_bridge.server import BridgeServer
from sip_bridge.sip.offer_answer import MediaConfig, NegotiatedMedia
from sip_bridge.sip.transport import Received, SipTransport
from sip_bridge.sip.uac import OutboundCall
from testkit.wire_caller import WireCaller, _Rtp

CALLER_HZ, ATTACK_HZ = 700.0, 1900.0
FRAME = 160
ATTACK_S = 1.5
ATTACK_PERIOD_S = 0.01  # twice the caller's packet rate


def _tone(hz: float, seconds: float, dbfs: float) -> NDArray[np.int16]:
    t = np.arange(int(8000 * seconds)) / 8000
    return (32767 * 10 ** (dbfs / 20) * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def _config(symmetric: str) -> BridgeConfig:
    base = BridgeConfig.line_check()
    low = 48000 + 200 * ("off", "on", "auto").index(symmetric)
    return replace(
        base,
        sip=replace(base.sip, listen="127.0.0.1:0"),
        rtp=replace(base.rtp, ports=f"{low}-{low + 199}", symmetric=symmetric),
        agent=replace(base.agent, echo_delay_s=0.1),
    )


class _Sink(asyncio.DatagramProtocol):
    """A socket that only counts what reaches it."""

    def __init__(self) -> None:
        self.count = 0

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.count += 1


class NattedCaller(WireCaller):
    """A WireCaller whose SDP may name another port than the one it sends from (a NAT),
    and whose RTP can be held back until the test lets it go."""

    def __init__(self, target: str, *, nat: bool) -> None:
        super().__init__(target)
        self.nat = nat
        self.go = asyncio.Event()
        self.decoy = _Sink()  # the SDP's port when behind the "NAT"
        self.source: tuple[str, int] = ("", 0)

    async def connect(self, dest: tuple[str, int], timeout_s: float = 30.0) -> None:
        loop = asyncio.get_running_loop()
        self._rtp, _ = await loop.create_datagram_endpoint(
            lambda: _Rtp(self), local_addr=(self.host, 0), family=socket.AF_INET
        )
        self.source = (self.host, self._rtp.get_extra_info("sockname")[1])
        decoy_t, _ = await loop.create_datagram_endpoint(
            lambda: self.decoy, local_addr=(self.host, 0), family=socket.AF_INET
        )
        self._tasks.append(loop.create_task(_close_later(decoy_t, self.ended)))
        sdp_port = decoy_t.get_extra_info("sockname")[1] if self.nat else self.source[1]
        inbox: asyncio.Queue[Received | str] = asyncio.Queue()
        self._sip = SipTransport(inbox.put_nowait)
        await self._sip.start(self.host, 0, ("udp",))
        assert self._sip.local is not None
        media = MediaConfig(self.host, sdp_port, codecs=(self.codec,), telephone_event=False)
        self._uac = OutboundCall(self.target, self._sip.local, dest, media)
        self._tasks.append(loop.create_task(self._signalling(inbox)))
        await asyncio.wait_for(self.answered.wait(), timeout_s)
        self._tasks.append(loop.create_task(self._held_send_loop()))

    async def _held_send_loop(self) -> None:
        await self.go.wait()
        await self._send_loop()

    @property
    def bridge_rtp(self) -> tuple[str, int]:
        assert self._remote is not None
        return self._remote


async def _close_later(transport: asyncio.DatagramTransport, ended: asyncio.Event) -> None:
    try:
        await ended.wait()
    finally:
        transport.close()


@dataclass
class Attacker:
    """Injects RTP with the victim's SSRC, sequence numbers ahead, at twice its rate."""

    host: str
    sink: _Sink
    transport: asyncio.DatagramTransport
    sent: int = 0

    @property
    def address(self) -> tuple[str, int]:
        return self.host, int(self.transport.get_extra_info("sockname")[1])

    async def inject(self, dest: tuple[str, int], victim: WireCaller, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        payload = ulaw_encode(_tone(ATTACK_HZ, FRAME / 8000, -3.0)).tobytes()
        end, k = loop.time() + seconds, 0
        while loop.time() < end:
            sender = victim._sender
            ahead = 50 + k
            pkt = RtpPacket(
                payload_type=0,
                sequence=(sender.sequence + ahead) & 0xFFFF,
                timestamp=(sender.timestamp + FRAME * ahead) & 0xFFFFFFFF,
                ssrc=sender.ssrc,
                payload=payload,
            )
            self.transport.sendto(pkt.serialize(), dest)
            self.sent += 1
            k += 1
            await asyncio.sleep(ATTACK_PERIOD_S)


async def _attacker(host: str) -> Attacker:
    loop = asyncio.get_running_loop()
    sink = _Sink()
    transport, _ = await loop.create_datagram_endpoint(
        lambda: sink, local_addr=(host, 0), family=socket.AF_INET
    )
    return Attacker(host, sink, transport)


def _media(server: BridgeServer) -> CallMedia:
    (call,) = server.calls.values()
    assert call.media is not None
    return call.media


async def _until(check: Any, timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not check():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.02)


def _band_db(pcm: NDArray[np.int16], hz: float) -> float:
    """Power within +-60 Hz of ``hz``, in dB relative to the whole signal's power."""
    x = pcm.astype(np.float64)
    spec = np.abs(np.fft.rfft(x * np.hanning(x.size))) ** 2
    freqs = np.fft.rfftfreq(x.size, 1 / 8000)
    band = spec[np.abs(freqs - hz) <= 60].sum()
    return float(10 * np.log10(max(band, 1e-12) / max(spec.sum(), 1e-12)))


def _dominant_hz(pcm: NDArray[np.int16]) -> float:
    x = pcm.astype(np.float64)
    spec = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.fft.rfftfreq(x.size, 1 / 8000)[int(np.argmax(spec))])


def _heard_between(caller: WireCaller, t0: float, t1: float) -> NDArray[np.int16]:
    log = caller.log
    frames = [pcm for (t, _), pcm in zip(log.received, log.heard, strict=False) if t0 <= t <= t1]
    return np.concatenate(frames) if frames else np.zeros(0, np.int16)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("symmetric", ["on", "off"])
def test_injected_rtp_after_latching_is_ignored(symmetric: str) -> None:
    nat = symmetric == "on"  # with latching, the caller sends from another port than its SDP

    async def main() -> dict[str, Any]:
        server = BridgeServer(_config(symmetric))
        await server.start()
        caller = NattedCaller(server.uri, nat=nat)
        attackers = [await _attacker("127.0.0.1"), await _attacker("127.0.0.2")]
        try:
            await caller.connect(("127.0.0.1", server.port))
            assert caller.status == 200
            caller.say(_tone(CALLER_HZ, 6.0, -12.0))
            caller.go.set()
            media = _media(server)
            # the echo of our own tone is back: media flows (and has latched, with "on")
            loop = asyncio.get_running_loop()
            t_first = loop.time()
            assert await caller.wait_speech(t_first, 5.0) is not None
            before = media.stats
            assert before.remote == caller.source and before.latched is nat
            decoy_before = caller.decoy.count
            got_before = len(caller.log.received)
            t_attack = loop.time()
            await asyncio.gather(
                *(a.inject(caller.bridge_rtp, caller, ATTACK_S) for a in attackers)
            )
            t_end = loop.time()
            await asyncio.sleep(0.6)  # the echo of the attack window has come back
            after = media.stats
            heard = _heard_between(caller, t_attack + 0.3, t_end + 0.3)
            return {
                "before": before,
                "after": after,
                "heard": heard,
                "rx_rate": (len(caller.log.received) - got_before) / (loop.time() - t_attack),
                "sent": [a.sent for a in attackers],
                "attacker_got": [a.sink.count for a in attackers],
                "decoy_new": caller.decoy.count - decoy_before,
                "source": caller.source,
            }
        finally:
            await caller.hangup()
            for a in attackers:
                a.transport.close()
            await server.stop()

    r = asyncio.run(main())
    before, after = r["before"], r["after"]
    # every injected packet was counted as a stranger's and nothing else was
    assert after.wrong_source - before.wrong_source == sum(r["sent"]) > 100
    assert after.wrong_ssrc == before.wrong_ssrc and after.malformed == 0
    # the bridge kept sending to the caller, never to an attacker (nor back to the SDP port)
    assert after.remote == r["source"] and after.latched is (symmetric == "on")
    assert r["attacker_got"] == [0, 0] and r["decoy_new"] == 0
    assert r["rx_rate"] > 40, r["rx_rate"]  # ~50 packets/s kept coming back
    # the echo is the caller's tone; the attacker's is nowhere in it (one 20 ms frame of
    # it in the window would stand ~25 dB above this bound, G.711's noise floor ~20 below)
    heard = r["heard"]
    assert heard.size >= 8000, heard.size
    assert abs(_dominant_hz(heard) - CALLER_HZ) < 10
    assert _band_db(heard, CALLER_HZ) > -1.0
    assert _band_db(heard, ATTACK_HZ) < -35.0, _band_db(heard, ATTACK_HZ)
    # and the call's own stream saw no loss, lateness or resync because of it
    jb0, jb1 = before.jitter, after.jitter
    assert (
        (jb1.lost, jb1.late, jb1.resyncs, jb1.duplicates)
        == (
            jb0.lost,
            jb0.late,
            jb0.resyncs,
            jb0.duplicates,
        )
        == (0, 0, 0, 0)
    )
    assert jb1.concealed == jb0.concealed


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("symmetric", "nat"), [("off", False), ("on", False), ("on", True)])
def test_an_attacker_sending_before_the_caller(symmetric: str, nat: bool) -> None:
    """The race before latching. "off" (what "auto" picks for a public SDP address): the
    first sender is a stranger and stays one. "on" (and "auto" for a private SDP address):
    a stranger is latched onto only after a stream of packets in sequence (sprayed packets
    never are), and the SDP's own address takes the call back with its first packet. What
    no rule can do without SRTP: tell a NATed caller (sending from an address the SDP does
    not name) from an attacker who streams to the port first; that one is pinned."""

    async def main() -> dict[str, Any]:
        server = BridgeServer(_config(symmetric))
        await server.start()
        caller = NattedCaller(server.uri, nat=nat)
        attacker = await _attacker("127.0.0.2")
        try:
            await caller.connect(("127.0.0.1", server.port))
            caller.say(_tone(CALLER_HZ, 4.0, -12.0))
            media = _media(server)
            await attacker.inject(caller.bridge_rtp, caller, 0.3)  # before any caller packet
            first = media.stats
            caller.go.set()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await asyncio.sleep(1.5)
            after = media.stats
            heard = _heard_between(caller, t0 + 0.5, loop.time())
            return {
                "first": first,
                "after": after,
                "sent": attacker.sent,
                "attacker_got": attacker.sink.count,
                "heard": heard,
                "caller": caller.source,
                "attacker": attacker.address,
                "caller_sent": len(caller.log.sent),
            }
        finally:
            await caller.hangup()
            attacker.transport.close()
            await server.stop()

    r = asyncio.run(main())
    first, after = r["first"], r["after"]
    if symmetric == "off":
        assert first.wrong_source == r["sent"] > 10 and not first.latched
        assert after.remote == r["caller"] and r["attacker_got"] == 0
        assert after.wrong_source == r["sent"]
        heard = r["heard"]
        assert heard.size >= 4000 and abs(_dominant_hz(heard) - CALLER_HZ) < 10
        assert _band_db(heard, ATTACK_HZ) < -35.0
    elif not nat:
        # the attacker's stream was latched onto (2 packets proved it) ...
        assert first.latched and first.remote == r["attacker"]
        # ... until the caller's first packet from its signalled address took the call back
        assert after.remote == r["caller"]
        assert after.wrong_source == first.wrong_source == 2  # the stream's probation
        heard = r["heard"]
        assert heard.size >= 4000 and abs(_dominant_hz(heard) - CALLER_HZ) < 10
        assert _band_db(heard, ATTACK_HZ) < -35.0
    else:
        # the limit of symmetric RTP without SRTP: the stream that came first keeps the call
        assert first.latched and first.remote == r["attacker"]
        assert after.remote == r["attacker"] and r["attacker_got"] > 0
        assert after.wrong_source >= r["caller_sent"] - 5


@pytest.mark.parametrize(
    ("symmetric", "address", "latch"),
    [
        ("auto", "203.0.114.7", False),  # public-looking: trust the SDP address
        ("auto", "8.8.4.4", False),
        ("auto", "10.1.2.3", True),  # private: expect NAT, latch
        ("auto", "192.168.7.9", True),
        ("auto", "127.0.0.1", True),
        ("on", "203.0.114.7", True),
        ("off", "10.1.2.3", False),
    ],
)
def test_when_the_bridge_latches(symmetric: str, address: str, latch: bool) -> None:
    """What ``[rtp] symmetric`` decides for a call, from the SDP address (no traffic)."""
    neg = NegotiatedMedia(
        stream_index=0,
        remote_address=address,
        remote_port=4000,
        payload_type=0,
        codec="PCMU",
        clock_rate=8000,
        telephone_event_pt=None,
        recv_telephone_event_pt=None,
        ptime=20,
        direction="sendrecv",
    )
    server = BridgeServer(_config(symmetric))
    assert server._media_params(neg).latch is latch

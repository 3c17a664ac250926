"""Talkspurts leave at once, and a frame-by-frame producer (an echo) never underruns.

The first test drives the shared media clock by hand: a fake loop whose time only moves when
the test says so, RTP pushed in with chosen arrival times, and ``MediaClock._serve`` called
for each 5 ms grid point. So "in the same wake-up" is exact (no sleeps, no timing bounds):
every packet is tagged with the grid point it went out on. The second one writes through the
real event loop and a loopback socket, and checks what is sent before the write returns.
"""

from __future__ import annotations

import asyncio
import random
import socket
from collections import Counter
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from agent import Agent, AgentOutput, CallInfo, EchoAgent
from resample import ulaw_decode, ulaw_encode
from sip_bridge.media.call_media import CallMedia, MediaParams
from sip_bridge.media.media_clock import MediaClock, media_clock
from sip_bridge.media.rtp import RtpPacket, RtpSender
from sip_bridge.media.rtp_ports import RtpPortPool
from testkit.media_fakes import FakeLoop

PEER = ("127.0.0.1", 4000)
TICK = 0.005


class FakeSocket:
    """Records each datagram with the index of the grid point (the wake-up) it left on."""

    def __init__(self) -> None:
        self.tick = -1
        self.sent: list[tuple[int, RtpPacket]] = []
        self.send_errors = 0

    def sendto(self, data: bytes, dest: tuple[str, int]) -> None:
        assert dest == PEER
        self.sent.append((self.tick, RtpPacket.parse(data)))


def _tone(n: int, k: int) -> NDArray[np.int16]:
    t = (np.arange(n) + k * n) / 8000
    return (8000 * np.sin(2 * np.pi * 700 * t)).astype(np.int16)


def test_an_echo_starts_in_its_first_pop_and_follows_its_pops_either_way() -> None:
    loop = FakeLoop(100.0)
    clock = MediaClock(cast(Any, loop))
    agent = EchoAgent(delay_s=0.1)
    params = MediaParams(*PEER, local_host="127.0.0.1")
    media = CallMedia(agent, RtpPortPool(40000, 40099), params, CallInfo(call_id="t"))
    media._clock = clock
    t0 = clock.add(media)  # no socket yet: nothing to poll, the test pushes datagrams
    media.rx_due = t0
    media.pacer.start(t0)
    media.hold_s = clock.tick_s
    sock = FakeSocket()
    media.sock = cast(Any, sock)
    agent._output = media.output
    pops: list[int] = []  # grid index of every pop that handed the echo a frame
    heard = agent.on_audio

    def on_audio(pcm: NDArray[np.int16]) -> None:
        pops.append(sock.tick)
        heard(pcm)

    agent.on_audio = on_audio  # type: ignore[method-assign]
    peer = RtpSender(0, rng=random.Random(3))
    arrivals = [t0 + 0.0013 + 0.02 * k for k in range(60)]  # a steady 20 ms stream
    nudge_at = 40  # then the pop moves a tick later, as a jitter buffer's nudge does
    nudged = False
    for j in range(300):
        now = t0 + j * TICK
        loop.now, sock.tick = now, j
        while arrivals and arrivals[0] <= now:
            k = 60 - len(arrivals)
            data = peer.next_packet(ulaw_encode(_tone(160, k)).tobytes(), 160)
            media.on_datagram(data, PEER, arrivals.pop(0))
        if len(pops) == nudge_at and not nudged:
            media.rx_due += TICK
            nudged = True
        clock._serve(now, now)
    audio = [(tick, p) for tick, p in sock.sent if p.payload_type == 0]
    markers = [i for i, (_, p) in enumerate(audio) if p.marker]
    assert markers == [0, 1]  # the stream's first packet (silence), then the echo's start
    spurt = audio[1:]
    # The first frame left in the wake-up whose pop wrote it; the next ones on the tick
    # after their pop while the pops settle (they move earlier, the sends follow), and
    # after the nudge (later: the frame waits for its pop, the grid follows it). Then, the
    # pops back where they were, the sends stay: a frame is never sent twice over or
    # replaced by silence, and it waits at most one frame for its slot.
    assert spurt[0][0] == pops[0]
    lag = [tick - pop for (tick, _), pop in zip(spurt, pops, strict=False)]
    assert lag[1:nudge_at] == [1] * (nudge_at - 1) and lag[nudge_at] == 1  # (frame 40: nudged)
    assert all(1 <= x <= 4 for x in lag[1:])
    assert media.playout.underrun_frames == 1  # the silence before the first write only
    assert media.pacer.followed == 1  # the nudged pop: its frame waited one tick for it
    seqs = [p.sequence for _, p in audio]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    stamps = np.diff([p.timestamp for _, p in audio])
    assert set(stamps.tolist()) == {160}
    # the cadence: a frame every 4 grid points; one a tick sooner each time the pops moved
    # earlier (the buffer settling on its target), one a tick later for the nudge, and the
    # second frame: the first one left in the pop's own wake-up, a tick before its grid
    steps = Counter(np.diff([tick for tick, _ in spurt]).tolist())
    assert set(steps) <= {3, 4, 5} and steps[5] == 2 and steps[4] >= len(spurt) - 7
    # what went out is the tone, 0.1 s (5 frames) after it was heard
    echo = np.concatenate([ulaw_decode(np.frombuffer(p.payload, np.uint8)) for _, p in spurt])
    first = int(np.flatnonzero(np.abs(echo.astype(np.int32)) > 2000)[0])
    assert 5 * 160 <= first <= 9 * 160  # and the frames before the buffer started
    assert float(np.sqrt(np.mean(echo[first : first + 4000].astype(np.float64) ** 2))) > 4000
    st = media.stats
    assert st.talkspurts == 1 and st.held_frames == 1
    assert st.first_frame_delay_max_ms >= 0  # measured (write -> sendto), not asserted on


class Speaker(Agent):
    """Keeps its output for the test to write through."""

    name = "speaker"

    def __init__(self) -> None:
        self.out: AgentOutput | None = None

    async def start(self, call: CallInfo, output: AgentOutput) -> None:
        self.out = output

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        pass


def _drain(sock: socket.socket) -> list[RtpPacket]:
    out = []
    while True:
        try:
            out.append(RtpPacket.parse(sock.recv(2048)))
        except BlockingIOError:
            return out


def test_a_reply_leaves_in_the_agents_write_and_the_rest_follows_on_the_grid() -> None:
    async def main() -> None:
        peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        peer.bind(("127.0.0.1", 0))
        peer.setblocking(False)
        low = random.Random().randrange(30000, 60000, 2)
        agent = Speaker()
        params = MediaParams("127.0.0.1", peer.getsockname()[1], local_host="127.0.0.1")
        media = CallMedia(agent, RtpPortPool(low, low + 199), params)
        await media.start()
        try:
            await asyncio.sleep(0.1)  # silence flows meanwhile
            before = _drain(peer)
            assert before  # (its first packet has the marker: the stream started)
            assert agent.out is not None
            reply = _tone(3 * 480, 0)  # three frames at the agent's 24 kHz, in one write
            sent = media.stats.packets_out
            written_at = asyncio.get_running_loop().time()
            agent.out.write(reply)
            # before the write returned: exactly the first frame went out, marked, audible
            assert media.stats.packets_out == sent + 1
            (first,) = _drain(peer)
            assert first.marker and first.sequence == (before[-1].sequence + 1) & 0xFFFF
            assert np.abs(ulaw_decode(np.frombuffer(first.payload, np.uint8))).max() > 2000
            clock = media_clock()  # the call's grid restarted on the nearest grid point
            k = (media.pacer.t0 - clock._origin) / clock.tick_s
            assert abs(k - round(k)) < 1e-6
            assert abs(media.pacer.t0 - written_at) <= clock.tick_s / 2 + 1e-6
            await asyncio.sleep(0.1)
            rest = _drain(peer)
        finally:
            await media.close()
            peer.close()
        seq = [first.sequence] + [p.sequence for p in rest]
        assert seq == [(first.sequence + i) & 0xFFFF for i in range(len(seq))]
        assert not any(p.marker for p in rest)
        loud = [np.abs(ulaw_decode(np.frombuffer(p.payload, np.uint8))).max() > 2000 for p in rest]
        assert loud[:2] == [True, True] and not any(loud[3:])  # the reply, then silence
        st = media.stats
        assert st.talkspurts == 1 and st.first_frame_delay_max_ms >= 0

    asyncio.run(main())

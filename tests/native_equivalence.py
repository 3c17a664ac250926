"""Digests of what the media path computes, to compare its compiled and Python forms.

Run as a script (``tests/test_native.py`` runs it twice: against the tree as it is, with
the mypyc-compiled modules, and against a copy of the sources alone). It prints one JSON
object: a sha256 per scenario of everything that came out, so any difference in any sample,
packet byte or counter shows.

- every standard network trace of ``jitter.netsim`` through a ``JitterBuffer``, on a fixed
  20 ms pop grid and following ``due_s``: every frame popped, and the stats;
- echo calls (8 kHz, and 24 kHz through the resamplers) on the shared media clock, driven
  by hand as tests/test_media_talkspurt.py does, with seeded jitter, loss and reordering:
  every RTP and RTCP datagram sent, and each call's stats.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import sys
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

import jitter.jitterbuffer
import sip_bridge.media.call_media
from agent import EchoAgent
from jitter import JitterBuffer
from jitter.netsim import STANDARD_TRACES, replay, standard_trace
from resample import ulaw_encode
from sip_bridge.media.call_media import CallMedia, MediaParams
from sip_bridge.media.media_clock import MediaClock
from sip_bridge.media.media_io import AudioRtpSender, Datagram
from sip_bridge.media.media_rtcp import RtcpLink
from sip_bridge.media.rtcp_session import RtcpSession
from sip_bridge.media.rtp_ports import RtpPortPool
from testkit.media_fakes import FakeLoop

PEER = ("127.0.0.1", 4000)
TICK = 0.005


class _HashingBuffer:
    """A JitterBuffer whose every popped frame goes into a digest."""

    def __init__(self, jb: JitterBuffer, digest: Any) -> None:
        self.jb = jb
        self.digest = digest
        self.push = jb.push
        self.push_comfort_noise = jb.push_comfort_noise

    @property
    def playout_timestamp(self) -> int | None:
        return self.jb.playout_timestamp

    @property
    def due_s(self) -> float | None:
        return self.jb.due_s

    def pop(self, now_s: float) -> NDArray[np.int16]:
        out = self.jb.pop(now_s)
        self.digest.update(out.tobytes())
        return out


def jitter_digests() -> dict[str, str]:
    out = {}
    for name in sorted(STANDARD_TRACES):
        trace = standard_trace(name, duration_s=20.0, seed=11)
        for follows in (False, True):
            h = hashlib.sha256()
            jb = JitterBuffer(8000, follows_due=follows)
            res = replay(
                trace, cast(Any, _HashingBuffer(jb, h)), follow_due_s=0.005 if follows else 0.0
            )
            h.update(repr(dataclasses.astuple(jb.stats)).encode())
            h.update(repr((res.late, res.skipped, res.frames, res.played)).encode())
            out[f"jitter/{name}/{'follow' if follows else 'grid'}"] = h.hexdigest()
    return out


class _Socket:
    """What a call sends, in order, into one digest per call."""

    def __init__(self) -> None:
        self.send_errors = 0
        self.digest = hashlib.sha256()

    def fileno(self) -> int:
        return -1

    def read(self, loop_now: float, offset: float) -> Datagram | None:
        return None

    def drain(self, loop_now: float, limit: int = 64) -> list[Datagram]:
        return []

    def sendto(self, data: bytes, dest: tuple[str, int]) -> None:
        self.digest.update(repr(dest).encode() + data)

    def close(self) -> None:
        pass


def media_digests(seconds: float = 6.0) -> dict[str, str]:
    loop = FakeLoop(1000.0)
    clock = MediaClock(cast(Any, loop))
    pool = RtpPortPool(40000, 40100)
    rng = random.Random(5)
    t0 = loop.now
    calls: list[tuple[CallMedia, _Socket, RtcpSession]] = []
    for k, rate in enumerate((8000, 8000, 24000, 8000, 24000)):
        m = CallMedia(EchoAgent(delay_s=0.1, sample_rate=rate), pool, MediaParams(*PEER))
        m.sender = AudioRtpSender(m.params.payload_type, rng=random.Random(100 + k))
        m._clock = clock
        start = clock.add(m)
        m.rx_due = start
        m.pacer.start(start)
        sock = _Socket()
        m.sock = sock
        m._lease = cast(Any, SimpleNamespace(port=0))  # RTCP goes out through the socket
        m.agent._output = m.output  # type: ignore[attr-defined]
        session = RtcpSession(m.sender.ssrc, 8000, "equivalence", t0, rand=lambda: 0.5)
        m.rtcp = RtcpLink(session, (PEER[0], PEER[1] + 1), mux=False, latch=False)
        m.receiver.on_accepted = session.on_rtp_received
        calls.append((m, sock, session))
    t = np.arange(8000 * 2) / 8000
    tone = ulaw_encode((9000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)).tobytes()
    # arrivals: 20 ms frames, 0..8 ms jitter, 2 % lost, 2 % a frame late (reordered)
    events: list[tuple[float, int, bytes]] = []
    for c in range(len(calls)):
        peer = AudioRtpSender(0, rng=random.Random(200 + c))
        phase = rng.uniform(0, 0.02)
        for k in range(int(seconds / 0.02)):
            off = (k * 160) % (len(tone) - 160)
            data = peer.next_packet(tone[off : off + 160], 160)
            if rng.random() < 0.02:
                continue
            late = 0.02 if rng.random() < 0.02 else 0.0
            events.append((t0 + phase + 0.02 * k + rng.uniform(0, 0.008) + late, c, data))
    events.sort(key=lambda e: e[0])
    e = 0
    for j in range(round(seconds / TICK) + 40):
        now = t0 + j * TICK
        loop.now = now
        while e < len(events) and events[e][0] <= now:
            at, c, data = events[e]
            calls[c][0].on_datagram(data, PEER, at)
            e += 1
        clock._serve(now, now)
    out = {}
    for k, (m, sock, _) in enumerate(calls):
        st = m.stats
        figures = (st.packets_in, st.packets_out, st.talkspurts, st.held_frames)
        figures += dataclasses.astuple(st.jitter)
        sock.digest.update(repr(figures).encode())
        out[f"media/call{k}"] = sock.digest.hexdigest()
    return out


def main() -> int:
    result = {
        "compiled": [
            m.__name__
            for m in (jitter.jitterbuffer, sip_bridge.media.call_media)
            if not (m.__file__ or "").endswith(".py")
        ],
        "digests": {**jitter_digests(), **media_digests()},
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

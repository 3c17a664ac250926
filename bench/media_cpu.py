"""CPU of the media path per echo call and 20 ms, on simulated time: a figure that does not
depend on how busy the machine is (beyond its clock speed).

Why: bench/calls.py and bench/media_load.py measure in real time, and on a shared 2-core
machine a starved process serves late ticks with another mix of work (catch-up pops,
deferred receives), so its CPU per call moves with the neighbours' load. Here the media
clock is driven by hand, as tests/test_media_talkspurt.py does: a fake loop whose time
moves 5 ms per step, each call's peer packets handed to ``CallMedia.on_datagram`` at their
arrival times (20 ms apart, 0..4 ms jitter), ``MediaClock._serve`` for every grid point,
sends into a sink. Everything of the per-call work runs (RTP parse, jitter buffer, RTCP
statistics, resamplers, echo agent, pacer, G.711, RTP build) except the kernel's part
of recvmsg/sendto/epoll (~10 us per call and frame on this machine, see media_load.py).
Only the bridge's calls are timed (``time.thread_time``), not the packet generation.

The media path runs compiled when `make native` built it (sip_bridge/native.py);
``--compare-python`` also runs the same simulation on a copy of the sources without the
compiled modules, in a child process, and prints both figures and their ratio. cProfile
(``--profile``) and ``--breakdown`` see only interpreted code: use them with the Python run.

    .venv/bin/python bench/media_cpu.py [--calls 100] [--seconds 10] [--rounds 3] [--profile]
        [--compare-python]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from agent.lines.echo import EchoAgent  # noqa: E402
from resample.g711 import ulaw_encode  # noqa: E402
from sip_bridge.media.call_media import CallMedia, MediaParams  # noqa: E402
from sip_bridge.media.media_clock import MediaClock  # noqa: E402
from sip_bridge.media.media_rtcp import RtcpLink  # noqa: E402
from sip_bridge.media.rtcp_session import RtcpSession  # noqa: E402
from sip_bridge.media.rtp_ports import RtpPortPool  # noqa: E402
from sip_bridge.native import check as native_check  # noqa: E402
from testkit.media_fakes import FakeLoop  # noqa: E402

PEER = ("127.0.0.1", 4000)
TICK = 0.005
_HDR = struct.Struct("!BBHII")


class _Sink:
    send_errors = 0

    def __init__(self) -> None:
        self.count = 0

    def sendto(self, data: bytes, dest: tuple[str, int]) -> None:
        self.count += 1


SPENT: dict[str, float] = {}


def timed(owner: Any, name: str, label: str) -> None:
    """Wrap owner.name so its thread CPU time adds up in SPENT[label]."""
    fn = getattr(owner, name)

    def wrapper(*a: Any, **k: Any) -> Any:
        t0 = time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            SPENT[label] = SPENT.get(label, 0.0) + time.thread_time() - t0

    setattr(owner, name, wrapper)


def _instrument() -> None:
    from sip_bridge.media import media_clock as mc

    timed(mc, "_send", "send (all)")
    timed(mc, "_drain_writes", "send: downsample")
    timed(mc, "_send_batch", "send: encode+sendto")
    timed(mc, "_receive", "receive: pop+upsample+agent")
    timed(mc, "process_many", "resample batches (up+down)")


def _round(calls: int, seconds: float, warm_s: float, prof: cProfile.Profile | None) -> float:
    """One simulated run; returns CPU us per call per 20 ms over the timed window."""
    loop = FakeLoop(1000.0)
    clock = MediaClock(cast(Any, loop))
    pool = RtpPortPool(40000, 40000 + 4 * calls + 4)
    medias = []
    t0 = loop.now
    for _ in range(calls):
        echo = EchoAgent(delay_s=0.5, sample_rate=8000)  # at the line rate, as the bridge's
        m = CallMedia(echo, pool, MediaParams(*PEER), rtcp_rand=lambda: 0.5)
        m._clock = clock
        start = clock.add(m)
        m.rx_due = start
        m.pacer.start(start)
        m.sock = cast(Any, _Sink())
        m._lease = cast(Any, SimpleNamespace(port=0))  # RTCP goes out through the sink too
        m.agent._output = m.output  # type: ignore[attr-defined]
        session = RtcpSession(m.sender.ssrc, 8000, "bench", t0, rand=lambda: 0.5)
        m.rtcp = RtcpLink(session, (PEER[0], PEER[1] + 1), mux=False, latch=False)
        m.receiver.on_accepted = session.on_rtp_received
        medias.append(m)
    t = np.arange(8000 * 4) / 8000
    tone = ulaw_encode((8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)).tobytes()
    rng = np.random.default_rng(7)
    phase = rng.uniform(0, 0.02, calls)  # each peer's own send phase
    ticks = round((warm_s + seconds) / TICK)
    warm = round(warm_s / TICK)
    frames = int((warm_s + seconds) / 0.02) + 2
    # arrivals: (time, call, frame k), in time order
    when = (phase[:, None] + 0.02 * np.arange(frames)[None, :]) + rng.uniform(
        0, 0.004, (calls, frames)
    )
    order = np.argsort(when, axis=None)
    events = [(t0 + float(when.flat[o]), int(o // frames), int(o % frames)) for o in order]
    e = 0
    spent = 0.0
    tt = time.thread_time
    for j in range(ticks):
        now = t0 + j * TICK
        loop.now = now
        batch = []
        while e < len(events) and events[e][0] <= now:
            at, c, k = events[e]
            off = (k * 160) % (len(tone) - 160)
            pkt = _HDR.pack(0x80, 0, k & 0xFFFF, k * 160, 1000 + c) + tone[off : off + 160]
            batch.append((medias[c], pkt, at))
            e += 1
        timed = j >= warm
        if timed and prof is not None:
            prof.enable()
        a = tt()
        for m, pkt, at in batch:
            m.on_datagram(pkt, PEER, at)
        b = tt()
        clock._serve(now, now)
        if timed:
            done = tt()
            spent += done - a
            SPENT["datagrams in (parse, jitter push, RTCP stats)"] = (
                SPENT.get("datagrams in (parse, jitter push, RTCP stats)", 0.0) + b - a
            )
            if prof is not None:
                prof.disable()
    sent = sum(cast(_Sink, m.sock).count for m in medias)
    if sent < 0.9 * calls * ticks / 4:
        raise SystemExit(f"only {sent} packets sent: the simulation is broken")
    for m in medias:
        m.sock = None
        clock.remove(m)
    return 1e6 * spent / (calls * seconds / 0.02)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=10.0, help="simulated seconds timed")
    ap.add_argument("--warm", type=float, default=2.0, help="simulated seconds before")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="cProfile the timed ticks")
    ap.add_argument("--breakdown", action="store_true", help="CPU per stage (wrapped)")
    ap.add_argument(
        "--compare-python", action="store_true", help="also run the sources as Python, apart"
    )
    args = ap.parse_args(argv)
    if args.breakdown:
        _instrument()
    prof = cProfile.Profile() if args.profile else None
    us = []
    for _ in range(args.rounds):
        SPENT.clear()
        us.append(_round(args.calls, args.seconds, args.warm, prof))
    frames = args.calls * args.seconds / 0.02
    breakdown = {k: round(1e6 * v / frames, 1) for k, v in sorted(SPENT.items())}
    result: dict[str, Any] = {
        "bench": "media_cpu",
        "media_path": native_check().mode,
        "calls": args.calls,
        "simulated_s": args.seconds,
        "cpu_us_per_call_per_20ms_best": round(min(us), 1),
        "cpu_us_per_call_per_20ms_rounds": [round(x, 1) for x in us],
        "note": "kernel part of recvmsg/sendto/epoll not included",
        **({"last_round_breakdown_us": breakdown} if args.breakdown else {}),
    }
    if args.compare_python:
        py = _as_python(argv or sys.argv[1:])
        result["python"] = {k: py[k] for k in ("media_path", "cpu_us_per_call_per_20ms_best")}
        result["python_over_this"] = round(
            py["cpu_us_per_call_per_20ms_best"] / result["cpu_us_per_call_per_20ms_best"], 2
        )
    print(json.dumps(result))
    if prof is not None:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(40)
        print(buf.getvalue())
    return 0


def _as_python(argv: list[str]) -> dict[str, Any]:
    """This bench, same arguments, on a copy of the sources without compiled modules."""
    with tempfile.TemporaryDirectory() as tmp:
        for pkg in ("sip_bridge", "jitter", "resample", "agent", "model_runtime", "bench"):
            shutil.copytree(
                ROOT / pkg,
                Path(tmp) / pkg,
                ignore=shutil.ignore_patterns("*.so", "__pycache__", "out"),
            )
        args = [a for a in argv if a not in ("--compare-python", "--profile", "--breakdown")]
        out = subprocess.run(
            [sys.executable, str(Path(tmp) / "bench" / Path(__file__).name), *args],
            env={**os.environ, "PYTHONPATH": tmp},
            capture_output=True,
            text=True,
            check=True,
        )
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[0])
    return result


if __name__ == "__main__":
    sys.exit(main())

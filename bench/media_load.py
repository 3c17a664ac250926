"""CPU per echo call of the media path alone, in one process: no SIP, no sipp.

N :class:`~sip_bridge.media.call_media.CallMedia` with the echo agent run on the shared media clock;
a separate peer process streams 20 ms PCMU packets to every call's port (one socket,
absolute 20 ms grid) and drains what comes back. The bridge side's CPU is
``time.process_time`` over a steady window, divided per call and per 20 ms: the figure the
0.5 %-of-a-core target (100 us per call per 20 ms) is about. ``--profile`` runs the window
under cProfile and prints the top functions (profiling inflates the total; use it for the
shares, the plain run for the figure).

    .venv/bin/python bench/media_load.py [--calls 100] [--seconds 8] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import multiprocessing as mp
import os
import pstats
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from agent.lines.echo import EchoAgent  # noqa: E402
from bench.media_cpu import SPENT, timed  # noqa: E402  (one CPU-time wrapper for both benches)
from resample.g711 import ulaw_encode  # noqa: E402
from sip_bridge.media.call_media import CallMedia, MediaParams  # noqa: E402
from sip_bridge.media.media_io import RtpProtocol  # noqa: E402
from sip_bridge.media.rtp_ports import RtpPortPool  # noqa: E402
from sip_bridge.native import check as native_check  # noqa: E402


def _peer(ports: list[int], port_q: Any, stop: Any) -> None:
    """Stream to every port on a 20 ms grid (with a little jitter) and drain replies."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    port_q.put(sock.getsockname()[1])
    t = np.arange(8000 * 4) / 8000
    tone = ulaw_encode((8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)).tobytes()
    hdr = struct.Struct("!BBHII")
    rng = np.random.default_rng(1)
    t0 = time.monotonic() + 0.05
    k = 0
    while not stop.is_set():
        now = time.monotonic()
        due = t0 + k * 0.02
        if now < due:
            time.sleep(due - now)
        off = (k * 160) % len(tone)
        payload = tone[off : off + 160] if off + 160 <= len(tone) else tone[:160]
        order = rng.permutation(len(ports))
        for i in order:
            pkt = hdr.pack(0x80, 0, k & 0xFFFF, (k * 160) & 0xFFFFFFFF, 1000 + int(i)) + payload
            with contextlib.suppress(OSError):  # a call that has just ended
                sock.sendto(pkt, ("127.0.0.1", ports[i]))
        try:
            while True:
                sock.recv(2048)
        except (BlockingIOError, InterruptedError):
            pass
        k += 1


_COUNTS: dict[str, int] = {}


def _counted(owner: Any, name: str, label: str, rows: bool = False) -> None:
    """Wrap owner.name to count its calls (and the rows of its second argument)."""
    fn = getattr(owner, name)

    def wrapper(*a: Any, **k: Any) -> Any:
        _COUNTS[label] = _COUNTS.get(label, 0) + 1
        if rows:
            _COUNTS[label + " rows"] = _COUNTS.get(label + " rows", 0) + len(a[1])
        return fn(*a, **k)

    setattr(owner, name, wrapper)


def _instrument() -> None:
    from sip_bridge.media import media_clock as mc
    from sip_bridge.media.call_media import CallMedia as Cm

    _counted(mc, "process_many", "process_many", rows=True)
    _counted(Cm, "_drain_one", "drain_one (unbatched downsample)")

    timed(mc, "_send", "send (all)")
    timed(mc, "_drain_writes", "send: downsample")
    timed(mc, "_send_batch", "send: encode+sendto")
    timed(mc.MediaClock, "_read_ready", "read: recv+parse+push")
    timed(mc, "_receive", "receive: pop+upsample+agent")
    timed(mc.MediaClock, "_tick", "tick (all)")


async def _run(calls: int, seconds: float, profile: bool, warm_s: float) -> dict[str, Any]:
    pool = RtpPortPool(46000, 46000 + 4 * calls + 10)
    ctx = mp.get_context("fork")
    port_q = ctx.Queue()
    stop = ctx.Event()
    medias: list[CallMedia] = []
    # Bind first (the peer must know the ports), with a placeholder remote.
    leases = [await pool.bind("127.0.0.1", _proto) for _ in range(calls)]
    ports = [lease.port for lease in leases]
    peer = ctx.Process(target=_peer, args=(ports, port_q, stop), daemon=True)
    peer.start()
    peer_port = port_q.get(timeout=10)
    try:
        params = MediaParams("127.0.0.1", peer_port)
        for lease in leases:
            m = CallMedia(EchoAgent(delay_s=0.5, sample_rate=8000), pool, params, lease=lease)
            await m.start()
            medias.append(m)
        await asyncio.sleep(warm_s)
        prof = cProfile.Profile() if profile else None
        SPENT.clear()
        _COUNTS.clear()
        c0, w0 = time.process_time(), time.monotonic()
        t0 = time.thread_time()
        if prof is not None:
            prof.enable()
        await asyncio.sleep(seconds)
        if prof is not None:
            prof.disable()
        cpu = time.process_time() - c0
        tcpu = time.thread_time() - t0
        wall = time.monotonic() - w0
    finally:
        stop.set()
        for m in medias:
            await m.close()
        peer.join(2)
    frames = calls * wall / 0.02
    stats = [m.stats for m in medias]
    p99 = float(np.percentile([s.pacing_jitter_p99_ms for s in stats], 99))
    out: dict[str, Any] = {
        "bench": "media_load",
        "media_path": native_check().mode,
        "calls": calls,
        "window_s": round(wall, 2),
        "cpu_pct": round(100 * cpu / wall, 1),
        "cpu_us_per_call_per_20ms": round(1e6 * cpu / frames, 1),
        "thread_us_per_call_per_20ms": round(1e6 * tcpu / frames, 1),
        "core_pct_per_call": round(100 * cpu / wall / calls, 3),
        "pacing_p99_of_calls_p99_ms": round(p99, 2),
        "late_frames": sum(s.pacer_late_frames for s in stats),
        "packets_in": sum(s.packets_in for s in stats),
        "packets_out": sum(s.packets_out for s in stats),
        "jb_late": sum(s.jitter.late for s in stats),
        "load_avg": os.getloadavg()[0],
    }
    if SPENT:
        out["breakdown_us_per_call_per_20ms"] = {
            k: round(1e6 * v / frames, 1) for k, v in sorted(SPENT.items())
        }
    if _COUNTS:
        out["counts"] = dict(_COUNTS)
    if prof is not None:
        buf = io.StringIO()
        ps = pstats.Stats(prof, stream=buf).sort_stats("tottime")
        ps.print_stats(35)
        out["profile"] = buf.getvalue()
    return out


def _proto() -> RtpProtocol:
    return RtpProtocol()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warm", type=float, default=2.0, help="seconds before the window")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--breakdown", action="store_true", help="CPU per clock stage (wrapped)")
    args = ap.parse_args(argv)
    if args.breakdown:
        _instrument()
    res = asyncio.run(_run(args.calls, args.seconds, args.profile, args.warm))
    prof = res.pop("profile", None)
    print(json.dumps(res))
    if prof:
        print(prof)
    return 0


if __name__ == "__main__":
    sys.exit(main())

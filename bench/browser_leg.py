"""N browser sessions (WebRTC, Opus) at once against `sip-bridge run`: what one costs.

The bridge runs as its own process (echo agent, the web server on a free loopback port);
the "browsers" are aiortc peer connections in this process, each saying its own tone
(400 Hz, 500 Hz, ...) through the talk page's one-POST signalling. Figures: set-up time
(POST of the offer -> first audio frame back), the bridge's CPU per session over the steady
part (from /proc, its process alone), its RSS, and whether every session heard its own tone
back (no crosstalk, no silence). This process also encodes and decodes every session's
Opus, on the same 2 cores: the bridge's share is measured apart.

    .venv/bin/python bench/browser_leg.py [--sessions 4] [--duration 20]

Prints one JSON object; writes bench/out/browser_leg.json.
"""

from __future__ import annotations

import argparse
import asyncio
import fractions
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from bench.figures import pct
from sip_bridge.web.webrtc_leg import gathering_on

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
RATE = 48000
_TICK = os.sysconf("SC_CLK_TCK")


class Tone(MediaStreamTrack):
    kind = "audio"

    def __init__(self, freq: float) -> None:
        super().__init__()
        self.freq, self.n, self.t0 = freq, 0, 0.0

    async def recv(self) -> av.AudioFrame:
        loop = asyncio.get_running_loop()
        if self.n == 0:
            self.t0 = loop.time()
        wait = self.t0 + self.n * 0.02 - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        t = (np.arange(960) + self.n * 960) / RATE
        pcm = (0.3 * 32767 * np.sin(2 * np.pi * self.freq * t)).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(np.repeat(pcm, 2).reshape(1, -1), format="s16",
                                           layout="stereo")  # fmt: skip
        frame.sample_rate, frame.time_base = RATE, fractions.Fraction(1, RATE)
        frame.pts = self.n * 960
        self.n += 1
        return frame


class Session:
    def __init__(self, freq: float) -> None:
        self.freq = freq
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.heard: list[np.ndarray[Any, Any]] = []
        self.first_audio: float | None = None
        self.url = ""
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self, base: str, token: str, http: aiohttp.ClientSession) -> float:
        self.pc.addTrack(Tone(self.freq))
        self.pc.on("track", lambda tr: self.tasks.append(asyncio.ensure_future(self.listen(tr))))
        with gathering_on(("127.0.0.1",)):
            await self.pc.setLocalDescription(await self.pc.createOffer())
        t0 = time.monotonic()
        headers = {"Content-Type": "application/sdp", "Authorization": f"Bearer {token}"}
        async with http.post(f"{base}/talk/offer", data=self.pc.localDescription.sdp,
                             headers=headers) as r:  # fmt: skip
            if r.status != 201:
                raise RuntimeError(f"offer refused: {r.status} {await r.text()}")
            self.url = base + r.headers["Location"]
            answer = await r.text()
        await self.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        return t0

    async def listen(self, track: MediaStreamTrack) -> None:
        while True:
            frame = await track.recv()
            assert isinstance(frame, av.AudioFrame)
            x = frame.to_ndarray().reshape(-1, len(frame.layout.channels)).mean(axis=1)
            if self.first_audio is None and np.abs(x).max() > 1000:
                self.first_audio = time.monotonic()
            self.heard.append(x)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _dominant_hz(x: np.ndarray[Any, Any]) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.argmax(spec) * RATE / x.size)


async def run(sessions: int, duration: float) -> dict[str, Any]:
    rtp = f"{41000 + 200 * (os.getpid() % 40)}-{41199 + 200 * (os.getpid() % 40)}"
    cfg = Path(tempfile.mkdtemp()) / "bridge.toml"
    cfg.write_text(f'[agent]\nname = "echo"\n[http]\nmax_sessions = {sessions}\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "sip_bridge.cli", "run", "--config", str(cfg),
         "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--rtp-ports", rtp],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        base = None
        while base is None:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("the bridge did not start")
            m = re.search(r"operator console: (http://[\d.:]+)/console", line)
            base = m.group(1) if m else None
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/talk") as r:
                page = await r.text()
            token = re.search(r'name="page-token" content="([^"]+)"', page)
            assert token is not None
            all_s = [Session(400.0 + 100 * i) for i in range(sessions)]
            starts = [await s.start(base, token.group(1), http) for s in all_s]
            deadline = time.monotonic() + 15
            while any(s.first_audio is None for s in all_s) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            setup_ms = [1000 * (s.first_audio - t0) for s, t0 in zip(all_s, starts, strict=True)
                        if s.first_audio is not None]  # fmt: skip
            await asyncio.sleep(2.0)  # past the start: the echo's delay line is full
            cpu0, t0 = _cpu_s(proc.pid), time.monotonic()
            await asyncio.sleep(duration)
            cpu = (_cpu_s(proc.pid) - cpu0) / (time.monotonic() - t0)
            rss = _rss_mb(proc.pid)
            async with http.get(f"{base}/api/calls") as r:
                live = len((await r.json())["calls"])
            for s in all_s:
                async with http.delete(
                    s.url, headers={"Authorization": f"Bearer {token.group(1)}"}
                ):
                    pass
                for t in s.tasks:
                    t.cancel()
                await s.pc.close()
        heard_own = 0
        for s in all_s:
            tail = np.concatenate(s.heard)[-RATE:] if s.heard else np.zeros(RATE)
            if np.sqrt(np.mean(tail**2)) > 1000 and abs(_dominant_hz(tail) - s.freq) < 15:
                heard_own += 1
        return {
            "sessions": sessions,
            "listed_live": live,
            "heard_own_tone": heard_own,
            "setup_ms_p50": pct(setup_ms, 50),
            "setup_ms_max": round(max(setup_ms), 1) if setup_ms else None,
            "bridge_cpu_pct_per_session": round(100 * cpu / sessions, 2),
            "bridge_cpu_pct": round(100 * cpu, 1),
            "bridge_rss_mb": round(rss, 1),
            "duration_s": duration,
            "load_avg_1m": os.getloadavg()[0],
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--duration", type=float, default=20.0)
    args = ap.parse_args()
    result = asyncio.run(run(args.sessions, args.duration))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "browser_leg.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""What the softphone interop tests share: tone WAVs, spectrum checks, ports, a bridge thread.

The bridge runs in this process on its own event-loop thread (:class:`BridgeThread`) so a
test can drive a softphone synchronously and still look into the live call (its media
parameters and counters) while the phone holds, resumes or sends digits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import re
import socket
import subprocess
import sys
import threading
import time
import wave
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from agent.base import Agent, DtmfEvent
from agent.lines.echo import EchoAgent
from sip_bridge.config.loader import BridgeConfig
from sip_bridge.media.call_media import MediaStats
from sip_bridge.server import BridgeServer

T = TypeVar("T")
RATE = 8000
FRAME = 160  # 20 ms at 8 kHz

ROOT = Path(__file__).resolve().parents[2]


def write_tone(path: Path, freq: float, seconds: float = 3.0, level: float = 0.3) -> None:
    """A mono 16-bit 8 kHz sine WAV, `level` of full scale peak."""
    t = np.arange(int(RATE * seconds)) / RATE
    pcm = (level * 32767 * np.sin(2 * np.pi * freq * t)).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.tobytes())


def read_wav(path: Path) -> NDArray[np.float64]:
    """A mono 16-bit WAV as floats in [-1, 1]; the phones here record at 8 kHz."""
    with wave.open(str(path), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, RATE)
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return pcm.astype(np.float64) / 32767


def frame_rms(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """RMS of each 20 ms frame."""
    n = x.size // FRAME * FRAME
    rms: NDArray[np.float64] = np.sqrt(np.mean(x[:n].reshape(-1, FRAME) ** 2, axis=1))
    return rms


def loud_runs(x: NDArray[np.float64], threshold: float = 0.03) -> list[tuple[int, int]]:
    """(first, end) frame indices of each stretch of frames above `threshold` RMS."""
    loud = np.concatenate(([False], frame_rms(x) > threshold, [False]))
    edges = np.flatnonzero(np.diff(loud.astype(np.int8)))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def dominant_hz(seg: NDArray[np.float64] | NDArray[np.int16], rate: int = RATE) -> float:
    """Frequency of the strongest spectral peak (Hann window; 1/len resolution)."""
    spec = np.abs(np.fft.rfft(seg * np.hanning(seg.size)))
    spec[0] = 0.0
    return float(np.argmax(spec) * rate / seg.size)


def peak_level(seg: NDArray[np.float64]) -> float:
    """Peak amplitude of a steady sine, from its RMS."""
    return float(np.sqrt(2 * np.mean(seg**2)))


def steady_tone(
    x: NDArray[np.float64], frames: tuple[int, int], trim: int = 5
) -> NDArray[np.float64]:
    """The samples of a loud run without its first and last `trim` frames (edges, fades)."""
    a, b = frames
    return x[(a + trim) * FRAME : (b - trim) * FRAME]


def assert_tone(path: Path, freq: float, level: float = 0.3) -> None:
    """The longest loud stretch of a recording is `freq` (+-10 Hz) at `level` (+-2 dB).

    Stretches, not the whole file: DTMF (which replaces audio frames) and hold cut it up.
    """
    x = read_wav(path)
    runs = loud_runs(x)
    assert runs, f"nothing heard in {path.name}"
    a, b = max(runs, key=lambda r: r[1] - r[0])
    assert b - a >= 40, runs  # at least 0.8 s of steady tone
    seg = steady_tone(x, (a, b))
    assert abs(dominant_hz(seg) - freq) < 10, dominant_hz(seg)
    assert abs(20 * np.log10(peak_level(seg) / level)) < 2.0, peak_level(seg)


def free_udp_port(even: bool = False) -> int:
    """A UDP port on 127.0.0.1 free right now (with its odd neighbour free too if `even`)."""
    for _ in range(200):
        port = random.randrange(20000, 60000, 2) if even else 0
        socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2 if even else 1)]
        try:
            for i, s in enumerate(socks):
                s.bind(("127.0.0.1", port + i if even else 0))
            return int(socks[0].getsockname()[1])
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free UDP port")


def bridge_config(echo_delay_s: float = 0.5) -> BridgeConfig:
    """The shipped defaults on loopback, with a random RTP range so parallel tests don't meet."""
    low = random.randrange(20000, 59800, 2)
    base = BridgeConfig.line_check()
    return dataclasses.replace(
        base,
        sip=dataclasses.replace(base.sip, listen="127.0.0.1:0"),
        rtp=dataclasses.replace(base.rtp, ports=f"{low}-{low + 99}"),
        agent=dataclasses.replace(base.agent, echo_delay_s=echo_delay_s),
    )


class BridgeThread:
    """A BridgeServer with the echo agent on its own loop thread; keeps every agent it made."""

    def __init__(self, config: BridgeConfig | None = None) -> None:
        self.config = config or bridge_config()
        self.agents: list[EchoAgent] = []
        self.loop = asyncio.new_event_loop()
        self.server = BridgeServer(self.config, self._agent)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def _agent(self, config: BridgeConfig) -> Agent:
        agent = EchoAgent(delay_s=config.agent.echo_delay_s)
        self.agents.append(agent)
        return agent

    def run(self, fn: Callable[[], T]) -> T:
        """Call `fn` on the bridge's loop (where the call state lives) and return its result."""

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout=10)

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(timeout=10)

    def stop(self) -> None:
        try:
            fut = asyncio.run_coroutine_threadsafe(self.server.stop(grace_s=1.0), self.loop)
            fut.result(timeout=15)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
            self.loop.close()

    @property
    def uri(self) -> str:
        return self.server.uri

    def live_stats(self) -> list[MediaStats]:
        """Media counters and directions of the calls up right now."""

        def snap() -> list[MediaStats]:
            return [c.media.stats for c in self.server.calls.values() if c.media is not None]

        return self.run(snap)

    def digits(self) -> list[str]:
        """DTMF digits the agents got, in order."""
        return self.run(
            lambda: [e.digit for a in self.agents for e in a.events if isinstance(e, DtmfEvent)]
        )

    def stats(self) -> dict[str, int]:
        return self.run(lambda: dict(self.server.stats))


@contextmanager
def running_bridge(config: BridgeConfig | None = None) -> Iterator[BridgeThread]:
    bridge = BridgeThread(config)
    bridge.start()
    try:
        yield bridge
    finally:
        bridge.stop()


class LineReader:
    """Collects a subprocess's stdout lines on a thread, so waits can be bounded."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.lines.append("<EOF>")
            self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float = 10.0, start: int = 0) -> re.Match[str]:
        """The first line from index `start` on matching `pattern`; AssertionError on timeout."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            i = start
            while True:
                while i < len(self.lines):
                    m = rx.search(self.lines[i])
                    if m:
                        return m
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0 or (self.lines and self.lines[-1] == "<EOF>"):
                    tail = "\n".join(self.lines[-40:])
                    raise AssertionError(f"no line matching {pattern!r}; last lines:\n{tail}")
                self._cond.wait(left)

    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)


class ShellPeer:
    """A softphone driven by typing commands on its stdin (baresip, linphonec).

    Subclasses start ``self.proc`` (text mode, stdin/stdout pipes), set ``self.reader`` and
    name the command that makes them exit in ``QUIT``.
    """

    QUIT = "quit"
    proc: subprocess.Popen[str]
    reader: LineReader

    def send(self, command: str) -> int:
        """Type one line; returns the output line count before it, a start for `wait_for`."""
        mark = len(self.reader.lines)
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return mark

    def wait_for(self, pattern: str, timeout: float = 10.0, start: int = 0) -> str:
        return self.reader.wait_for(pattern, timeout, start).group(0)

    def close(self) -> None:
        """Quit (killing it if it will not), so the WAVs it recorded are complete."""
        try:
            if self.proc.poll() is None:
                self.send(self.QUIT)
                self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=5)


def bridge_calls(
    uri: str, play: Path, record: Path, duration_s: float = 3.0, dtmf: str = ""
) -> subprocess.CompletedProcess[str]:
    """``sip-bridge call URI`` as an operator runs it, on a free pair of RTP ports."""
    low = free_udp_port(even=True)
    cmd = [
        sys.executable, "-m", "sip_bridge.cli", "call", uri,
        "--play", str(play), "--record", str(record), "--duration", str(duration_s),
        "--rtp-ports", f"{low}-{low + 1}", *(["--dtmf", dtmf] if dtmf else []),
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=ROOT, check=False)


def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll `cond()` every 50 ms until true; AssertionError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


class HearingEchoAgent(EchoAgent):
    """The echo agent that also keeps every frame it heard (at its own rate, 24 kHz)."""

    def __init__(self, delay_s: float = 0.5) -> None:
        super().__init__(delay_s=delay_s)
        self.frames: list[NDArray[np.int16]] = []

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        self.frames.append(np.array(pcm, dtype=np.int16))
        super().on_audio(pcm)


class HearingBridgeThread(BridgeThread):
    """A BridgeThread whose echo agents keep what they heard: audio checked at the bridge,
    for peers that cannot record everything they hear (baresip 1.0.0 after a re-INVITE)."""

    def _agent(self, config: BridgeConfig) -> Agent:
        agent = HearingEchoAgent(delay_s=config.agent.echo_delay_s)
        self.agents.append(agent)
        return agent

    def heard_frames(self) -> int:
        """How many frames the call's agent has heard so far (a mark for `heard`)."""
        return self.run(lambda: sum(len(a.frames) for a in self._hearing()))

    def heard(self, since: int = 0) -> NDArray[np.float64]:
        """What the first call's agent heard from frame `since` on, at 8 kHz in [-1, 1]."""
        pcm = self.run(lambda: np.concatenate([*self._hearing()[0].frames[since:], np.zeros(0)]))
        x: NDArray[np.float64] = pcm[:: self._hearing()[0].sample_rate // RATE] / 32767
        return x

    def _hearing(self) -> list[HearingEchoAgent]:
        return [a for a in self.agents if isinstance(a, HearingEchoAgent)]


class AgentBridgeThread(BridgeThread):
    """A BridgeThread whose agents come from ``factory(n)``, n counting its calls from 0,
    so a test can give each call its own agent (a transferring one, then an echo)."""

    def __init__(self, factory: Callable[[int], Agent], config: BridgeConfig | None = None) -> None:
        self.factory = factory
        self.made: list[Agent] = []
        super().__init__(config)

    def _agent(self, config: BridgeConfig) -> Agent:
        agent = self.factory(len(self.made))
        self.made.append(agent)
        if isinstance(agent, EchoAgent):
            self.agents.append(agent)
        return agent


@contextmanager
def running_agent_bridge(
    factory: Callable[[int], Agent], config: BridgeConfig | None = None
) -> Iterator[AgentBridgeThread]:
    bridge = AgentBridgeThread(factory, config)
    bridge.start()
    try:
        yield bridge
    finally:
        bridge.stop()

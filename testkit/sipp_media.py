"""Helpers for the sipp tests that carry media: tone files, spectra, socket counters, and
running sipp in a chosen folder (rtp_stream reads its file name literally).

Used by tests/test_sipp_load.py and tests/test_sipp_reinvite.py; sipp's command line and
its pass/fail check are testkit/sipp_runner.py's.
"""

from __future__ import annotations

import asyncio
import random
import re
import wave
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from resample.g711 import ulaw_encode
from testkit.sipp_runner import finish, sipp_command

HOST = "127.0.0.1"


async def run_sipp_in(
    cwd: Path, bridge_port: int, scenario: str, *args: str, timeout: float, log: Path | None = None
) -> str:
    """sipp as a UAC against the bridge, run in ``cwd``; asserts it passed, returns its screen."""
    cmd = sipp_command(scenario, f"{HOST}:{bridge_port}", *args, timeout=timeout, log=log)
    proc = await asyncio.create_subprocess_exec(
        *cmd, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        return await finish(proc, scenario, timeout + 10)
    finally:
        if proc.returncode is None:  # timed out: do not leave it streaming
            proc.kill()
            await proc.wait()


def sipp_counts(screen: str) -> tuple[int | None, int | None]:
    """(successful, failed) cumulative call counts from sipp's final screen."""
    ok = re.findall(r"Successful call\s+\|\s+\d+\s+\|\s+(\d+)", screen)
    failed = re.findall(r"Failed call\s+\|\s+\d+\s+\|\s+(\d+)", screen)
    return (int(ok[-1]) if ok else None, int(failed[-1]) if failed else None)


def random_port_range(size: int, low: int, high: int) -> tuple[int, int]:
    """An even-based block of ``size`` ports inside [low, high]; the pool skips busy ones."""
    base = random.Random().randrange(low, high - size, 2)
    return base, base + size - 1


def tone(freqs: tuple[float, ...], seconds: float, level: float = 0.25) -> NDArray[np.int16]:
    """A sum of sines at 8 kHz, speech level, so the echo path does real work."""
    t = np.arange(int(8000 * seconds)) / 8000
    x = sum(np.sin(2 * np.pi * f * t) for f in freqs) * (level / len(freqs))
    return (np.asarray(x) * 32767).astype(np.int16)


def write_wav(path: Path, pcm: NDArray[np.int16]) -> Path:
    """8 kHz 16-bit mono WAV, what `sip-bridge call --play` and place_call() read."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(pcm.astype("<i2").tobytes())
    return path


def write_ulaw(path: Path, pcm: NDArray[np.int16]) -> None:
    """Raw mu-law, what sipp's rtp_stream plays (PT 0, 160 bytes per packet)."""
    path.write_bytes(ulaw_encode(pcm).tobytes())


def udp_socket_counters(port: int) -> tuple[int, int] | None:
    """(bytes queued, datagrams dropped) of the IPv4 UDP socket bound to ``port``, or None.

    sipp never reads its media socket (without -rtp_echo), so once its receive buffer is
    full every datagram that reaches it is counted as a drop: a count of what arrived.
    """
    for line in Path("/proc/net/udp").read_text().splitlines()[1:]:
        f = line.split()
        if int(f[1].rsplit(":", 1)[1], 16) == port:
            return int(f[4].split(":")[1], 16), int(f[-1])
    return None

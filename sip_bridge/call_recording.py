"""Optional call recording: one stereo WAV per call, the caller left, the agent right.

Both sides are taken at the line rate (8 kHz) where the media path already has them: the
caller's frame as the jitter buffer plays it to the agent, and the agent's frame as it goes
on the wire (silence included, an RFC 4733 key's slot as silence), so the two channels stay
in step sample for sample with no clock of their own. Written in blocks of about a second
(a crash loses at most the last one, and the header is fixed up at the end).
"""

from __future__ import annotations

import re
import time
import wave
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

__all__ = ["StereoRecorder", "recording_path"]

RATE = 8000
_BLOCK = RATE  # samples per channel written at once


def recording_path(directory: str | Path, call_id: str, when: float | None = None) -> Path:
    """``<dir>/<UTC time>_<call id, made safe for a file name>.wav``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if when is None else when))
    safe = re.sub(r"[^A-Za-z0-9@._-]", "_", call_id)[:120] or "call"
    return Path(directory) / f"{stamp}_{safe}.wav"


class StereoRecorder:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._wav = wave.open(str(path), "wb")  # noqa: SIM115 (open for the call's life)
        self._wav.setnchannels(2)
        self._wav.setsampwidth(2)
        self._wav.setframerate(RATE)
        self._left: list[NDArray[np.int16]] = []
        self._right: list[NDArray[np.int16]] = []
        self._nl = self._nr = 0
        self.samples = 0  # per channel, written
        self.closed = False

    def caller(self, pcm: NDArray[np.int16]) -> None:
        self._left.append(pcm.copy())
        self._nl += pcm.size
        self._write_ready()

    def agent(self, pcm: NDArray[np.int16]) -> None:
        self._right.append(pcm.copy())
        self._nr += pcm.size
        self._write_ready()

    def agent_silence(self, samples: int) -> None:
        self.agent(np.zeros(samples, np.int16))

    def _write_ready(self) -> None:
        n = min(self._nl, self._nr)
        if n >= _BLOCK:
            self._write(n)

    def _write(self, n: int) -> None:
        left, self._left = _split(self._left, n)
        right, self._right = _split(self._right, n)
        self._nl -= n
        self._nr -= n
        frames = np.empty(2 * n, np.int16)
        frames[0::2], frames[1::2] = left, right
        self._wav.writeframesraw(frames.astype("<i2").tobytes())
        self.samples += n

    def close(self) -> None:
        """Write what is left (the shorter side padded with silence) and fix the header."""
        if self.closed:
            return
        self.closed = True
        n = max(self._nl, self._nr)
        if n:
            if self._nl < n:
                self._left.append(np.zeros(n - self._nl, np.int16))
                self._nl = n
            if self._nr < n:
                self._right.append(np.zeros(n - self._nr, np.int16))
                self._nr = n
            self._write(n)
        self._wav.close()


def _split(
    chunks: list[NDArray[np.int16]], n: int
) -> tuple[NDArray[np.int16], list[NDArray[np.int16]]]:
    """The first ``n`` samples of ``chunks`` as one array, and the rest as chunks."""
    whole = np.concatenate(chunks)
    return whole[:n], ([whole[n:]] if whole.size > n else [])

"""Optional call recording: one stereo WAV per call, the caller left, the agent right.

Both sides are taken at the line rate (8 kHz) where the media path already has them: the
caller's frame as the jitter buffer plays it to the agent, and the agent's frame as it goes
on the wire (silence included, an RFC 4733 key's slot as silence), so the two channels stay
in step sample for sample with no clock of their own. Written in blocks of about a second
(a crash loses at most the last one, and the header is fixed up at the end).

What must not be kept is not: while ``muted()`` says so (the agent asks for a sensitive
slot: a PIN, a card number) both channels get silence, and for :data:`MUTE_HANGOVER`
after, so the last key's tone and the jitter buffer's lag stay out too ("pause and
resume", as contact centres do for card payments). :meth:`StereoRecorder.silence_caller`
blanks the caller's side after the fact, from a sample on (a card number heard in a turn
that was not a sensitive slot's).
"""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.typing import NDArray

__all__ = ["MUTE_HANGOVER", "StereoRecorder", "recording_path"]

RATE = 8000
_BLOCK = RATE  # samples per channel written at once
_HEADER = 44  # bytes of the canonical PCM WAV header
MUTE_HANGOVER = RATE // 2  # samples of silence after a muted stretch ends


def recording_path(directory: str | Path, call_id: str, when: float | None = None) -> Path:
    """``<dir>/<UTC time>_<call id, made safe for a file name>.wav``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if when is None else when))
    safe = re.sub(r"[^A-Za-z0-9@._-]", "_", call_id)[:120] or "call"
    return Path(directory) / f"{stamp}_{safe}.wav"


def _header(frames: int) -> bytes:
    data = frames * 4  # 2 channels x 16 bits
    return b"RIFF" + struct.pack("<I", 36 + data) + b"WAVEfmt " + struct.pack(
        "<IHHIIHH", 16, 1, 2, RATE, RATE * 4, 4, 16
    ) + b"data" + struct.pack("<I", data)  # fmt: skip


class StereoRecorder:
    def __init__(self, path: Path, muted: Callable[[], bool] | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh: BinaryIO = open(path, "w+b")  # noqa: SIM115 (open for the call's life)
        self._fh.write(_header(0))
        self._muted = muted
        self._hangover = {"caller": 0, "agent": 0}  # samples of silence still owed per side
        self._left: list[NDArray[np.int16]] = []
        self._right: list[NDArray[np.int16]] = []
        self._nl = self._nr = 0
        self.samples = 0  # per channel, written
        self.closed = False

    @property
    def caller_samples(self) -> int:
        """Samples of the caller's side so far (written and waiting): a position for
        :meth:`silence_caller`."""
        return self.samples + self._nl

    @property
    def agent_samples(self) -> int:
        """Samples of the agent's side so far (each side counts its own: they may drift
        apart by a few frames when the media loop skips ticks under load)."""
        return self.samples + self._nr

    def caller(self, pcm: NDArray[np.int16]) -> None:
        self._left.append(self._kept("caller", pcm))
        self._nl += pcm.size
        self._write_ready()

    def agent(self, pcm: NDArray[np.int16]) -> None:
        self._right.append(self._kept("agent", pcm))
        self._nr += pcm.size
        self._write_ready()

    def agent_silence(self, samples: int) -> None:
        self.agent(np.zeros(samples, np.int16))

    def _kept(self, side: str, pcm: NDArray[np.int16]) -> NDArray[np.int16]:
        """What of a frame may be recorded: a copy, or silence while muted."""
        if self._muted is not None and self._muted():
            self._hangover[side] = MUTE_HANGOVER  # counted from the end of the stretch
            return np.zeros(pcm.size, np.int16)
        owed = self._hangover[side]
        if not owed:
            return pcm.copy()
        self._hangover[side] = max(0, owed - pcm.size)
        out = np.zeros(pcm.size, np.int16)
        if owed < pcm.size:
            out[owed:] = pcm[owed:]
        return out

    def silence_caller(self, start: int) -> None:
        """Blank the caller's side from sample ``start`` (of :attr:`caller_samples`) to now,
        on disk too."""
        start = max(0, start)
        if start < self.samples and not self.closed:
            self._fh.flush()
            pos = _HEADER + 4 * start
            self._fh.seek(pos)
            frames = np.frombuffer(self._fh.read(4 * (self.samples - start)), "<i2").copy()
            frames[0::2] = 0
            self._fh.seek(pos)
            self._fh.write(frames.tobytes())
            self._fh.seek(0, 2)
        offset = self.samples  # the waiting chunks' first sample
        for chunk in self._left:
            lo = max(0, start - offset)
            if lo < chunk.size:
                chunk[lo:] = 0
            offset += chunk.size

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
        self._fh.write(frames.astype("<i2").tobytes())
        self.samples += n

    def close(self) -> None:
        """Write what is left (the shorter side padded with silence) and fix the header."""
        if self.closed:
            return
        self.closed = True
        n = max(self._nl, self._nr)
        try:
            if n:
                if self._nl < n:
                    self._left.append(np.zeros(n - self._nl, np.int16))
                    self._nl = n
                if self._nr < n:
                    self._right.append(np.zeros(n - self._nr, np.int16))
                    self._nr = n
                self._write(n)
            self._fh.seek(0)
            self._fh.write(_header(self.samples))
        finally:
            self._fh.close()


def _split(
    chunks: list[NDArray[np.int16]], n: int
) -> tuple[NDArray[np.int16], list[NDArray[np.int16]]]:
    """The first ``n`` samples of ``chunks`` as one array, and the rest as chunks."""
    whole = np.concatenate(chunks)
    return whole[:n], ([whole[n:]] if whole.size > n else [])

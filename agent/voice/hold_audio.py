"""What a caller hears while the agent works without speaking: ringback or hold audio while
a transfer rings, and a short tone pip that fills a long wait.

Frame-by-frame sources at 8 kHz (the voice agent's rate): the agent writes one frame per
tick it hears, like the tone and playback agents, so the outbound queue stays at one frame
and the sound stops the moment the transfer's outcome is known.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["RINGBACK", "LoopedAudio", "Ringback", "tone_pip"]

RATE = 8000
FULL_SCALE = 32768.0
#: North American ringback (ANSI T1.401, ITU-T E.180 supplement 2): 440 + 480 Hz,
#: 2 s on, 4 s off, each tone at -19 dBm0 (about -22 dBFS RMS for G.711).
RINGBACK = ((440.0, 480.0), 2.0, 4.0, -22.0)


class Ringback:
    """A cadenced tone pair: ``on_s`` of the summed sines, ``off_s`` of silence, repeated.
    ``level_dbfs`` is each tone's RMS level. Phase runs on across frames and bursts."""

    def __init__(
        self,
        freqs: tuple[float, ...] = RINGBACK[0],
        on_s: float = RINGBACK[1],
        off_s: float = RINGBACK[2],
        level_dbfs: float = RINGBACK[3],
        rate: int = RATE,
    ) -> None:
        self.freqs = freqs
        self.rate = rate
        self.period = round((on_s + off_s) * rate)
        self.on = round(on_s * rate)
        self.amplitude = FULL_SCALE * 10 ** (level_dbfs / 20) * 2**0.5  # peak of that RMS
        self._n = 0  # samples produced

    def next_frame(self, size: int) -> NDArray[np.int16]:
        n = self._n + np.arange(size)
        self._n += size
        y = np.zeros(size)
        for f in self.freqs:
            y += np.sin(2 * np.pi * f * n / self.rate)
        y *= self.amplitude * ((n % self.period) < self.on)
        out: NDArray[np.int16] = np.clip(np.rint(y), -32767, 32767).astype(np.int16)
        return out


class LoopedAudio:
    """A recording (mono int16 at the agent's rate) played over and over."""

    def __init__(self, pcm: NDArray[np.int16]) -> None:
        if pcm.size == 0:
            raise ValueError("hold audio is empty")
        self.pcm = pcm
        self._pos = 0

    def next_frame(self, size: int) -> NDArray[np.int16]:
        idx = (self._pos + np.arange(size)) % self.pcm.size
        self._pos = (self._pos + size) % self.pcm.size
        return self.pcm[idx]


def tone_pip(
    freq_hz: float, ms: int = 200, level_dbfs: float = -24.0, rate: int = RATE
) -> NDArray[np.int16]:
    """A short soft tone with 20 ms raised-cosine ramps (no click): "still working"."""
    n = round(rate * ms / 1000)
    t = np.arange(n) / rate
    ramp = min(n // 2, round(0.02 * rate))
    env = np.ones(n)
    if ramp:
        edge = 0.5 - 0.5 * np.cos(np.pi * np.arange(ramp) / ramp)
        env[:ramp], env[n - ramp :] = edge, edge[::-1]
    y = FULL_SCALE * 10 ** (level_dbfs / 20) * 2**0.5 * env * np.sin(2 * np.pi * freq_hz * t)
    out: NDArray[np.int16] = np.clip(np.rint(y), -32767, 32767).astype(np.int16)
    return out

"""What a caller hears, frame by frame: ringback or not, and the silences in between.

Test and bench helpers over 20 ms frames of received 8 kHz audio (the wire caller's log).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["ringback_frames", "ringback_like", "tone_share"]

RINGBACK_HZ = (440.0, 480.0)


def tone_share(pcm: NDArray[np.int16], freqs: tuple[float, ...], rate: int = 8000) -> float:
    """The share of the frame's energy at ``freqs`` (0..1)."""
    x = pcm.astype(np.float64)
    total = float(np.dot(x, x))
    if total <= 0:
        return 0.0
    n = np.arange(x.size)
    tone = sum(2 * abs(np.dot(x, np.exp(-2j * np.pi * f * n / rate))) ** 2 / x.size for f in freqs)
    return float(tone / total)


def ringback_like(pcm: NDArray[np.int16]) -> bool:
    """Most of the frame's energy at 440 and 480 Hz (the North American ringback pair)."""
    return tone_share(pcm, RINGBACK_HZ) > 0.5


def ringback_frames(frames: list[NDArray[np.int16]], run: int = 10, edge: int = 2) -> list[bool]:
    """Which frames are ringback: runs of ``run`` (200 ms) or more ringback-like frames
    (speech has moments near 440/480 Hz too), and ``edge`` frames either side of a run (a
    burst's first and last frames, part tone and part silence, may not look like it)."""
    flags = [ringback_like(f) for f in frames]
    out = [False] * len(flags)
    i = 0
    while i < len(flags):
        j = i
        while j < len(flags) and flags[j]:
            j += 1
        if j - i >= run:
            out[max(0, i - edge) : j + edge] = [True] * (
                min(len(flags), j + edge) - max(0, i - edge)
            )
        i = max(j, i + 1)
    return out

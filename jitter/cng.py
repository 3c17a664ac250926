"""Comfort noise for DTX gaps (RFC 3389 level, white spectrum).

A caller's silence should not sound like a dead line: during a DTX gap the
jitter buffer plays noise at the level the sender's last CN packet announced,
or digital silence if it never sent one.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["ComfortNoise"]


class ComfortNoise:
    """Deterministic white noise at an RFC 3389 level (-dBov, 0..127)."""

    def __init__(self, clock_rate: int, seed: int = 0x5EED) -> None:
        # One second of pre-drawn noise, cycled: cheap, and reproducible in tests.
        self._noise: NDArray[np.float64] = np.random.default_rng(seed).standard_normal(clock_rate)
        self._pos = 0
        self.amplitude = 0.0  # rms in int16 units; 0 = digital silence until a level is set

    def set_level_dbov(self, level: int) -> None:
        """Level from a CN payload: rms = 32767 * 10^(-level/20); 127 is practically silence."""
        lvl = min(127, max(0, int(level)))
        self.amplitude = 32767.0 * 10.0 ** (-lvl / 20.0)

    def generate(self, n: int) -> NDArray[np.float64]:
        """`n` samples of noise (float, int16 scale) at the current level."""
        if self.amplitude <= 0.0:
            return np.zeros(n)
        noise = self._noise
        size = noise.size
        i = self._pos
        j = i + n
        x = noise[i:j] if j <= size else np.concatenate((noise[i:], noise[: j % size]))
        self._pos = j % size
        return x * self.amplitude

"""Audio samples addressed by an unbounded timeline position, in a fixed circular buffer.

The jitter buffer writes each packet's samples at its timeline timestamp and
reads frames from its playout cursor; any packet size, partial overlaps and
duplicates need no special case. Each sample also records whether it holds
audio and which (unwrapped) sequence number wrote it, so a hole can be told
apart as a loss or as silence.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

_G = TypeVar("_G", bound=np.generic)

__all__ = ["SampleRing"]


class SampleRing:
    """`capacity` samples of int16 audio with a validity mask and writer sequence numbers."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self.pcm: NDArray[np.int16] = np.zeros(capacity, dtype=np.int16)
        self.valid: NDArray[np.bool_] = np.zeros(capacity, dtype=bool)
        self.seq: NDArray[np.int64] = np.zeros(capacity, dtype=np.int64)

    def view(self, arr: NDArray[_G], p: int, n: int) -> NDArray[_G]:
        """`n` entries of one of the arrays from position `p` (a copy only across the wrap)."""
        cap = self.capacity
        i = p % cap
        j = i + n
        if j <= cap:
            return arr[i:j]
        return np.concatenate((arr[i:], arr[: j - cap]))

    def write(self, p: int, pcm: NDArray[np.int16], seq: int) -> None:
        """Store `pcm` at positions p.. as valid audio written by packet `seq`."""
        cap = self.capacity
        i = p % cap
        j = i + pcm.size
        if j <= cap:
            self.pcm[i:j] = pcm
            self.valid[i:j] = True
            self.seq[i:j] = seq
        else:
            k = cap - i
            self.pcm[i:] = pcm[:k]
            self.pcm[: j - cap] = pcm[k:]
            self.valid[i:] = True
            self.valid[: j - cap] = True
            self.seq[i:] = seq
            self.seq[: j - cap] = seq

    def clear(self, p: int, n: int) -> None:
        """Mark n positions from p as empty (played, or skipped)."""
        cap = self.capacity
        if n <= 0:
            return
        if n >= cap:
            self.valid[:] = False
            return
        i = p % cap
        j = i + n
        if j <= cap:
            self.valid[i:j] = False
        else:
            self.valid[i:] = False
            self.valid[: j - cap] = False

    def first_valid(self, p: int, end: int) -> int | None:
        """The first position in [p, end) holding audio, or None."""
        length = min(end - p, self.capacity)
        if length <= 0:
            return None
        m = self.view(self.valid, p, length)
        k = int(np.argmax(m))
        if not m[k]:
            return None
        return p + k

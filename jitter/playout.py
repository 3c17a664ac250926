"""Outbound playout buffer: paces bursty agent audio into fixed RTP frames."""

from __future__ import annotations

from collections import deque

import numpy as np
from numpy.typing import NDArray


class PlayoutBuffer:
    """A FIFO of int16 samples read one frame per tick.

    `write()` accepts bursts of any size; `pop()` always returns exactly one
    frame (the tail of the queue zero-padded, or silence on underrun). Samples
    are never inserted or lost except by `flush()` (barge-in) and by the
    optional `max_ms` cap, which drops the OLDEST queued audio so that latency
    cannot grow without bound over a long call.
    """

    def __init__(self, rate: int, frame_ms: int = 20, max_ms: float | None = None) -> None:
        if rate <= 0 or frame_ms <= 0:
            raise ValueError("rate and frame_ms must be positive")
        if (rate * frame_ms) % 1000:
            raise ValueError("frame_ms must be a whole number of samples at this rate")
        self.rate = rate
        self.frame_ms = frame_ms
        self.frame_samples = rate * frame_ms // 1000
        self.max_samples: int | None = None
        if max_ms is not None:
            if max_ms < frame_ms:
                raise ValueError("max_ms must be at least one frame")
            self.max_samples = int(rate * max_ms / 1000)
        self._chunks: deque[NDArray[np.int16]] = deque()
        self._head = 0  # samples of _chunks[0] already consumed
        self._queued = 0
        self.underrun_frames = 0  # pops that were not a full frame of queued audio
        self.overflow_samples = 0  # dropped by the max_ms cap
        self.flushed_samples = 0  # dropped by flush()
        self.written_samples = 0
        self.popped_samples = 0  # real (not padding) samples handed out

    @property
    def queued_samples(self) -> int:
        return self._queued

    @property
    def queued_ms(self) -> float:
        return 1000.0 * self._queued / self.rate

    @property
    def overflow_ms(self) -> float:
        return 1000.0 * self.overflow_samples / self.rate

    def write(self, pcm: NDArray[np.int16], *, copy: bool = True) -> None:
        """Queue samples. ``copy=False`` keeps a reference instead of a copy: only for a
        caller that hands over an array nobody else will write to (the media clock's
        freshly resampled rows)."""
        a = np.asarray(pcm)
        if a.dtype != np.int16 or a.ndim != 1:
            raise ValueError("pcm must be a 1-D int16 array")
        if a.size == 0:
            return
        self._chunks.append(a.copy() if copy else a)
        self._queued += a.size
        self.written_samples += a.size
        if self.max_samples is not None and self._queued > self.max_samples:
            self.overflow_samples += self._discard(self._queued - self.max_samples)

    def _discard(self, n: int) -> int:
        """Drop the oldest `n` samples; returns how many were dropped."""
        dropped = 0
        while n > 0 and self._chunks:
            left = self._chunks[0].size - self._head
            if left <= n:
                self._chunks.popleft()
                self._head = 0
                n -= left
                dropped += left
            else:
                self._head += n
                dropped += n
                n = 0
        self._queued -= dropped
        return dropped

    def pop(self) -> NDArray[np.int16]:
        f = self.frame_samples
        if self._chunks:  # the usual frame: all inside the first chunk, one copy
            c = self._chunks[0]
            h = self._head
            if c.size - h >= f:
                out = c[h : h + f].copy()
                if c.size - h == f:
                    self._chunks.popleft()
                    self._head = 0
                else:
                    self._head = h + f
                self._queued -= f
                self.popped_samples += f
                return out
        out = np.zeros(f, dtype=np.int16)
        filled = 0
        while filled < f and self._chunks:
            c = self._chunks[0]
            take = min(f - filled, c.size - self._head)
            out[filled : filled + take] = c[self._head : self._head + take]
            filled += take
            self._head += take
            if self._head >= c.size:
                self._chunks.popleft()
                self._head = 0
        self._queued -= filled
        self.popped_samples += filled
        if filled < f:
            self.underrun_frames += 1
        return out

    def flush(self, fade: NDArray[np.float64] | None = None) -> float:
        """Drop everything queued (barge-in); returns the milliseconds dropped. ``fade``:
        the first ``fade.size`` queued samples stay, multiplied by it (a fade-out the
        caller hears instead of a cut), and play as usual; the rest is dropped."""
        keep = np.zeros(0, dtype=np.int16)
        if fade is not None and self._queued:
            n = min(int(fade.size), self._queued)
            head = np.zeros(n, dtype=np.float64)
            filled = 0
            for c in self._chunks:
                start = self._head if filled == 0 else 0
                take = min(n - filled, c.size - start)
                head[filled : filled + take] = c[start : start + take]
                filled += take
                if filled >= n:
                    break
            keep = np.rint(head * fade[:n]).astype(np.int16)
        n_dropped = self._queued - keep.size
        self._chunks.clear()
        self._head = 0
        self._queued = 0
        self.flushed_samples += n_dropped
        if keep.size:
            self._chunks.append(keep)
            self._queued = keep.size
        return 1000.0 * n_dropped / self.rate

"""Playout-delay estimation for the jitter buffer (pure, no I/O).

relative transit r = arrival - T/rate for each packet. The *base* is the
minimum of r over a sliding window (4 s, in 0.25 s buckets), de-trended by
the slope of r's per-second minima over the last 60 s: that slope is the
sender's clock drift, and without it a +-0.5 % drift would bias the base by
up to 20 ms. A packet's jitter sample is r - base; the target delay is a high
quantile of the recent samples plus a margin, with instant attack (a spike
raises it at once) and a slow exponential release.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque

import numpy as np

__all__ = ["DelayEstimator"]

_GUARD_S = 1e-7  # float slack below a bucket boundary, where the exact test takes over


class DelayEstimator:
    """Base transit (drift-corrected sliding minimum) and target-delay quantile."""

    def __init__(
        self,
        min_delay_s: float,
        max_delay_s: float,
        *,
        quantile: float = 0.99,
        window: int = 500,
        margin_s: float = 0.004,
        base_window_s: float = 4.0,
        bucket_s: float = 0.25,
        slope_window_s: float = 60.0,
        release_tau_s: float = 2.0,
        max_slope: float = 0.01,
    ) -> None:
        self.min_delay_s = min_delay_s
        self.max_delay_s = max_delay_s
        self.quantile = quantile
        self.window = window
        self.margin_s = margin_s
        self.base_window_s = base_window_s
        self.bucket_s = bucket_s
        self.slope_window_s = slope_window_s
        self.release_tau_s = release_tau_s
        self.max_slope = max_slope
        self.target_s = min_delay_s
        self.slope = 0.0  # d(relative transit)/dt: minus the sender's clock drift
        self.jitter_s = 0.0  # RFC 3550 J
        self._t0: float | None = None
        self._last_t = 0.0
        self._last_r: float | None = None
        self._span = round(base_window_s / bucket_s)  # buckets in the base window
        # closed base buckets: (bucket index, t, r) of each bucket's minimum
        self._buckets: deque[tuple[int, float, float]] = deque()
        # the open bucket, as plain attributes (this runs for every packet)
        self._b_idx = -1
        self._b_t = 0.0
        self._b_r = math.inf
        self._b_guard = -math.inf  # below it t is in the open bucket (see update)
        self._closed_min = math.inf  # min over closed buckets of r - slope * t
        self._secs: deque[tuple[float, float]] = deque()  # per-second minima (t, r)
        self._s_idx = -1
        self._s_t = 0.0
        self._s_r = math.inf
        self._s_n = 0
        self._sorted: list[float] = []
        self._fifo: deque[float] = deque()

    @property
    def has_data(self) -> bool:
        return self._t0 is not None

    def _recompute_closed(self) -> None:
        s = self.slope
        self._closed_min = min((r - s * t for _, t, r in self._buckets), default=math.inf)

    def _fit_slope(self) -> None:
        if len(self._secs) < 20 or self._secs[-1][0] - self._secs[0][0] < 30.0:
            return
        ts = np.array([p[0] for p in self._secs])
        rs = np.array([p[1] for p in self._secs])
        tc = ts - ts.mean()
        den = float(np.dot(tc, tc))
        if den <= 0.0:
            return
        slope = float(np.dot(tc, rs - rs.mean())) / den
        self.slope = min(self.max_slope, max(-self.max_slope, slope))
        self._recompute_closed()

    def base_at(self, now_s: float) -> float:
        """The drift-corrected base relative transit at time `now_s` (seconds)."""
        t0 = self._t0
        if t0 is None:
            return 0.0
        slope = self.slope
        m = self._b_r - slope * self._b_t
        closed = self._closed_min
        return (closed if closed < m else m) + slope * (now_s - t0)

    def typical_jitter_s(self) -> float:
        if not self._sorted:
            return 0.0
        return self._sorted[len(self._sorted) // 2]

    def update(self, arrival_s: float, r: float, phase_s: float) -> float:
        """Account one packet; returns its jitter sample (s).

        Runs for every packet of every call: the bucket and second boundaries are checked
        against precomputed bounds, attributes are read once."""
        t0 = self._t0
        if t0 is None:
            t0 = self._t0 = arrival_s
        t = arrival_s - t0
        last_r = self._last_r
        if last_r is not None:
            self.jitter_s += (abs(r - last_r) - self.jitter_s) * 0.0625
        self._last_r = r
        # sliding minimum in buckets (b_guard: below it, t is still in the open bucket)
        if t >= self._b_guard and int(t // self.bucket_s) > self._b_idx:
            b = int(t // self.bucket_s)
            if self._b_idx >= 0:
                buckets = self._buckets
                buckets.append((self._b_idx, self._b_t, self._b_r))
                lo = b - self._span
                while buckets and buckets[0][0] < lo:
                    buckets.popleft()
                self._recompute_closed()
            self._b_idx, self._b_t, self._b_r = b, t, r
            self._b_guard = (b + 1) * self.bucket_s - _GUARD_S
        elif r < self._b_r:
            self._b_t, self._b_r = t, r
        # per-second minima for the drift slope (t // 1.0 > s is exactly t >= s + 1)
        if t >= self._s_idx + 1:
            if self._s_n >= 10:  # sparse seconds (DTX) give biased minima
                secs = self._secs
                secs.append((self._s_t, self._s_r))
                while secs and secs[0][0] < t - self.slope_window_s:
                    secs.popleft()
                self._fit_slope()
            self._s_idx, self._s_t, self._s_r, self._s_n = int(t // 1.0), t, r, 1
        else:
            self._s_n += 1
            if r < self._s_r:
                self._s_t, self._s_r = t, r
        slope = self.slope
        m = self._b_r - slope * self._b_t
        closed = self._closed_min
        base = (closed if closed < m else m) + slope * t
        j = r - base
        if j < 0.0:
            j = 0.0
        j += phase_s
        # quantile window
        srt = self._sorted
        insort(srt, j)
        fifo = self._fifo
        fifo.append(j)
        if len(fifo) > self.window:
            del srt[bisect_left(srt, fifo.popleft())]
        n = len(srt)
        k = int(self.quantile * n)
        q = srt[k if k < n else n - 1] + self.margin_s
        least = self.min_delay_s
        raw = least if q < least else min(q, self.max_delay_s)
        last_t = self._last_t
        if raw >= self.target_s:
            self.target_s = raw
        else:
            dt = t - last_t
            if dt > 0.0:
                self.target_s = raw + (self.target_s - raw) * math.exp(-dt / self.release_tau_s)
        if t > last_t:
            self._last_t = t
        return j

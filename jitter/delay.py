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

import bisect
import math
from collections import deque

import numpy as np

__all__ = ["DelayEstimator"]


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
        # closed base buckets: (bucket index, t, r) of each bucket's minimum
        self._buckets: deque[tuple[int, float, float]] = deque()
        self._bucket: tuple[int, float, float] | None = None
        self._closed_min = math.inf  # min over closed buckets of r - slope * t
        self._secs: deque[tuple[float, float]] = deque()  # per-second minima (t, r)
        self._sec: tuple[int, float, float, int] | None = None
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
        if self._t0 is None:
            return 0.0
        t = now_s - self._t0
        m = self._closed_min
        if self._bucket is not None:
            _, bt, br = self._bucket
            m = min(m, br - self.slope * bt)
        return m + self.slope * t

    def typical_jitter_s(self) -> float:
        if not self._sorted:
            return 0.0
        return self._sorted[len(self._sorted) // 2]

    def update(self, arrival_s: float, r: float, phase_s: float) -> float:
        """Account one packet; returns its jitter sample (s)."""
        if self._t0 is None:
            self._t0 = arrival_s
            self._last_t = 0.0
        t = arrival_s - self._t0
        if self._last_r is not None:
            self.jitter_s += (abs(r - self._last_r) - self.jitter_s) / 16.0
        self._last_r = r
        # sliding minimum in buckets
        b = math.floor(t / self.bucket_s)
        cur = self._bucket
        if cur is None:
            self._bucket = (b, t, r)
        elif b > cur[0]:
            self._buckets.append(cur)
            lo = b - round(self.base_window_s / self.bucket_s)
            while self._buckets and self._buckets[0][0] < lo:
                self._buckets.popleft()
            self._bucket = (b, t, r)
            self._recompute_closed()
        elif r < cur[2]:
            self._bucket = (cur[0], t, r)
        # per-second minima for the drift slope
        sec = math.floor(t)
        cs = self._sec
        if cs is None:
            self._sec = (sec, t, r, 1)
        elif sec > cs[0]:
            if cs[3] >= 10:  # sparse seconds (DTX) give biased minima
                self._secs.append((cs[1], cs[2]))
                while self._secs and self._secs[0][0] < t - self.slope_window_s:
                    self._secs.popleft()
                self._fit_slope()
            self._sec = (sec, t, r, 1)
        elif r < cs[2]:
            self._sec = (cs[0], t, r, cs[3] + 1)
        else:
            self._sec = (cs[0], cs[1], cs[2], cs[3] + 1)
        j = max(0.0, r - self.base_at(arrival_s)) + phase_s
        # quantile window
        bisect.insort(self._sorted, j)
        self._fifo.append(j)
        if len(self._fifo) > self.window:
            old = self._fifo.popleft()
            k = bisect.bisect_left(self._sorted, old)
            del self._sorted[k]
        n = len(self._sorted)
        q = self._sorted[min(n - 1, int(self.quantile * n))]
        raw = min(self.max_delay_s, max(self.min_delay_s, q + self.margin_s))
        dt = max(0.0, t - self._last_t)
        self._last_t = max(self._last_t, t)
        if raw >= self.target_s:
            self.target_s = raw
        else:
            self.target_s = raw + (self.target_s - raw) * math.exp(-dt / self.release_tau_s)
        return j

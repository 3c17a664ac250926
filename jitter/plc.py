"""Packet-loss concealment in the spirit of ITU-T G.711 Appendix I.

Written from the published description of the algorithm:

* a history of the last ~48.75 ms of output is kept;
* on the first lost frame the pitch period is estimated by normalised
  cross-correlation of the newest 20 ms of history against earlier segments,
  over lags of 2.5..15 ms;
* the excitation is the last pitch period repeated; the junction where the
  repeated period wraps around is smoothed by overlap-adding the last quarter
  period with the quarter period that precedes it;
* after 10 ms of erasure two periods are repeated, after 20 ms three, to
  avoid the buzzy sound of a single repeated period (with a quarter-period
  cross-fade at each switch);
* from the second 10 ms on the synthetic signal is attenuated linearly by
  20 % per 10 ms, so it reaches silence 60 ms into the erasure;
* on the first good frame after an erasure the still-running synthetic
  signal is cross-faded into the real one over a quarter period plus 4 ms
  per additional 10 ms of erasure (at most 10 ms).

Unlike Appendix I there is no 3.75 ms output delay: the history tail that was
already played is not modified. The concealer runs at any clock rate; all
lengths scale with it.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray

_I16_MIN = -32768
_I16_MAX = 32767


def _to_int16(x: NDArray[np.float64]) -> NDArray[np.int16]:
    return np.clip(np.rint(x), _I16_MIN, _I16_MAX).astype(np.int16)


class Concealer:
    """Stateful PLC for one audio stream.

    Feed every played frame through `good()`; call `conceal(n)` for each
    missing stretch of `n` samples and `stretch(n)` to synthesise `n` extra
    samples without an erasure (time-scale insertion by the jitter buffer).
    """

    def __init__(self, clock_rate: int = 8000) -> None:
        if clock_rate <= 0:
            raise ValueError("clock_rate must be positive")
        self.clock_rate = clock_rate
        self.pitch_min = max(2, round(0.0025 * clock_rate))
        self.pitch_max = max(self.pitch_min + 1, round(0.015 * clock_rate))
        self.corr_len = max(4, round(0.020 * clock_rate))
        self.ten_ms = max(1, clock_rate // 100)
        need = max(3 * self.pitch_max + 3 + self.pitch_max // 4, self.corr_len + self.pitch_max)
        self.history_len = max(round(0.04875 * clock_rate), need)
        self._hist: NDArray[np.float64] = np.zeros(self.history_len)
        # Good frames not yet folded into _hist: most frames are never concealed, so the
        # float history is only rebuilt when an erasure needs it (a per-frame saving).
        self._pending: deque[NDArray[np.int16]] = deque()
        self._pending_n = 0
        self._active = False  # synthesising (erasure or stretch in progress)
        self._attenuate = False
        self._pos = 0  # samples synthesised since the erasure started
        self._pitch = self.pitch_max
        self._quarter = max(1, self.pitch_max // 4)
        self._loops: list[NDArray[np.float64]] = []
        self._lags: list[int] = []

    # -- analysis ---------------------------------------------------------------------------

    @property
    def pitch(self) -> int:
        """The pitch period (samples) used by the current/last concealment."""
        return self._pitch

    def _sync(self) -> None:
        if self._pending:
            x = np.concatenate(self._pending).astype(np.float64)
            self._pending.clear()
            self._pending_n = 0
            self._remember(x)

    def estimate_pitch(self) -> int:
        """Pitch period in samples from the history (normalised cross-correlation)."""
        self._sync()
        h = self._hist
        n = self.history_len
        length = self.corr_len
        pmin, pmax = self.pitch_min, self.pitch_max
        target = h[n - length :]
        # Row j of `cand` starts at n - length - pmax + j, i.e. lag pmax - j.
        cand = sliding_window_view(h[n - length - pmax : n - pmin], length)
        num = cand @ target
        energy = np.einsum("ij,ij->i", cand, cand)
        tnorm = float(np.dot(target, target))
        if tnorm <= 1e-6 or not np.any(energy > 1e-6):
            return pmax
        score = num / np.sqrt(np.maximum(energy, 1e-9) * tnorm)
        score = score[::-1]  # index k -> lag pmin + k
        best = float(np.max(score))
        if best <= 0.0:
            return pmax
        # Prefer the shortest lag that is a local maximum close to the global best:
        # a periodic signal correlates as well at 2T as at T (octave errors).
        left = np.concatenate(([-np.inf], score[:-1]))
        right = np.concatenate((score[1:], [-np.inf]))
        peaks = np.flatnonzero((score >= left) & (score >= right) & (score >= 0.9 * best))
        k = int(peaks[0]) if peaks.size else int(np.argmax(score))
        return pmin + k

    # -- synthesis --------------------------------------------------------------------------

    def _start(self, attenuate: bool) -> None:
        p = self.estimate_pitch()
        q = max(1, p // 4)
        self._sync()
        h = self._hist
        n = self.history_len
        loops = []
        lags = []
        ramp = (np.arange(q) + 0.5) / q
        for k in (1, 2, 3):
            lag = k * p if k == 1 else self._refine_lag(k * p, k)
            lags.append(lag)
            seg = h[n - lag :].copy()
            pre = h[n - lag - q : n - lag]
            # Cross-fade the loop's end into what precedes its start: seamless wrap-around.
            seg[-q:] = seg[-q:] * (1.0 - ramp) + pre * ramp
            loops.append(seg)
        self._loops = loops
        self._lags = lags
        self._pitch = p
        self._quarter = q
        self._pos = 0
        self._active = True
        self._attenuate = attenuate

    def _refine_lag(self, lag: int, spread: int) -> int:
        """Best integer lag near `lag` (k pitch periods of a non-integer pitch)."""
        self._sync()
        h = self._hist
        n = self.history_len
        length = min(self.corr_len, n - lag - spread - self._quarter)
        if length <= 4:
            return lag
        target = h[n - length :]
        best, best_score = lag, -np.inf
        for cand in range(lag - spread, lag + spread + 1):
            seg = h[n - length - cand : n - cand]
            den = float(np.dot(seg, seg))
            if den <= 1e-9:
                continue
            score = float(np.dot(seg, target)) / np.sqrt(den)
            if score > best_score:
                best, best_score = cand, score
        return best

    def _synth(self, n: int) -> NDArray[np.float64]:
        q, ten = self._quarter, self.ten_ms
        i = self._pos + np.arange(n)
        l1, l2, l3 = self._loops
        g1, g2, g3 = self._lags
        s = l1[i % g1]
        if self._pos + n > ten:
            w12 = np.clip((i - ten + 1) / q, 0.0, 1.0)
            s = s * (1.0 - w12) + l2[i % g2] * w12
        if self._pos + n > 2 * ten:
            w23 = np.clip((i - 2 * ten + 1) / q, 0.0, 1.0)
            s = s * (1.0 - w23) + l3[i % g3] * w23
        if self._attenuate and self._pos + n > ten:
            gain = np.clip(1.0 - 0.2 * (i - ten) / ten, 0.0, 1.0)
            s = s * gain
        self._pos += n
        return s

    def _remember(self, x: NDArray[np.float64]) -> None:
        self._sync()
        n = x.size
        h = self._hist
        if n >= h.size:
            h[:] = x[-h.size :]
        elif n:
            h[:-n] = h[n:]
            h[-n:] = x

    # -- public API -------------------------------------------------------------------------

    def good(self, frame: NDArray[np.int16], blend: bool = True) -> NDArray[np.int16]:
        """A received frame: returned (cross-faded after an erasure) and added to history."""
        if not self._active and frame.size:
            pending = self._pending
            pending.append(frame.copy())
            self._pending_n += frame.size
            while self._pending_n - pending[0].size >= self.history_len:
                self._pending_n -= pending.popleft().size
            return frame
        x = frame.astype(np.float64)
        if self._active and blend and x.size:
            extra = max(0, math.ceil(self._pos / self.ten_ms) - 1)
            length = min(self._quarter + extra * round(0.004 * self.clock_rate), self.ten_ms)
            length = min(length, x.size)
            syn = self._synth(length)
            ramp = (np.arange(length) + 0.5) / length
            x[:length] = syn * (1.0 - ramp) + x[:length] * ramp
        self._active = False
        self._remember(x)
        return _to_int16(x)

    def conceal(self, n_samples: int) -> NDArray[np.int16]:
        """Synthesise `n_samples` for a lost stretch (attenuated as the erasure goes on)."""
        if n_samples <= 0:
            return np.zeros(0, dtype=np.int16)
        if not self._active:
            self._start(attenuate=True)
        self._attenuate = True
        out = self._synth(n_samples)
        self._remember(out)
        return _to_int16(out)

    def stretch(self, n_samples: int) -> NDArray[np.int16]:
        """Synthesise `n_samples` of pitch-repeated audio to lengthen the output (no fade)."""
        if n_samples <= 0:
            return np.zeros(0, dtype=np.int16)
        if not self._active:
            self._start(attenuate=False)
        out = self._synth(n_samples)
        self._remember(out)
        return _to_int16(out)

    def end_erasure(self) -> None:
        """Forget the running synthesis (e.g. after fading into comfort noise)."""
        self._active = False

    @property
    def erasure_samples(self) -> int:
        """Samples synthesised in the current erasure/stretch (0 when none is running)."""
        return self._pos if self._active else 0

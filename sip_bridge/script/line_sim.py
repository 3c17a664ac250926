"""A phone line as the call-script runner imposes it on its own side of a call (no I/O).

- :func:`active_level_dbfs`: the active speech level of ITU-T P.56 (method B: an envelope
  with a 30 ms time constant, 200 ms hangover, 15.9 dB margin), so "a caller at -35 dBFS"
  means what telephony means by it, whatever the pauses in the recording.
- :class:`LineEcho`: what a 2-wire hybrid sends back of the audio the caller receives:
  delayed, ``erl_db`` down (echo return loss), through a band-limited, dispersive
  colouring filter (an echo path is never a clean copy).
- :class:`PacketSchedule`: bursty loss (Gilbert-Elliott) and jitter for the packets the
  caller sends, drawn from the seeded models of :mod:`jitter.netsim`, so the same seed
  gives the same line in a test and in the bench.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray
from scipy import signal

from jitter.netsim import NetworkModel, make_trace

__all__ = [
    "LineEcho",
    "PacketSchedule",
    "active_level_dbfs",
    "hybrid_filter",
    "scale_to_level",
]

_FULL_SCALE_DB = 20.0 * math.log10(32768.0)
_P56_MARGIN_DB = 15.9


def active_level_dbfs(pcm: NDArray[np.int16], rate: int = 8000) -> float:
    """P.56 active speech level of 16-bit audio, in dBFS (-100 for silence)."""
    x = np.asarray(pcm, dtype=np.float64).reshape(-1)
    energy = float(np.sum(x * x))
    if x.size == 0 or energy <= 0:
        return -100.0
    g = math.exp(-1.0 / (rate * 0.03))
    envelope = signal.lfilter([1 - g], [1, -g], signal.lfilter([1 - g], [1, -g], np.abs(x)))
    hangover = math.ceil(0.2 * rate)
    n = np.arange(x.size)
    prev: tuple[float, float] | None = None  # (A_j, A_j - C_j) of the threshold below
    for j in range(16):
        above = envelope >= 2.0**j
        last = np.maximum.accumulate(np.where(above, n, -hangover - 1))
        active = int(np.count_nonzero(n - last <= hangover))
        if active == 0:
            break
        level = 10.0 * math.log10(energy / active)
        diff = level - 20.0 * math.log10(2.0**j)
        if diff <= _P56_MARGIN_DB:
            if prev is None:
                return level - _FULL_SCALE_DB
            frac = (prev[1] - _P56_MARGIN_DB) / (prev[1] - diff)
            return prev[0] + frac * (level - prev[0]) - _FULL_SCALE_DB
        prev = (level, diff)
    if prev is None:
        return -100.0
    return prev[0] - _FULL_SCALE_DB


def scale_to_level(
    pcm: NDArray[np.int16], target_dbfs: float, rate: int = 8000
) -> NDArray[np.int16]:
    """``pcm`` with its active speech level moved to ``target_dbfs`` (peaks clip, as on a
    real line)."""
    level = active_level_dbfs(pcm, rate)
    if level <= -100.0:
        return pcm.copy()
    gain = 10.0 ** ((target_dbfs - level) / 20.0)
    y = np.rint(pcm.astype(np.float64) * gain)
    out: NDArray[np.int16] = np.clip(y, -32768, 32767).astype(np.int16)
    return out


def hybrid_filter(rate: int = 8000) -> NDArray[np.float64]:
    """The echo path's impulse response (about 6 ms): the telephone band (200-3400 Hz) and
    a decaying dispersive tail, scaled to 0 dB for speech-shaped sound, so the echo comes
    back exactly ``erl_db`` below what was heard."""
    band = signal.firwin(31, [200.0, 3400.0], pass_zero=False, fs=rate)
    rng = np.random.default_rng(4168)  # fixed: one hybrid, the same on every run
    taps = int(0.006 * rate)
    tail = rng.standard_normal(taps) * np.exp(-np.arange(taps) / (0.0015 * rate))
    tail[0] = 2.0  # the direct part dominates, as in a real hybrid's response
    h = np.convolve(band, tail)
    # normalise on a speech-shaped reference: flat to 500 Hz, -6 dB/octave above
    f, resp = signal.freqz(h, worN=512, fs=rate)
    weight = np.where(f < 500.0, 1.0, (500.0 / np.maximum(f, 1.0)) ** 2)
    gain = math.sqrt(float(np.sum(weight * np.abs(resp) ** 2) / np.sum(weight)))
    result: NDArray[np.float64] = h / gain
    return result


class LineEcho:
    """The caller's line echo: what it receives, sent back ``delay_ms`` later, ``erl_db``
    down, coloured by :func:`hybrid_filter`.

    Received frames are placed on the caller's sample clock at their arrival (a frame
    arriving within 40 ms of where the previous one ended follows it seamlessly, as a
    phone's playout would); :meth:`echo` gives the echo for samples the caller is about
    to send.
    """

    def __init__(self, erl_db: float, delay_ms: float, rate: int = 8000, history_s: float = 4.0):
        if erl_db < 0 or not 0 <= delay_ms <= 1000:
            raise ValueError("erl_db >= 0 and 0 <= delay_ms <= 1000")
        self.erl_db = erl_db
        self.delay_ms = delay_ms
        self.rate = rate
        self.gain = 10.0 ** (-erl_db / 20.0)
        self.delay = round(delay_ms * rate / 1000.0)
        self.h = hybrid_filter(rate)
        self._size = int(history_s * rate)
        self._buf = np.zeros(self._size, np.float64)
        self._end: int | None = None  # where the last received frame ended
        self._slack = int(0.04 * rate)

    def heard(self, t_s: float, pcm: NDArray[np.int16]) -> None:
        """A frame the caller received ``t_s`` seconds after its clock started."""
        pos = max(0, round(t_s * self.rate))
        if self._end is not None:
            if abs(pos - self._end) <= self._slack:
                pos = self._end
            elif pos > self._end:
                self._write(self._end, np.zeros(min(pos - self._end, self._size)))
        self._write(pos, pcm.astype(np.float64))
        self._end = pos + pcm.size if self._end is None else max(self._end, pos + pcm.size)

    def _write(self, pos: int, x: NDArray[np.float64]) -> None:
        idx = (pos + np.arange(x.size)) % self._size
        self._buf[idx] = x

    def _read(self, pos: int, n: int) -> NDArray[np.float64]:
        p = pos + np.arange(n)
        out = self._buf[p % self._size].copy()
        end = -1 if self._end is None else self._end
        out[(p < 0) | (p >= end) | (p < end - self._size)] = 0.0
        return out

    def echo(self, pos: int, n: int) -> NDArray[np.float64]:
        """The echo in the caller's samples ``pos`` .. ``pos + n`` (float, not clipped)."""
        taps = self.h.size
        x = self._read(pos - self.delay - taps + 1, n + taps - 1)
        result: NDArray[np.float64] = np.convolve(x, self.h, mode="valid") * self.gain
        return result


class PacketSchedule:
    """For each packet the caller sends, in order: None (lost) or the extra delay in
    seconds. ``loss_pct`` is bursty (Gilbert-Elliott, mean burst ``burst_len`` packets);
    ``jitter_ms`` is the RFC 3550 interarrival jitter of a Gaussian delay."""

    def __init__(
        self,
        loss_pct: float = 0.0,
        jitter_ms: float = 0.0,
        seed: int = 0,
        *,
        burst_len: float = 3.0,
        ptime_ms: int = 20,
        chunk_s: float = 60.0,
    ) -> None:
        if not 0 <= loss_pct < 100 or jitter_ms < 0:
            raise ValueError("loss_pct must be 0-99, jitter_ms >= 0")
        self.model = NetworkModel(
            base_delay_ms=0.0,
            jitter="gaussian" if jitter_ms > 0 else "none",
            jitter_ms=jitter_ms,
            loss="gilbert" if loss_pct > 0 else "none",
            loss_pct=loss_pct,
            burst_len=burst_len,
        )
        self.seed = seed
        self.ptime_ms = ptime_ms
        self.chunk_s = chunk_s
        self._chunk = 0
        self._plan: list[float | None] = []
        self._i = 0
        self.sent = 0
        self.lost = 0

    @property
    def impaired(self) -> bool:
        return self.model.loss != "none" or self.model.jitter != "none"

    def next(self) -> float | None:
        if self._i >= len(self._plan):
            trace = make_trace(
                self.model, self.chunk_s, self.seed * 1000 + self._chunk, ptime_ms=self.ptime_ms
            )
            self._plan = [
                None if p.arrival_s is None else max(0.0, p.arrival_s - p.send_s) for p in trace
            ]
            self._chunk += 1
            self._i = 0
        delay = self._plan[self._i]
        self._i += 1
        self.sent += 1
        if delay is None:
            self.lost += 1
        return delay

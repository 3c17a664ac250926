"""Measurements of the streaming Resampler, shared by the tests and bench/media_core.py.

Everything is measured on the real stream (20 ms chunks plus flush), not on the prototype
filter, so chunking, polyphase bookkeeping and fixed-point rounding are all included.
Test tones use integer-Hz frequencies and one-second analysis windows, so every tone, image
and alias falls exactly on an FFT bin: no window, no leakage, no scalloping.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from resample.resampler import PASS_FRACTION, STOP_FRACTION

__all__ = [
    "ResamplerFactory",
    "StreamResampler",
    "amplitude_spectrum",
    "cpu_us_per_20ms",
    "measure_delay_s",
    "measure_gain_db",
    "measure_holdback_s",
    "measure_image_rejection_db",
    "measure_passband_ripple_db",
    "run_stream",
    "tone",
]


class StreamResampler(Protocol):
    """What the measurements need: our Resampler, or an adapter around soxr for the bench."""

    @property
    def in_rate(self) -> int: ...

    @property
    def out_rate(self) -> int: ...

    def process(self, x: NDArray[Any]) -> NDArray[Any]: ...

    def flush(self) -> NDArray[Any]: ...

    def reset(self) -> None: ...


ResamplerFactory = Callable[[], StreamResampler]
_SETTLE_S = 0.1  # transient skipped before the 1 s analysis window (filters are ~4 ms long)


def tone(
    freq: float, rate: int, n: int, amp: float = 0.5, phase: float = 0.0
) -> NDArray[np.float32]:
    """A float32 cosine of n samples."""
    t = np.arange(n, dtype=np.float64) / rate
    return (amp * np.cos(2 * np.pi * freq * t + phase)).astype(np.float32)


def run_stream(
    resampler: StreamResampler, x: NDArray[np.float32], chunk_s: float = 0.02
) -> NDArray[np.float32]:
    """Feed x in chunk_s chunks, then flush: what a call's media path would produce."""
    step = max(1, round(resampler.in_rate * chunk_s))
    parts = [resampler.process(x[i : i + step]) for i in range(0, len(x), step)]
    parts.append(resampler.flush())
    return np.concatenate(parts).astype(np.float32)


def amplitude_spectrum(y: NDArray[np.float32] | NDArray[np.float64]) -> NDArray[np.float64]:
    """Per-bin sinusoid amplitude of y (one bin per Hz when len(y) == rate)."""
    amp = 2.0 * np.abs(np.fft.rfft(np.asarray(y, dtype=np.float64))) / len(y)
    amp[0] /= 2.0
    if len(y) % 2 == 0:
        amp[-1] /= 2.0  # DC and Nyquist are real: no mirrored half
    return amp


def _steady_spectrum(factory: ResamplerFactory, x: NDArray[np.float32]) -> NDArray[np.float64]:
    r = factory()
    y = run_stream(r, x)
    start = round(_SETTLE_S * r.out_rate)
    return amplitude_spectrum(y[start : start + r.out_rate])


def _tone_input(
    r: StreamResampler, freq: float, amp: float, phase: float = 0.0
) -> NDArray[np.float32]:
    return tone(freq, r.in_rate, round((2 * _SETTLE_S + 1.0) * r.in_rate), amp, phase)


def _band(r: StreamResampler) -> tuple[float, float, float]:
    """(ripple low edge, pass edge, stop edge) in Hz: 300/3400/4000 for 8 kHz pairs."""
    low = min(r.in_rate, r.out_rate)
    return 300.0 * low / 8000, PASS_FRACTION * low, STOP_FRACTION * low


def _passband_grid(r: StreamResampler, step_hz: int) -> list[int]:
    lo, hi, _ = _band(r)
    return list(range(int(np.ceil(lo)), int(hi) + 1, step_hz))


def measure_delay_s(factory: ResamplerFactory, step_hz: int = 50, seed: int = 0) -> float:
    """Group delay from the phase slope of a passband multitone (-dphi/domega, least squares).

    Tones every step_hz across 300-3400 Hz with random phases; the output phase of each,
    relative to the ideal zero-delay resampled tone, is unwrapped across frequency and fitted.
    """
    r = factory()
    freqs = np.array(_passband_grid(r, step_hz), dtype=np.float64)
    phases = np.random.default_rng(seed).uniform(0, 2 * np.pi, len(freqs))
    n = round((2 * _SETTLE_S + 1.0) * r.in_rate)
    t = np.arange(n) / r.in_rate
    x = (0.5 / len(freqs)) * np.cos(2 * np.pi * freqs[:, None] * t + phases[:, None]).sum(axis=0)
    y = run_stream(r, x.astype(np.float32))
    start = round(_SETTLE_S * r.out_rate)
    spec = np.fft.rfft(y[start : start + r.out_rate].astype(np.float64))
    bins = freqs.astype(np.int64)
    t0 = start / r.out_rate
    lag = np.angle(spec[bins]) - phases - 2 * np.pi * freqs * t0
    slope = np.polyfit(freqs, np.unwrap(np.mod(lag, 2 * np.pi)), 1)[0]
    return float(-slope / (2 * np.pi))


def measure_holdback_s(factory: ResamplerFactory, chunk_s: float = 0.02, chunks: int = 60) -> float:
    """Mean audio a streaming resampler withholds after each chunk, in seconds.

    Some resamplers (soxr) output time-aligned audio but keep back their filter's
    delay until more input arrives; ours outputs at once with the delay in the signal.
    A call hears the sum: `measure_delay_s` + this.
    """
    r = factory()
    step = max(1, round(r.in_rate * chunk_s))
    x = tone(1000, r.in_rate, step * chunks)
    fed = emitted = 0
    held = []
    for i in range(chunks):
        emitted += len(r.process(x[i * step : (i + 1) * step]))
        fed += step
        if i >= chunks // 3:  # steady state
            held.append(fed / r.in_rate - emitted / r.out_rate)
    return float(np.mean(held))


def measure_passband_ripple_db(factory: ResamplerFactory, step_hz: int = 100) -> float:
    """Peak-to-peak steady-state gain in dB over 300-3400 Hz tones (one tone per run)."""
    levels = []
    for f in _passband_grid(factory(), step_hz):
        r = factory()
        spec = _steady_spectrum(factory, _tone_input(r, f, 0.5))
        levels.append(20 * np.log10(spec[f] / 0.5))
    return float(max(levels) - min(levels))


def measure_gain_db(factory: ResamplerFactory, freq: int = 1000, amp: float = 0.5) -> float:
    """Steady-state gain at one passband frequency, in dB."""
    r = factory()
    return float(20 * np.log10(_steady_spectrum(factory, _tone_input(r, freq, amp))[freq] / amp))


def measure_image_rejection_db(
    factory: ResamplerFactory, step_hz: int = 50, freqs: Sequence[int] | None = None
) -> float:
    """Worst-case rejection (positive dB) of everything the low band must not contain.

    Upsampling: 300-3400 Hz tones in, worst output bin at or above 4 kHz vs. the tone.
    Downsampling: tones from 4 kHz to the input Nyquist in step_hz steps, worst output bin
    (wherever the alias lands) vs. the output level of a 1 kHz tone of the same amplitude.
    """
    r = factory()
    _, _, stop = _band(r)
    amp = 0.5
    worst = np.inf
    if r.out_rate > r.in_rate:
        grid = list(freqs) if freqs is not None else _passband_grid(r, step_hz)
        for f in grid:
            spec = _steady_spectrum(factory, _tone_input(r, f, amp))
            images = spec[int(np.ceil(stop)) :]
            worst = min(worst, 20 * np.log10(spec[f] / images.max()))
        return float(worst)
    ref_hz = round(1000 * r.out_rate / 8000)
    ref = _steady_spectrum(factory, _tone_input(r, ref_hz, amp))[ref_hz]
    if freqs is None:
        freqs = range(int(np.ceil(stop)), r.in_rate // 2 + 1, step_hz)
    for f in freqs:
        spec = _steady_spectrum(factory, _tone_input(r, f, amp))
        worst = min(worst, 20 * np.log10(ref / max(float(spec.max()), 1e-300)))
    return float(worst)


def cpu_us_per_20ms(resampler: StreamResampler, n_chunks: int = 500, repeats: int = 7) -> float:
    """Median wall time of process() on one 20 ms int16 chunk, in microseconds."""
    rng = np.random.default_rng(0)
    chunk = rng.integers(-8000, 8000, round(resampler.in_rate * 0.02)).astype(np.int16)
    resampler.reset()
    for _ in range(20):
        resampler.process(chunk)  # warm caches and the reusable buffer
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n_chunks):
            resampler.process(chunk)
        samples.append((time.perf_counter() - t0) / n_chunks * 1e6)
    resampler.reset()
    return float(np.median(samples))

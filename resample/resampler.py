"""Streaming rational polyphase FIR resampler for the telephone band.

Why not soxr/resample_poly: soxr's streaming presets add 23-86 ms of delay, and a one-shot
resampler cannot be fed 20 ms RTP frames. This one uses a short linear-phase equiripple
lowpass (pass 0.425, stop 0.5 of the low rate: 3400/4000 Hz for 8 kHz) giving about 2 ms of
group delay with >= 60 dB image/alias rejection.

Exactness: coefficients are quantised to 24-bit integers and samples to the 2^-24 full-scale
grid, and both are held in float64. Every product and partial sum is then an integer below
2^53, so float64 arithmetic is exact and the result cannot depend on summation order, BLAS
blocking, or how the stream was chunked: chunked output equals one-shot output bit for bit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from math import gcd
from typing import Any, overload

import numpy as np
import scipy.interpolate
import scipy.signal
from numpy.typing import NDArray

__all__ = ["SUPPORTED_RATES", "FilterDesign", "Resampler", "design_filter"]

SUPPORTED_RATES = frozenset({8000, 16000, 22050, 24000, 48000})
PASS_FRACTION = 0.425  # of the low rate: 3400 Hz at 8 kHz
STOP_FRACTION = 0.5  # of the low rate: 4000 Hz at 8 kHz (its Nyquist)
_RIPPLE_LO_FRACTION = 0.0375  # 300 Hz at 8 kHz: the bottom of the specified band
_DIRECT_DESIGN_MAX = 6  # remez runs directly at rates up to 6x the low rate (48 kHz for 8 kHz)
_STOP_WEIGHT = 25.0
_MIN_REJECTION_DB = 62.0  # 2 dB margin on the product's 60 dB
_MAX_RIPPLE_DB = 0.35  # margin on the product's 0.5 dB peak-to-peak

_COEF_BITS = 24  # coefficient grid: 2^-24
_SAMPLE_BITS = 24  # sample grid: full scale (1.0 or 32768) is 2^24
_FLOAT_LIMIT = 4.0  # float input is clipped here so sums stay below 2^53
# The history buffer holds samples in one of two power-of-two units, chosen by the dtype of
# the chunks being fed (switching rescales the history exactly):
#   int16 mode: 1 = one int16 LSB (samples are then multiples of 2^-9: the 2^-24 grid)
#   float mode: 1 = 2^-24 of full scale (samples are integers)
# Scaling samples or coefficients by a power of two keeps every product and partial sum
# exactly representable, so the exactness argument above is unchanged.
_INT16_TO_FLOAT_UNITS = float(2 ** (_SAMPLE_BITS - 15))
_SCALE_INT16 = 2.0**-_COEF_BITS  # raw sum -> int16 LSB
_SCALE_FLOAT = 2.0 ** -(_COEF_BITS + _SAMPLE_BITS)  # raw sum -> float full scale
_FLOAT_IN = 2.0**_SAMPLE_BITS
_INT16 = np.dtype(np.int16)
_FLOAT32 = np.dtype(np.float32)
_PLAN_MIN_OUTPUTS = 8  # fewer outputs per chunk: the generic path is as cheap
_PLAN_TARGET_BATCHES = 10  # measured: ~10 small gemvs beat one copy + gemm, or fewer big ones


@dataclass(frozen=True)
class FilterDesign:
    """A polyphase bank for one rate pair (immutable, shared by every stream of that pair)."""

    up: int  # L
    down: int  # M
    fine_rate: int  # in_rate * L: the rate the prototype lowpass runs at
    numtaps: int  # prototype length N at fine_rate
    taps_per_phase: int  # T = ceil(N / L): multiply-adds per output sample
    bank: NDArray[np.float64]  # (L, T) integer-valued coefficients, time-reversed per phase
    bank_t: NDArray[np.float64]  # bank.T, contiguous, for the interpolation matmul
    base_n: NDArray[np.int64]  # newest input index used by output j, j in [0, L)
    phase: NDArray[np.int64]  # polyphase row used by output j, j in [0, L)
    seq_rows: NDArray[np.float64]  # bank row of output j, j in [0, 2L) (general L/M only)
    seq_newest: NDArray[np.int64]  # newest input index of output j, j in [0, 2L)

    @property
    def delay_s(self) -> float:
        """Linear-phase group delay (N-1)/2 at the fine rate, in seconds."""
        return (self.numtaps - 1) / 2.0 / self.fine_rate


def _response_check(h: NDArray[np.float64], fs: float, low: int) -> tuple[float, float]:
    """(passband ripple p-p dB, stopband rejection dB) of a prototype relative to DC."""
    f = np.linspace(0.0, fs / 2.0, 16385)
    _, resp = scipy.signal.freqz(h, worN=f, fs=fs)
    mag = np.abs(resp) / abs(float(np.sum(h)))
    band = mag[(f >= _RIPPLE_LO_FRACTION * low) & (f <= PASS_FRACTION * low)]
    stop = mag[f >= STOP_FRACTION * low]
    return float(20 * np.log10(band.max() / band.min())), float(-20 * np.log10(stop.max()))


@functools.cache
def _remez_lowpass(fs: int, low: int) -> NDArray[np.float64]:
    """Shortest equiripple lowpass at fs meeting the margins (shortest = least delay)."""
    start = int(0.0036 * fs * 8000 / low)  # ~1.8 ms: just below what is feasible
    for numtaps in range(start, start + 400):
        h = np.asarray(
            scipy.signal.remez(
                numtaps,
                [0.0, PASS_FRACTION * low, STOP_FRACTION * low, fs / 2.0],
                [1.0, 0.0],
                weight=[1.0, _STOP_WEIGHT],
                fs=fs,
                maxiter=100,
            ),
            dtype=np.float64,
        )
        ripple, rejection = _response_check(h, fs, low)
        if ripple <= _MAX_RIPPLE_DB and rejection >= _MIN_REJECTION_DB:
            return h
    raise RuntimeError(f"no lowpass design found for fs={fs}, low={low}")  # pragma: no cover


def _prototype(low: int, fine_rate: int) -> NDArray[np.float64]:
    """The lowpass at the fine (L-upsampled) rate.

    Up to 6x the low rate remez designs it directly. Above that (22050 pairs: 3.528 MHz) a
    remez design at 6x the low rate is interpolated with a quintic spline: its periodic
    images sit near multiples of 6x the low rate, where the spline attenuates them > 80 dB.
    """
    if fine_rate <= _DIRECT_DESIGN_MAX * low:
        return _remez_lowpass(fine_rate, low)
    base_rate = _DIRECT_DESIGN_MAX * low
    hb = _remez_lowpass(base_rate, low)
    center_b = (len(hb) - 1) / 2.0
    pad = 6
    knots = np.arange(-pad, len(hb) + pad, dtype=np.float64)
    spline = scipy.interpolate.make_interp_spline(knots, np.pad(hb, pad), k=5)
    # Keep one base sample of the spline's ringing past each end: cutting exactly at the
    # design's ends costs ~2.5 dB of stopband, one more sample costs only 0.02 ms of delay.
    c = int(np.floor((center_b + 1) * fine_rate / base_rate))
    pos = center_b + (np.arange(2 * c + 1) - c) * (base_rate / fine_rate)
    return np.asarray(spline(pos), dtype=np.float64)


@functools.cache
def design_filter(in_rate: int, out_rate: int) -> FilterDesign:
    """Design (once per rate pair, cached) the polyphase bank for in_rate -> out_rate."""
    if in_rate not in SUPPORTED_RATES or out_rate not in SUPPORTED_RATES:
        raise ValueError(f"unsupported rate pair {in_rate} -> {out_rate}")
    if in_rate == out_rate:
        raise ValueError("in_rate == out_rate: no resampling needed")
    g = gcd(in_rate, out_rate)
    up, down = out_rate // g, in_rate // g
    fine_rate = in_rate * up
    h = _prototype(min(in_rate, out_rate), fine_rate)
    taps = -(-len(h) // up)
    padded = np.zeros(taps * up)
    padded[: len(h)] = h
    rows = padded.reshape(taps, up).T.copy()  # rows[p, i] = h[p + i*L]
    # DC gain L overall (1 per output, compensating zero-stuffing). Normalising each phase
    # separately would look tidier but modulates the filter with period L and puts passband
    # images at about -60 dB; the phases' small DC spread is just the stopband response.
    rows *= up / float(np.sum(h))
    q = np.rint(rows * 2.0**_COEF_BITS)
    # |x| <= _FLOAT_LIMIT * 2^24 and sum|q| bound every partial sum; keep it below 2^53.
    if float(np.abs(q).sum(axis=1).max()) * _FLOAT_LIMIT * 2.0**_SAMPLE_BITS >= 2.0**53:
        raise RuntimeError(
            "filter gain too large for exact float64 accumulation"
        )  # pragma: no cover
    j = np.arange(up, dtype=np.int64)
    base_n = (j * down) // up
    phase = j * down - base_n * up
    bank = np.ascontiguousarray(q[:, ::-1])
    general = up > 1 and down > 1
    j2 = np.arange(2 * up if general else 0, dtype=np.int64)
    seq_rows = np.ascontiguousarray(bank[phase[j2 % up]])
    for arr in (bank, seq_rows):
        arr.flags.writeable = False
    return FilterDesign(
        up=up,
        down=down,
        fine_rate=fine_rate,
        numtaps=len(h),
        taps_per_phase=taps,
        bank=bank,
        bank_t=np.ascontiguousarray(bank.T),
        base_n=base_n,
        phase=phase,
        seq_rows=seq_rows,
        seq_newest=(j2 * down) // up,
    )


@dataclass(frozen=True)
class _Plan:
    """A fixed-size chunk computed as one batched matmul straight from the history buffer.

    Batch a's inputs are buf[start + a*stride : ... + span] (overlapping rows are fine: each
    batch is its own gemv); its G outputs are that row times h[a] (span x G), a banded matrix
    holding each output's (pre-scaled) phase row at the output's offset, zeros elsewhere.
    """

    start: int
    stride: int
    batches: int
    span: int
    h: NDArray[np.float64]  # (span, G) when every batch has the same pattern, else (B, span, G)
    buf_len: int  # buffer length the strided view needs


def _batch_size(count: int, up: int) -> int:
    """Outputs per batch: a divisor of count giving about _PLAN_TARGET_BATCHES batches,
    preferring multiples of L (the phase pattern repeats, so one matrix serves all)."""
    divisors = [g for g in range(1, count + 1) if count % g == 0]

    def badness(g: int) -> float:
        return abs(float(np.log(count / g / _PLAN_TARGET_BATCHES)))

    uniform = [g for g in divisors if g % up == 0 and badness(g) <= np.log(2.0)]
    return min(uniform or divisors, key=badness)


# Per-call frames are 10-60 ms; a plan for a one-off long chunk (a whole prompt) costs
# seconds to build and megabytes to keep, for nothing.
_PLAN_MAX_INPUTS = 4096


@functools.lru_cache(maxsize=64)
def _plan(
    in_rate: int, out_rate: int, n_new: int, n_in: int, n_out: int, scale: float
) -> _Plan | None:
    """The batched-matmul plan for one chunk size and phase state (shared by all streams)."""
    d = design_filter(in_rate, out_rate)
    up, down, taps = d.up, d.down, d.taps_per_phase
    total = n_in + n_new
    k_end = -(-total * up // down)
    count = k_end - n_out
    if count < _PLAN_MIN_OUTPUTS or n_new > _PLAN_MAX_INPUTS:
        return None  # tiny chunks gain nothing; huge ones would build a huge banded matrix
    q, j = np.divmod(np.arange(n_out, k_end, dtype=np.int64), up)
    w = q * down + d.base_n[j] - n_in  # window start in the buffer, per output
    g = _batch_size(count, up)
    nb = count // g
    first = w[::g]
    stride = int(np.min((first[1:] - first[0]) // np.arange(1, nb))) if nb > 1 else 0
    origin = int(w[0])
    rel = np.arange(count)
    off = w - (origin + (rel // g) * stride)  # >= 0: w is nondecreasing
    span = int(off.max()) + taps
    hs = np.zeros((nb, span, g))
    hs[(rel // g)[:, None], off[:, None] + np.arange(taps), (rel % g)[:, None]] = (
        d.bank[d.phase[j]] * scale
    )
    h = hs[0].copy() if bool(np.all(hs == hs[:1])) else hs
    h.flags.writeable = False
    return _Plan(origin, stride, nb, span, h, origin + (nb - 1) * stride + span)


class Resampler:
    """Streaming in_rate -> out_rate resampler; feed chunks of any length, then flush().

    Output sample k is the signal at time k/out_rate delayed by ``delay_s``; the stream starts
    from silence. After n inputs exactly ceil(n*L/M) outputs have been returned.
    int16 and float32 chunks may be mixed; each call returns its input's dtype.

    Hot path: when the same chunk length arrives twice in a row in the same phase state
    (20 ms frames do), later chunks of that length take a precomputed batched matmul that
    reads the history buffer in place. By the exactness argument it returns bit for bit what
    the generic path would.
    """

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self.design = design_filter(in_rate, out_rate)
        self._dtype: np.dtype[Any] = _INT16
        self.reset()

    @property
    def delay_s(self) -> float:
        """Group delay of the whole stream (input time -> output time), in seconds."""
        return self.design.delay_s

    @property
    def delay_samples_out(self) -> float:
        """Group delay in output samples (fractional in general)."""
        return self.design.delay_s * self.out_rate

    def reset(self) -> None:
        """Forget all history: the next chunk starts a new stream from silence."""
        self._hist_len = self.design.taps_per_phase - 1
        # [history | current chunk | zero slack]; history sits at [0, hist) between calls.
        self._buf = np.zeros(self._hist_len + 1)
        self._mode: np.dtype[Any] = (
            _INT16  # unit of the buffer's samples (see _INT16_TO_FLOAT_UNITS)
        )
        self._n_in = 0  # inputs consumed, modulo whole periods of M
        self._n_out = 0  # outputs emitted, modulo the same whole periods of L
        self._started = False
        self._last_key: tuple[int, int, int, np.dtype[Any]] | None = None
        # Fast path state: (shape, dtype, seg, x_view, h, y, y_flat, hist_dst, hist_src)
        self._fast: tuple[Any, ...] | None = None

    @overload
    def process(self, x: NDArray[np.int16]) -> NDArray[np.int16]: ...
    @overload
    def process(self, x: NDArray[np.float32]) -> NDArray[np.float32]: ...
    def process(self, x: NDArray[Any]) -> NDArray[Any]:
        """Resample one chunk; returns every output that this chunk made computable."""
        fast = self._fast
        if fast is not None and x.shape == fast[0] and x.dtype is fast[1]:
            _, dtype, seg, xv, h, y, y_flat, hist_dst, hist_src = fast
            if dtype is _INT16:
                seg[...] = x
                np.matmul(xv, h, out=y)
                hist_dst[...] = hist_src
                np.rint(y_flat, out=y_flat)
                np.maximum(y_flat, -32768.0, out=y_flat)
                np.minimum(y_flat, 32767.0, out=y_flat)
                out: NDArray[Any] = y_flat.astype(np.int16)
                return out
            np.multiply(x, _FLOAT_IN, out=seg)
            np.maximum(seg, -_FLOAT_LIMIT * _FLOAT_IN, out=seg)
            np.minimum(seg, _FLOAT_LIMIT * _FLOAT_IN, out=seg)
            np.rint(seg, out=seg)
            np.matmul(xv, h, out=y)
            hist_dst[...] = hist_src
            out = y_flat.astype(np.float32)
            return out
        return self._process_generic(x)

    def _process_generic(self, x: NDArray[Any]) -> NDArray[Any]:
        if x.ndim != 1:
            raise ValueError("process expects a 1-D chunk")
        if x.dtype != np.int16 and x.dtype != np.float32:
            raise TypeError(f"process expects int16 or float32, got {x.dtype}")
        dtype = _INT16 if x.dtype == np.int16 else _FLOAT32
        self._dtype = dtype
        self._fast = None
        n_new = len(x)
        if n_new == 0:
            return np.empty(0, dtype=dtype)
        self._started = True
        if dtype is not self._mode:  # exact power-of-two change of unit for the history
            self._buf *= _INT16_TO_FLOAT_UNITS if dtype is _FLOAT32 else 1 / _INT16_TO_FLOAT_UNITS
            self._mode = dtype
        hist = self._hist_len
        if len(self._buf) < hist + n_new:
            self._grow(hist + n_new)
        buf = self._buf
        seg = buf[hist : hist + n_new]
        if dtype is _INT16:
            seg[...] = x
        else:
            np.multiply(x, _FLOAT_IN, out=seg)
            np.maximum(seg, -_FLOAT_LIMIT * _FLOAT_IN, out=seg)
            np.minimum(seg, _FLOAT_LIMIT * _FLOAT_IN, out=seg)
            np.rint(seg, out=seg)
        key = (n_new, self._n_in, self._n_out, dtype)
        y = self._run(n_new)
        buf[:hist] = buf[n_new : n_new + hist]
        if key == self._last_key and key[1:3] == (self._n_in, self._n_out):
            self._activate(n_new, dtype)  # same size, same phase state: a steady stream
        self._last_key = key
        if dtype is _INT16:
            y *= _SCALE_INT16
            np.rint(y, out=y)
            np.maximum(y, -32768.0, out=y)
            np.minimum(y, 32767.0, out=y)
            return y.astype(np.int16)
        y *= _SCALE_FLOAT
        return y.astype(np.float32)

    def _grow(self, length: int) -> None:
        """Reallocate the buffer (zero slack included), keeping the history."""
        buf = np.zeros(length)
        buf[: self._hist_len] = self._buf[: self._hist_len]
        self._buf = buf
        self._fast = None  # its views point into the old buffer

    def _activate(self, n_new: int, dtype: np.dtype[Any]) -> None:
        scale = _SCALE_INT16 if dtype is _INT16 else _SCALE_FLOAT
        plan = _plan(self.in_rate, self.out_rate, n_new, self._n_in, self._n_out, scale)
        if plan is None:
            return
        hist = self._hist_len
        if len(self._buf) < plan.buf_len:
            self._grow(plan.buf_len)
        buf = self._buf
        buf[hist + n_new :] = 0.0  # slack the plan reads (times zero) must hold finite values
        xv = np.ndarray(
            (plan.batches, 1, plan.span),
            dtype=np.float64,
            buffer=buf,
            offset=8 * plan.start,
            strides=(8 * plan.stride, 0, 8),
        )
        y = np.empty((plan.batches, 1, plan.h.shape[-1]))
        self._fast = (
            (n_new,),
            dtype,
            buf[hist : hist + n_new],
            xv,
            plan.h,
            y,
            y.reshape(-1),
            buf[:hist],
            buf[n_new : n_new + hist],
        )

    def _run(self, n_new: int) -> NDArray[np.float64]:
        """Raw (unscaled) outputs of the chunk at buf[hist : hist + n_new]; advances state."""
        d = self.design
        up, down = d.up, d.down
        windows: NDArray[np.float64] = np.ndarray(
            (n_new, d.taps_per_phase), dtype=np.float64, buffer=self._buf, strides=(8, 8)
        )
        total = self._n_in + n_new
        k_end = -(-total * up // down)
        count = k_end - self._n_out
        if count <= 0:
            y = np.empty(0)
        elif down == 1:  # pure interpolation: L outputs per input, phases 0..L-1
            y = (np.ascontiguousarray(windows) @ d.bank_t).reshape(-1)
        elif up == 1:  # pure decimation: one output every M inputs, single phase
            start = self._n_out * down - self._n_in
            y = np.ascontiguousarray(windows[start::down][:count]) @ d.bank[0]
        elif k_end <= 2 * up:  # up to one period of outputs: contiguous rows, no gather
            rows = d.seq_rows[self._n_out : k_end]
            w = d.seq_newest[self._n_out : k_end] - self._n_in
            y = np.einsum("ij,ij->i", windows[w], rows)
        else:
            q, j = np.divmod(np.arange(self._n_out, k_end), up)
            w = q * down + d.base_n[j] - self._n_in
            y = np.einsum("ij,ij->i", windows[w], d.bank[d.phase[j]])
        periods = total // down  # keep the counters small; the phase pattern is unchanged
        self._n_in = total - periods * down
        self._n_out = k_end - periods * up
        return y

    def flush(self) -> NDArray[Any]:
        """Return the tail (outputs as if silence followed) and reset for a new stream.

        The tail runs until the last input's impulse response has fully left the filter, so
        one-shot output + flush() is the complete convolution. Same dtype as the last chunk.
        """
        d = self.design
        dtype = self._dtype
        if not self._started:
            return np.empty(0, dtype=dtype)
        last = (self._n_in - 1) * d.up + d.numtaps - 1  # fine index of the last nonzero output
        remaining = last // d.down + 1 - self._n_out
        tail: NDArray[Any] = self._process_generic(np.zeros(d.taps_per_phase, dtype=dtype))
        self.reset()
        self._dtype = dtype
        return tail[:remaining]

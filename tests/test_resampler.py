"""Streaming resampler: product targets measured on the real stream, plus exact chunking."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from resample import Resampler, design_filter
from testkit.analysis import (
    amplitude_spectrum,
    measure_delay_s,
    measure_gain_db,
    measure_image_rejection_db,
    measure_passband_ripple_db,
    run_stream,
    tone,
)

HARD_PAIRS = [(8000, 16000), (16000, 8000), (8000, 24000), (24000, 8000)]
OTHER_PAIRS = [(8000, 22050), (22050, 8000), (8000, 48000), (48000, 8000)]
ALL_PAIRS = HARD_PAIRS + OTHER_PAIRS


def factory(pair: tuple[int, int]) -> functools.partial[Resampler]:
    return functools.partial(Resampler, *pair)


def one_shot(pair: tuple[int, int], x: NDArray[Any]) -> NDArray[Any]:
    r = Resampler(*pair)
    return np.concatenate([r.process(x), r.flush()])


def chunked(pair: tuple[int, int], x: NDArray[Any], cuts: list[int]) -> NDArray[Any]:
    r = Resampler(*pair)
    parts = [r.process(p) for p in np.split(x, sorted(cuts))]
    return np.concatenate([*parts, r.flush()])


# --- product targets (hard for 8k<->16k/24k; the others are held to the same numbers) ---


@pytest.mark.parametrize("pair", ALL_PAIRS)
def test_group_delay_is_short_and_true_to_measurement(pair: tuple[int, int]) -> None:
    r = Resampler(*pair)
    assert r.delay_s <= 3e-3
    assert abs(measure_delay_s(factory(pair)) - r.delay_s) < 0.1e-3
    assert r.delay_samples_out == pytest.approx(r.delay_s * pair[1])


@pytest.mark.parametrize("pair", ALL_PAIRS)
def test_passband_ripple_and_gain(pair: tuple[int, int]) -> None:
    assert measure_passband_ripple_db(factory(pair), step_hz=100) <= 0.5
    assert abs(measure_gain_db(factory(pair))) < 0.25


@pytest.mark.parametrize("pair", ALL_PAIRS)
def test_image_and_alias_rejection(pair: tuple[int, int]) -> None:
    step = 100 if max(pair) > 24000 else 50
    rejection = measure_image_rejection_db(factory(pair), step_hz=step)
    assert rejection >= 60.0


@pytest.mark.parametrize("pair", ALL_PAIRS)
def test_1khz_tone_frequency_and_level(pair: tuple[int, int]) -> None:
    in_rate, out_rate = pair
    y = run_stream(Resampler(*pair), tone(1000, in_rate, in_rate, amp=0.3))  # -10 dBFS
    seg = y[out_rate // 10 : out_rate // 10 + out_rate // 2]  # 0.5 s: 2 Hz bins
    spec = amplitude_spectrum(seg)
    assert np.argmax(spec) * 2 == 1000
    assert spec[500] == pytest.approx(0.3, rel=0.01)


# --- streaming contract ---


@pytest.mark.parametrize("pair", ALL_PAIRS)
@pytest.mark.parametrize("dtype", [np.int16, np.float32])
def test_dtype_preserved_and_any_length(pair: tuple[int, int], dtype: type[Any]) -> None:
    r = Resampler(*pair)
    total_in = 0
    total_out = 0
    up, down = design_filter(*pair).up, design_filter(*pair).down
    for n in (0, 1, 7, 160, 0, 3, 10000, 1):
        y = r.process(np.ones(n, dtype=dtype))
        assert y.dtype == dtype and y.ndim == 1
        total_in += n
        total_out += len(y)
        assert total_out == -(-total_in * up // down)  # ceil(n * L / M): deterministic
    assert r.flush().dtype == dtype


def test_float32_clips_and_int16_saturates() -> None:
    r = Resampler(8000, 24000)
    y = r.process(np.full(400, 32767, dtype=np.int16))
    assert y.dtype == np.int16 and int(y.max()) == 32767  # overshoot saturates, no wrap
    f = Resampler(8000, 24000).process(np.full(400, 1.0, dtype=np.float32))
    # DC gain is 1 over a period; single phases differ by the -62 dB image of DC at 8 kHz.
    assert f.dtype == np.float32 and abs(float(np.mean(f[-300:])) - 1.0) < 1e-4


def test_rejects_bad_input() -> None:
    r = Resampler(8000, 16000)
    with pytest.raises(TypeError):
        r.process(np.zeros(4, dtype=np.float64))
    with pytest.raises(ValueError):
        r.process(np.zeros((2, 2), dtype=np.int16))
    with pytest.raises(ValueError):
        Resampler(8000, 8000)
    with pytest.raises(ValueError):
        Resampler(8000, 44100)


@pytest.mark.parametrize("pair", ALL_PAIRS)
def test_flush_tail_completes_impulse_response_and_resets(pair: tuple[int, int]) -> None:
    d = design_filter(*pair)
    x = np.zeros(50, dtype=np.float32)
    x[-1] = 0.5
    r = Resampler(*pair)
    head = r.process(x)
    tail = r.flush()
    # The last input's response ends at fine index (n-1)L + N-1; the tail reaches it exactly.
    assert len(head) + len(tail) == ((len(x) - 1) * d.up + d.numtaps - 1) // d.down + 1
    assert np.any(tail != 0)
    assert len(r.flush()) == 0  # reset: nothing left
    # After flush the resampler behaves exactly like a fresh one.
    again = np.concatenate([r.process(x), r.flush()])
    assert np.array_equal(again, one_shot(pair, x))


def test_empty_stream_flush() -> None:
    r = Resampler(8000, 24000)
    assert len(r.process(np.empty(0, dtype=np.int16))) == 0
    assert len(r.flush()) == 0


def test_reset_discards_history() -> None:
    x = (np.arange(500) % 97 * 300).astype(np.int16)
    r = Resampler(24000, 8000)
    r.process(x[::-1].copy())
    r.reset()
    assert np.array_equal(np.concatenate([r.process(x), r.flush()]), one_shot((24000, 8000), x))


@st.composite
def chunk_case(draw: st.DrawFn) -> tuple[tuple[int, int], NDArray[Any], list[int]]:
    pair = draw(st.sampled_from(ALL_PAIRS))
    n = draw(st.integers(0, 3000))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    x: NDArray[Any]
    if draw(st.booleans()):
        x = rng.integers(-32768, 32768, n).astype(np.int16)
    else:
        x = rng.uniform(-1.0, 1.0, n).astype(np.float32)
    cuts = draw(st.lists(st.integers(0, n), max_size=25))
    return pair, x, cuts


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunk_case())
def test_chunked_output_equals_one_shot_exactly(
    case: tuple[tuple[int, int], NDArray[Any], list[int]],
) -> None:
    pair, x, cuts = case
    expected = one_shot(pair, x)
    got = chunked(pair, x, cuts)
    assert got.dtype == x.dtype
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("pair", ALL_PAIRS)
def test_single_sample_chunks_equal_one_shot(pair: tuple[int, int]) -> None:
    x = np.random.default_rng(3).uniform(-1, 1, 700).astype(np.float32)
    r = Resampler(*pair)
    got = np.concatenate([*(r.process(x[i : i + 1]) for i in range(len(x))), r.flush()])
    assert np.array_equal(got, one_shot(pair, x))


def test_int16_and_float32_agree() -> None:
    """The int16 path is the float path on the same grid, rounded to int16."""
    x = np.random.default_rng(5).integers(-20000, 20000, 2000).astype(np.int16)
    yi = one_shot((8000, 24000), x).astype(np.float64)
    yf = one_shot((8000, 24000), x.astype(np.float32) / 32768).astype(np.float64) * 32768
    assert np.max(np.abs(yi - yf)) <= 0.51


@pytest.mark.parametrize("pair", ALL_PAIRS)
@pytest.mark.parametrize("dtype", [np.int16, np.float32])
def test_steady_frames_fast_path_equals_one_shot(pair: tuple[int, int], dtype: type[Any]) -> None:
    """Repeated 20 ms frames (after an odd lead-in, so the phase state need not be 0) take the
    precomputed batched path; with a frame-size change it must match one-shot exactly, and
    earlier outputs must not be overwritten by later calls."""
    frame = pair[0] // 50
    rng = np.random.default_rng(11)
    xi = rng.integers(-32768, 32768, 7 + 8 * frame + 6 * (frame // 2)).astype(np.int16)
    x: NDArray[Any] = xi if dtype == np.int16 else (xi / 40000.0).astype(np.float32)
    cuts = [7 + frame * i for i in range(9)] + [7 + 8 * frame + (frame // 2) * i for i in range(6)]
    r = Resampler(*pair)
    parts = []
    for p in np.split(x, cuts):
        parts.append(r.process(p))
        if len(parts) == 5:
            assert r._fast is not None  # the hot path is what is being tested
    copies = [p.copy() for p in parts]
    got = np.concatenate([*parts, r.flush()])
    assert all(np.array_equal(p, c) for p, c in zip(parts, copies, strict=True))
    assert np.array_equal(got, one_shot(pair, x))


@pytest.mark.parametrize("pair", ALL_PAIRS)
def test_steady_frames_with_dtype_switches(pair: tuple[int, int]) -> None:
    """Switching dtype mid-stream rescales the history exactly, on both paths."""
    frame = pair[0] // 50
    xi = np.random.default_rng(12).integers(-32768, 32768, 12 * frame).astype(np.int16)
    frames: list[NDArray[Any]] = list(np.split(xi, 12))
    for i in (4, 5, 6, 7, 10):
        frames[i] = (frames[i] / 32768.0).astype(np.float32)
    r = Resampler(*pair)
    fast = [r.process(f).astype(np.float64) for f in frames]
    r = Resampler(*pair)
    slow = [
        np.concatenate([r.process(f[k : k + 1]) for k in range(len(f))]).astype(np.float64)
        for f in frames
    ]
    for a, b in zip(fast, slow, strict=True):
        assert np.array_equal(a, b)

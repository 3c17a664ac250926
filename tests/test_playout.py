"""PlayoutBuffer: exact, drift-free pacing of bursty agent audio."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jitter import PlayoutBuffer

FRAME = 160


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=30))
def test_bursty_writes_come_back_in_order(sizes: list[int]) -> None:
    pb = PlayoutBuffer(8000)
    total = sum(sizes)
    data = (np.arange(total) % 30000 + 1).astype(np.int16)
    pos = 0
    for n in sizes:
        pb.write(data[pos : pos + n])
        pos += n
    assert pb.queued_samples == total
    frames = [pb.pop() for _ in range(-(-total // FRAME))]
    assert all(f.dtype == np.int16 and f.size == FRAME for f in frames)
    out = np.concatenate(frames)
    np.testing.assert_array_equal(out[:total], data)
    assert not out[total:].any()  # zero padding of the last partial frame
    assert pb.queued_samples == 0


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.one_of(st.integers(min_value=0, max_value=500), st.just(-1)), min_size=1, max_size=60
    )
)
def test_interleaved_write_pop_is_a_fifo(ops: list[int]) -> None:
    """Whatever the interleaving, popped real samples are exactly the written ones in order."""
    pb = PlayoutBuffer(8000)
    written: list[int] = []
    got: list[int] = []
    counter = 1
    for op in ops:
        if op < 0:
            q = pb.queued_samples
            f = pb.pop()
            assert f.size == FRAME
            got.extend(f[: min(q, FRAME)].tolist())
        elif op > 0:
            chunk = np.arange(counter, counter + op, dtype=np.int64) % 32000 + 1
            counter += op
            pb.write(chunk.astype(np.int16))
            written.extend(chunk.tolist())
    assert got == written[: len(got)]
    assert pb.queued_samples == len(written) - len(got)


def test_underrun_is_silence_and_counted() -> None:
    pb = PlayoutBuffer(8000)
    f = pb.pop()
    assert f.dtype == np.int16 and f.size == FRAME and not f.any()
    pb.write(np.full(50, 7, dtype=np.int16))
    f = pb.pop()
    assert (f[:50] == 7).all() and not f[50:].any()
    assert pb.underrun_frames == 2


def test_flush_returns_ms_and_empties() -> None:
    pb = PlayoutBuffer(24000, frame_ms=20)
    pb.write(np.ones(24000, dtype=np.int16))  # 1 s
    pb.pop()
    assert pb.flush() == pytest.approx(980.0)
    assert pb.queued_ms == 0.0
    assert not pb.pop().any()
    assert pb.flush() == 0.0


def test_max_ms_drops_oldest_and_counts() -> None:
    pb = PlayoutBuffer(8000, max_ms=100)
    pb.write(np.arange(1, 1601, dtype=np.int16))  # 200 ms
    assert pb.queued_ms == pytest.approx(100.0)
    assert pb.overflow_ms == pytest.approx(100.0)
    f = pb.pop()
    np.testing.assert_array_equal(f, np.arange(801, 961, dtype=np.int16))


def test_latency_bounded_over_long_call_with_cap() -> None:
    """A producer 1 % faster than real time cannot make the queue grow past max_ms."""
    pb = PlayoutBuffer(8000, max_ms=200)
    chunk = np.ones(1616, dtype=np.int16)  # 202 ms per 10 ticks
    for tick in range(30_000):  # 10 minutes
        if tick % 10 == 0:
            pb.write(chunk)
        pb.pop()
        assert pb.queued_ms <= 200.0
    assert pb.overflow_samples > 0


def test_no_drift_over_one_hour() -> None:
    """Writes matching consumption (in odd-sized bursts) over an hour: no sample lost or added."""
    pb = PlayoutBuffer(8000)
    rng = np.random.default_rng(3)
    ticks = 180_000
    written = 0
    popped = 0
    pending = 0
    sizes = rng.integers(1, 800, size=ticks)
    k = 0
    for _ in range(ticks):
        pending += FRAME
        # write what the producer owes, in a random-sized burst, keeping ~1 frame queued
        while written < pending + FRAME:
            n = int(sizes[k % ticks])
            k += 1
            pb.write(np.ones(n, dtype=np.int16))
            written += n
        q = pb.queued_samples
        pb.pop()
        popped += min(q, FRAME)
    assert pb.underrun_frames == 0
    assert popped == ticks * FRAME
    assert pb.queued_samples == written - popped
    assert pb.queued_samples < 2 * FRAME + 800


def test_rejects_bad_input() -> None:
    pb = PlayoutBuffer(8000)
    with pytest.raises(ValueError):
        pb.write(np.zeros(10, dtype=np.float32))
    with pytest.raises(ValueError):
        PlayoutBuffer(8000, frame_ms=20, max_ms=5)
    pb.write(np.zeros(0, dtype=np.int16))
    assert pb.queued_samples == 0


def test_flush_with_a_fade_plays_the_next_samples_faded_then_nothing() -> None:
    """Barge-in without a click: the next 800 samples (100 ms) play, ramped down by the
    gain given; the rest of the reply is dropped and counted as dropped."""
    pb = PlayoutBuffer(8000)
    pb.write(np.full(1000, 1000, dtype=np.int16))
    pb.write(np.full(2000, -2000, dtype=np.int16))
    pb.pop()  # 160 played
    gain = np.linspace(1.0, 0.0, 800, endpoint=False)
    assert pb.flush(gain) == pytest.approx(1000 * (3000 - 160 - 800) / 8000)
    assert pb.queued_samples == 800
    out = np.concatenate([pb.pop() for _ in range(5)])
    want = np.concatenate([np.full(840, 1000.0), np.full(2000, -2000.0)])[:800] * gain
    assert np.array_equal(out, np.rint(want).astype(np.int16))
    assert not pb.pop().any() and pb.queued_samples == 0
    assert pb.flushed_samples == 3000 - 160 - 800


def test_flush_with_a_fade_longer_than_the_queue_fades_what_there_is() -> None:
    pb = PlayoutBuffer(8000)
    pb.write(np.full(100, 4000, dtype=np.int16))
    assert pb.flush(np.full(800, 0.5)) == 0.0
    f = pb.pop()
    assert (f[:100] == 2000).all() and not f[100:].any()

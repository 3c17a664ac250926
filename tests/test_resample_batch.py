"""process_many: many streams in one matmul, bit for bit what each stream alone returns."""

from __future__ import annotations

import numpy as np
import pytest

from resample import Resampler
from resample.batch import process_many


@pytest.mark.parametrize(
    ("rates", "chunk"),
    [((8000, 24000), 160), ((24000, 8000), 480), ((8000, 16000), 160), ((16000, 8000), 320)],
)
def test_batched_equals_per_stream(rates: tuple[int, int], chunk: int) -> None:
    rng = np.random.default_rng(3)
    n = 7
    ours = [Resampler(*rates) for _ in range(n)]
    ref = [Resampler(*rates) for _ in range(n)]
    for step in range(12):
        x = rng.integers(-32768, 32767, (n, chunk), dtype=np.int16)
        if step == 6:  # one stream restarts: the batch must fall back, same answer
            ours[2].reset()
            ref[2].reset()
        got = process_many(ours, x)
        want = np.stack([r.process(row) for r, row in zip(ref, x, strict=True)])
        np.testing.assert_array_equal(got, want)
    # and the streams carry on alone, state intact
    x1 = rng.integers(-32768, 32767, chunk, dtype=np.int16)
    for a, b in zip(ours, ref, strict=True):
        np.testing.assert_array_equal(a.process(x1), b.process(x1))


def test_mixed_states_and_shapes_are_checked() -> None:
    rs = [Resampler(8000, 24000), Resampler(8000, 24000)]
    rs[0].process(np.zeros(160, np.int16))  # one stream ahead of the other
    x = np.ones((2, 160), np.int16)
    ref = [Resampler(8000, 24000), Resampler(8000, 24000)]
    ref[0].process(np.zeros(160, np.int16))
    np.testing.assert_array_equal(
        process_many(rs, x), np.stack([r.process(row) for r, row in zip(ref, x, strict=True)])
    )
    with pytest.raises(ValueError):
        process_many(rs, np.ones((3, 160), np.int16))
    with pytest.raises(TypeError):
        process_many(rs, np.ones((2, 160), np.float32))

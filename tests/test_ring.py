"""SampleRing against a plain dict model: positions far past the capacity, across the wrap."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jitter.ring import SampleRing

CAP = 64


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["write", "clear"]),
            st.integers(0, 4 * CAP),  # offset from a moving base
            st.integers(1, CAP // 2),
        ),
        max_size=40,
    ),
    st.integers(0, 10**9),
)
def test_ring_matches_a_dict_model(ops: list[tuple[str, int, int]], base: int) -> None:
    ring = SampleRing(CAP)
    model: dict[int, tuple[int, int]] = {}  # position -> (sample, seq)
    lo = base
    for k, (op, off, n) in enumerate(ops):
        p = lo + off % (CAP - n)  # the ring only promises a window of `capacity`
        if op == "write":
            pcm = np.arange(n, dtype=np.int16) + k
            ring.write(p, pcm, k)
            for i in range(n):
                model[p + i] = (int(pcm[i]), k)
        else:
            ring.clear(p, n)
            for i in range(n):
                model.pop(p + i, None)
        # forget what fell out of the window [lo, lo + CAP)
        for q in [q for q in model if not lo <= q < lo + CAP]:
            del model[q]
    valid = ring.view(ring.valid, lo, CAP)
    pcm = ring.view(ring.pcm, lo, CAP)
    seq = ring.view(ring.seq, lo, CAP)
    for i in range(CAP):
        if lo + i in model:
            assert valid[i]
            assert (int(pcm[i]), int(seq[i])) == model[lo + i]
        else:
            assert not valid[i]
    first = min((q for q in model if q >= lo), default=None)
    assert ring.first_valid(lo, lo + CAP) == first


def test_clear_everything_and_bounds() -> None:
    ring = SampleRing(8)
    ring.write(6, np.ones(4, dtype=np.int16), 1)  # wraps: positions 6..9
    assert ring.first_valid(2, 20) == 6  # the window is 2..9
    assert ring.first_valid(2, 6) is None  # `end` is exclusive
    assert ring.view(ring.pcm, 6, 4).tolist() == [1, 1, 1, 1]
    ring.clear(0, 100)
    assert not ring.valid.any()
    assert ring.first_valid(2, 20) is None

"""The benches' rounded percentiles (bench/figures.py)."""

from __future__ import annotations

import numpy as np

from bench.figures import pct


def test_a_percentile_is_rounded_as_the_report_shows_it() -> None:
    assert pct([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert pct([0.12345, 0.5], 0, digits=3) == 0.123
    assert pct(np.array([10.0, 20.0, 30.0]), 100) == 30.0  # an array as well as a list


def test_no_values_have_no_percentile() -> None:
    assert pct([], 95) is None
    assert pct(np.array([]), 50) is None

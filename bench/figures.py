"""Figures for the benches' JSON: percentiles rounded as a report shows them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from sip_bridge.script.script_report import percentile

__all__ = ["pct"]


def pct(xs: Sequence[float] | NDArray[np.float64], q: float, digits: int = 1) -> float | None:
    """The ``q``-th percentile of ``xs`` rounded to ``digits`` (None when there are none)."""
    value = percentile(xs, q)
    return None if value is None else round(value, digits)

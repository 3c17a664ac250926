import numpy as np
import pytest

from jitter.cng import ComfortNoise


def test_silence_until_a_level_is_set() -> None:
    cng = ComfortNoise(8000)
    assert not cng.generate(160).any()


@pytest.mark.parametrize("level", [30, 50, 70])
def test_rms_follows_the_rfc3389_level(level: int) -> None:
    cng = ComfortNoise(8000)
    cng.set_level_dbov(level)
    x = np.concatenate([cng.generate(160) for _ in range(100)])  # 2 s, crosses the cycle
    rms_dbov = 20 * np.log10(np.sqrt(np.mean(x**2)) / 32767)
    assert rms_dbov == pytest.approx(-level, abs=0.5)
    # Continuous across calls and across the pre-drawn cycle: no repeated block boundary.
    assert not np.array_equal(x[:160], x[160:320])


def test_out_of_range_levels_are_clamped() -> None:
    cng = ComfortNoise(8000)
    cng.set_level_dbov(-5)
    assert cng.amplitude == pytest.approx(32767.0)
    cng.set_level_dbov(500)
    assert cng.amplitude == pytest.approx(32767.0 * 10 ** (-127 / 20))

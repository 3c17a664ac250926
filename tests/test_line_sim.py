"""The caller's line as the script runner imposes it: level, echo, loss and jitter."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from sip_bridge.script.line_sim import (
    LineEcho,
    PacketSchedule,
    active_level_dbfs,
    hybrid_filter,
    scale_to_level,
)
from sip_bridge.script.script_voice import espeak_ng


def _db(x: NDArray[np.float64] | NDArray[np.int16]) -> float:
    return float(10 * np.log10(np.mean(np.asarray(x, np.float64) ** 2)))


@pytest.fixture(scope="module")
def speech() -> NDArray[np.int16]:
    return espeak_ng("Thanks for calling. You can ask about our opening hours, or your order.")


def test_active_level_of_a_tone_is_its_rms() -> None:
    t = np.arange(16000) / 8000
    tone = (16384 * np.sin(2 * np.pi * 1000 * t)).astype(np.int16)
    assert abs(active_level_dbfs(tone) - (-9.03)) < 0.2
    assert active_level_dbfs(np.zeros(8000, np.int16)) == -100.0


def test_pauses_do_not_lower_the_active_level(speech: NDArray[np.int16]) -> None:
    """P.56's point: a caller's level is that of their speech, not of their silences."""
    gap = np.zeros(5 * 8000, np.int16)
    padded = np.concatenate([gap, speech, gap, speech, gap])
    assert abs(active_level_dbfs(padded) - active_level_dbfs(speech)) < 0.5
    assert _db(padded) < _db(speech) - 3  # a plain RMS drops by several dB


@pytest.mark.parametrize("target", [-15.0, -25.0, -35.0])
def test_scale_to_level(speech: NDArray[np.int16], target: float) -> None:
    assert abs(active_level_dbfs(scale_to_level(speech, target)) - target) < 0.5


def test_the_hybrid_is_a_coloured_telephone_band() -> None:
    response = 20 * np.log10(np.abs(np.fft.rfft(hybrid_filter(), 8000)))  # 1 Hz bins
    band = response[300:3300]
    assert 3 < band.max() - band.min() < 15  # coloured, not a copy; but the band passes
    assert response[20] < band.mean() - 20 and response[3800] < band.mean() - 20


@pytest.mark.parametrize(("erl", "delay_ms"), [(6.0, 150.0), (12.0, 60.0), (20.0, 10.0)])
def test_echo_comes_back_erl_down_and_delay_late(
    speech: NDArray[np.int16], erl: float, delay_ms: float
) -> None:
    echo = LineEcho(erl, delay_ms)
    frames = speech[: speech.size // 160 * 160].reshape(-1, 160)
    out = []
    for k, frame in enumerate(frames):
        echo.heard(k * 0.02 + 0.003, frame)  # arrivals with a little scheduling jitter
        out.append(echo.echo(k * 160, 160))
    back = np.concatenate(out)
    sent = frames.reshape(-1).astype(np.float64)
    assert abs((_db(sent) - _db(back)) - erl) < 1.5
    corr = np.correlate(back, sent[: sent.size - 4000], mode="valid")
    lag_ms = int(np.argmax(corr)) / 8
    # plus the 3 ms the frames arrived late and the band filter's 15-sample group delay
    assert abs(lag_ms - (delay_ms + 3.0 + 15 / 8)) <= 1.0


def test_echo_of_nothing_heard_is_silence() -> None:
    echo = LineEcho(6.0, 100.0)
    assert not echo.echo(8000, 160).any()
    echo.heard(0.0, np.full(160, 1000, np.int16))
    assert not echo.echo(5 * 8000, 160).any()  # long after: gone, not wrapped around


def test_loss_is_bursty_and_repeatable() -> None:
    plan = [PacketSchedule(3.0, 0.0, seed=7).next() for _ in range(1)]
    sched = PacketSchedule(3.0, 0.0, seed=7)
    lost = np.array([sched.next() is None for _ in range(30000)])
    assert 0.02 < lost.mean() < 0.04
    starts = np.flatnonzero(lost[1:] & ~lost[:-1])
    mean_burst = lost.sum() / max(1, starts.size)
    assert mean_burst > 1.8  # Gilbert-Elliott: losses come in runs (mean 3)
    again = PacketSchedule(3.0, 0.0, seed=7)
    assert [again.next() for _ in range(1)] == plan
    assert sched.lost == int(lost.sum()) and sched.sent == 30000
    clean = PacketSchedule()
    assert not clean.impaired and all(clean.next() == 0.0 for _ in range(100))


def test_jitter_is_the_rfc3550_figure() -> None:
    sched = PacketSchedule(0.0, 20.0, seed=3)
    delays = np.array([sched.next() for _ in range(20000)], dtype=np.float64)
    j = float(np.mean(np.abs(np.diff(delays)))) * 1000
    assert 17.0 < j < 23.0
    assert delays.min() >= 0.0

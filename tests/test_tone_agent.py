"""ToneAgent: right frequency, exact level, seamless frame joins, no drift over an hour."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from numpy.typing import NDArray

from agent.base import CallInfo
from agent.lines.tone import ToneAgent
from testkit.agent_capture import Capture

FRAME = 480  # 20 ms at 24 kHz


def _run(agent: ToneAgent, frames: int, frame: int = FRAME) -> Capture:
    out = Capture()
    asyncio.run(agent.start(CallInfo(call_id="t"), out))
    rng = np.random.default_rng(0)
    for _ in range(frames):
        agent.on_audio(rng.integers(-32768, 32767, frame, dtype=np.int16))  # ignored
    return out


def _exact_tone(n: int, freq: int, rate: int, amp: float, start: int = 0) -> NDArray[np.float64]:
    """Reference with exact integer phase: (k * f mod rate) / rate cycles."""
    k = np.arange(start, start + n, dtype=np.int64)
    cycles = (k * freq % rate) / rate
    return amp * np.sin(2 * np.pi * cycles)


@pytest.mark.parametrize("freq", [440.0, 1000.0, 3150.0])
def test_frequency_by_fft(freq: float) -> None:
    out = _run(ToneAgent(freq_hz=freq), 50)  # 1 s: 1 Hz bins
    x = out.audio.astype(np.float64)
    assert x.size == 24000
    spec = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    assert abs(float(np.argmax(spec)) - freq) <= 1.0
    # Nothing else: everything 3 bins away from the tone is > 80 dB down.
    peak = int(np.argmax(spec))
    rest = np.delete(spec, np.arange(peak - 3, peak + 4))
    assert 20 * np.log10(rest.max() / spec.max()) < -80


@pytest.mark.parametrize("level", [-10.0, -3.0, -20.0, 0.0])
def test_level_is_exact(level: float) -> None:
    out = _run(ToneAgent(level_dbfs=level), 50)
    x = out.audio.astype(np.float64)
    peak = min(32768 * 10 ** (level / 20), 32767)
    assert abs(np.abs(x).max() - peak) <= 1.0
    rms_dbfs = 20 * np.log10(np.sqrt(np.mean(x**2)) * np.sqrt(2) / 32768)  # sine: 0 dB at FS
    assert abs(rms_dbfs - level) < 0.01
    assert int(np.abs(x).max()) <= 32767


def test_frames_join_without_discontinuity() -> None:
    # 997 Hz does not divide 24 kHz, so every frame starts at a different phase.
    agent = ToneAgent(freq_hz=997.0, level_dbfs=-6.0)
    out = _run(agent, 40)
    x = out.audio.astype(np.float64)
    ref = _exact_tone(x.size, 997, 24000, agent.amplitude)
    assert np.max(np.abs(x - ref)) <= 0.5 + 1e-9  # only rounding to int16
    # The step across each join is no bigger than the largest step inside a frame.
    d = np.abs(np.diff(x))
    joins = d[FRAME - 1 :: FRAME]
    assert joins.max() <= d.max()
    assert joins.max() <= 2 * np.pi * 997 / 24000 * agent.amplitude + 1


def test_odd_frame_sizes_continue_phase() -> None:
    agent = ToneAgent(freq_hz=1234.0)
    out = Capture()
    asyncio.run(agent.start(CallInfo(call_id="t"), out))
    for n in [1, 479, 480, 160, 7, 0, 953]:
        agent.on_audio(np.zeros(n, np.int16))
    x = out.audio.astype(np.float64)
    assert x.size == 1 + 479 + 480 + 160 + 7 + 953
    assert np.max(np.abs(x - _exact_tone(x.size, 1234, 24000, agent.amplitude))) <= 0.5 + 1e-9


def test_one_hour_exact_sample_count_and_no_phase_drift() -> None:
    agent = ToneAgent(freq_hz=997.0)
    out = Capture(keep=False)
    asyncio.run(agent.start(CallInfo(call_id="t"), out))
    frame = np.zeros(FRAME, np.int16)
    frames = 3600 * 50
    for _ in range(frames):
        agent.on_audio(frame)
    total = frames * FRAME
    assert sum(out.sizes) == total == agent.samples_written
    assert set(out.sizes) == {FRAME}  # one frame out per frame in: never over-queues
    last = agent.next_frame(FRAME).astype(np.float64)
    ref = _exact_tone(FRAME, 997, 24000, agent.amplitude, start=total)
    assert np.max(np.abs(last - ref)) <= 0.5 + 1e-6


def test_other_sample_rate_and_silence_before_start() -> None:
    agent = ToneAgent(freq_hz=1000.0, sample_rate=8000)
    agent.on_audio(np.zeros(160, np.int16))  # not started: nothing to write to, no error
    out = _run(agent, 50, frame=160)
    x = out.audio.astype(np.float64)
    assert x.size == 8000
    assert int(np.argmax(np.abs(np.fft.rfft(x)))) == 1000
    assert agent.name == "tone"


@pytest.mark.parametrize(
    "kwargs",
    [{"freq_hz": 0.0}, {"freq_hz": 12000.0}, {"level_dbfs": 1.0}, {"sample_rate": 0}],
)
def test_bad_parameters_raise(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ToneAgent(**kwargs)  # type: ignore[arg-type]


def test_stop_ends_output() -> None:
    agent = ToneAgent()
    out = _run(agent, 2)
    asyncio.run(agent.stop())
    agent.on_audio(np.zeros(FRAME, np.int16))
    assert len(out.sizes) == 2

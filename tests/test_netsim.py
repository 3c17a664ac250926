"""The network models must produce what they claim, or every bench figure is wrong."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from numpy.typing import NDArray

from jitter.netsim import (
    STANDARD_TRACES,
    NetworkModel,
    TracePacket,
    interarrival_jitter_ms,
    make_trace,
    oracle_added_delay_ms,
    received,
    replay,
    standard_trace,
    tone_pcm,
)


@pytest.mark.parametrize("kind", ["gaussian", "uniform", "pareto"])
def test_jitter_models_produce_the_rfc3550_jitter_they_claim(kind: str) -> None:
    model = NetworkModel(base_delay_ms=50, jitter=kind, jitter_ms=20.0)  # type: ignore[arg-type]
    trace = make_trace(model, 200.0, seed=3)
    transit = np.array([p.arrival_s - p.send_s for p in trace if p.arrival_s is not None])
    # Calibration: in send order, E|d(i) - d(i-1)| is the nominal J.
    tol = 0.2 if kind == "pareto" else 0.05  # Pareto's heavy tail converges slowly
    assert 1000 * np.mean(np.abs(np.diff(transit))) == pytest.approx(20.0, rel=tol)
    # RTCP's estimator runs in arrival order, so reordered packets read a little higher.
    assert interarrival_jitter_ms(trace) == pytest.approx(20.0, rel=tol + 0.07)


def test_no_jitter_no_loss_is_a_clean_line() -> None:
    trace = make_trace(NetworkModel(base_delay_ms=10), 10.0, seed=1, seq0=65530, ts0=2**32 - 320)
    assert len(received(trace)) == len(trace) == 500
    assert interarrival_jitter_ms(trace) == pytest.approx(0.0, abs=1e-9)
    # Sequence and timestamp wrap like a real sender.
    assert [p.seq for p in trace[:8]] == [65530, 65531, 65532, 65533, 65534, 65535, 0, 1]
    assert trace[2].timestamp == 0 and trace[2].ts_ext == 2**32
    for p in trace:
        assert p.arrival_s is not None
        assert p.arrival_s - p.send_s == pytest.approx(0.010)


def _burst_lengths(trace: list[TracePacket]) -> NDArray[np.int64]:
    lost = np.array([p.arrival_s is None for p in trace], dtype=np.int8)
    edges = np.diff(np.concatenate([[0], lost, [0]]))
    return np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)


def test_gilbert_elliott_loss_rate_and_burstiness() -> None:
    model = NetworkModel(loss="gilbert", loss_pct=2.0, burst_len=3.0)
    trace = make_trace(model, 600.0, seed=5)
    loss = 1 - len(received(trace)) / len(trace)
    assert loss == pytest.approx(0.02, rel=0.15)
    assert np.mean(_burst_lengths(trace)) == pytest.approx(3.0, rel=0.2)
    bern = make_trace(NetworkModel(loss="bernoulli", loss_pct=2.0), 600.0, seed=5)
    assert np.mean(_burst_lengths(bern)) < 1.1  # independent loss is not bursty


def test_drift_changes_real_send_rate_not_timestamps() -> None:
    fast = make_trace(NetworkModel(), 100.0, seed=2, drift=0.005)
    span = fast[-1].send_s - fast[0].send_s
    ts_span = (fast[-1].ts_ext - fast[0].ts_ext) / 8000
    assert ts_span / span == pytest.approx(1.005, rel=1e-6)


def test_talkspurts_have_markers_and_one_cn_per_pause() -> None:
    trace = make_trace(NetworkModel(), 60.0, seed=4, talkspurts=True)
    seqs = [p.seq for p in trace]
    assert all((b - a) % 65536 == 1 for a, b in itertools.pairwise(seqs))
    for prev, cur in itertools.pairwise(trace):
        if cur.kind == "audio" and prev.kind == "cn":
            assert cur.marker
            assert cur.ts_ext - prev.ts_ext >= 160  # DTX: timestamps keep real time
        if cur.kind == "cn":
            assert prev.kind == "audio"
    active = sum(p.kind == "audio" for p in trace) * 0.02
    assert 0.45 < active / 60.0 < 0.8  # on/off speech model, 1.0 s talk / 0.6 s pause


def test_traces_are_deterministic_per_seed() -> None:
    a = standard_trace("wan_gauss_j30_ge2", 20.0, seed=11)
    b = standard_trace("wan_gauss_j30_ge2", 20.0, seed=11)
    c = standard_trace("wan_gauss_j30_ge2", 20.0, seed=12)
    assert a == b
    assert a != c
    assert set(STANDARD_TRACES) >= {"lan", "wan_gauss_j30_ge2", "drift_plus_0.5pct"}


def test_oracle_is_the_hindsight_quantile() -> None:
    trace = make_trace(NetworkModel(base_delay_ms=20, jitter="uniform", jitter_ms=10.0), 300, 9)
    # Uniform on [0, 30 ms]: the 99 % point is 29.7 ms, mean on-time wait ~ 29.7 - 14.85.
    assert oracle_added_delay_ms(trace) == pytest.approx(14.85, abs=0.5)


class _FixedDelay:
    """A reference buffer: starts `delay_s` after the first arrival, then one frame a tick."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.anchor: tuple[float, int] | None = None
        self._pt: int | None = None
        self._next: int | None = None

    @property
    def playout_timestamp(self) -> int | None:
        return self._pt

    def push(self, seq, timestamp, pcm, arrival_s, marker=False, ssrc=None):  # type: ignore[no-untyped-def]
        if self.anchor is None:
            self.anchor = (arrival_s, timestamp)

    def push_comfort_noise(self, seq, timestamp, level_dbov, arrival_s, ssrc=None):  # type: ignore[no-untyped-def]
        pass

    def pop(self, now_s: float) -> NDArray[np.int16]:
        if self._next is None and self.anchor and now_s >= self.anchor[0] + self.delay_s:
            self._next = self.anchor[1]
        if self._next is not None:
            self._pt = self._next
            self._next = (self._next + 160) & 0xFFFFFFFF
        return np.zeros(160, dtype=np.int16)


def test_replay_measures_buffering_delay_exactly() -> None:
    trace = make_trace(NetworkModel(base_delay_ms=5), 30.0, seed=1, ts0=2**32 - 8000)
    res = replay(trace, _FixedDelay(0.060))
    assert res.late == 0 and res.skipped == 0
    assert res.played == res.received == len(trace)
    # The first tick at or after arrival + 60 ms, and every packet waits the same.
    assert np.all(res.added_delay_ms >= 60.0 - 1e-6)
    assert np.all(res.added_delay_ms < 80.0)
    assert np.ptp(res.added_delay_ms) < 1e-6


def test_replay_counts_late_packets() -> None:
    # Every 10th packet 100 ms late against a 60 ms fixed buffer: exactly those are late.
    trace = make_trace(NetworkModel(base_delay_ms=5), 10.0, seed=1)
    trace = [
        TracePacket(**{**p.__dict__, "arrival_s": p.arrival_s + 0.1})
        if i % 10 == 5 and p.arrival_s is not None
        else p
        for i, p in enumerate(trace)
    ]
    res = replay(trace, _FixedDelay(0.060))
    assert res.late == 50
    assert res.late_loss_pct == pytest.approx(10.0)


def test_tone_pcm_is_continuous_across_packets() -> None:
    trace = make_trace(NetworkModel(), 1.0, seed=1)
    joined = np.concatenate([tone_pcm(p) for p in trace[:5]])
    assert np.max(np.abs(np.diff(joined.astype(np.int32)))) < 1500

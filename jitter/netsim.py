"""Seeded network models and a replay harness for the jitter buffer.

Tests and bench/media_core.py replay the same traces, so a figure in the
bench means the same thing as an assertion in a test. Everything here is
pure and deterministic for a given seed: no sockets, no wall clock.

`jitter_ms` of a model is the RFC 3550 interarrival jitter J (the figure an
RTCP receiver report and an SBC dashboard show), not a standard deviation:
for i.i.d. delays J = E|d(i) - d(i-1)|, so each distribution is scaled to
produce that J.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
from numpy.typing import NDArray

JitterKind = Literal["none", "gaussian", "uniform", "pareto"]
LossKind = Literal["none", "bernoulli", "gilbert"]

_PARETO_ALPHA = 2.5


@dataclass(frozen=True)
class NetworkModel:
    """One direction of a network path, as seen by RTP packets."""

    base_delay_ms: float = 20.0
    jitter: JitterKind = "none"
    jitter_ms: float = 0.0
    loss: LossKind = "none"
    loss_pct: float = 0.0
    burst_len: float = 3.0  # mean length of a bad-state visit (Gilbert-Elliott), in packets
    bad_loss: float = 1.0  # loss probability inside the bad state
    reorder_pct: float = 0.0  # extra 1..3 ptime delay on this share of packets


@dataclass(frozen=True)
class TracePacket:
    """One RTP packet as sent and (maybe) received."""

    seq: int  # 16-bit, wrapped
    timestamp: int  # 32-bit, wrapped
    ts_ext: int  # the sender's timestamp without wrapping (harness bookkeeping)
    send_s: float
    arrival_s: float | None  # None: lost in the network
    marker: bool
    ssrc: int
    samples: int
    kind: Literal["audio", "cn"] = "audio"


def _jitter_samples(model: NetworkModel, n: int, rng: np.random.Generator) -> NDArray[np.float64]:
    """Per-packet extra delay in seconds, >= 0, scaled so E|X1 - X2| = jitter_ms."""
    j = model.jitter_ms / 1000.0
    if model.jitter == "none" or j <= 0:
        return np.zeros(n)
    if model.jitter == "gaussian":
        # E|X1-X2| = 2 sigma / sqrt(pi); shift so that almost all samples are >= 0.
        sigma = j * math.sqrt(math.pi) / 2.0
        x = rng.normal(3.0 * sigma, sigma, n)
        return np.clip(x, 0.0, None)
    if model.jitter == "uniform":
        return rng.uniform(0.0, 3.0 * j, n)  # E|X1-X2| = width / 3
    if model.jitter == "pareto":
        # Lomax (shifted Pareto): Gini mean difference = 2 a xm / ((a-1)(2a-1)).
        a = _PARETO_ALPHA
        xm = j * (a - 1.0) * (2.0 * a - 1.0) / (2.0 * a)
        return xm * rng.pareto(a, n)
    raise ValueError(f"unknown jitter model {model.jitter!r}")


def _loss_mask(model: NetworkModel, n: int, rng: np.random.Generator) -> NDArray[np.bool_]:
    target = model.loss_pct / 100.0
    if model.loss == "none" or target <= 0:
        return np.zeros(n, dtype=bool)
    if model.loss == "bernoulli":
        return rng.random(n) < target
    if model.loss == "gilbert":
        h = model.bad_loss
        if not 0 < target < h:
            raise ValueError("gilbert loss_pct must be below bad_loss")
        r = 1.0 / max(model.burst_len, 1.0)  # bad -> good
        pi_bad = target / h
        p = r * pi_bad / (1.0 - pi_bad)  # good -> bad
        u = rng.random(n)
        v = rng.random(n)
        lost = np.zeros(n, dtype=bool)
        bad = False
        for i in range(n):
            bad = (u[i] >= r) if bad else (u[i] < p)
            lost[i] = bad and v[i] < h
        return lost
    raise ValueError(f"unknown loss model {model.loss!r}")


def _talkspurt_mask(n: int, ptime_s: float, rng: np.random.Generator) -> NDArray[np.bool_]:
    """On/off speech activity: exponential talkspurts (mean 1.0 s) and pauses (mean 0.6 s)."""
    active = np.zeros(n, dtype=bool)
    i = 0
    talking = True
    while i < n:
        mean = 1.0 if talking else 0.6
        length = max(1, round(rng.exponential(mean) / ptime_s))
        active[i : i + length] = talking
        i += length
        talking = not talking
    return active


def make_trace(
    model: NetworkModel,
    duration_s: float,
    seed: int,
    *,
    ptime_ms: int = 20,
    clock_rate: int = 8000,
    talkspurts: bool = False,
    drift: float = 0.0,
    seq0: int | None = None,
    ts0: int | None = None,
    ssrc: int | None = None,
) -> list[TracePacket]:
    """Packets of one RTP stream in send order (lost ones kept, arrival None).

    `drift` is the sender's clock error: +0.005 means its sample clock runs
    0.5 % fast, so it sends 0.5 % more audio per real second than we play.
    With `talkspurts`, silences are DTX: one CN packet at the start of each
    pause, then nothing until the next talkspurt (marker bit set).
    """
    rng = np.random.default_rng(seed)
    samples = clock_rate * ptime_ms // 1000
    ptime_s = ptime_ms / 1000.0
    n_slots = int(duration_s / ptime_s)
    seq = int(rng.integers(0, 1 << 16)) if seq0 is None else seq0
    ts_ext = int(rng.integers(0, 1 << 32)) if ts0 is None else ts0
    ssrc_v = int(rng.integers(1, 1 << 32)) if ssrc is None else ssrc
    active = _talkspurt_mask(n_slots, ptime_s, rng) if talkspurts else np.ones(n_slots, bool)
    delay = model.base_delay_ms / 1000.0 + _jitter_samples(model, n_slots, rng)
    if model.reorder_pct > 0:
        late = rng.random(n_slots) < model.reorder_pct / 100.0
        delay = delay + late * rng.integers(1, 4, n_slots) * ptime_s
    lost = _loss_mask(model, n_slots, rng)
    out: list[TracePacket] = []
    was_active = False
    for i in range(n_slots):
        send_s = i * ptime_s / (1.0 + drift)
        ts_i = ts_ext + i * samples
        kind: Literal["audio", "cn"]
        if active[i]:
            kind, marker = "audio", not was_active and talkspurts
        elif was_active or i == 0:
            kind, marker = "cn", False
        else:
            continue  # DTX: nothing on the wire
        was_active = bool(active[i])
        arrival = None if lost[i] else send_s + float(delay[i])
        out.append(
            TracePacket(
                seq=seq & 0xFFFF,
                timestamp=ts_i & 0xFFFFFFFF,
                ts_ext=ts_i,
                send_s=send_s,
                arrival_s=arrival,
                marker=marker,
                ssrc=ssrc_v,
                samples=samples,
                kind=kind,
            )
        )
        seq += 1
    return out


def received(trace: Sequence[TracePacket]) -> list[TracePacket]:
    """The packets that arrived, in arrival order (what a socket would deliver)."""
    got = [p for p in trace if p.arrival_s is not None]
    got.sort(key=lambda p: (p.arrival_s, p.send_s))
    return got


def interarrival_jitter_ms(trace: Sequence[TracePacket], clock_rate: int = 8000) -> float:
    """Mean of the RFC 3550 running jitter estimate J over the received packets."""
    pkts = received(trace)
    if len(pkts) < 2:
        return 0.0
    j = 0.0
    acc = 0.0
    prev = pkts[0]
    for p in pkts[1:]:
        assert p.arrival_s is not None and prev.arrival_s is not None
        d = (p.arrival_s - prev.arrival_s) - (p.ts_ext - prev.ts_ext) / clock_rate
        j += (abs(d) - j) / 16.0
        acc += j
        prev = p
    return 1000.0 * acc / (len(pkts) - 1)


def oracle_added_delay_ms(
    trace: Sequence[TracePacket],
    late_pct: float = 1.0,
    *,
    frame_ms: int | None = None,
    tick_phase_s: float = 0.0073,
) -> float:
    """Mean buffering delay of the best fixed playout delay chosen in hindsight.

    A lower bound for any buffer that loses at most `late_pct` % of packets to
    lateness on this trace. With `frame_ms`, playout is also tied to the pop
    ticks of `replay` (every frame_ms at tick_phase_s), as a real buffer's is:
    a packet is played at the first tick at or after its scheduled time.
    """
    audio = [p for p in received(trace) if p.kind == "audio" and p.arrival_s is not None]
    if not audio:
        return 0.0
    arrival = np.array([p.arrival_s for p in audio], dtype=np.float64)
    # The sender's true clock: a buffer that tracked drift perfectly plays on it.
    nominal = np.array([p.send_s for p in audio], dtype=np.float64)
    nominal += float(np.min(arrival - nominal))  # best-case transit at 0 jitter
    if frame_ms is None:
        rel = arrival - nominal
        playout = float(np.quantile(rel, 1.0 - late_pct / 100.0))
        return 1000.0 * float(np.mean(playout - rel[rel <= playout]))
    frame_s = frame_ms / 1000.0
    best = math.inf
    for d in np.arange(0.0, 0.5, 0.0005):
        tick = np.ceil((nominal + d - tick_phase_s) / frame_s) * frame_s + tick_phase_s
        on_time = arrival <= tick + 1e-9
        if 100.0 * (1.0 - np.mean(on_time)) > late_pct:
            continue
        best = min(best, float(np.mean(tick[on_time] - arrival[on_time])))
    return 1000.0 * best


# -- replay ---------------------------------------------------------------------------------


class JitterBufferLike(Protocol):
    """What replay() drives: the jitter.JitterBuffer API."""

    @property
    def playout_timestamp(self) -> int | None: ...

    def push(
        self,
        seq: int,
        timestamp: int,
        pcm: NDArray[np.int16],
        arrival_s: float,
        marker: bool = False,
        ssrc: int | None = None,
    ) -> None: ...

    def push_comfort_noise(
        self, seq: int, timestamp: int, level_dbov: int, arrival_s: float, ssrc: int | None = None
    ) -> None: ...

    def pop(self, now_s: float) -> NDArray[np.int16]: ...


_TONE_PERIOD = 50  # 160 Hz at 8 kHz: a voiced, PLC-friendly test signal
_TONE: NDArray[np.int16] = (
    6000 * np.sin(2 * np.pi * np.arange(_TONE_PERIOD) / _TONE_PERIOD)
    + 2000 * np.sin(6 * np.pi * np.arange(_TONE_PERIOD) / _TONE_PERIOD)
).astype(np.int16)


def tone_pcm(p: TracePacket) -> NDArray[np.int16]:
    """Default packet audio: a harmonic tone indexed by RTP timestamp, continuous across packets."""
    idx = (p.ts_ext + np.arange(p.samples)) % _TONE_PERIOD
    return _TONE[idx]


@dataclass
class ReplayResult:
    sent: int
    received: int
    played: int
    late: int  # arrived after its first sample's playout tick
    skipped: int  # arrived in time but never played (frame dropped to shrink the delay)
    frames: int  # frames popped once playout had started
    added_delay_ms: NDArray[np.float64]  # per played packet: playout tick - arrival
    timeline: NDArray[np.float64] = field(default_factory=lambda: np.zeros((0, 2)))

    @property
    def added_delay_mean_ms(self) -> float:
        return float(np.mean(self.added_delay_ms)) if self.added_delay_ms.size else 0.0

    @property
    def added_delay_p95_ms(self) -> float:
        return float(np.quantile(self.added_delay_ms, 0.95)) if self.added_delay_ms.size else 0.0

    @property
    def late_loss_pct(self) -> float:
        return 100.0 * self.late / self.received if self.received else 0.0


def replay(
    trace: Sequence[TracePacket],
    jb: JitterBufferLike,
    *,
    frame_ms: int = 20,
    clock_rate: int = 8000,
    pcm_for: Callable[[TracePacket], NDArray[np.int16]] | None = None,
    tick_phase_s: float = 0.0073,
    cn_level_dbov: int = 70,
    sample_timeline: Callable[[], float] | None = None,
    follow_due_s: float = 0.0,
) -> ReplayResult:
    """Drive `jb` on a simulated clock: pushes at arrival times, a pop every frame_ms.

    Each packet's buffering delay is the first pop tick whose frame contains
    the packet's first sample (from `jb.playout_timestamp`) minus its arrival.
    `sample_timeline`, if given, is read after every pop (e.g. the target
    delay) and recorded with the tick time for plots. With `follow_due_s` > 0
    the pop clock moves each tick by up to that much toward `jb.due_s` (a
    phase-following receive loop) instead of keeping a fixed 20 ms grid; build
    the buffer with ``follows_due=True`` then, so the two do not both adapt.
    """
    make_pcm = pcm_for or tone_pcm
    pkts = received(trace)
    audio = sorted((p for p in trace if p.kind == "audio"), key=lambda p: p.ts_ext)
    starts = np.array([p.ts_ext for p in audio], dtype=np.int64)
    first_tick: dict[int, float] = {}  # index into `audio` -> tick that played it
    frame = clock_rate * frame_ms // 1000
    frame_s = frame_ms / 1000.0
    if not pkts:
        return ReplayResult(len(trace), 0, 0, 0, 0, 0, np.zeros(0))
    assert pkts[0].arrival_s is not None and pkts[-1].arrival_s is not None
    t = math.floor(pkts[0].arrival_s / frame_s) * frame_s + tick_phase_s
    end = pkts[-1].arrival_s + 0.5
    i = 0
    frames = 0
    ref = int(audio[0].ts_ext) if audio else 0
    samples: list[tuple[float, float]] = []
    while t <= end:
        while i < len(pkts):
            p = pkts[i]
            assert p.arrival_s is not None
            if p.arrival_s > t:
                break
            if p.kind == "audio":
                jb.push(p.seq, p.timestamp, make_pcm(p), p.arrival_s, p.marker, p.ssrc)
            else:
                jb.push_comfort_noise(p.seq, p.timestamp, cn_level_dbov, p.arrival_s, p.ssrc)
            i += 1
        out = jb.pop(t)
        if len(out) != frame:
            raise AssertionError(f"pop returned {len(out)} samples, expected {frame}")
        pt = jb.playout_timestamp
        if pt is not None:
            frames += 1
            # Bring the buffer's timestamp into our unwrapped space (nearest 2**32 multiple).
            ext = pt + ((ref - pt + (1 << 31)) >> 32 << 32)
            ref = ext
            lo = int(np.searchsorted(starts, ext, side="left"))
            hi = int(np.searchsorted(starts, ext + frame, side="left"))
            for k in range(lo, hi):
                first_tick.setdefault(k, t)
        if sample_timeline is not None:
            samples.append((t, sample_timeline()))
        nxt = t + frame_s
        due = getattr(jb, "due_s", None) if follow_due_s > 0 else None
        if due is not None:
            nxt += min(follow_due_s, max(-follow_due_s, due - nxt))
        t = nxt
    delays: list[float] = []
    late = skipped = 0
    n_received = 0
    for k, p in enumerate(audio):
        if p.arrival_s is None:
            continue
        n_received += 1
        tick = first_tick.get(k)
        if tick is None:
            skipped += 1
        elif p.arrival_s > tick:
            late += 1
        else:
            delays.append(1000.0 * (tick - p.arrival_s))
    return ReplayResult(
        sent=sum(1 for p in trace if p.kind == "audio"),
        received=n_received,
        played=len(delays),
        late=late,
        skipped=skipped,
        frames=frames,
        added_delay_ms=np.array(delays),
        timeline=np.array(samples) if samples else np.zeros((0, 2)),
    )


# -- the standard traces ----------------------------------------------------------------------


@dataclass(frozen=True)
class StandardTrace:
    model: NetworkModel
    talkspurts: bool = False
    drift: float = 0.0


def _wan(jitter: JitterKind, jitter_ms: float, loss_pct: float, burst: float) -> NetworkModel:
    return NetworkModel(
        base_delay_ms=40.0,
        jitter=jitter,
        jitter_ms=jitter_ms,
        loss="gilbert",
        loss_pct=loss_pct,
        burst_len=burst,
    )


# Durations are chosen by the caller: tests keep them short, the bench runs minutes.
STANDARD_TRACES: dict[str, StandardTrace] = {
    "lan": StandardTrace(NetworkModel(base_delay_ms=1.0, jitter="gaussian", jitter_ms=1.0)),
    "wan_gauss_j30_ge2": StandardTrace(_wan("gaussian", 30.0, 2.0, 3.0), talkspurts=True),
    "wan_uniform_j30_ge2": StandardTrace(_wan("uniform", 30.0, 2.0, 3.0), talkspurts=True),
    "wan_pareto_j10_ge1": StandardTrace(_wan("pareto", 10.0, 1.0, 2.0), talkspurts=True),
    "reorder5_j5": StandardTrace(
        NetworkModel(base_delay_ms=20.0, jitter="gaussian", jitter_ms=5.0, reorder_pct=5.0)
    ),
    "drift_plus_0.5pct": StandardTrace(
        NetworkModel(base_delay_ms=20.0, jitter="gaussian", jitter_ms=3.0), drift=0.005
    ),
    "drift_minus_0.5pct": StandardTrace(
        NetworkModel(base_delay_ms=20.0, jitter="gaussian", jitter_ms=3.0), drift=-0.005
    ),
}


def standard_trace(name: str, duration_s: float = 120.0, seed: int = 7) -> list[TracePacket]:
    std = STANDARD_TRACES[name]
    return make_trace(std.model, duration_s, seed, talkspurts=std.talkspurts, drift=std.drift)

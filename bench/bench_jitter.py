"""Jitter buffers replayed on the standard network traces (part of media_core)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from jitter import JitterBuffer
from jitter.netsim import (
    STANDARD_TRACES,
    TracePacket,
    interarrival_jitter_ms,
    oracle_added_delay_ms,
    received,
    replay,
    standard_trace,
)


def _summary(delays: np.ndarray, late: int, n_received: int, **extra: Any) -> dict[str, Any]:
    return {
        "added_delay_ms": {
            "mean": round(float(np.mean(delays)), 1) if delays.size else None,
            "p95": round(float(np.quantile(delays, 0.95)), 1) if delays.size else None,
        },
        "late_loss_pct": round(100.0 * late / n_received, 2) if n_received else 0.0,
        **extra,
    }


def _ours(
    trace: list[TracePacket], follow_due_s: float = 0.0, **kw: int
) -> tuple[dict[str, Any], np.ndarray]:
    jb = JitterBuffer(follows_due=follow_due_s > 0, **kw)
    res = replay(
        trace,
        jb,
        sample_timeline=lambda: float(jb.stats.target_delay_ms),
        follow_due_s=follow_due_s,
    )
    st = jb.stats
    return (
        _summary(
            res.added_delay_ms,
            res.late,
            res.received,
            concealed_pct=round(100.0 * st.concealed / max(res.frames, 1), 2),
            skipped_packets=res.skipped,
            dropped_frames=st.dropped_frames,
            inserted_frames=st.inserted_frames,
            final_target_delay_ms=round(float(st.target_delay_ms), 1),
        ),
        res.timeline,
    )


def _aiortc(trace: list[TracePacket]) -> dict[str, Any] | None:
    """aiortc's audio buffer as its receiver uses it (capacity 16, prefetch 4).

    It is event-driven, with no playout clock: a frame leaves when 4 later
    frames are in, and a hole stalls it until the ring overflows. So its
    "added delay" is release time minus arrival, and packets it never
    releases count as late. It has no concealment.
    """
    try:
        from aiortc.jitterbuffer import JitterBuffer as AiortcJitterBuffer
        from aiortc.rtp import RtpPacket
    except ImportError:
        return None
    jb = AiortcJitterBuffer(capacity=16, prefetch=4)
    arrival: dict[int, float] = {}
    released: dict[int, float] = {}
    for p in received(trace):
        if p.kind != "audio" or p.arrival_s is None:
            continue
        pkt = RtpPacket(
            payload_type=0,
            marker=p.marker,
            sequence_number=p.seq,
            timestamp=p.timestamp,
            ssrc=p.ssrc,
            payload=b"\xff" * p.samples,
        )
        pkt._data = pkt.payload  # type: ignore[attr-defined]  # set by aiortc's depayloader
        arrival[p.timestamp] = p.arrival_s
        _, frame = jb.add(pkt)
        if frame is not None and frame.timestamp not in released:
            released[frame.timestamp] = p.arrival_s
    delays = np.array([1000.0 * (released[ts] - arrival[ts]) for ts in released if ts in arrival])
    late = len(arrival) - len(released)
    return _summary(delays, late, len(arrival), concealed_pct=None)


def bench_jitter(duration_s: float = 180.0, seed: int = 7) -> dict[str, Any]:
    """Per trace: our adaptive buffer, a fixed 60 ms one, aiortc's, and the hindsight bounds.

    `adaptive_following_due` pops on a clock nudged (<= 5 ms a tick) toward the
    buffer's `due_s`, as the per-call receive loop does; `adaptive` and
    `fixed_60ms` pop on a rigid 20 ms grid, whose phase alone costs up to a frame
    (compare `oracle_on_20ms_tick_grid_added_ms`). The drift traces have no
    meaningful fixed-delay oracle (a fixed delay cannot follow a drifting clock).
    The result's "_timelines" (target delay per tick) is for the plots only.
    """
    out: dict[str, Any] = {"duration_s": duration_s, "seed": seed, "traces": {}, "_timelines": {}}
    for name in STANDARD_TRACES:
        trace = standard_trace(name, duration_s, seed)
        got = received(trace)
        following, timeline = _ours(trace, follow_due_s=0.005)
        ours, _ = _ours(trace)
        fixed, _ = _ours(trace, min_delay_ms=60, max_delay_ms=60)
        out["traces"][name] = {
            "model": repr(STANDARD_TRACES[name]),
            "packets": len(trace),
            "network_loss_pct": round(100.0 * (1 - len(got) / len(trace)), 2),
            "interarrival_jitter_ms": round(interarrival_jitter_ms(trace), 1),
            "oracle_fixed_delay_added_ms": round(oracle_added_delay_ms(trace), 1),
            "oracle_on_20ms_tick_grid_added_ms": round(
                oracle_added_delay_ms(trace, frame_ms=20), 1
            ),
            "adaptive_following_due": following,
            "adaptive": ours,
            "fixed_60ms": fixed,
            "aiortc": _aiortc(trace),
        }
        out["_timelines"][name] = timeline
    return out


def plot_jitter(
    res: dict[str, Any], timelines: dict[str, np.ndarray], out: Path, plt: Any
) -> list[str]:
    names = list(res["traces"])
    kinds = ["adaptive_following_due", "adaptive", "fixed_60ms", "aiortc"]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    x = np.arange(len(names))
    for k, kind in enumerate(kinds):
        mean = [(res["traces"][n][kind] or {}).get("added_delay_ms", {}).get("mean") for n in names]
        late = [(res["traces"][n][kind] or {}).get("late_loss_pct") for n in names]
        ax1.bar(x + (k - 1.5) * 0.2, [m or 0 for m in mean], 0.2, label=kind)
        ax2.bar(x + (k - 1.5) * 0.2, [v or 0 for v in late], 0.2, label=kind)
    oracle = [res["traces"][n]["oracle_fixed_delay_added_ms"] for n in names]
    ax1.scatter(x, oracle, marker="_", s=400, color="k", label="hindsight-optimal fixed delay")
    ax1.set_ylabel("mean added delay (ms)")
    ax1.set_ylim(0, 150)
    ax2.set_ylabel("late loss (%)")
    ax2.axhline(1.0, color="r", lw=0.8, ls="--")
    ax2.set_xticks(x, names, rotation=20, ha="right")
    ax1.legend(fontsize=8)
    ax1.set_title("jitter buffers on the standard traces")
    fig.tight_layout()
    p1 = out / "jitter_buffers.png"
    fig.savefig(p1, dpi=90)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(11, 3.5))
    for n in ("wan_gauss_j30_ge2", "wan_uniform_j30_ge2", "lan"):
        tl = timelines.get(n, np.zeros((0, 2)))
        if len(tl):
            ax.plot(tl[:, 0] - tl[0, 0], tl[:, 1], lw=0.8, label=n)
    ax.set_xlabel("s")
    ax.set_ylabel("target delay (ms)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p2 = out / "jitter_target_delay.png"
    fig.savefig(p2, dpi=90)
    plt.close(fig)
    return [str(p1), str(p2)]

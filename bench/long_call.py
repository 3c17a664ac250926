"""One long call: does turn latency or memory grow, do the call's queues stay bounded?

Runs the bridge in this process with the voice agent and the demo profile (real models),
as bench/turn_latency.py does, and has its packet-level caller (`testkit/wire_caller.py`)
keep ONE call up for ``--minutes``: ask an espeak-ng question, wait for the reply, stay
silent a few seconds (idle time for the agent's queues), again. The profile's call limits
(20 turns, 5 min) and its escalation to a person are lifted for this call only.

Every ~10 s it samples the process RSS, asyncio tasks, threads, open files, and the depth of
every queue it can reach on the call (jitter buffer, playout buffer, agent audio not yet
sent, VAD backlog, ASR open segment, model jobs waiting) with the call's late/lost counters;
per turn, the turn latency as turn_latency.py defines it (caller's last speech packet sent
-> first reply speech packet received, on the wire).

    .venv/bin/python bench/long_call.py [--minutes 30] [--pause-s 3] [--out bench/out]

Prints the summary as JSON; writes OUT/long_call.json (samples, turns, summary) and
OUT/long_call.png (turn latency and RSS against minutes). The verdicts compare the first
5 minutes with the last 5 (a third of the call each when it is shorter than 15 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The bridge in this process runs as `sip-bridge run` runs it: OpenBLAS on one thread, set
# before numpy loads (sip_bridge/cli.py says why).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

from bench.figures import pct

if TYPE_CHECKING:
    from agent.voice.voice_agent import VoiceAgent
    from sip_bridge.script.script_voice import espeak_ng
    from sip_bridge.server import BridgeServer
    from testkit.wire_caller import WireCaller

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_S = 10.0  # seconds between samples
WINDOW_MIN = 5.0  # the first and the last this many minutes are compared
LATENCY_RATIO_MAX = 1.2  # last window's p50 turn latency / first window's
# RSS growth after the first window, linear fit. A leak of 60 bytes per 20 ms frame would
# be 10.8 MB/h; allocator noise on a flat process is a few MB over a call.
RSS_SLOPE_MAX_MB_H = 10.0
# A queue without a configured limit is "bounded" when its deepest point in the last window
# is at most this factor (plus one unit of slack) over its deepest in the first.
UNLIMITED_GROWTH_FACTOR = 1.5
LOG_KEEP_S = 30.0  # the caller's own wire log is trimmed to this: it is not the bridge's

Series = Sequence[dict[str, Any]]


# -- the summary and its verdicts (pure: tests/test_long_call_bench.py) --------------------


def _slope_per_h(t_min: Sequence[float], y: Sequence[float]) -> float | None:
    """Least-squares slope of y over time, per hour; None with fewer than 2 points."""
    if len(t_min) < 2 or max(t_min) - min(t_min) <= 0:
        return None
    return round(float(np.polyfit(np.asarray(t_min), np.asarray(y), 1)[0]) * 60.0, 2)


def _at(samples: Series, t_min: float, key: str) -> float | None:
    """``key`` of the sample nearest to ``t_min``."""
    if not samples:
        return None
    return float(min(samples, key=lambda s: abs(s["t_min"] - t_min))[key])


def windows(end_min: float, window_min: float = WINDOW_MIN) -> tuple[float, float]:
    """(end of the first window, start of the last): WINDOW_MIN each, a third of a call
    shorter than three windows (the two never overlap)."""
    w = min(window_min, end_min / 3)
    return w, end_min - w


def _latency(turns: Series, first_end: float, last_start: float) -> dict[str, Any]:
    def lat(lo: float, hi: float) -> list[float]:
        return [
            float(t["latency_ms"])
            for t in turns
            if t.get("latency_ms") is not None and lo <= t["t_min"] <= hi
        ]

    first, last = lat(-1.0, first_end), lat(last_start, float("inf"))
    allv = lat(-1.0, float("inf"))
    f50, l50 = pct(first, 50), pct(last, 50)
    f95, l95 = pct(first, 95), pct(last, 95)
    return {
        "turns": len(turns),
        "answered": len(allv),
        "unanswered": len(turns) - len(allv),
        "all": {"p50": pct(allv, 50), "p95": pct(allv, 95), "max": pct(allv, 100)},
        "first_window": {"n": len(first), "p50": f50, "p95": f95},
        "last_window": {"n": len(last), "p50": l50, "p95": l95},
        "ratio_p50": round(l50 / f50, 3) if f50 and l50 is not None else None,
        "ratio_p95": round(l95 / f95, 3) if f95 and l95 is not None else None,
    }


def _rss(samples: Series, first_end: float, end: float) -> dict[str, Any]:
    after = [s for s in samples if s["t_min"] >= first_end]
    at_w, at_end = _at(samples, first_end, "rss_mb"), _at(samples, end, "rss_mb")
    growth = None if at_w is None or at_end is None else round(at_end - at_w, 2)
    span_h = (end - first_end) / 60.0
    return {
        "at_first_window_end_mb": at_w,
        "at_end_mb": at_end,
        "growth_mb": growth,
        "growth_mb_per_h": round(growth / span_h, 2) if growth is not None and span_h else None,
        "slope_mb_per_h": _slope_per_h([s["t_min"] for s in after], [s["rss_mb"] for s in after]),
        "peak_mb": max((float(s["rss_mb"]) for s in samples), default=None),
    }


def _grew(first: float, last: float) -> bool:
    return last > UNLIMITED_GROWTH_FACTOR * first + 1.0


def _queues(
    samples: Series, limits: dict[str, float | None], first_end: float, last_start: float
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, limit in limits.items():
        vals = [(s["t_min"], s["queues"].get(name)) for s in samples]
        vals = [(t, float(v)) for t, v in vals if v is not None]
        if not vals:
            out[name] = {"max": None, "limit": limit, "bounded": None}
            continue
        top = max(v for _, v in vals)
        first = max((v for t, v in vals if t <= first_end), default=0.0)
        last = max((v for t, v in vals if t >= last_start), default=0.0)
        ok = top <= limit if limit is not None else not _grew(first, last)
        out[name] = {
            "max": round(top, 2),
            "limit": limit,
            "first_window_max": round(first, 2),
            "last_window_max": round(last, 2),
            "bounded": ok,
        }
    return out


def summarize(
    samples: Series,
    turns: Series,
    limits: dict[str, float | None],
    window_min: float = WINDOW_MIN,
) -> dict[str, Any]:
    """Figures and verdicts from the series: ``samples`` carry ``t_min``, ``rss_mb``,
    ``tasks`` and ``queues`` (name -> depth); ``turns`` carry ``t_min`` and ``latency_ms``
    (None: no reply); ``limits`` name each queue's configured cap (None: none)."""
    end = max([s["t_min"] for s in samples] + [t["t_min"] for t in turns] + [0.0])
    first_end, last_start = windows(end, window_min)
    lat = _latency(turns, first_end, last_start)
    rss = _rss(samples, first_end, end)
    queues = _queues(samples, limits, first_end, last_start)
    task_first = max((int(s["tasks"]) for s in samples if s["t_min"] <= first_end), default=0)
    task_last = max((int(s["tasks"]) for s in samples if s["t_min"] >= last_start), default=0)
    tasks = {
        "first": int(samples[0]["tasks"]) if samples else None,
        "last": int(samples[-1]["tasks"]) if samples else None,
        "first_window_max": task_first,
        "last_window_max": task_last,
    }
    slope = rss["slope_mb_per_h"]
    verdict = {
        "latency_no_growth": lat["ratio_p50"] is not None and lat["ratio_p50"] <= LATENCY_RATIO_MAX,
        "rss_no_growth": slope is not None and slope < RSS_SLOPE_MAX_MB_H,
        "queues_bounded": all(q["bounded"] is not False for q in queues.values()),
        "tasks_no_growth": not _grew(task_first, task_last),
    }
    return {
        "minutes": round(end, 2),
        "window_min": round(first_end, 2),
        "criteria": {
            "latency_ratio_p50_max": LATENCY_RATIO_MAX,
            "rss_slope_max_mb_per_h": RSS_SLOPE_MAX_MB_H,
            "unlimited_queue_growth_factor": UNLIMITED_GROWTH_FACTOR,
        },
        "turn_latency_ms": lat,
        "rss": rss,
        "tasks": tasks,
        "queues": queues,
        "verdict": verdict,
    }


# -- sampling the running call --------------------------------------------------------------


def rss_mb() -> float:
    """Resident set size of this process, from /proc (Linux), else the peak."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _open_files() -> int | None:
    with contextlib.suppress(OSError):
        return len(os.listdir("/proc/self/fd"))
    return None


def _try(read: Callable[[], float]) -> float | None:
    """A depth read through internals that may move: None rather than a failed bench."""
    try:
        return float(read())
    except (AttributeError, TypeError, ValueError, StopIteration, AssertionError):
        return None  # a moved attribute, or the call already gone


def queue_probes(server: BridgeServer, agent: VoiceAgent) -> dict[str, Callable[[], float]]:
    """How to read each queue of the call (one call: the server's only one)."""

    def media() -> Any:
        call = next(iter(server.calls.values()))
        assert call.media is not None
        return call.media

    rate = agent.sample_rate
    return {
        "jitter_delay_ms": lambda: media().jb.stats.current_delay_ms,
        "jitter_buffered_ms": lambda: max(0, media().jb._max_end - media().jb._cursor) / 8,
        "playout_ms": lambda: media().playout.queued_ms,
        "agent_audio_pending_ms": lambda: 1000 * media()._pending_samples / rate,
        "reply_queued_ms": lambda: 1000 * agent.playout.queued / rate,
        "vad_backlog_windows": lambda: agent._vad.pending,
        "asr_open_s": lambda: agent._stt.open_seconds,
        "asr_segments_waiting": lambda: len(agent._stt._done),
        "model_jobs_queued": lambda: agent.models.executor._work_queue.qsize(),
        "agent_tasks": lambda: len(agent._tasks),
    }


def queue_limits(server: BridgeServer, agent: VoiceAgent) -> dict[str, float | None]:
    """Each probed queue's configured cap, where the code or config has one (None: none,
    or no longer where this bench looks: then that queue is judged on growth alone)."""
    media: Any = next(iter(server.calls.values())).media
    stt: Any = agent._stt
    return {
        "jitter_delay_ms": float(server.config.jitter.max_delay_ms),
        "jitter_buffered_ms": _try(lambda: media.jb.capacity / 8),
        "playout_ms": _try(lambda: media.params.max_queue_ms),
        "agent_audio_pending_ms": None,
        # the agent's model of that same outbound queue (agent/voice/reply_playout.py): its depth
        # is the reply not yet spoken, so it follows reply length, capped with the queue
        "reply_queued_ms": _try(lambda: media.params.max_queue_ms),
        "vad_backlog_windows": _try(lambda: agent._vad.max_backlog + 1),
        "asr_open_s": _try(lambda: stt._max / stt.asr.sample_rate),
        "asr_segments_waiting": None,
        "model_jobs_queued": None,
        "agent_tasks": None,
    }


def _counters(server: BridgeServer) -> dict[str, int]:
    """The call's late/lost counters (cumulative)."""
    call = next(iter(server.calls.values()), None)
    if call is None or call.media is None:
        return {}
    return _media_counters(call.media.stats)


def _media_counters(st: Any) -> dict[str, int]:
    j = st.jitter
    return {
        "packets_in": st.packets_in,
        "packets_out": st.packets_out,
        "jitter_late": j.late,
        "jitter_lost": j.lost,
        "jitter_concealed": j.concealed,
        "jitter_dropped_frames": j.dropped_frames,
        "pacer_late_frames": st.pacer_late_frames,
        "pacer_skipped_frames": st.pacer_skipped_frames,
        "playout_underrun_frames": st.playout_underrun_frames,
        "held_frames": st.held_frames,
    }


def sample(
    t0: float, server: BridgeServer, agent: VoiceAgent, probes: dict[str, Callable[[], float]]
) -> dict[str, Any]:
    eot: Any = agent._eot
    return {
        "t_min": round((time.monotonic() - t0) / 60.0, 4),
        "rss_mb": round(rss_mb(), 2),
        "tasks": len(asyncio.all_tasks()),
        "threads": threading.active_count(),
        "open_files": _open_files(),
        "queues": {name: _try(read) for name, read in probes.items()},
        "records": {  # kept per turn by design (a call's history), not queues
            "agent_turns": len(agent.turns),
            "agent_events": len(agent.events),
            "turn_evaluations": len(getattr(eot, "evaluations", ())),
        },
        "media": _counters(server),
    }


# -- the call -------------------------------------------------------------------------------


def _trim_log(caller: WireCaller, keep_s: float) -> None:
    """Drop what the caller logged more than ``keep_s`` ago: its per-packet log lives in
    this process too and would read as the bridge's growth."""
    log, now = caller.log, time.monotonic()
    for series in (log.sent, log.received):
        cut = next((i for i, (t, _) in enumerate(series) if t >= now - keep_s), len(series))
        del series[:cut]
    log.heard.clear()


def _lift_limits(agent: VoiceAgent) -> None:
    """The demo profile hangs up after 20 turns or 5 min and escalates after 3 misses."""
    p = agent.profile
    agent.profile = replace(
        p,
        limits=replace(p.limits, max_turns=0, max_call_s=0.0),
        fallback=replace(p.fallback, escalate_after=0),
    )


async def _talk(
    caller: WireCaller,
    audio: Sequence[Any],
    until: float,
    pause_s: float,
    rows: list[dict[str, float | None]],
) -> None:
    await caller.wait_speech(0.0, 10.0)  # the greeting
    await caller.wait_quiet(1.0, 20.0)
    i = 0
    while time.monotonic() < until and not caller.ended.is_set():
        _trim_log(caller, LOG_KEEP_S)
        t_end = await caller.say_all(audio[i % len(audio)])
        t_reply = await caller.wait_speech(t_end, 8.0)
        rows.append({"speech_end": t_end, "reply_start": t_reply})
        await caller.wait_quiet(0.8, 20.0)
        await asyncio.sleep(pause_s)
        i += 1


async def run(minutes: float, pause_s: float, sample_s: float = SAMPLE_S) -> dict[str, Any]:
    from bench.turn_latency import QUESTIONS, start_bridge, turn_stages
    from sip_bridge.server import settle_heap
    from testkit.wire_caller import WireCaller

    server, config, agents, load_s = await start_bridge(1, adapt=_lift_limits)
    settle_heap()  # as `sip-bridge run` does after start
    audio = [espeak_ng(q) for q in QUESTIONS]
    caller = WireCaller(server.uri)
    rows: list[dict[str, float | None]] = []
    samples: list[dict[str, Any]] = []
    limits: dict[str, float | None] = {}
    final: dict[str, int] = {}
    try:
        await caller.connect(("127.0.0.1", server.port))
        t0 = time.monotonic()
        agent = agents[0]
        probes = queue_probes(server, agent)
        limits = queue_limits(server, agent)
        talk = asyncio.create_task(_talk(caller, audio, t0 + 60 * minutes, pause_s, rows))
        while not talk.done():
            samples.append(sample(t0, server, agent, probes))
            await asyncio.wait({talk}, timeout=sample_s)
        samples.append(sample(t0, server, agent, probes))
        talk.result()
        ended_early = caller.ended.is_set()  # before our BYE: the bridge hung up
    finally:
        await caller.hangup()
        await server.stop()
    if server.finished:
        final = _media_counters(server.finished[-1])
    turns: list[dict[str, Any]] = []
    for r in rows:
        assert r["speech_end"] is not None
        turns.append({"t_min": round((r["speech_end"] - t0) / 60.0, 4)})
        turns[-1].update(turn_stages(r, agent.turns))
    summary = summarize(samples, turns, limits)
    summary |= {
        "call_ended_early": ended_early,
        "frames": final,
        "records_at_end": samples[-1]["records"] if samples else {},
        "open_files": {"first": samples[0]["open_files"], "last": samples[-1]["open_files"]},
        "threads": {"first": samples[0]["threads"], "last": samples[-1]["threads"]},
        "model_load_and_warmup_s": round(load_s, 2),
        "pause_s": pause_s,
        "sample_s": sample_s,
        "jitter_ms": {"min": config.jitter.min_delay_ms, "max": config.jitter.max_delay_ms},
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg()[0],
    }
    return {"bench": "long_call", "summary": summary, "samples": samples, "turns": turns}


def plot(result: dict[str, Any], path: Path) -> None:
    """Turn latency and RSS against minutes, two panels."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    s = result["summary"]
    turns = [t for t in result["turns"] if t.get("latency_ms") is not None]
    fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
    ax1.plot([t["t_min"] for t in turns], [t["latency_ms"] for t in turns], ".", ms=4)
    for x in (s["window_min"], s["minutes"] - s["window_min"]):
        ax1.axvline(x, color="grey", lw=0.8, ls="--")
    lat = s["turn_latency_ms"]
    ax1.set_ylabel("turn latency (ms)")
    ax1.set_title(
        f"one {s['minutes']:.0f}-min call: latency p50 first/last window "
        f"{lat['first_window']['p50']}/{lat['last_window']['p50']} ms, "
        f"RSS slope {s['rss']['slope_mb_per_h']} MB/h"
    )
    samples = result["samples"]
    ax2.plot([x["t_min"] for x in samples], [x["rss_mb"] for x in samples], "-")
    ax2.set_ylabel("RSS (MB)")
    ax2.set_xlabel("minutes into the call")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0, help="length of the call")
    p.add_argument("--pause-s", type=float, default=3.0, help="silence after each reply")
    p.add_argument("--sample-s", type=float, default=SAMPLE_S, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = p.parse_args(argv)
    result = asyncio.run(run(args.minutes, args.pause_s, args.sample_s))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "long_call.json").write_text(json.dumps(result, indent=2))
    plot(result, args.out / "long_call.png")
    print(json.dumps(result["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

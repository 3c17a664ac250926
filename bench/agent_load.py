"""A realistic load: N callers on real SIP/RTP follow the demo's call scripts, staggered as
in a call center, against a bridge in its own process; what the callers perceive and what
the bridge spends.

The bridge is ``sip-bridge run`` with the shipped config (voice agent, demo profile, real
models) or ``--config FILE``, on free loopback ports, its Prometheus endpoint on
(``--metrics 127.0.0.1:0``) and a temporary records folder. Its CPU (``/proc/PID/stat``
user + system, threads included, and any child processes) and RSS (``VmRSS`` of it and its
children) are its own, apart from the callers'.

The callers are one asyncio process (this one): :class:`bench.load_caller.LoadCall`, the
call-script runner's SIP and RTP legs. Caller i waits a random offset (``--seed``), then
places calls one after another, each a random demo script (the ones that need no transfer
target), with a random short gap between them, until ``--minutes`` are over; calls in
progress then finish. The load generator must not take the cores the bridge is measured
on, so it is cheap on purpose: every utterance is rendered (espeak-ng) once before the
clock starts, and nothing the callers hear is transcribed: turn latency, dead air and
barge-in reaction are measured on packet energy and arrival times, as
bench/turn_latency.py and the script runner do, so a reply's words are not checked (its
presence and timing are). Its own CPU is reported beside the bridge's.

Per N (JSON, one entry per N, to stdout and bench/out/agent_load.json):

- turns: latency p50/p95/p99 (the caller's last packet with speech -> the first reply
  packet with speech), keypad turns apart; dead air p99 and max (the caller finished and
  hears nothing while waiting for the agent); barge-in reaction p50/p95 (the caller talks
  over the agent -> its audio stops) and how often it kept talking;
- media: the bridge's late or missing frames (its pacer's counters on /metrics) and what
  the callers received (holes in the packet stream);
- CPU of the bridge in the steady state (all callers started; the model load is before)
  in % of one core, per call in progress and in total; RSS per call ((RSS under load -
  idle RSS) / N, idle after one warm-up call: the models' buffers grow on their first
  real inputs) and in total;
- calls placed, completed, failed, refused (503: a node shedding load; not failures, and
  the turn figures cover admitted calls only); the callers' talk / listen / pause shares;
- ``settled``: turns, dead air and failures again for the calls answered a minute or more
  after the first (a node shedding load takes a crowd's rush in its first minute).

    .venv/bin/python bench/agent_load.py --calls 4 --minutes 1
    .venv/bin/python bench/agent_load.py --sweep 1,4,8,16,24,32 --minutes 5   # + a .png
    .venv/bin/python bench/agent_load.py --calls 8 --config /etc/sip-bridge/bridge.toml

bench/turn_latency.py --calls N (every caller's turn at the same moment) stays the worst
case; this is the typical one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.figures import pct
from bench.load_caller import CallResult, LoadCall, Voices
from sip_bridge.config.loader import load_config
from sip_bridge.ops.control import ControlError, query
from sip_bridge.ops.records import CallRecords
from sip_bridge.script.script_file import Script, load_script
from sip_bridge.script.script_leg import LineOptions
from testkit.demo_bridge import DEMO_SCRIPTS, ROOT, TRANSFER_TARGETS, shipped_bridge

OUT = ROOT / "bench" / "out"
SHIPPED = ROOT / "config" / "bridge.toml"
TICK = os.sysconf("SC_CLK_TCK")
SETTLED_S = 60.0  # the callers' figures again for the calls answered this long after the first
IDLE_S = 3.0  # the bridge's idle CPU and RSS, after its start, before the first call
#: The demo scripts a caller picks from: those that need no transfer target.
DEFAULT_SCRIPTS = sorted(
    p.stem for p in DEMO_SCRIPTS.glob("*.toml") if p.stem not in TRANSFER_TARGETS
)


# ---------------------------------------------------------------- the bridge's process
def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (model worker processes, if any)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                kids = Path(f"/proc/{p}/task/{task}/children").read_text().split()
                todo += [int(k) for k in kids]
        except OSError:
            continue
    return out


def tree_cpu_s(pid: int) -> float:
    """CPU-seconds (user + system, every thread) of the process and its children, the
    children it reaped included."""
    total = 0.0
    for p in _tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11 : 15 if p == pid else 13]) / TICK
    return total


def tree_rss_mb(pid: int) -> float:
    total = 0.0
    for p in _tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            continue
    return total


def scrape(url: str) -> dict[str, float]:
    """The bridge's Prometheus counters of interest (sums over labels)."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    want = (
        "sipbridge_late_frames_total",
        "sipbridge_frames_sent_total",
        "sipbridge_calls_offered_total",
        "sipbridge_active_calls",
        "sipbridge_phrase_cache_hits_total",
        "sipbridge_phrase_cache_misses_total",
        "sipbridge_phrase_cache_bytes",
        "sipbridge_phrase_cache_queued",
    )
    out = dict.fromkeys(want, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


# ---------------------------------------------------------------- figures
def _ms(xs: list[float]) -> dict[str, Any]:
    ms = [1000 * x for x in xs]
    return {
        "p50": pct(ms, 50),
        "p95": pct(ms, 95),
        "p99": pct(ms, 99),
        "max": pct(ms, 100),
        "n": len(ms),
    }


#: a voice turn's stages in the bridge's own records (TurnTiming.stages_ms), in order
STAGES = ("end_of_turn", "asr_tail", "dialogue", "tts_first_audio")


def bridge_turn_stages(data: Path, max_silence_ms: float) -> dict[str, Any]:
    """Where the bridge spent its voice turns, from its call records: each stage's p50/p95
    (the caller's last speech tick -> end of turn decided -> words -> reply -> its first
    audio) and the share of turns whose end was the ``max_silence_ms`` timeout (smart-turn
    unsure), which no CPU makes shorter. Why: the callers' figure alone cannot tell waiting
    out a pause from queueing for a model."""
    store = CallRecords(data / "calls.sqlite", readonly=True)
    try:
        stages: dict[str, list[float]] = {name: [] for name in STAGES}
        waited_texts: dict[str, int] = {}
        for row in store.list(limit=100_000):
            call = store.show(str(row["call_id"]))
            for turn in call["turns"] if call else []:
                t = turn["timings"] or {}
                if t.get("input") == "keypad" or "end_of_turn" not in t:
                    continue
                for name in STAGES:
                    if name in t:
                        stages[name].append(float(t[name]))
                if float(t["end_of_turn"]) >= max_silence_ms - 25:
                    text = str(turn.get("caller_text") or "")
                    waited_texts[text] = waited_texts.get(text, 0) + 1
    finally:
        store.close()
    eot = stages["end_of_turn"]
    waited = sum(1 for x in eot if x >= max_silence_ms - 25)  # a tick's slack
    return {
        **{
            name: {"p50": pct(xs, 50), "p95": pct(xs, 95), "n": len(xs)}
            for name, xs in stages.items()
        },
        "max_silence_ms": max_silence_ms,
        "waited_out_pct": round(100 * waited / len(eot), 1) if eot else None,
        # what the callers had said in the turns that waited (the bridge's transcript):
        # which utterances smart-turn and the dialogue left unsure
        "waited_out_heard": dict(sorted(waited_texts.items(), key=lambda kv: (-kv[1], kv[0]))[:12]),
    }


def settled(results: list[CallResult], after_s: float = SETTLED_S) -> dict[str, Any]:
    """The calls answered ``after_s`` or more after the first: a node shedding load has
    found its size by then (its first minute takes a crowd's rush)."""
    admitted = [r for r in results if r.outcome != "refused"]
    if not admitted:
        return {"after_s": after_s, "calls": 0}
    first = min(r.figures.answered_at for r in admitted)
    late = [r for r in admitted if r.figures.answered_at >= first + after_s]
    dead = [x for r in late for x in r.figures.dead_air_s]
    return {
        "after_s": after_s,
        "calls": len(late),
        "failed": sum(r.outcome == "failed" for r in late),
        "turn_latency_ms": _ms([x for r in late for x in r.figures.turns_s]),
        "dead_air_p99_s": pct(dead, 99, 3),
    }


def summarise(results: list[CallResult]) -> dict[str, Any]:
    """The callers' figures over every admitted call."""
    admitted = [r for r in results if r.outcome != "refused"]
    figs = [r.figures for r in admitted]
    turns = [x for f in figs for x in f.turns_s]
    keys = [x for f in figs for x in f.keypad_turns_s]
    dead = [x for f in figs for x in f.dead_air_s]
    barge = [x for f in figs for x in f.barge_ins_s]
    stopped = [x for x in barge if x is not None]
    call_s = sum(f.call_s for f in figs)
    talk, listen, both = (
        sum(getattr(f, k) for f in figs) for k in ("talk_s", "listen_s", "overlap_s")
    )
    rx, expected = sum(f.rx_frames for f in figs), sum(f.rx_expected for f in figs)
    holes = [x for f in figs for x in f.rx_gaps_s]
    by_text: dict[str, list[float]] = {}
    for f in figs:
        for text, x in zip(f.turn_texts, f.turns_s, strict=True):
            by_text.setdefault(text, []).append(1000 * x)
    failures: dict[str, int] = {}
    for r in results:
        if r.outcome == "failed":
            why = f"{r.script}: " + re.sub(r"(?<!step )\b\d+(\.\d+)?", "N", r.reason)
            failures[why] = failures.get(why, 0) + 1
    return {
        "placed": len(results),
        "completed": sum(r.outcome == "completed" for r in results),
        "failed": sum(r.outcome == "failed" for r in results),
        "refused": sum(r.outcome == "refused" for r in results),
        "failures": failures,
        "scripts": {
            s: sum(r.script == s for r in results) for s in sorted({r.script for r in results})
        },
        "turn_latency_ms": _ms(turns),
        "turn_latency_ms_by_utterance": {
            text: {"p50": pct(xs, 50), "n": len(xs)} for text, xs in sorted(by_text.items())
        },
        "keypad_turn_latency_ms": _ms(keys),
        "settled": settled(results),
        "dead_air_s": {
            "p99": pct(dead, 99, 3),
            "max": round(max(dead), 3) if dead else None,
            "n": len(dead),
        },
        "barge_in_reaction_ms": {
            "p50": pct([1000 * x for x in stopped], 50),
            "p95": pct([1000 * x for x in stopped], 95),
            "n": len(barge),
            "kept_talking": len(barge) - len(stopped),
            "agent_already_quiet": sum(f.barge_in_not_talking for f in figs),
        },
        "callers_received": {
            "frames": rx,
            "missing_pct": round(100 * max(0, expected - rx) / expected, 3) if expected else None,
            "holes_over_60ms": len(holes),
            "longest_hole_ms": round(1000 * max(holes), 1) if holes else None,
        },
        "shares": {
            "talk": round(talk / call_s, 3) if call_s else None,
            "listen": round(listen / call_s, 3) if call_s else None,
            "both": round(both / call_s, 3) if call_s else None,
            "pause": round(max(0.0, call_s - talk - listen + both) / call_s, 3) if call_s else None,
            "call_s_mean": round(call_s / len(figs), 1) if figs else None,
        },
    }


# ---------------------------------------------------------------- one run
@dataclass(frozen=True)
class LoadOptions:
    minutes: float
    config: Path = SHIPPED
    seed: int = 1
    ramp_s: float | None = None  # callers start within this; None: a quarter of the run, <= 20 s
    gap_s: tuple[float, float] = (1.0, 4.0)  # a caller's pause between two calls
    level_dbfs: float = -20.0
    warmup: bool = True  # one call before the idle figures: the models' buffers grow on it
    max_calls: int | None = None  # the bridge's --max-calls; None: twice the callers


async def run_load(
    calls: int, scripts: list[Script], voices: Voices, opts: LoadOptions
) -> dict[str, Any]:
    """One N: a fresh bridge, ``calls`` callers for ``opts.minutes``, the figures."""
    loop = asyncio.get_running_loop()
    duration = 60.0 * opts.minutes
    ramp = opts.ramp_s if opts.ramp_s is not None else min(20.0, duration / 4)
    with tempfile.TemporaryDirectory(prefix="agent-load-") as tmp:
        cap = opts.max_calls if opts.max_calls is not None else max(2 * calls, 10)
        args = ["--max-calls", str(cap), "--metrics", "127.0.0.1:0"]
        t_start = time.monotonic()
        with shipped_bridge(Path(tmp) / "data", config=opts.config, args=args) as bridge:
            start_s = time.monotonic() - t_start
            pid = bridge.proc.pid
            url = next(
                (m.group(1) for line in bridge.banner if (m := re.search(r"metrics: (\S+)", line))),
                None,
            )
            if url is None:
                raise RuntimeError(f"the bridge announced no metrics endpoint: {bridge.banner}")
            t_warm = time.monotonic()  # the profile's fixed phrases, rendered after the start
            while scrape(url)["sipbridge_phrase_cache_queued"] and time.monotonic() - t_warm < 300:
                await asyncio.sleep(0.2)
            phrases_s = time.monotonic() - t_warm
            start_rss = tree_rss_mb(pid)
            warmup = None
            if opts.warmup:  # ONNX Runtime sizes its buffers on the first real inputs
                line = LineOptions(level_dbfs=opts.level_dbfs)
                dest = ("127.0.0.1", bridge.port)
                warm = LoadCall(scripts[0], voices, bridge.uri, dest, user="warmup", line=line)
                warmup = await warm.run()
            before = scrape(url)  # the warm-up call's frames are not the run's
            cpu0, w0 = tree_cpu_s(pid), time.monotonic()
            await asyncio.sleep(IDLE_S)
            idle_cpu = 100 * (tree_cpu_s(pid) - cpu0) / (time.monotonic() - w0)
            idle_rss = tree_rss_mb(pid)

            results: list[CallResult] = []
            running: set[LoadCall] = set()
            t0 = loop.time()
            end_at = t0 + duration
            samples: list[tuple[float, float, float, int, float]] = []  # t, cpu, rss, active, ours

            async def caller(i: int) -> None:
                rng = random.Random(f"{opts.seed}-{calls}-{i}")
                await asyncio.sleep(rng.uniform(0, ramp))
                n = 0
                while loop.time() < end_at:
                    n += 1
                    script = rng.choice(scripts)
                    call = LoadCall(
                        script,
                        voices,
                        bridge.uri,
                        ("127.0.0.1", bridge.port),
                        user=f"load-{i}-{n}",
                        line=LineOptions(level_dbfs=opts.level_dbfs, seed=rng.randrange(1 << 30)),
                    )
                    running.add(call)
                    try:
                        results.append(await call.run())
                    finally:
                        running.discard(call)
                    await asyncio.sleep(rng.uniform(*opts.gap_s))

            async def sample() -> None:
                while True:
                    active = sum(c.in_progress for c in running)
                    samples.append(
                        (
                            loop.time(),
                            tree_cpu_s(pid),
                            tree_rss_mb(pid),
                            active,
                            time.process_time(),
                        )
                    )
                    await asyncio.sleep(1.0)

            sampler = loop.create_task(sample())
            try:
                await asyncio.gather(*(caller(i) for i in range(calls)))
            finally:
                sampler.cancel()
            wall = loop.time() - t0
            counters = scrape(url)
            sock = load_config(opts.config).control.socket_path(bridge.port)
            try:
                status: dict[str, Any] = query(sock)
            except ControlError as exc:
                status = {"error": str(exc)}
        silence_ms = load_config(opts.config).agent.voice.max_silence_ms
        stages = bridge_turn_stages(Path(tmp) / "data", silence_ms)
    steady = [s for s in samples if t0 + ramp <= s[0] <= end_at]
    if len(steady) < 3:  # a run too short for a steady state: all of it
        steady = samples
    cpu = per_call = ours = None
    if len(steady) >= 2:
        span = steady[-1][0] - steady[0][0]
        cpu = 100 * (steady[-1][1] - steady[0][1]) / span
        ours = 100 * (steady[-1][4] - steady[0][4]) / span
        mean_active = float(np.mean([s[3] for s in steady]))
        per_call = cpu / mean_active if mean_active else None
    rss = max((s[2] for s in steady), default=idle_rss)
    late, sent = (
        counters[k] - before[k]
        for k in ("sipbridge_late_frames_total", "sipbridge_frames_sent_total")
    )
    hits, misses = (
        counters[k] - before[k]
        for k in ("sipbridge_phrase_cache_hits_total", "sipbridge_phrase_cache_misses_total")
    )
    out = {
        "calls": calls,
        "minutes": opts.minutes,
        **summarise(results),
        "bridge_turn_stages_ms": stages,
        "bridge_media": {
            "frames_sent": int(sent),
            "late_or_missing_frames": int(late),
            "late_or_missing_pct": round(100 * late / sent, 3) if sent else None,
        },
        "cpu_pct": {
            "bridge_total": None if cpu is None else round(cpu, 1),
            "bridge_per_call": None if per_call is None else round(per_call, 2),
            "bridge_idle": round(idle_cpu, 1),
            "mean_calls_in_progress": round(float(np.mean([s[3] for s in steady])), 2)
            if steady
            else None,
            "steady_window_s": round(steady[-1][0] - steady[0][0], 1) if steady else 0.0,
            "load_generator": None if ours is None else round(ours, 1),
        },
        "rss_mb": {
            "bridge_after_start": round(start_rss, 1),
            "bridge_idle": round(idle_rss, 1),
            "bridge_under_load": round(rss, 1),
            "bridge_per_call": round((rss - idle_rss) / calls, 2),
        },
        "bridge_status": {
            k: status.get(k)
            for k in ("counters", "admission", "models", "media_path", "error")
            if k in status
        },
        "phrase_cache": {
            "hits": int(hits),
            "misses": int(misses),
            "mb": round(counters["sipbridge_phrase_cache_bytes"] / 2**20, 2),
            "rendered_ahead_in_s": round(phrases_s, 1),
        },
        "warmup_call": None if warmup is None else warmup.outcome,
        "bridge_start_s": round(start_s, 1),
        "wall_s": round(wall, 1),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    return out


# ---------------------------------------------------------------- the plot
def plot(runs: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    n = [r["calls"] for r in runs]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for q, style in (("p50", "o-"), ("p95", "s-"), ("p99", "^-")):
        ax.plot(n, [r["turn_latency_ms"][q] or np.nan for r in runs], style, label=f"turn {q}")
    ax.set_xlabel("callers")
    ax.set_ylabel("turn latency (ms)")
    ax.set_ylim(bottom=0)
    right = ax.twinx()
    right.plot(n, [r["cpu_pct"]["bridge_total"] or np.nan for r in runs], "k--", label="bridge CPU")
    right.set_ylabel("bridge CPU (% of one core)")
    right.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8)
    ax.set_title(f"agent_load: staggered demo calls, {runs[0]['minutes']:g} min per point")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- command line
def pick_scripts(names: str | None) -> list[Script]:
    """Demo script names or paths (comma-separated); default: the demo's without transfers."""
    chosen = names.split(",") if names else DEFAULT_SCRIPTS
    out = []
    for name in chosen:
        path = Path(name) if name.endswith(".toml") else DEMO_SCRIPTS / f"{name}.toml"
        out.append(load_script(path))
    return out


async def run_all(counts: list[int], scripts: list[Script], opts: LoadOptions) -> dict[str, Any]:
    t = time.monotonic()
    voices = await asyncio.to_thread(Voices, scripts, opts.level_dbfs)
    render_s = time.monotonic() - t
    runs = []
    for n in counts:
        runs.append(await run_load(n, scripts, voices, opts))
        print(
            json.dumps(
                {
                    k: runs[-1][k]
                    for k in (
                        "calls",
                        "placed",
                        "completed",
                        "failed",
                        "refused",
                        "turn_latency_ms",
                        "cpu_pct",
                    )
                }
            ),
            file=sys.stderr,
            flush=True,
        )
    return {
        "bench": "agent_load",
        "config": str(opts.config),
        "scripts": [s.path.stem for s in scripts],
        "seed": opts.seed,
        "utterances_prerendered": len(voices),
        "prerender_s": round(render_s, 1),
        "cpus": os.cpu_count(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "runs": runs,
    }


def with_phrase_cache(toml: str, mb: int) -> str:
    """``toml`` (a bridge.toml) with ``[models] phrase_cache_mb = mb``."""
    line = f"phrase_cache_mb = {mb}"
    if re.search(r"^phrase_cache_mb\s*=.*$", toml, re.M):
        return re.sub(r"^phrase_cache_mb\s*=.*$", line, toml, count=1, flags=re.M)
    if re.search(r"^\[models\]\s*$", toml, re.M):
        return re.sub(r"^\[models\]\s*$", f"[models]\n{line}", toml, count=1, flags=re.M)
    return f"{toml}\n[models]\n{line}\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=4, help="concurrent callers")
    p.add_argument("--sweep", help="several caller counts, each with a fresh bridge: 1,4,8")
    p.add_argument("--minutes", type=float, default=1.0, help="how long callers place calls")
    p.add_argument("--config", type=Path, default=SHIPPED, help="the bridge.toml to bench")
    p.add_argument(
        "--scripts",
        help="demo script names or .toml paths, comma-separated "
        f"(default: {','.join(DEFAULT_SCRIPTS)})",
    )
    p.add_argument("--seed", type=int, default=1, help="offsets, scripts and gaps")
    p.add_argument(
        "--ramp-s",
        type=float,
        help="callers start within this many seconds (default: a quarter of the run, at most 20)",
    )
    p.add_argument("--level", type=float, default=-20.0, help="callers' speech level, dBFS")
    p.add_argument("--out", type=Path, default=OUT / "agent_load.json")
    p.add_argument(
        "--max-calls",
        type=int,
        help="the bridge's calls in progress at most, one more gets 503 (default: twice "
        "--calls): what a node sized from this bench is set to, for a run past it",
    )
    p.add_argument(
        "--phrase-cache-mb",
        type=int,
        help="run the config with this [models] phrase_cache_mb (0: off; a copy beside it)",
    )
    args = p.parse_args(argv)
    counts = [int(x) for x in args.sweep.split(",")] if args.sweep else [args.calls]
    if min(counts) < 1 or args.minutes <= 0:
        p.error("callers >= 1 and --minutes > 0")
    if not args.config.is_file():
        p.error(f"--config {args.config}: no such file")
    config = args.config.resolve()
    if args.phrase_cache_mb is not None:  # beside the original: its relative paths still hold
        copy = config.with_name(f".agent_load-{os.getpid()}.toml")
        copy.write_text(with_phrase_cache(config.read_text(), args.phrase_cache_mb))
        config = copy
    opts = LoadOptions(
        args.minutes,
        config,
        args.seed,
        args.ramp_s,
        level_dbfs=args.level,
        max_calls=args.max_calls,
    )
    try:
        result = asyncio.run(run_all(counts, pick_scripts(args.scripts), opts))
    finally:
        if config != args.config.resolve():
            config.unlink()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    if args.sweep:
        plot(result["runs"], args.out.with_suffix(".png"))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Turn latency on the wire: caller stops speaking -> first packet of the spoken reply.

Runs the bridge in this process with the voice agent and the demo profile (real models),
and has a packet-level caller (`testkit/wire_caller.py`) ask espeak-ng questions turn after
turn. Per turn: the send time of the caller's last RTP packet with speech energy, and the
arrival time of the first reply packet with speech energy after it. The agent's own
timestamps (same monotonic clock) split that into stages: end of turn (network, jitter
buffer, VAD, pause, smart-turn), ASR tail, dialogue, TTS first audio, write -> wire.

    .venv/bin/python bench/turn_latency.py [--turns 20] [--calls 1] [--codec PCMU]

`--calls N` is the concurrent_calls mode: N callers take turns at once (same figures, plus
the CPU of this process). Prints JSON; writes bench/out/turn_latency.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

# The bridge in this process runs as `sip-bridge run` runs it: OpenBLAS on one thread, set
# before numpy loads (sip_bridge/cli.py says why).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
from numpy.typing import NDArray

from agent.voice.phrase_cache import shared_stats
from agent.voice.voice_agent import TurnTiming, VoiceAgent
from bench.figures import pct
from sip_bridge.agents import make_agent
from sip_bridge.config.loader import BridgeConfig, load_config
from sip_bridge.script.script_voice import espeak_ng
from sip_bridge.server import BridgeServer
from testkit.voice_agents import VoiceAgents
from testkit.wire_caller import WireCaller

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
STAGES = ("end_of_turn_ms", "asr_tail_ms", "dialogue_ms", "tts_first_audio_ms")
# Questions the demo profile (config/agents/demo.toml) answers without ending the call.
QUESTIONS = [
    "What are your opening hours?",
    "Where is my order?",
    "One two three four five.",
    "When do you close?",
]


async def _one_caller(
    uri: str, dest: tuple[str, int], codec: str, turns: int, audio: list[NDArray[np.int16]]
) -> list[dict[str, float | None]]:
    c = WireCaller(uri, codec=codec)
    await c.connect(dest)
    rows: list[dict[str, float | None]] = []
    try:
        await c.wait_speech(0.0, 10.0)  # the greeting
        await c.wait_quiet(1.0, 20.0)
        for i in range(turns):
            t_end = await c.say_all(audio[i % len(audio)])
            t_reply = await c.wait_speech(t_end, 8.0)
            rows.append({"speech_end": t_end, "reply_start": t_reply})
            await c.wait_quiet(0.8, 20.0)
            await asyncio.sleep(0.3)
    finally:
        await c.hangup()
    return rows


def _ms(x: float | None, y: float | None) -> float | None:
    return round(1000 * (x - y), 1) if x and y else None


def turn_stages(row: dict[str, float | None], turns: list[TurnTiming]) -> dict[str, float | None]:
    """The agent's turn that this wire turn caused: its turn_end lies in between."""
    t0, t1 = row["speech_end"], row["reply_start"]
    assert t0 is not None
    out: dict[str, float | None] = {"latency_ms": None if t1 is None else 1000 * (t1 - t0)}
    match = [t for t in turns if t.turn_end > t0 and (t1 is None or t.turn_end < t1)]
    if not match:
        return out
    a = match[0]
    out.update(
        end_of_turn_ms=_ms(a.turn_end, t0),
        asr_tail_ms=_ms(a.asr_done, a.turn_end),
        dialogue_ms=_ms(a.reply_ready, a.asr_done),
        tts_first_audio_ms=_ms(a.tts_first, a.reply_ready),
        write_to_wire_ms=_ms(t1, a.first_write) if t1 else None,
        reason=None,
    )
    out["reason"] = a.reason  # type: ignore[assignment]
    out["heard"] = a.text  # type: ignore[assignment]
    return out


async def start_bridge(
    calls: int,
    adapt: Callable[[VoiceAgent], None] | None = None,
    phrase_cache_mb: int | None = None,
) -> tuple[BridgeServer, BridgeConfig, list[VoiceAgent], float]:
    """The bridge in this process, voice agent and demo profile, models loaded and warm, the
    profile's fixed phrases rendered (as a node is seconds after it starts): (server,
    config, every call's agent as it is made, model load seconds). ``adapt`` sees each
    agent before its call starts (bench/long_call.py lifts the profile's limits);
    ``phrase_cache_mb``: ``[models] phrase_cache_mb`` (default: the shipped config's)."""
    config = load_config(ROOT / "config" / "bridge.toml")
    models = config.models
    if phrase_cache_mb is not None:
        models = replace(models, phrase_cache_mb=phrase_cache_mb)
    config = replace(
        config,
        sip=replace(config.sip, listen="127.0.0.1:0", max_calls=max(calls, 10)),
        http=replace(config.http, listen=""),
        rtp=replace(config.rtp, ports="31000-31999"),
        models=models,
    )
    factory = VoiceAgents(adapt)
    agents = factory.made

    t_load = time.monotonic()
    make_agent(config)  # loads and warms the models, as BridgeServer.start() would
    while (st := shared_stats()) is not None and st.queued and time.monotonic() - t_load < 300:
        await asyncio.sleep(0.1)
    load_s = time.monotonic() - t_load
    server = BridgeServer(config, agent_factory=factory)
    await server.start()
    return server, config, agents, load_s


async def run(
    turns: int, calls: int, codec: str, phrase_cache_mb: int | None = None
) -> dict[str, Any]:
    server, config, agents, load_s = await start_bridge(calls, phrase_cache_mb=phrase_cache_mb)
    cache0 = shared_stats()
    audio = [espeak_ng(q) for q in QUESTIONS]
    dest = ("127.0.0.1", server.port)
    cpu0, wall0 = time.process_time(), time.monotonic()
    try:
        per_call = await asyncio.gather(
            *(_one_caller(server.uri, dest, codec, turns, audio) for _ in range(calls))
        )
    finally:
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        await server.stop()
    rows = []
    for call_rows, agent in zip(per_call, agents, strict=False):
        rows += [turn_stages(r, agent.turns) for r in call_rows]
    lat = [r["latency_ms"] for r in rows if r["latency_ms"] is not None]
    stages = {}
    for key in STAGES:
        vals = [float(r[key]) for r in rows if r.get(key) is not None]  # type: ignore[arg-type]
        stages[key] = {"p50": pct(vals, 50), "p95": pct(vals, 95)}
    vals = [float(r["write_to_wire_ms"]) for r in rows if r.get("write_to_wire_ms") is not None]  # type: ignore[arg-type]
    stages["write_to_wire_ms"] = {"p50": pct(vals, 50), "p95": pct(vals, 95)}
    jb = [s.jitter.current_delay_ms for s in server.finished]
    cache = shared_stats()
    phrases = None
    if cache is not None and cache0 is not None:
        phrases = {"hits": cache.hits - cache0.hits, "misses": cache.misses - cache0.misses,
                   "pieces": cache.entries, "bytes": cache.bytes}  # fmt: skip
    return {
        "bench": "turn_latency",
        "calls": calls,
        "turns": len(rows),
        "answered_turns": len(lat),
        "codec": codec,
        "latency_ms": {"p50": pct(lat, 50), "p95": pct(lat, 95), "max": pct(lat, 100)},
        "stages": stages,
        "bridge_jitter_delay_ms": pct(jb, 50) if jb else None,
        "cpu_percent_of_one_core": round(100 * cpu / wall, 1),
        "model_load_and_warmup_s": round(load_s, 2),
        "phrase_cache": phrases,
        "settings": asdict(config.agent.voice) | asdict(config.models),
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg()[0],
        "rows": rows,
    }


def _plot(result: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    keys = [
        "end_of_turn_ms",
        "asr_tail_ms",
        "dialogue_ms",
        "tts_first_audio_ms",
        "write_to_wire_ms",
    ]
    rows = [r for r in result["rows"] if r.get("end_of_turn_ms") is not None]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    bottom = np.zeros(len(rows))
    for k in keys:
        v = np.array([float(r.get(k) or 0.0) for r in rows])
        ax.bar(range(len(rows)), v, bottom=bottom, label=k.removesuffix("_ms"))
        bottom += v
    ax.plot(range(len(rows)), [r["latency_ms"] or 0 for r in rows], "k.", label="on the wire")
    ax.set_xlabel("turn")
    ax.set_ylabel("ms")
    lat = result["latency_ms"]
    ax.set_title(
        f"turn latency ({result['calls']} call(s)): p50 {lat['p50']} ms, p95 {lat['p95']} ms"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=20, help="turns per call")
    p.add_argument("--calls", type=int, default=1, help="concurrent callers")
    p.add_argument("--codec", choices=("PCMU", "PCMA"), default="PCMU")
    p.add_argument(
        "--phrase-cache-mb",
        help="[models] phrase_cache_mb; a list (0,32) runs each in turn, in this process",
    )
    args = p.parse_args(argv)
    sizes = [int(v) for v in args.phrase_cache_mb.split(",")] if args.phrase_cache_mb else [None]
    OUT.mkdir(parents=True, exist_ok=True)
    name = "turn_latency" if args.calls == 1 else f"turn_latency_{args.calls}calls"
    for mb in sizes:
        result = asyncio.run(run(args.turns, args.calls, args.codec, mb))
        suffix = "" if len(sizes) == 1 else f"_cache{mb}mb"
        (OUT / f"{name}{suffix}.json").write_text(json.dumps(result, indent=2))
        _plot(result, OUT / f"{name}{suffix}.png")
        summary = {k: v for k, v in result.items() if k != "rows"}
        print(json.dumps(summary, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Barge-in: how fast callers stop the agent, and whether its own line echo ever does.

The voice agent on its real models (VAD, Piper's voice, the demo profile) runs tick by tick
over a simulated line (testkit/barge_in_sim.py): our voice comes back late, down by the echo
return loss, through a hybrid-like band-pass and G.711, over line noise. Two figures per
rule, the echo canceller's (``after``) and the loudness rule it replaced (``before``,
``agent.voice.echo_canceller = false``), side by side in one run:

- reaction: a caller (espeak-ng voices, beckett.wav, an Asterisk prompt) starts talking
  over the greeting at an exact active-speech level; ms from their first word to the
  agent's flush of its reply, p50/p95 per level and echo condition, and the calls where it
  never stopped (``missed``). The target: every call within min_speech_ms + 150 ms.
- false barge-ins: ``--minutes`` of the agent talking (the greeting, then replies) with
  only echo and noise coming back, per echo condition: flushes and turns it took for the
  caller. The target: none.

And the canceller's CPU per call per 20 ms tick, while our voice is in its tail and while
it is idle. Prints JSON; writes bench/out/barge_in.json.

    .venv/bin/python bench/barge_in.py [--minutes 10] [--rules after,before] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from agent.voice.barge_in import EchoGate
from agent.voice.voice_agent import VoiceSettings
from sip_bridge.script.script_voice import espeak_ng
from testkit.barge_in_sim import REPLIES, Line, Sim, beckett, models, onset_sample
from testkit.line_echo import at_level

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
QUESTION = "Hello, I would like to ask about my order, it has not arrived yet."
ASTERISK = Path("/usr/share/asterisk/sounds/en/vm-intro.wav")
MIN_SPEECH_MS = 250  # the demo profile's [barge_in] min_speech_ms
LEVELS = [-15, -20, -25, -30, -35, -38]
#: (name, ERL dB or None, delay ms, hybrid colouring)
REACTION_LINES = [
    ("none", None, 0, True),
    ("erl12_60ms", 12, 60, True),
    ("erl6_150ms", 6, 150, True),
]
ECHO_LINES = [
    ("none", None, 0, True),
    ("erl6_10ms", 6, 10, True),
    ("erl6_150ms", 6, 150, True),
    ("erl6_200ms", 6, 200, True),
    ("erl12_60ms", 12, 60, True),
    ("erl20_200ms", 20, 200, True),
    ("erl6_150ms_flat", 6, 150, False),
]
RULES = {"after": VoiceSettings(), "before": VoiceSettings(echo_canceller=False)}


def voices(quick: bool) -> dict[str, np.ndarray[Any, Any]]:
    import wave

    out: dict[str, np.ndarray[Any, Any]] = {}
    for v in ["en-us", "en+m3"] if quick else ["en-us", "en+m3", "en+f3", "en-gb"]:
        out[v] = espeak_ng(QUESTION, v)
    out["beckett"] = beckett()
    if ASTERISK.exists() and not quick:
        with wave.open(str(ASTERISK)) as w:
            out["asterisk"] = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    return out


async def reaction(rule: VoiceSettings, line: Line, pcm: Any, at_s: float) -> float | None:
    sim = Sim(line, settings=rule)
    await sim.start()
    tick = round(at_s * 50)
    line.say_at(tick, pcm)
    onset = tick + onset_sample(pcm) / 160
    try:
        await sim.run(tick + 150, lambda: bool(sim.out.flush_ticks))
    finally:
        await sim.stop()
    return (sim.out.flush_ticks[0] - onset) * 20 if sim.out.flush_ticks else None


async def echo_only(rule: VoiceSettings, line: Line, minutes: float) -> dict[str, Any]:
    sim = Sim(line, settings=rule)
    await sim.start()
    cpu = _CpuMeter(sim)
    try:
        await sim.run_until_quiet()
        k = 0
        while sim.tick < minutes * 60 * 50:
            await sim.say(REPLIES[k % len(REPLIES)])
            await sim.run_until_quiet()
            k += 1
    finally:
        await sim.stop()
    played_s = sum(1 for db in sim.sent_level if db > -60.0) * 0.02
    return {
        "agent_speech_played_s": round(played_s, 1),
        "ticks": sim.tick,
        "false_barge_ins": sim.agent.barge_ins,
        "false_turns": len(sim.agent.turns),
        **cpu.report(),
    }


class _CpuMeter:
    """Times the gate's per-tick work (canceller + decision) in the agent under test."""

    def __init__(self, sim: Sim) -> None:
        gate = sim.agent.gate
        self.active: list[float] = []
        self.idle: list[float] = []  # ticks with nothing of ours in the tail
        inner = gate.process
        canceller = gate.canceller if isinstance(gate, EchoGate) else None

        def timed(heard: Any, ours: Any, *, learn: bool = True) -> Any:
            busy = canceller.active or bool(ours.any()) if canceller is not None else True
            t0 = time.thread_time()  # this thread's CPU: the TTS threads do not count
            out = inner(heard, ours, learn=learn)
            (self.active if busy else self.idle).append(time.thread_time() - t0)
            return out

        gate.process = timed  # type: ignore[method-assign]

    def report(self) -> dict[str, Any]:
        def us(xs: list[float], q: float) -> float | None:
            return round(1e6 * float(np.percentile(xs, q)), 1) if xs else None

        return {
            "gate_us_per_tick_active": {"p50": us(self.active, 50), "p95": us(self.active, 95)},
        }


def idle_cost(ticks: int = 3000) -> dict[str, float]:
    """The gate with nothing of ours in the canceller's tail (the caller's turn): µs/tick."""
    gate = EchoGate(13)
    silent = np.zeros(160, np.int16)
    heard = (np.random.default_rng(0).standard_normal(160) * 300).astype(np.int16)
    t0 = time.thread_time()
    for _ in range(ticks):
        gate.process(heard, silent)
    return {"gate_us_per_tick_idle": round(1e6 * (time.thread_time() - t0) / ticks, 1)}


def _pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 1) if xs else None


async def run(minutes: float, rules: list[str], quick: bool) -> dict[str, Any]:
    models()
    speech = voices(quick)
    onsets = [2.5] if quick else [2.5, 4.0]
    levels = [-15, -30, -38] if quick else LEVELS
    out: dict[str, Any] = {"bench": "barge_in", "target_ms": MIN_SPEECH_MS + 150}
    for name in rules:
        rule = RULES[name]
        react: dict[str, Any] = {}
        for lname, erl, delay, colour in REACTION_LINES:
            per_level: dict[str, Any] = {}
            for level in levels:
                got: list[float | None] = []
                for v, pcm in speech.items():
                    scaled = at_level(pcm, level)
                    for i, at_s in enumerate(onsets):
                        line = Line(erl, delay, colour=colour, noise_dbfs=-60, seed=i)
                        got.append(await reaction(rule, line, scaled, at_s))
                    del v
                hit = [g for g in got if g is not None]
                per_level[str(level)] = {
                    "calls": len(got),
                    "p50_ms": _pct(hit, 50),
                    "p95_ms": _pct(hit, 95),
                    "max_ms": _pct(hit, 100),
                    "missed": len(got) - len(hit),
                    "over_target": sum(1 for g in hit if g > MIN_SPEECH_MS + 150),
                }
                print(name, lname, level, per_level[str(level)], flush=True)
            react[lname] = per_level
        false: dict[str, Any] = {}
        for lname, erl, delay, colour in ECHO_LINES:
            false[lname] = await echo_only(rule, Line(erl, delay, colour=colour), minutes)
            print(name, lname, false[lname], flush=True)
        out[name] = {"reaction": react, "echo_only": false}
    out.update(
        **idle_cost(),
        voices=list(speech),
        onsets_s=onsets,
        minutes_per_echo_condition=minutes,
        cpus=os.cpu_count(),
        load_avg=os.getloadavg()[0],
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0, help="agent speech per echo line")
    p.add_argument("--rules", default="after,before", help="after (canceller), before (old)")
    p.add_argument("--quick", action="store_true", help="fewer voices, levels and onsets")
    p.add_argument("--out", default="barge_in.json", help="file name under bench/out")
    args = p.parse_args(argv)
    rules = [r for r in args.rules.split(",") if r]
    result = asyncio.run(run(args.minutes, rules, args.quick))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

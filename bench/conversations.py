"""Conversations as callers have them: every demo call script in every cell of a matrix of
voices, levels, packet loss and line echo.

The bridge runs in this process with the shipped config (voice agent, demo profile, real
models); `sip-bridge script`'s runner (sip_bridge.script.script_runner) places each call. Voices:
espeak-ng variants and "human" (recorded 8 kHz prompts of Debian's
asterisk-core-sounds-en-wav and the beckett.wav of the model store, where a step's words
exist in them; espeak-ng says the rest). Per cell and overall:

- steps passed (%), skipped steps counting as not passed; the demo scripts' caller says an
  answer again, once, when the agent asks for it (``repeat_on``): ``said_again`` counts
  those times, and ``steps_passed_first_time_pct`` is what would have passed without;
- barge-in reaction p50/p95: a step with ``barge_in = true`` (the caller talks over the
  agent) -> the agent's audio stops, on what the caller receives; when it kept talking,
  the caller's whole utterance counts (a lower bound) and ``kept_talking`` says how often;
- false barge-ins: the agent cut a reply short (its own count, sampled with the time)
  where nothing the caller meant explains it: echo, a backchannel, a key it should have
  ignored (see talk_over_figures);
- dead air p99 over every silence while the caller waited, and the longest;
- turn latency p50/p95 (the caller's last packet with speech -> the first one back).

    .venv/bin/python bench/conversations.py --quick
    .venv/bin/python bench/conversations.py --voices en-us,human --levels=-35,-25 --echo 6@150
    .venv/bin/python bench/conversations.py            # the whole matrix: hours

The bridge shares this process (as in bench/turn_latency.py, whose figures are the
reference), so the agent's own count of the replies it cut is at hand; one call at a time
by default: a second call in this process starves the TTS of the first on 2 cores (its
greeting stops for seconds between sentences). Every (cell, script) run is a JSON file
under OUT/runs/ written when it ends: a stopped run resumes where it was (``--fresh``
starts over), and several bench processes can share one OUT to go faster (a claim file
marks each run in progress). The summary covers every run in OUT/runs/ of the cells asked
for: OUT/conversations.json and OUT/conversations.png (heat maps).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import re
import sys
import time
import wave
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from agent.base import AgentOutput, CallInfo
from agent.voice.voice_agent import VoiceAgent
from bench.figures import pct
from resample import Resampler
from sip_bridge.script.script_file import Script, Speak, load_script
from sip_bridge.script.script_leg import LineOptions
from sip_bridge.script.script_report import CallReport
from sip_bridge.script.script_runner import RunOptions, Transcriber, run_script
from testkit.demo_bridge import (
    DEMO_SCRIPTS,
    ROOT,
    TRANSFER_TARGETS,
    start_transfer_target,
    stop_transfer_target,
)

OUT = ROOT / "bench" / "out" / "conversations"
VOICES = ["en-us", "en-gb-x-rp+f3", "en-us+m3", "human"]
LEVELS = [-15.0, -25.0, -35.0]
LOSSES = [0.0, 3.0]
ECHOES = ["none", "12@60", "6@150"]
#: --quick: a few minutes
QUICK_VOICES = ["en-us"]
QUICK_LEVELS = [-15.0, -35.0]
QUICK_LOSSES = [0.0]
QUICK_ECHOES = ["none", "6@150"]
QUICK_SCRIPTS = ["hours_by_voice", "barge_in", "order_by_keypad"]
SOUNDS = Path("/usr/share/asterisk/sounds/en")
#: A step's words as recorded human speech: prompt names (asterisk sounds) or
#: "beckett:START-END" (seconds of the model store's beckett.wav). The words differ a little
#: where the recordings do ("Thank you. Goodbye!"); what they ask the agent is the same.
HUMAN = {
    "No thanks, goodbye.": ["vm-no", "auth-thankyou", "goodbye"],
    "No thanks.": ["vm-no", "auth-thankyou"],
    "What are your opening hours?": ["hours"],
    "I would like to speak to a person please.": ["spy-agent"],
    "My order number is one two three four five.": ["number", *(f"digits/{d}" for d in "12345")],
    "My order number is one two three four six.": ["number", *(f"digits/{d}" for d in "12346")],
    "Purple elephants dance quietly.": ["beckett:0.0-3.3"],
    "My cat likes to sleep in the sun.": ["beckett:3.3-6.6"],
    "The weather is lovely on Tuesdays.": ["hello-world"],
}


@dataclass(frozen=True)
class Cell:
    voice: str
    level: float
    loss: float
    echo: str  # "none" or "ERL@DELAY_MS"

    @property
    def name(self) -> str:
        return f"{self.voice}_{self.level:g}dBFS_loss{self.loss:g}_echo-{self.echo}"

    def line(self, seed: int) -> LineOptions:
        erl, delay = (None, 60.0) if self.echo == "none" else map(float, self.echo.split("@"))
        return LineOptions(level_dbfs=self.level, loss_pct=self.loss, echo_erl_db=erl,
                           echo_delay_ms=delay, seed=seed)  # fmt: skip


# ---------------------------------------------------------------- human speech
class HumanVoice:
    """Steps whose words exist as recordings; None for the rest (espeak-ng says them)."""

    def __init__(self) -> None:
        self.available = SOUNDS.is_dir()
        self.used = 0
        self.fallback = 0

    def _piece(self, name: str) -> NDArray[np.int16]:
        if name.startswith("beckett:"):
            from model_runtime.store import default_store

            start, end = (float(x) for x in name.split(":")[1].split("-"))
            path = Path(default_store().path("beckett", "beckett.wav"))
        else:
            start, end, path = 0.0, 1e9, SOUNDS / f"{name}.wav"
        with wave.open(str(path)) as w:
            rate = w.getframerate()
            pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16)
        pcm = pcm[int(start * rate) : int(min(end * rate, pcm.size))]
        out: NDArray[np.int16] = Resampler(rate, 8000).process(pcm) if rate != 8000 else pcm
        return out

    def __call__(self, step: Speak, voice: str) -> NDArray[np.int16] | None:
        if voice != "human":
            return None
        names = HUMAN.get(step.text) if self.available else None
        if names is None:
            self.fallback += 1
            return None
        self.used += 1
        gap = np.zeros(1200, np.int16)  # 150 ms between the recorded words
        return np.concatenate([x for n in names for x in (self._piece(n), gap)][:-1])


# ---------------------------------------------------------------- one run
def talk_over_figures(report: CallReport, cuts: list[float] | None) -> dict[str, Any]:
    """Intended barge-ins and their reactions; the agent's cuts that nothing the caller
    meant explains.

    ``cuts``: when the agent cut a reply short (its own record, on this clock). A
    cut is the caller's doing within 1.5 s of the start of something the caller said (to
    the end of it plus 0.5 s), or of keys pressed while the agent talked; a cut within 1 s
    of a transfer's outcome is the agent's own (it takes the caller back). Every other cut
    is false: echo, noise, a backchannel, a key it should have ignored. Without ``cuts``,
    only backchannels and ignored keys that stopped the agent on the wire are counted."""
    s = report.summary
    intended: list[dict[str, Any]] = []
    wrong = 0  # a backchannel or an ignored key that stopped the agent (on the wire)
    for o in s.talk_overs:
        r = o.reaction
        if o.barge_in is False:
            wrong += int(r.stopped)
        elif o.barge_in is True and not o.key:
            # the agent's own decision: its first cut after the caller began (the rest of
            # the reaction is the wire both ways and the fade)
            cut = min((c - r.onset for c in cuts or () if r.onset <= c <= r.onset + 2.0),
                      default=None)  # fmt: skip
            intended.append({"step": o.step, "stopped": r.stopped,
                             "ms": None if r.seconds is None else round(1000 * r.seconds, 1),
                             "decided_ms": None if cut is None else round(1000 * cut, 1),
                             "overlap_ms": round(1000 * r.overlap_s, 1)})  # fmt: skip
    if cuts is None:
        return {"barge_ins": intended, "false_barge_ins": wrong, "agent_cuts": None}
    over_keys = {o.step for o in s.talk_overs if o.key and o.barge_in is not False}
    windows: list[tuple[float, float]] = []
    for step, t in s.sent:
        if step.barge_in is False:
            continue
        if isinstance(step, Speak) and t.onset is not None and t.end is not None:
            windows.append((t.onset, max(t.onset + 1.5, t.end + 0.5)))
        elif not isinstance(step, Speak) and step.index in over_keys:
            windows.append((t.start, t.done + 0.3))
    false = 0
    used: set[int] = set()
    for cut in cuts:
        if s.transfer_at is not None and s.transfer_at - 0.2 <= cut <= s.transfer_at + 1.0:
            continue
        hit = next((i for i, (a, b) in enumerate(windows) if a <= cut <= b and i not in used),
                   None)  # fmt: skip
        if hit is None:
            false += 1
        else:
            used.add(hit)
    return {"barge_ins": intended, "false_barge_ins": max(false, wrong),
            "agent_cuts": len(cuts)}  # fmt: skip


def run_record(report: CallReport, cell: Cell, cuts: list[float] | None) -> dict[str, Any]:
    s = report.summary
    return {
        "cell": cell.__dict__ | {"name": cell.name},
        "script": report.script.path.stem,
        "steps": [
            {
                "index": r.step.index,
                "kind": r.step.kind,
                "status": r.status,
                "detail": r.detail[:300],
                "repeats": r.repeats,
            }
            for r in report.results
        ],
        "steps_total": len(report.script.steps),
        "steps_passed": report.steps_passed,
        "answered": report.answered,
        "error": report.error,
        "turn_latency_ms": [round(1000 * x, 1) for x in s.turn_latencies_s],
        "dead_air_s": [round(g.seconds, 3) for g in s.dead_air],
        "call_s": round(report.call_s, 1),
        "lost_packets": report.lost_packets,
        "sent_packets": report.sent_packets,
        **talk_over_figures(report, cuts),
    }


@contextlib.contextmanager
def claim(path: Path) -> Iterator[bool]:
    """A run no other live process is doing: True when this one may do it."""
    lock = path.with_suffix(".claim")
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            pid = int(lock.read_text() or "0")
            os.kill(pid, 0)
            yield False  # someone is on it
            return
        except (ValueError, ProcessLookupError, PermissionError):
            lock.unlink(missing_ok=True)  # its process is gone: take it over
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    try:
        yield True
    finally:
        lock.unlink(missing_ok=True)


class Bench:
    def __init__(self, out: Path, parallel: int) -> None:
        self.out = out
        self.runs = out / "runs"
        self.runs.mkdir(parents=True, exist_ok=True)
        self.gate = asyncio.Semaphore(parallel)
        self.human = HumanVoice()
        self.agents: dict[str, VoiceAgent] = {}
        self.transcriber = Transcriber()
        self.uri = ""
        self.n = 0

    def adapt(self, agent: VoiceAgent) -> None:
        """Remember which call each agent answers (by the caller's From user)."""
        start = agent.start

        async def remember(call: CallInfo, output: AgentOutput) -> None:
            m = re.search(r"(bench-\d+-\d+)", call.caller)
            if m:
                self.agents[m.group(1)] = agent
            await start(call, output)

        agent.start = remember  # type: ignore[method-assign]

    async def one(self, cell: Cell, script: Script, seed: int) -> None:
        path = self.runs / f"{cell.name}__{script.path.stem}.json"
        if path.exists():
            return
        async with self.gate:
            with claim(path) as mine:
                if not mine or path.exists():
                    return
                self.n += 1
                token = f"bench-{os.getpid()}-{self.n}"
                proxy, target = None, None
                name = script.path.stem
                if name in TRANSFER_TARGETS:
                    target, port = start_transfer_target(TRANSFER_TARGETS[name])
                    proxy = ("127.0.0.1", port)
                opts = RunOptions(uri=self.uri, voice=cell.voice, line=cell.line(seed),
                                  transfer_proxy=proxy, follow_refer=proxy is not None,
                                  caller_user=token)  # fmt: skip
                t0 = time.monotonic()
                try:
                    report = await run_script(script, opts, self.transcriber,
                                              renderer=self.renderer)  # fmt: skip
                finally:
                    if target is not None:
                        await asyncio.to_thread(stop_transfer_target, target, 15.0)
                agent = self.agents.pop(token, None)
                # when the agent cut a reply, as it recorded (time.monotonic, this loop's
                # clock): when the reply stopped, not when a held one was counted
                cuts = list(agent.cut_at) if agent is not None else None
                rec = run_record(report, cell, cuts)
                rec["wall_s"] = round(time.monotonic() - t0, 1)
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(rec, indent=1))
                tmp.replace(path)  # whole or not at all
                print(f"{cell.name} {name}: {rec['steps_passed']}/{rec['steps_total']} steps"
                      f" in {rec['call_s']} s", flush=True)  # fmt: skip

    def renderer(self, step: Speak, voice: str) -> NDArray[np.int16] | None:
        got = self.human(step, voice)
        if got is None and voice == "human":
            from sip_bridge.script.script_voice import espeak_ng

            return espeak_ng(step.text, "en-us", step.rate_wpm or 165)
        return got


async def run_matrix(cells: list[Cell], scripts: list[Script], out: Path, parallel: int,
                     seed: int) -> None:  # fmt: skip
    os.environ.setdefault("SIP_BRIDGE_DATA", str(out / "data"))  # records: not the user's
    from bench.turn_latency import start_bridge

    bench = Bench(out, parallel)
    server, _config, _agents, load_s = await start_bridge(max(parallel, 4), bench.adapt)
    bench.uri = server.uri
    print(f"bridge up ({load_s:.1f} s to load the models); {len(cells)} cells x "
          f"{len(scripts)} scripts", flush=True)  # fmt: skip
    try:
        jobs = [bench.one(c, s, seed + i) for i, (c, s) in
                enumerate(itertools.product(cells, scripts))]  # fmt: skip
        await asyncio.gather(*jobs)
    finally:
        bench.transcriber.close()
        await server.stop()
    if bench.human.used or bench.human.fallback:
        print(f"human voice: {bench.human.used} steps recorded speech, "
              f"{bench.human.fallback} espeak-ng", flush=True)  # fmt: skip


# ---------------------------------------------------------------- the summary
def first_time_passed(run: dict[str, Any]) -> int:
    """The steps a run would have passed had the caller never said an answer again: those
    before the first ``expect`` that needed it (without ``repeat_on`` that one fails and
    the rest are skipped)."""
    again = [s["index"] for s in run["steps"] if s.get("repeats")]
    upto = min(again, default=math.inf)
    return sum(1 for s in run["steps"] if s["status"] == "PASS" and s["index"] < upto)


def figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    total = sum(r["steps_total"] for r in runs)
    passed = sum(r["steps_passed"] for r in runs)
    first = sum(first_time_passed(r) for r in runs)
    # a 0 ms "reaction": echo had cut the agent before the caller began (runs of an older
    # runner recorded it so; the runner now says the agent was not talking)
    bis = [b for r in runs for b in r["barge_ins"] if b["ms"] is None or b["ms"] > 0]
    reaction = [b["ms"] if b["stopped"] else b["overlap_ms"] for b in bis]
    gaps = [g for r in runs for g in r["dead_air_s"]]
    lat = [x for r in runs for x in r["turn_latency_ms"]]
    return {
        "runs": len(runs),
        "steps": total,
        "steps_passed_pct": round(100 * passed / total, 1) if total else None,
        # as if the caller never said an answer again when the agent asked (repeat_on)
        "steps_passed_first_time_pct": round(100 * first / total, 1) if total else None,
        "said_again": sum(1 for r in runs for st in r["steps"] if st.get("repeats")),
        "barge_in_reaction_ms": {"n": len(reaction), "p50": pct(reaction, 50),
                                 "p95": pct(reaction, 95),
                                 "kept_talking": sum(1 for b in bis if not b["stopped"])},
        "false_barge_ins": sum(r["false_barge_ins"] for r in runs),
        "dead_air_s": {"p99": pct(gaps, 99), "max": max(gaps, default=None)},
        "turn_latency_ms": {"n": len(lat), "p50": pct(lat, 50), "p95": pct(lat, 95)},
    }  # fmt: skip


def summarise(out: Path, cells: list[Cell], scripts: list[str]) -> dict[str, Any]:
    runs = []
    for f in sorted((out / "runs").glob("*.json")):
        rec = json.loads(f.read_text())
        if rec["cell"]["name"] in {c.name for c in cells} and rec["script"] in scripts:
            runs.append(rec)
    per_cell = {c.name: figures([r for r in runs if r["cell"]["name"] == c.name])
                for c in cells}  # fmt: skip
    per_script = {s: figures([r for r in runs if r["script"] == s]) for s in scripts}
    failing: dict[str, int] = {}
    for r in runs:
        for st in r["steps"]:
            if st["status"] == "FAIL":
                key = f"{r['script']} step {st['index']} ({st['kind']})"
                failing[key] = failing.get(key, 0) + 1
    return {
        "bench": "conversations",
        "overall": figures(runs),
        "cells": per_cell,
        "scripts": per_script,
        "failing_steps": dict(sorted(failing.items(), key=lambda kv: -kv[1])),
        "matrix": {"cells": [c.__dict__ for c in cells], "scripts": scripts},
        "missing_runs": len(cells) * len(scripts) - len(runs),
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg()[0],
    }


def plot(result: dict[str, Any], cells: list[Cell], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = sorted({(c.voice, c.loss) for c in cells})
    cols = sorted({(c.level, c.echo) for c in cells}, key=lambda x: (-x[0], x[1]))
    panels: list[tuple[str, Callable[[dict[str, Any]], Any], str, tuple[float, float]]] = [
              ("steps passed %", lambda f: f["steps_passed_pct"], "RdYlGn", (0, 100)),
              ("barge-in reaction p95 ms", lambda f: f["barge_in_reaction_ms"]["p95"],
               "RdYlGn_r", (0, 1500)),
              ("false barge-ins", lambda f: f["false_barge_ins"], "RdYlGn_r", (0, 5)),
              ("dead air p99 s", lambda f: f["dead_air_s"]["p99"], "RdYlGn_r", (0, 5))]  # fmt: skip
    height = 1.1 * len(panels) * max(1, len(rows)) + 1
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(8.0, 1.1 * len(cols) + 3), height))
    for ax, (title, get, cmap, (lo, hi)) in zip(np.atleast_1d(axes), panels, strict=False):
        grid = np.full((len(rows), len(cols)), np.nan)
        for c in cells:
            f = result["cells"][c.name]
            v = get(f) if f["runs"] else None
            if v is not None:
                grid[rows.index((c.voice, c.loss)), cols.index((c.level, c.echo))] = v
        ax.imshow(grid, cmap=cmap, vmin=lo, vmax=hi, aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            if not np.isnan(v):
                ax.text(j, i, f"{v:.0f}" if v >= 10 or float(v).is_integer() else f"{v:.1f}",
                        ha="center", va="center", fontsize=8)  # fmt: skip
        ax.set_xticks(range(len(cols)), [f"{lv:g} dBFS\necho {e}" for lv, e in cols], fontsize=7)
        ax.set_yticks(range(len(rows)), [f"{v}, loss {lo_:g}%" for v, lo_ in rows], fontsize=7)
        ax.set_title(title, fontsize=9)
    o = result["overall"]
    fig.suptitle(
        f"conversations: {o['steps_passed_pct']}% of {o['steps']} steps passed,\n"
        f"barge-in p95 {o['barge_in_reaction_ms']['p95']} ms, "
        f"{o['false_barge_ins']} false barge-ins, dead air p99 {o['dead_air_s']['p99']} s",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small matrix: a few minutes")
    ap.add_argument("--voices", help=f"comma-separated (default {','.join(VOICES)})")
    ap.add_argument("--levels", help="dBFS, comma-separated (default -15,-25,-35)")
    ap.add_argument("--loss", help="percent, comma-separated (default 0,3)")
    ap.add_argument("--echo", help="none or ERL@DELAY_MS, comma-separated "
                    "(default none,12@60,6@150)")  # fmt: skip
    ap.add_argument("--scripts", help="demo script names (default: all)")
    ap.add_argument("--parallel", type=int, default=1,
                    help="calls at once (default 1: the bridge shares this process; for a "
                    "big matrix run several processes on one --out instead)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=1, help="loss and jitter seed")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--fresh", action="store_true", help="forget earlier runs in OUT")
    ap.add_argument("--summary-only", action="store_true",
                    help="no calls: summarise OUT (no matrix options: all its runs)")  # fmt: skip
    args = ap.parse_args()
    quick = args.quick
    voices = args.voices.split(",") if args.voices else QUICK_VOICES if quick else VOICES
    levels = _floats(args.levels) if args.levels else QUICK_LEVELS if quick else LEVELS
    losses = _floats(args.loss) if args.loss else QUICK_LOSSES if quick else LOSSES
    echoes = args.echo.split(",") if args.echo else QUICK_ECHOES if quick else ECHOES
    names = sorted(p.stem for p in DEMO_SCRIPTS.glob("*.toml"))
    chosen = args.scripts.split(",") if args.scripts else QUICK_SCRIPTS if quick else names
    unknown = set(chosen) - set(names)
    if unknown:
        ap.error(f"no such demo scripts: {', '.join(sorted(unknown))}")
    for e in echoes:
        if e != "none" and not re.fullmatch(r"\d+(\.\d+)?@\d+(\.\d+)?", e):
            ap.error(f"--echo {e!r}: none or ERL@DELAY_MS, e.g. 12@60")
    if "human" in voices and not SOUNDS.is_dir():
        print("note: no asterisk-core-sounds-en-wav: the human voice has beckett.wav only",
              file=sys.stderr)  # fmt: skip
    cells = [Cell(*c) for c in itertools.product(voices, levels, losses, echoes)]
    out: Path = args.out
    dims = (args.voices, args.levels, args.loss, args.echo, args.quick)
    if args.summary_only and not any(dims):  # every cell that has runs in OUT
        found = [json.loads(f.read_text())["cell"] for f in (out / "runs").glob("*.json")]
        keys = {(c["voice"], c["level"], c["loss"], c["echo"]) for c in found}
        cells = [Cell(*k) for k in sorted(keys, key=lambda k: (k[0], -k[1], k[2], k[3]))]
    if args.fresh:
        for f in (out / "runs").glob("*.json"):
            f.unlink()
    if not args.summary_only:
        scripts = [load_script(DEMO_SCRIPTS / f"{n}.toml") for n in chosen]
        asyncio.run(run_matrix(cells, scripts, out, args.parallel, args.seed))
    result = summarise(out, cells, chosen)
    out.mkdir(parents=True, exist_ok=True)
    (out / "conversations.json").write_text(json.dumps(result, indent=1))
    plot(result, cells, out / "conversations.png")
    print(json.dumps({"overall": result["overall"], "missing_runs": result["missing_runs"],
                      "failing_steps": result["failing_steps"]}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

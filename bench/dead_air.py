"""Dead air in the demo's flows, heard by a caller: the silences the caller sits through
while the agent owes them something (an answer, the transfer, the way back).

Runs the bridge in this process (voice agent, the shipped demo profile, real models) and
calls it with the packet-level caller of the tests (`testkit/wire_caller.py`), which speaks
espeak-ng, presses RFC 4733 keys and follows a REFER as a transferee (to a sipp UAS that
only rings: the transfer nobody answers). Everything is measured at the caller's socket.

A step is one caller input (speech or keys) and what follows it. Dead air in a step: the
silence from the end of the input to the first audio, then every silent stretch of
PAUSE_S or more up to the last audio of the step's answer (shorter ones are pauses
inside speech); the silence after that is the caller's floor (the agent asked or
answered, the caller speaks next) and is not counted. A frame is audio when its level is
over -45 dBFS (the wire caller's speech threshold); after a ringback burst (a run of 200 ms
or more of 440+480 Hz) the cadence's off time, up to 4 s, is part of the ringback signal,
not dead air.

    .venv/bin/python bench/dead_air.py [--runs 1] [--out bench/out/dead_air.json]

Prints JSON: per flow and step, the longest gap and the total, the keypad turn latency
(the key's release, its first RFC 4733 End packet -> first reply packet), and what was
heard (ASR); per flow, the bridge's own figures from the call record (its dead-air meter,
its keypad turns' `total`), where the bridge records them.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import tempfile
import time
import wave
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

# The bridge in this process runs as `sip-bridge run` runs it: OpenBLAS on one thread, set
# before numpy loads (sip_bridge/cli.py says why).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
from numpy.typing import NDArray

from bench.figures import pct
from resample import Resampler
from sip_bridge.agents import make_agent, prepare_agents
from sip_bridge.config.loader import DEMO_PROFILE, load_config
from sip_bridge.ops.records import CallRecords
from sip_bridge.script.script_voice import espeak_ng
from sip_bridge.server import BridgeServer
from testkit.line_tones import ringback_frames
from testkit.sipp_runner import free_port, start_sipp
from testkit.wire_caller import SPEECH_DBFS, WireCaller

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
FRAME_S = 0.02
PAUSE_S = 0.3  # a shorter silence after the answer began is a pause in speech
RINGBACK_OFF_S = 4.0  # ringback: 2 s on, 4 s off


@dataclass(frozen=True)
class Step:
    say: str = ""  # espeak-ng text, or
    press: str = ""  # keys
    quiet_s: float = 2.5  # the step ends after this much quiet following the agent's audio
    cap_s: float = 20.0  # ... or this long after the input


FLOWS: dict[str, list[Step]] = {
    "hours_by_voice": [Step(say="What are your opening hours?")],
    "order_by_voice": [Step(say="Where is my order?"), Step(say="One two three four five.")],
    "order_by_keypad": [Step(press="2"), Step(press="54321#")],
    # the demo's "0": "putting you through" and a REFER; the target only rings
    "transfer_nobody_answers": [Step(press="0", quiet_s=45.0, cap_s=45.0)],
}


def gaps(frames: list[tuple[float, float, bool]], since: float) -> tuple[list[float], float]:
    """Silent stretches between ``since`` and the last audio frame, ringback cadence
    excluded: (gap lengths in s, time of the first audio frame or 0)."""
    out: list[float] = []
    frames = [f for f in frames if f[0] > since]
    audible = [i for i, (_, db, _) in enumerate(frames) if db > SPEECH_DBFS]
    if not audible:
        return out, 0.0
    first = frames[audible[0]][0]
    out.append(first - FRAME_S - since)  # the input's end to the first audio's arrival
    for a, b in itertools.pairwise(audible):
        gap = frames[b][0] - FRAME_S - frames[a][0]
        if frames[a][2]:  # after a ringback burst: its cadence's off time is ringback
            gap -= RINGBACK_OFF_S
        if gap >= PAUSE_S:  # (shorter: a pause in speech)
            out.append(gap)
    return [round(g, 3) for g in out if g > 0], first


def _save(folder: Path | None, name: str, pcm: NDArray[np.int16]) -> None:
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    with wave.open(str(folder / f"{name}.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(pcm.astype("<i2").tobytes())


async def run_flow(
    server: BridgeServer, name: str, steps: list[Step], models: Any, save: Path | None = None
) -> dict[str, Any]:
    caller = WireCaller(server.uri, dtmf=True, transferee=True)
    await caller.connect(("127.0.0.1", server.port))
    rb: list[bool] = []
    rows: list[dict[str, Any]] = []
    try:
        await caller.wait_speech(0.0, 15.0)  # the greeting
        await caller.wait_quiet(1.2, 30.0)
        for step in steps:
            mark = len(caller.log.heard)
            if step.say:
                end = await caller.say_all(espeak_ng(step.say))
            else:
                end = await caller.press_all(step.press)
            loop = asyncio.get_running_loop()
            stop = end + step.cap_s
            while loop.time() < stop:
                last = max((t for t, db in caller.log.received if db > SPEECH_DBFS), default=0)
                if last > end and loop.time() - last >= step.quiet_s:
                    break
                await asyncio.sleep(0.05)
            heard = caller.log.heard[mark:]
            rx = caller.log.received[mark:]
            rb = ringback_frames(heard)
            frames = [(t, db, r) for (t, db), r in zip(rx, rb, strict=True)]
            g, first = gaps(frames, end)
            pcm = np.concatenate(heard) if heard else np.zeros(0, np.int16)
            _save(save, f"{name}-{len(rows)}", pcm)
            # from just before the first audio: Moonshine may hear nothing in audio that
            # starts with seconds of silence
            loud = [i for i, (_, db) in enumerate(rx) if db > SPEECH_DBFS]
            lead = pcm[max(0, (loud[0] - 5) * 160) :] if loud else pcm
            text = await asyncio.to_thread(
                models.asr.transcribe, Resampler(8000, 16000).process(lead)
            )
            rows.append({
                "input": step.say or f"keys {step.press}",
                "first_audio_ms": round(1000 * (first - end), 1) if first else None,
                "gaps_s": g,
                "longest_s": max(g, default=0.0),
                "total_s": round(sum(g), 3),
                "ringback_frames": int(sum(rb)),
                "heard": text.strip(),
            })  # fmt: skip
    finally:
        await caller.hangup()
    gs = [x for r in rows for x in r["gaps_s"]]
    return {
        "flow": name,
        "steps": rows,
        "longest_s": max(gs, default=0.0),
        "total_s": round(sum(gs), 3),
        "over_1_5_s": sum(1 for x in gs if x > 1.5),
    }


def _agent_view(db: str) -> dict[str, Any]:
    """The bridge's own figures for the call just made: its record's dead air (None from
    a bridge that does not measure it) and its keypad turns' latency."""
    records = CallRecords(db, readonly=True)
    try:
        call = records.show(records.list(limit=1)[0]["call_id"])
    finally:
        records.close()
    assert call is not None
    keyed = [t for t in call["turns"] if (t["timings"] or {}).get("input") == "keypad"]
    return {
        "dead_air_max_ms": call["stats"].get("dead_air_max_ms"),
        "dead_air_total_ms": call["stats"].get("dead_air_total_ms"),
        "keypad_turns": [[t["timings"]["keys"], t["timings"].get("total")] for t in keyed],
    }


def demo_copy(target: str, folder: Path) -> Path:
    """The shipped demo profile with its transfer target pointed at ``target``."""
    text = DEMO_PROFILE.read_text().replace("sip:agent@127.0.0.1:5070", target)
    path = folder / "demo.toml"
    path.write_text(text)
    return path


async def main(runs: int, save: Path | None = None) -> dict[str, Any]:
    port = free_port()
    target = f"sip:agent@127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as d:
        profile = demo_copy(target, Path(d))
        config = load_config(ROOT / "config" / "bridge.toml")
        config = replace(
            config,
            sip=replace(config.sip, listen="127.0.0.1:0"),
            http=replace(config.http, listen=""),
            rtp=replace(config.rtp, ports="33000-33999"),
            agent=replace(config.agent, voice_profile=str(profile)),
            records=replace(config.records, enabled=True, db=str(Path(d) / "calls.sqlite")),
        )
        models, _ = prepare_agents(config)
        make_agent(config)
        server = BridgeServer(config)
        await server.start()
        results = []
        try:
            for _ in range(runs):
                for name, steps in FLOWS.items():
                    uas = None
                    if name.startswith("transfer"):
                        uas = await start_sipp(
                            "uas_target_rings.xml", None, "-p", str(port), "-m", "1",
                            timeout=90,
                        )  # fmt: skip
                    try:
                        results.append(await run_flow(server, name, steps, models, save))
                        await asyncio.sleep(0.3)  # the record is closed with the call
                        results[-1]["record"] = _agent_view(config.records.db)
                        print(json.dumps(results[-1]), file=sys.stderr)
                    finally:
                        if uas is not None:
                            if uas.returncode is None:
                                uas.kill()
                            out, _ = await uas.communicate()
                            if uas.returncode not in (0, -9):
                                print(out.decode(errors="replace")[-2000:], file=sys.stderr)
                    await asyncio.sleep(0.5)
        finally:
            await server.stop()
    gs = [x for r in results for s in r["steps"] for x in s["gaps_s"]]
    keypad = [
        s["first_audio_ms"]
        for r in results
        if r["flow"] == "order_by_keypad"
        for s in r["steps"]
        if s["first_audio_ms"] is not None
    ]
    return {
        "bench": "dead_air",
        "flows": results,
        "longest_s": max(gs, default=0.0),
        "p99_s": pct(gs, 99, 3),
        "total_s": round(sum(gs), 3),
        "gaps": len(gs),
        "keypad_first_audio_ms": keypad,
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg()[0],
        "at": time.time(),
    }


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--out", type=Path, default=OUT / "dead_air.json")
    p.add_argument("--save", type=Path, help="a folder for what the caller heard, per step")
    args = p.parse_args()
    result = asyncio.run(main(args.runs, args.save))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    cli()

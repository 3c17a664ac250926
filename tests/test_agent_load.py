"""bench/agent_load.py: its figures from what a caller heard, and the whole bench on real
calls (the echo agent, so no speech models: seconds, not minutes)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from bench.agent_load import LoadOptions, bridge_turn_stages, run_all, settled
from bench.load_caller import CallFigures, CallResult, call_figures
from sip_bridge.ops.records import CallRecords
from sip_bridge.script.heard_audio import HeardAudio, Span
from sip_bridge.script.script_actions import CallerTiming
from sip_bridge.script.script_file import Speak, load_script

pytestmark = pytest.mark.serial  # its own load bench, measuring the node

FRAME = 160


def _tone(loud: bool) -> np.ndarray:
    t = np.arange(FRAME) / 8000
    return (8000 * np.sin(2 * np.pi * 1000 * t) * loud).astype(np.int16)


def test_figures_of_a_call_from_what_the_caller_heard() -> None:
    """The agent talks 0.2-1.3 s, the caller talks over it from 1.0 to 2.0 s (a barge-in),
    the agent stopped at 1.3 s and answers at 2.4 s: a 0.3 s reaction, a 0.4 s turn, and
    two waits (0.2 s for the greeting, 0.4 s for the answer)."""
    heard = HeardAudio()
    for k in range(250):  # 5 s of packets, every 20 ms
        t = k * 0.02
        heard.add(t, _tone(0.2 <= t < 1.3 - 1e-9 or 2.4 - 1e-9 <= t < 3.4 - 1e-9))
    step = Speak(index=1, line=None, note="", text="stop", barge_in=True)
    sent = [(step, CallerTiming(start=0.98, onset=1.0, end=2.0, done=2.02))]
    spans = [Span(0.0, 0.2), Span(2.0, 3.4)]
    f = call_figures(heard, sent, spans, talk_s=1.0, t0=0.0, t_end=5.0)
    assert f.turns_s == [pytest.approx(0.4, abs=0.021)]
    assert f.barge_ins_s == [pytest.approx(0.3, abs=0.021)]
    assert f.barge_in_not_talking == 0
    assert sorted(f.dead_air_s) == [pytest.approx(0.2, abs=0.021), pytest.approx(0.4, abs=0.021)]
    assert f.overlap_s == pytest.approx(0.3, abs=0.021)
    assert f.listen_s == pytest.approx(2.1, abs=0.041)
    assert (f.rx_frames, f.rx_expected, f.rx_gaps_s) == (250, 250, [])


SCRIPT = """
[script]
name = "load-echo"
description = "Two questions, each heard back from the echo agent, then hang up."

[[step]]
say = "What are your opening hours?"

[[step]]
expect = "."
quiet_ms = 400

[[step]]
say = "Where is my order?"

[[step]]
expect = "."
quiet_ms = 400

[[step]]
hangup = true
"""


def test_the_settled_figures_are_those_of_the_calls_answered_a_minute_after_the_first() -> None:
    def call(at: float, outcome: str, turns: list[float]) -> CallResult:
        return CallResult("s", outcome, figures=CallFigures(turns_s=turns, answered_at=at))

    results = [
        call(100.0, "failed", [3.0, 3.0]),  # the rush of the first minute
        call(120.0, "completed", [2.5]),
        call(130.0, "refused", []),
        call(160.0, "completed", [0.5, 0.6]),
        call(170.0, "failed", [0.7]),
    ]
    s = settled(results)
    assert s["after_s"] == 60.0 and s["calls"] == 2 and s["failed"] == 1
    assert s["turn_latency_ms"]["n"] == 3 and s["turn_latency_ms"]["max"] == 700.0
    assert settled([]) == {"after_s": 60.0, "calls": 0}


def test_the_bridge_turn_stages_come_from_its_call_records(tmp_path: Path) -> None:
    """Voice turns' stages from the records (keypad turns apart), and how many waited out
    max_silence_ms."""
    store = CallRecords(tmp_path / "calls.sqlite")
    store.call_started("c1")
    for eot, asr in ((200.0, 100.0), (900.0, 0.0), (210.0, 60.0), (899.0, 0.0)):
        timings = {"end_of_turn": eot, "asr_tail": asr, "dialogue": 0.5, "tts_first_audio": 90}
        store.turn("c1", caller_text="words", timings=timings)
    store.turn("c1", caller_text="(keypad 1)", timings={"input": "keypad", "dialogue": 0.2})
    store.close()
    got = bridge_turn_stages(tmp_path, 900)
    assert got["end_of_turn"] == {"p50": 554.5, "p95": 899.9, "n": 4}
    assert got["asr_tail"]["n"] == 4 and got["dialogue"] == {"p50": 0.5, "p95": 0.5, "n": 4}
    assert (got["waited_out_pct"], got["max_silence_ms"]) == (50.0, 900)
    empty = tmp_path / "none"
    empty.mkdir()
    CallRecords(empty / "calls.sqlite").close()
    assert bridge_turn_stages(empty, 900)["waited_out_pct"] is None


def test_the_bench_places_real_calls_and_measures_the_bridge_process(tmp_path: Path) -> None:
    """`sip-bridge run` with the echo agent (2 s late: each question comes back after the
    caller stopped, a turn), one caller for 6 s after a warm-up call."""
    config = tmp_path / "bridge.toml"
    config.write_text('[agent]\nname = "echo"\n[agent.echo]\ndelay_s = 2.0\n')
    (tmp_path / "echo_questions.toml").write_text(SCRIPT)
    scripts = [load_script(tmp_path / "echo_questions.toml")]
    opts = LoadOptions(minutes=0.1, config=config, ramp_s=0.0, gap_s=(0.5, 1.0))
    result = asyncio.run(run_all([1], scripts, opts))
    assert result["utterances_prerendered"] == 2
    (run,) = result["runs"]
    assert run["warmup_call"] == "completed"
    assert run["placed"] >= 1 and run["completed"] == run["placed"]
    assert (run["failed"], run["refused"]) == (0, 0)
    turns = run["turn_latency_ms"]
    assert turns["n"] >= 2
    # 2 s of echo delay minus the question (1-1.6 s), plus the bridge's buffers
    assert 150 < turns["p50"] <= turns["p95"] <= turns["p99"] < 2500
    assert 0 < run["dead_air_s"]["max"] < 2.5
    assert run["barge_in_reaction_ms"]["n"] == 0  # the script has none
    assert run["callers_received"]["frames"] > 100
    assert run["bridge_media"]["frames_sent"] > 100
    assert run["bridge_media"]["late_or_missing_pct"] is not None
    assert run["cpu_pct"]["bridge_total"] > 0 and run["cpu_pct"]["bridge_per_call"] > 0
    assert run["rss_mb"]["bridge_idle"] > 30
    shares = run["shares"]
    assert shares["talk"] > 0.1 and shares["listen"] > 0.1
    total = shares["talk"] + shares["listen"] - shares["both"] + shares["pause"]
    assert total == pytest.approx(1.0, abs=0.01)
    assert run["bridge_turn_stages_ms"]["end_of_turn"]["n"] == 0  # the echo agent has no turns
    counters = run["bridge_status"]["counters"]  # the bridge's own count, warm-up included
    assert counters["established"] == run["placed"] + 1

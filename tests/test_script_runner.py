"""`sip-bridge script` on real calls to in-process bridges with line-check agents: what the
caller sends (keys, level, loss, jitter, line echo) is checked where it arrives, in the
bridge's call record and recording; REFER is followed to a sipp target."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import wave
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from agent.base import Agent, AgentEvent, AgentOutput, CallInfo, TransferRequest, TransferResult
from sip_bridge.config.loader import BridgeConfig, load_config
from sip_bridge.ops.records import CallRecords
from sip_bridge.script.line_sim import active_level_dbfs
from sip_bridge.script.script_file import parse_script_text
from sip_bridge.script.script_leg import LineOptions
from sip_bridge.script.script_report import CallReport, junit_xml
from sip_bridge.script.script_runner import RunOptions, Transcriber, run_script
from sip_bridge.server import BridgeServer
from testkit.sipp_media import random_port_range
from testkit.sipp_runner import free_port, sipp_command

ROOT = Path(__file__).resolve().parents[1]


def _config(tmp: Path, agent: str, extra: str = "") -> BridgeConfig:
    low, high = random_port_range(40, 41000, 44000)
    f = tmp / "bridge.toml"
    f.write_text(
        f'[sip]\nlisten = "127.0.0.1:0"\n[rtp]\nports = "{low}-{high}"\n[http]\nlisten = ""\n'
        f'[agent]\nname = "{agent}"\n{extra}'
        '[records]\nenabled = true\ndb = "calls.sqlite"\nrecordings_dir = "rec"\n'
    )
    return load_config(f)


def _play(
    config: BridgeConfig, script_text: str, tmp: Path, line: LineOptions, **opts: Any
) -> tuple[CallReport, dict[str, Any]]:
    """One script against a bridge: the runner's report and the bridge's call record."""
    script = parse_script_text(script_text, tmp / "s.toml")
    lines: list[str] = []

    async def main() -> CallReport:
        server = BridgeServer(config, opts.pop("factory", None) or _default_factory())
        await server.start()
        transcriber = Transcriber()
        try:
            run = RunOptions(uri=server.uri, line=line, **opts)
            report = await run_script(script, run, transcriber, on_line=lines.append)
            for _ in range(60):
                if not server.calls:
                    break
                await asyncio.sleep(0.05)
            return report
        finally:
            transcriber.close()
            await server.stop()

    report = asyncio.run(main())
    records = CallRecords(tmp / "calls.sqlite", readonly=True)
    (row,) = records.list()
    shown = records.show(row["call_id"])
    records.close()
    assert shown is not None
    assert "\n".join(lines).startswith("script s ")
    return report, shown


def _default_factory() -> Any:
    from sip_bridge.agents import make_agent

    return make_agent


def _caller_side(tmp: Path) -> NDArray[np.int16]:
    (wav,) = (tmp / "rec").glob("*.wav")
    with wave.open(str(wav)) as w:
        x = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    return x[0::2]  # left: what the caller sent


def test_line_echo_comes_back_erl_down(tmp_path: Path) -> None:
    """The tone agent plays 1 kHz at -10 dBFS; the caller, silent, sends back only its line
    echo: about 12 dB down (plus the hybrid's colouring at 1 kHz, under 1 dB)."""
    config = _config(tmp_path, "tone", "[agent.tone]\nfreq_hz = 1000.0\nlevel_dbfs = -10.0\n")
    text = '[[step]]\nwait = "speech"\n[[step]]\nwait_s = 3\n'
    line = LineOptions(echo_erl_db=12.0, echo_delay_ms=60.0)
    report, _ = _play(config, text, tmp_path, line)
    assert report.passed, report.results
    left = _caller_side(tmp_path)
    steady = left[16000:32000].astype(np.float64)  # seconds 2-4: the echo is steady
    level = 10 * np.log10(np.mean(steady**2) / 32768**2)
    assert abs(level - (-10.0 - 3.01 - 12.0)) < 2.0, level
    assert np.abs(left[:100]).max() < 50  # nothing before the echo could arrive


def test_keys_both_ways_reach_the_bridge(tmp_path: Path) -> None:
    config = _config(tmp_path, "echo")
    text = '[[step]]\ndtmf = "12#"\n[[step]]\ndtmf = "3"\nmethod = "info"\n[[step]]\nwait_s = 1\n'
    report, shown = _play(config, text, tmp_path, LineOptions())
    assert report.passed, report.results
    keys = [(e["data"]["digit"], e["data"]["method"]) for e in shown["events"]
            if e["kind"] == "dtmf"]  # fmt: skip
    assert keys == [("1", "rfc4733"), ("2", "rfc4733"), ("#", "rfc4733"), ("3", "info")]


def test_loss_and_jitter_reach_the_bridge(tmp_path: Path) -> None:
    config = _config(tmp_path, "echo")
    line = LineOptions(loss_pct=5.0, jitter_ms=40.0, seed=4)
    report, shown = _play(config, "[[step]]\nwait_s = 8\n", tmp_path, line)
    assert report.passed, report.results
    stats = shown["stats"]
    assert 1.0 <= stats["loss_pct"] <= 12.0, stats  # bursty: a short call varies
    # the bridge's RFC 3550 estimate; a clean line on a busy machine shows 1-10 ms
    assert 20.0 <= stats["jitter_ms"] <= 120.0, stats
    assert report.lost_packets > 0 and report.sent_packets > 380


def test_say_at_a_level_and_hear_it_back(tmp_path: Path) -> None:
    """The echo agent plays back what the caller said, 0.5 s later: the caller's words at
    the run's level arrive, and come back to be transcribed by the runner."""
    config = _config(tmp_path, "echo")
    text = (
        '[[step]]\nsay = "What are your opening hours?"\n'
        '[[step]]\nexpect = "what are you.*opening"\n[[step]]\nhangup = true\n'
    )
    report, _ = _play(config, text, tmp_path, LineOptions(level_dbfs=-30.0))
    assert report.passed, report.results
    sent = _caller_side(tmp_path)
    assert abs(active_level_dbfs(sent) - (-30.0)) < 1.5  # G.711 adds a little
    # the echo began 0.5 s into the question: the agent talked over the caller's end
    assert report.summary.turn_latencies_s == []


class _Transferring(Agent):
    """Says nothing; asks for a transfer after 0.5 s; remembers how it went."""

    name = "transfer-test"
    sample_rate = 8000

    def __init__(self) -> None:
        self.heard = 0
        self.output: AgentOutput | None = None
        self.events: list[AgentEvent] = []

    async def start(self, call: CallInfo, output: AgentOutput) -> None:
        self.output = output

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        self.heard += int(pcm.size)
        if self.heard == 4000 and self.output is not None:
            self.output.emit(TransferRequest("sip:agent@127.0.0.1:5070"))

    def on_event(self, event: AgentEvent) -> None:
        self.events.append(event)


@pytest.mark.parametrize(
    ("scenario", "result", "outcome"),
    [("uas_transfer_answer.xml", "answered", "succeeded"),
     ("uas_transfer_busy.xml", "rejected", "failed")],
)  # fmt: skip
def test_refer_is_followed_through_the_transfer_proxy(
    tmp_path: Path, scenario: str, result: str, outcome: str
) -> None:
    port = free_port()
    target = subprocess.Popen(
        sipp_command(scenario, None, "-p", str(port), "-m", "1", timeout=30),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    agents: list[_Transferring] = []

    def factory(_: BridgeConfig) -> Agent:
        agents.append(_Transferring())
        return agents[-1]

    config = _config(tmp_path, "echo")
    config = replace(config, records=replace(config.records, recordings_dir=""))
    text = f'[[step]]\nexpect_refer = "sip:agent@127.0.0.1:5070"\nresult = "{result}"\n'
    report, shown = _play(config, text, tmp_path, LineOptions(), factory=factory,
                          transfer_proxy=("127.0.0.1", port))  # fmt: skip
    out, _ = target.communicate(timeout=20)
    assert target.returncode == 0, out[-2000:]
    assert report.passed, report.results
    (agent,) = agents
    results = [e for e in agent.events if isinstance(e, TransferResult)]
    assert [r.outcome for r in results] == [outcome]
    assert any(e["kind"] == "transfer" for e in shown["events"])


def test_a_call_that_is_refused(tmp_path: Path) -> None:
    port = free_port()
    target = subprocess.Popen(
        sipp_command("uas_transfer_busy.xml", None, "-p", str(port), "-m", "1", timeout=30),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    script = parse_script_text('[[step]]\nwait_s = 1\n[[step]]\nhangup = true\n',
                               tmp_path / "busy.toml")  # fmt: skip
    opts = RunOptions(uri=f"sip:agent@127.0.0.1:{port}")
    transcriber = Transcriber()
    report = asyncio.run(run_script(script, opts, transcriber))
    transcriber.close()
    target.communicate(timeout=20)
    assert not report.passed and report.status == 486
    assert [r.status for r in report.results] == ["FAIL", "SKIP"]
    assert "486 Busy Here" in report.results[0].detail
    xml = junit_xml([report])
    assert 'failures="1"' in xml and 'skipped="1"' in xml and "486 Busy Here" in xml


def test_the_command_line_refuses_a_broken_script(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[step]]\nsay = "hello"\nvoise = "en-us"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "sip_bridge.cli", "script", str(bad), "--uri", "sip:x@127.0.0.1:9"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2
    assert f"{bad}:3: step[1].voise: unknown key" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "sip_bridge.cli", "script", str(bad), "--loss-pct", "70"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2 and "--loss-pct" in proc.stderr


def test_play_a_wav_at_the_level_asked(tmp_path: Path) -> None:
    t = np.arange(16000) / 16000
    tone = (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)  # 1 s, 16 kHz
    with wave.open(str(tmp_path / "tone.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(tone.tobytes())
    config = _config(tmp_path, "echo")
    text = '[[step]]\nplay = "tone.wav"\ngain_db = -6\n[[step]]\nwait_s = 0.5\n'
    report, _ = _play(config, text, tmp_path, LineOptions(level_dbfs=-20.0))
    assert report.passed, report.results
    sent = _caller_side(tmp_path)
    start = int(np.flatnonzero(np.abs(sent) > 500)[0])
    steady = sent[start + 2000 : start + 6000].astype(np.float64)  # 0.25-0.75 s in
    level = 10 * np.log10(np.mean(steady**2) / 32768**2)
    assert abs(level - (-26.0)) < 1.0, level  # -20 dBFS, gain_db -6 (a tone: RMS = P.56)
    spectrum = np.abs(np.fft.rfft(steady * np.hanning(4000)))
    assert abs(int(np.argmax(spectrum)) * 8000 / 4000 - 440) <= 4

"""pjsua2 (PyPI `pjsua2-python`, pjproject 2.15) as an independent SIP peer of the bridge.

Each phone is testkit/peers/pjsua_peer.py in a subprocess (the C library may crash or hang;
pytest must not), on pjmedia's null sound device, playing a tone WAV and recording what
it hears. Calls go both ways; audio is checked by the frequency and level each side heard,
DTMF by the digits the far side reported, hold by the bridge's live media state.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from agent.base import Agent, AgentEvent, AgentOutput, CallInfo, TransferRequest, TransferResult
from agent.lines.echo import EchoAgent
from sip_bridge.config.loader import BridgeConfig
from testkit.peers.support import (
    LineReader,
    assert_tone,
    bridge_calls,
    bridge_config,
    dominant_hz,
    free_udp_port,
    loud_runs,
    read_wav,
    running_agent_bridge,
    running_bridge,
    steady_tone,
    wait_until,
    write_tone,
)

ROOT = Path(__file__).resolve().parents[1]
PEER = Path(__file__).resolve().parents[1] / "testkit" / "peers" / "pjsua_peer.py"


def _peer(
    tmp: Path, *args: str, play: Path | None = None
) -> tuple[subprocess.Popen[str], LineReader]:
    cmd = [
        sys.executable, str(PEER), "--record", str(tmp / "peer_heard.wav"),
        "--rtp-port", str(free_udp_port(even=True)), "--timeout", "20", *args,
    ]  # fmt: skip
    if play is not None:
        cmd += ["--play", str(play)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
    )
    return proc, LineReader(proc)


def _finish(proc: subprocess.Popen[str], reader: LineReader) -> list[dict[str, Any]]:
    """Wait (bounded) for the peer to exit; its events, in order."""
    try:
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
    reader.wait_for("<EOF>", timeout=5)
    events = [json.loads(line[5:]) for line in reader.lines if line.startswith("PEER ")]
    # pjsua2 itself may die by a signal in its own teardown once every call has ended (a
    # SIGSEGV after "DISCONNECTED 200", before its "done", once in a full run): that is
    # the peer's library, not the call, which the caller's assertions judge (events, WAVs)
    states = [e for e in events if e["ev"] == "state"]
    ended = bool(states) and states[-1]["state"] == "DISCONNECTED"
    assert proc.returncode == 0 or (proc.returncode < 0 and ended), reader.text()[-3000:]
    return events


def test_pjsua_calls_the_echo_agent_hears_its_tone_and_its_digits_arrive(tmp_path: Path) -> None:
    tone = tmp_path / "tone.wav"
    write_tone(tone, 700)
    with running_bridge() as bridge:
        proc, reader = _peer(
            tmp_path, "--call", bridge.uri,
            "--at", "1.0", "dtmf:159#", "--at", "2.5", "info:*0", "--at", "5.0", "hangup",
            play=tone,
        )  # fmt: skip
        events = _finish(proc, reader)
        time.sleep(0.2)
        digits = bridge.digits()
        stats = bridge.stats()
    states = [e["state"] for e in events if e["ev"] == "state"]
    assert "CONFIRMED" in states and states[-1] == "DISCONNECTED", states
    assert stats == {"offered": 1, "established": 1, "ended": 1}
    # RFC 4733 events first, then SIP INFO (application/dtmf-relay), each once, in order.
    assert digits == list("159#*0")
    assert_tone(tmp_path / "peer_heard.wav", 700)


def test_pjsua_hold_stops_the_bridge_sending_and_unhold_brings_the_echo_back(
    tmp_path: Path,
) -> None:
    tone = tmp_path / "tone.wav"
    write_tone(tone, 900)
    samples: list[tuple[bool, bool, int]] = []
    with running_bridge() as bridge:
        proc, reader = _peer(
            tmp_path, "--call", bridge.uri,
            "--at", "1.5", "hold", "--at", "3.0", "unhold", "--at", "5.0", "hangup",
            play=tone,
        )  # fmt: skip
        deadline = time.monotonic() + 25
        while proc.poll() is None and time.monotonic() < deadline:
            samples += [(s.sending, s.receiving, s.packets_out) for s in bridge.live_stats()]
            time.sleep(0.05)
        events = _finish(proc, reader)
    media = [(e["status"], e["dir"]) for e in events if e["ev"] == "media"]
    # pjsua saw: active, local hold (its re-INVITE offered sendonly), active again.
    assert [s for s, _ in media] == [1, 2, 1], media
    held = [i for i, (send, recv, _) in enumerate(samples) if not send]
    assert held, "the bridge never stopped sending"
    assert all(samples[i][1] for i in held), "the bridge must keep receiving while held"
    sent_while_held = [samples[i][2] for i in held]
    assert max(sent_while_held) - min(sent_while_held) <= 1, sent_while_held
    assert samples[0][0] and samples[-1][0], "sending before hold and after unhold"
    assert samples[-1][2] > max(sent_while_held) + 25, "RTP resumed after unhold"
    # The peer heard its echo, a gap while held, then its echo again.
    x = read_wav(tmp_path / "peer_heard.wav")
    runs = [r for r in loud_runs(x) if r[1] - r[0] >= 10]
    assert len(runs) >= 2, runs
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(runs)]
    assert max(gaps) >= 15, gaps  # >= 0.3 s of silence while held
    after = runs[-1]
    assert after[1] - after[0] >= 40, runs  # >= 0.8 s of echo after resuming
    seg = steady_tone(x, after)
    assert abs(dominant_hz(seg) - 900) < 10


def test_pjsua_digits_sent_to_the_echo_agent_come_back_as_rfc4733(tmp_path: Path) -> None:
    with running_bridge() as bridge:
        proc, reader = _peer(
            tmp_path, "--call", bridge.uri,
            "--at", "0.5", "dtmf:2580", "--at", "2.0", "info:#", "--at", "3.5", "hangup",
        )  # fmt: skip
        events = _finish(proc, reader)
        time.sleep(0.2)
        sent = bridge.run(lambda: [s.dtmf_digits_sent for s in bridge.server.finished])
        digits = bridge.digits()
    assert digits == list("2580#")
    # The echo agent pressed every key back (AgentOutput.send_dtmf), in-band as RFC 4733
    # telephone-events, whichever way the key came in.
    back = [(e["digit"], e["method"]) for e in events if e["ev"] == "dtmf"]
    assert back == [(d, "rfc4733") for d in "2580#"], back
    assert sent == [5]


def test_bridge_calls_pjsua_audio_both_ways_and_dtmf(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours.wav", tmp_path / "theirs.wav"
    write_tone(ours, 500, seconds=3.0)
    write_tone(theirs, 1100, seconds=3.0)
    proc, reader = _peer(tmp_path, play=theirs)
    try:
        port = int(reader.wait_for(r'"listening".*"port": (\d+)', timeout=15).group(1))
        uri = f"sip:peer@127.0.0.1:{port}"
        caller = bridge_calls(uri, ours, tmp_path / "bridge_heard.wav", dtmf="47")
    finally:
        events = _finish(proc, reader)
    assert caller.returncode == 0, caller.stdout + caller.stderr
    assert "call answered (200)" in caller.stdout
    # `sip-bridge call` presses its keys (RFC 4733 when negotiated, else SIP INFO).
    assert [e["digit"] for e in events if e["ev"] == "dtmf"] == ["4", "7"]
    assert_tone(tmp_path / "bridge_heard.wav", 1100)
    assert_tone(tmp_path / "peer_heard.wav", 500)


class TransferringAgent(Agent):
    """Says nothing; asks for a transfer to ``target`` once it heard ``after_s`` of call."""

    name = "transfer-test"
    sample_rate = 8000

    def __init__(self, target: str, after_s: float = 1.0) -> None:
        self.target = target
        self.after = int(after_s * self.sample_rate)
        self.heard = 0
        self.output: AgentOutput | None = None
        self.events: list[AgentEvent] = []

    async def start(self, call: CallInfo, output: AgentOutput) -> None:
        self.output = output

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        before, self.heard = self.heard, self.heard + int(pcm.size)
        if before < self.after <= self.heard and self.output is not None:
            self.output.emit(TransferRequest(self.target))

    def on_event(self, event: AgentEvent) -> None:
        self.events.append(event)


def _transfer_call(
    tmp: Path, caplog: pytest.LogCaptureFixture, config: BridgeConfig | None = None
) -> tuple[list[TransferResult], dict[str, int], list[dict[str, Any]], list[tuple[str, str]], str]:
    """pjsua2 calls the bridge, whose first agent transfers it to the bridge's echo user.

    Returns the first agent's TransferResults, the bridge's call counts, the peer's events,
    the (outcome, reason) the bridge logged for each step of the transfer (the REFER's 202,
    then one per NOTIFY, whose reason starts with the sipfrag's status) and the target.
    """
    tone = tmp / "tone.wav"
    write_tone(tone, 700)
    caplog.set_level(logging.INFO, logger="sip_bridge.server")
    target: list[str] = []

    def agent(n: int) -> Agent:
        return TransferringAgent(target[0]) if n == 0 else EchoAgent(delay_s=0.3)

    with running_agent_bridge(agent, config) as bridge:
        target.append(f"sip:echo@127.0.0.1:{bridge.server.port}")
        proc, reader = _peer(
            tmp, "--call", bridge.uri, "--rtp-range", "10", "--at", "4.5", "hangup", play=tone
        )
        events = _finish(proc, reader)
        wait_until(lambda: bridge.run(lambda: not bridge.server.calls))
        first = bridge.made[0]
        assert isinstance(first, TransferringAgent)
        results = bridge.run(lambda: [e for e in first.events if isinstance(e, TransferResult)])
        stats = bridge.stats()
    logged = [
        (m.group(1), m.group(2))
        for r in caplog.records
        if (m := re.search(r": transfer to \S+ (\w+) \((.*)\)$", r.getMessage()))
    ]
    return results, stats, events, logged, target[0]


def test_pjsua_accepts_the_bridges_refer_and_calls_the_target(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    results, stats, events, logged, target = _transfer_call(tmp_path, caplog)
    # The bridge: one outcome for the agent, from pjsua's NOTIFYs (sipfrag 100, then 200).
    assert [(r.outcome, r.status, r.target) for r in results] == [("succeeded", 200, target)]
    assert logged[0] == ("trying", "REFER accepted") and logged[-1][0] == "succeeded", logged
    notified = [int(reason[:3]) for _, reason in logged[1:]]
    assert notified[0] == 100 and notified[-1] == 200 and notified == sorted(notified), logged
    # Both calls were answered by the bridge and are over: the transferred one, hung up by
    # pjsua once the new call was up, and the new one (the echo agent), by its timed hangup.
    assert stats == {"offered": 2, "established": 2, "ended": 2}
    # pjsua: the REFER named the target; call 1 reached CONFIRMED, then call 0 hung up.
    [request] = [e for e in events if e["ev"] == "xfer_request"]
    assert target in request["dst"] and request["code"] == 202 and request["call"] == 0
    states = [(e["call"], e["state"]) for e in events if e["ev"] == "state"]
    assert (1, "CONFIRMED") in states and states[-1] == (1, "DISCONNECTED"), states
    assert states.index((1, "CONFIRMED")) < states.index((0, "DISCONNECTED")), states
    hung = [e for e in events if e["ev"] == "action" and e["action"] == "hangup-transferred"]
    assert [e["call"] for e in hung] == [0]
    # The transferring agent said nothing: the tone pjsua heard is its echo on the new call.
    assert_tone(tmp_path / "peer_heard.wav", 700)


def test_a_target_that_refuses_makes_the_transfer_fail_with_its_status(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = bridge_config()
    config = dataclasses.replace(config, sip=dataclasses.replace(config.sip, max_calls=1))
    results, stats, events, logged, target = _transfer_call(tmp_path, caplog, config)
    # The bridge is full: it refused the transferred call with 503; pjsua NOTIFYs that sipfrag.
    assert [(r.outcome, r.status, r.target) for r in results] == [("failed", 503, target)]
    assert logged[-1] == ("failed", "503 Service Unavailable"), logged
    assert stats == {"offered": 1, "established": 1, "ended": 1}
    states = [(e["call"], e["state"], e["code"]) for e in events if e["ev"] == "state"]
    assert (1, "DISCONNECTED", 503) in states, states
    # The caller stayed on the original call until its own hangup.
    assert states[-1][:2] == (0, "DISCONNECTED"), states
    assert not [e for e in events if e["ev"] == "action" and e["action"] == "hangup-transferred"]

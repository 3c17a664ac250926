"""pjsua2 (PyPI `pjsua2-python`, pjproject 2.15) as an independent SIP peer of the bridge.

Each phone is tests/peers/pjsua_peer.py in a subprocess (the C library may crash or hang;
pytest must not), on pjmedia's null sound device, playing a tone WAV and recording what
it hears. Calls go both ways; audio is checked by the frequency and level each side heard,
DTMF by the digits the far side reported, hold by the bridge's live media state.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from peers.support import (
    LineReader,
    assert_tone,
    bridge_calls,
    dominant_hz,
    free_udp_port,
    loud_runs,
    read_wav,
    running_bridge,
    steady_tone,
    write_tone,
)

ROOT = Path(__file__).resolve().parents[1]
PEER = Path(__file__).parent / "peers" / "pjsua_peer.py"


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
    assert proc.returncode == 0, reader.text()[-3000:]
    return [json.loads(line[5:]) for line in reader.lines if line.startswith("PEER ")]


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

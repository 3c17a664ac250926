"""baresip (Debian `baresip-core` 1.0.0) as a real SIP peer of the bridge.

baresip runs headless, typed at through its stdin (testkit/peers/baresip.py): its `aufile`
source plays a tone WAV into the call and its `sndfile` filter records what it decoded.
Calls go both ways; audio is checked by the frequency and level each side heard, DTMF by
the keys the far side decoded (RFC 4733 both ways), hold by the bridge's live media state
and by the tone coming back after resume (at the bridge: baresip 1.0.0 stops recording at
a re-INVITE, so on its side only its RTP counters show the echo returning).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from testkit.peers.baresip import Baresip
from testkit.peers.support import (
    BridgeThread,
    HearingBridgeThread,
    assert_tone,
    bridge_calls,
    bridge_config,
    dominant_hz,
    frame_rms,
    loud_runs,
    peak_level,
    read_wav,
    running_bridge,
    steady_tone,
    wait_until,
    write_tone,
)

ROOT = Path(__file__).resolve().parents[1]
ECHO_DELAY_S = 0.5  # the shipped config/bridge.toml's [agent.echo]


def _call_bridge(phone: Baresip, uri: str) -> None:
    mark = phone.send(f"/dial {uri}")
    phone.wait_for("Call established", start=mark)
    phone.wait_for("incoming rtp for 'audio' established", start=mark)


def _hang_up(phone: Baresip) -> None:
    mark = phone.send("/hangup")
    phone.wait_for("terminated", start=mark)
    phone.close()


def _ended(bridge: BridgeThread) -> bool:
    return bridge.stats().get("ended", 0) >= 1


def test_baresip_calls_make_run_and_hears_its_tone_echoed(tmp_path: Path) -> None:
    tone = tmp_path / "tone.wav"
    write_tone(tone, 1000, seconds=8.0)
    rtp_ports = bridge_config().rtp.ports  # a random range, as for the in-process bridges
    bridge = subprocess.Popen(
        [
            sys.executable, "-m", "sip_bridge.cli", "run",
            "--config", str(ROOT / "config" / "bridge.toml"),
            "--listen", "127.0.0.1:0", "--rtp-ports", rtp_ports, "--agent", "echo",
            "--http", "off",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert bridge.stdout is not None
        bridge.stdout.readline()
        m = re.search(r"dial (sip:echo@127\.0\.0\.1:\d+)", bridge.stdout.readline())
        assert m, "the bridge did not print its URI"
        phone = Baresip(tmp_path / "baresip", tone)
        try:
            _call_bridge(phone, m.group(1))
            time.sleep(4.0)
            _hang_up(phone)
        finally:
            phone.close()
    finally:
        bridge.terminate()
        bridge.wait(timeout=10)
    x = read_wav(phone.heard())
    rms = frame_rms(x)
    assert rms.max() > 0.05, "baresip heard nothing back"
    onset = int(np.argmax(rms > 0.05)) * 0.02
    # baresip starts its tone when the call is up; the echo follows after the agent's delay.
    assert ECHO_DELAY_S <= onset <= ECHO_DELAY_S + 0.3, onset
    seg = x[int((onset + 0.5) * 8000) : int((onset + 2.5) * 8000)]
    assert abs(dominant_hz(seg) - 1000) < 5
    assert abs(20 * np.log10(peak_level(seg) / 0.3)) < 1.5  # what baresip sent: -10.5 dBFS


def test_baresip_digits_reach_the_echo_agent_and_come_back(tmp_path: Path) -> None:
    tone = tmp_path / "tone.wav"
    write_tone(tone, 700, seconds=10.0)
    with running_bridge() as bridge:
        phone = Baresip(tmp_path / "baresip", tone)
        try:
            _call_bridge(phone, bridge.uri)
            time.sleep(1.0)
            mark = phone.send("/sndcode 159#")  # RFC 4733 telephone-events, one per key
            phone.wait_for(r"received event: '#' \(end=1\)", timeout=8, start=mark)
            time.sleep(1.5)
            _hang_up(phone)
        finally:
            phone.close()
        wait_until(lambda: _ended(bridge))
        digits, stats = bridge.digits(), bridge.stats()
    assert stats == {"offered": 1, "established": 1, "ended": 1}
    assert digits == list("159#")
    # The echo agent pressed every key back (AgentOutput.send_dtmf) and baresip decoded them.
    assert phone.keys_received() == list("159#"), phone.reader.text()[-3000:]
    assert_tone(phone.heard(), 700)


def test_baresip_hold_stops_the_bridge_sending_and_resume_brings_the_tone_back(
    tmp_path: Path,
) -> None:
    tone = tmp_path / "tone.wav"
    write_tone(tone, 900, seconds=12.0)
    bridge = HearingBridgeThread(bridge_config())
    bridge.start()
    try:
        phone = Baresip(tmp_path / "baresip", tone)
        try:
            _call_bridge(phone, bridge.uri)
            time.sleep(2.0)
            [before] = bridge.live_stats()
            assert before.sending and before.receiving
            mark = phone.send("/hold")  # re-INVITE a=sendonly; the bridge answers recvonly
            phone.wait_for("call: hold ", start=mark)
            wait_until(lambda: not bridge.live_stats()[0].sending)
            [held] = bridge.live_stats()
            assert held.receiving, "the bridge must keep receiving while held (recvonly)"
            time.sleep(0.6)
            [held_later] = bridge.live_stats()
            assert held_later.packets_out - held.packets_out <= 1, "RTP sent while on hold"
            mark = phone.send("/resume")
            phone.wait_for("call: resume ", start=mark)
            wait_until(lambda: bridge.live_stats()[0].sending)
            resumed_at = bridge.heard_frames()
            received = phone.rtp_received()
            time.sleep(2.0)
            [after] = bridge.live_stats()
            assert after.receiving and after.packets_out > held_later.packets_out + 50
            assert phone.rtp_received() > received + 50, "baresip got no echo after resume"
            _hang_up(phone)
        finally:
            phone.close()
        after_resume = bridge.heard(since=resumed_at)
    finally:
        bridge.stop()
    # The bridge hears baresip's tone again after the resume...
    runs = loud_runs(after_resume)
    assert runs, "the bridge heard nothing after the resume"
    longest = max(runs, key=lambda r: r[1] - r[0])
    assert longest[1] - longest[0] >= 40, runs
    seg = steady_tone(after_resume, longest)
    assert abs(dominant_hz(seg) - 900) < 10, dominant_hz(seg)
    assert abs(20 * np.log10(peak_level(seg) / 0.3)) < 2.0, peak_level(seg)
    # ...and baresip heard the echo up to the hold. (Its recording ends there: baresip 1.0.0
    # rebuilds its receive chain without `sndfile` on a re-INVITE; `rtp_received` above is
    # what shows the echo reaching it again after the resume.)
    x = read_wav(phone.heard())
    [(a, b)] = [r for r in loud_runs(x) if r[1] - r[0] >= 10]
    assert b - a >= 40, (a, b)
    assert abs(dominant_hz(steady_tone(x, (a, b))) - 900) < 10


def test_bridge_calls_baresip_audio_both_ways_and_dtmf(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours.wav", tmp_path / "theirs.wav"
    bridge_heard = tmp_path / "bridge_heard.wav"
    write_tone(ours, 500, seconds=6.0)
    write_tone(theirs, 1100, seconds=10.0)
    phone = Baresip(tmp_path / "baresip", theirs, autoanswer=True)
    try:
        caller = bridge_calls(phone.uri, ours, bridge_heard, dtmf="47")
        phone.wait_for("terminated")
    finally:
        phone.close()
    assert caller.returncode == 0, caller.stdout + caller.stderr
    assert "call answered (200)" in caller.stdout
    # `sip-bridge call` pressed its keys as RFC 4733 events and baresip decoded them.
    assert phone.keys_received() == ["4", "7"], phone.reader.text()[-3000:]
    assert_tone(bridge_heard, 1100)
    assert_tone(phone.heard(), 500)

"""linphonec (Debian `linphone-cli`, liblinphone 5.1) as a real SIP peer of the bridge.

linphonec runs headless with its "files" sound card: it plays a tone WAV into the call
and records what it hears (testkit/peers/linphone.py). Calls go both ways; audio is checked
by the frequency and level each side heard, DTMF by the digits the far side got, hold by
the bridge's live media state and by the echo coming back after resume.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from testkit.peers.linphone import Linphonec
from testkit.peers.support import (
    BridgeThread,
    assert_tone,
    bridge_calls,
    dominant_hz,
    loud_runs,
    read_wav,
    running_bridge,
    wait_until,
    write_tone,
)

ROOT = Path(__file__).resolve().parents[1]
TONE = re.compile(r"Receiving tone (.) from ")


def _call_bridge(phone: Linphonec, bridge: BridgeThread) -> None:
    mark = phone.send(f"call {bridge.uri}")
    phone.wait_for(r"Call \d+ with .* connected", start=mark)
    phone.wait_for("Media streams established", start=mark)


def _hang_up(phone: Linphonec) -> None:
    mark = phone.send("terminate")
    phone.wait_for(r"Call \d+ with .* ended", start=mark)
    phone.close()


def _tones(phone: Linphonec) -> list[str]:
    """The DTMF keys linphonec reported receiving ("Receiving tone 5 from sip:...")."""
    return [m.group(1) for m in map(TONE.search, phone.reader.lines) if m]


def test_linphone_calls_the_echo_agent_hears_its_tone_and_its_digits_arrive(
    tmp_path: Path,
) -> None:
    tone, heard = tmp_path / "tone.wav", tmp_path / "heard.wav"
    write_tone(tone, 700)
    with running_bridge() as bridge:
        phone = Linphonec(tmp_path / "lin", tone, heard)
        try:
            _call_bridge(phone, bridge)
            time.sleep(1.0)
            phone.send("159#")  # a line of digits: sent as RFC 4733 events
            time.sleep(3.0)
            _hang_up(phone)
        finally:
            phone.close()
        time.sleep(0.2)
        digits, stats = bridge.digits(), bridge.stats()
    assert stats == {"offered": 1, "established": 1, "ended": 1}
    assert digits == list("159#")
    assert_tone(heard, 700)


def test_linphone_pause_holds_the_bridge_and_resume_brings_the_echo_back(
    tmp_path: Path,
) -> None:
    tone, heard = tmp_path / "tone.wav", tmp_path / "heard.wav"
    write_tone(tone, 900)
    with running_bridge() as bridge:
        phone = Linphonec(tmp_path / "lin", tone, heard)
        try:
            _call_bridge(phone, bridge)
            up = time.monotonic()
            time.sleep(1.5)
            [before] = bridge.live_stats()
            assert before.sending and before.receiving
            pre_pause_s = time.monotonic() - up
            mark = phone.send("pause")
            phone.wait_for(r"Call \d+ with .* is now paused", start=mark)
            wait_until(lambda: not bridge.live_stats()[0].sending)
            [held] = bridge.live_stats()
            assert held.receiving, "the bridge must keep receiving while held"
            time.sleep(0.6)
            [held_later] = bridge.live_stats()
            assert held_later.packets_out - held.packets_out <= 1, "RTP sent while on hold"
            mark = phone.send("resume")
            phone.wait_for(r"Resuming call \d+", start=mark)
            wait_until(lambda: bridge.live_stats()[0].sending)
            time.sleep(2.0)
            [after] = bridge.live_stats()
            assert after.receiving and after.packets_out > held_later.packets_out + 50
            _hang_up(phone)
        finally:
            phone.close()
    # linphone records nothing while paused: its WAV is the echo before the pause, then the
    # echo after resuming. So the tone must go on well past where the pause cut it.
    x = read_wav(heard)
    runs = [r for r in loud_runs(x) if r[1] - r[0] >= 10]
    assert runs, "linphone heard nothing"
    assert runs[-1][1] * 0.02 >= pre_pause_s + 1.0, (runs, pre_pause_s)
    assert abs(dominant_hz(x[(runs[-1][1] - 50) * 160 : (runs[-1][1] - 5) * 160]) - 900) < 10


def test_linphone_digits_sent_to_the_echo_agent_come_back(tmp_path: Path) -> None:
    tone, heard = tmp_path / "tone.wav", tmp_path / "heard.wav"
    write_tone(tone, 700)
    with running_bridge() as bridge:
        phone = Linphonec(tmp_path / "lin", tone, heard)
        try:
            _call_bridge(phone, bridge)
            time.sleep(0.5)
            phone.send("2580#")
            phone.wait_for("Receiving tone #", timeout=8)
            _hang_up(phone)
        finally:
            phone.close()
        digits = bridge.digits()
    assert digits == list("2580#")
    # The echo agent pressed every key back (AgentOutput.send_dtmf, RFC 4733).
    assert _tones(phone) == list("2580#"), phone.reader.text()[-3000:]


def test_bridge_calls_linphone_audio_both_ways_and_dtmf(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours.wav", tmp_path / "theirs.wav"
    phone_heard, bridge_heard = tmp_path / "phone_heard.wav", tmp_path / "bridge_heard.wav"
    write_tone(ours, 500)
    write_tone(theirs, 1100)
    phone = Linphonec(tmp_path / "lin", theirs, phone_heard, autoanswer=True)
    try:
        caller = bridge_calls(phone.uri, ours, bridge_heard, dtmf="47")
        phone.wait_for(r"Call \d+ with .* ended")
    finally:
        phone.close()
    assert caller.returncode == 0, caller.stdout + caller.stderr
    assert "call answered (200)" in caller.stdout
    # `sip-bridge call` presses its keys (RFC 4733 when negotiated, else SIP INFO).
    assert _tones(phone) == ["4", "7"], phone.reader.text()[-3000:]
    assert_tone(bridge_heard, 1100)
    assert_tone(phone_heard, 500)

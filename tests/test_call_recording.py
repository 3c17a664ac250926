"""Stereo call recordings: the caller on the left, the agent on the right, in step."""

from __future__ import annotations

import asyncio
import wave
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from agent.base import Agent, AgentOutput, CallInfo, TurnCompleted
from sip_bridge.config.loader import load_config
from sip_bridge.media.call_recording import MUTE_HANGOVER, StereoRecorder, recording_path
from sip_bridge.ops.records import CallRecords
from sip_bridge.script.caller import CallOptions, place_call
from sip_bridge.server import BridgeServer
from testkit.sipp_media import write_wav


def _read(path: Path) -> tuple[NDArray[np.int16], NDArray[np.int16]]:
    with wave.open(str(path), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (2, 2, 8000)
        x = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    return x[0::2], x[1::2]


def _tone(freq: float, n: int, start: int = 0) -> NDArray[np.int16]:
    t = (np.arange(n) + start) / 8000
    return (8000 * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def _hz(x: NDArray[np.int16]) -> float:
    spectrum = np.abs(np.fft.rfft(x.astype(np.float64) * np.hanning(x.size)))
    return float(np.fft.rfftfreq(x.size, 1 / 8000)[int(np.argmax(spectrum))])


def test_channels_stay_in_step_and_the_end_is_padded(tmp_path: Path) -> None:
    rec = StereoRecorder(tmp_path / "r.wav")
    for k in range(120):  # 2.4 s; the agent's side misses one frame (a DTMF slot: silence)
        rec.caller(_tone(440, 160, 160 * k))
        if k == 60:
            rec.agent_silence(160)
        else:
            rec.agent(_tone(1000, 160, 160 * k))
    rec.caller(_tone(440, 160))  # one more caller frame: the agent's side is padded
    rec.close()
    rec.close()  # twice is harmless
    left, right = _read(rec.path)
    assert left.size == right.size == 121 * 160 == rec.samples
    assert abs(_hz(left[:8000]) - 440) < 5 and abs(_hz(right[:8000]) - 1000) < 5
    assert not right[60 * 160 : 61 * 160].any() and right[59 * 160 : 60 * 160].any()
    assert not right[-160:].any()


def test_muted_stretches_and_their_hangover_are_silence_on_both_sides(tmp_path: Path) -> None:
    """While the agent asks for a sensitive slot nothing of either side is kept, nor for
    half a second after (the last key's tone, the jitter buffer's lag)."""
    muted = [False]
    rec = StereoRecorder(tmp_path / "m.wav", lambda: muted[0])
    for k in range(200):  # 4 s: muted from 1 s to 2 s
        muted[0] = 50 <= k < 100
        rec.caller(_tone(440, 160, 160 * k))
        rec.agent(_tone(1000, 160, 160 * k))
    rec.close()
    left, right = _read(rec.path)
    quiet = slice(50 * 160, 100 * 160 + MUTE_HANGOVER)
    assert not left[quiet].any() and not right[quiet].any()
    assert np.array_equal(left[: 50 * 160], _tone(440, 50 * 160))  # before: untouched
    assert abs(_hz(left[:8000]) - 440) < 5 and abs(_hz(right[-8000:]) - 1000) < 5
    after = slice(100 * 160 + MUTE_HANGOVER, None)
    assert np.count_nonzero(left[after]) > 0.9 * left[after].size


def test_the_callers_side_is_blanked_after_the_fact_on_disk_and_in_waiting(
    tmp_path: Path,
) -> None:
    """A card number heard in a turn: the caller's side goes silent back to a sample, both
    what was written to the file already and what waits to be; the agent's side stays."""
    rec = StereoRecorder(tmp_path / "b.wav")
    for k in range(150):  # 3 s; whole seconds go to disk, the rest waits
        rec.caller(_tone(440, 160, 160 * k))
        rec.agent(_tone(1000, 160, 160 * k))
    mark = 4000  # half a second in
    rec.silence_caller(mark)
    assert rec.caller_samples == 150 * 160
    for k in range(150, 200):  # what comes after is kept
        rec.caller(_tone(440, 160, 160 * k))
        rec.agent(_tone(1000, 160, 160 * k))
    rec.close()
    left, right = _read(rec.path)
    assert left[:mark].any() and not left[mark : 150 * 160].any()
    assert np.count_nonzero(left[150 * 160 :]) > 0.9 * 50 * 160
    assert abs(_hz(right[mark : 150 * 160]) - 1000) < 5  # the agent's side is whole


def _record_a_call(
    server: BridgeServer, play: Path, seconds: float
) -> tuple[NDArray[np.int16], NDArray[np.int16]]:
    """One call of ``play`` to ``server`` (its records next to ``play``): the recording."""

    async def main() -> None:
        await server.start()
        try:
            result = await place_call(CallOptions(
                f"sip:rec@127.0.0.1:{server.port}", play, play.with_name("heard.wav"),
                duration_s=seconds, rtp_ports=(45900, 45999),
            ))  # fmt: skip
            assert result.answered
            for _ in range(50):
                if not server.calls:
                    break
                await asyncio.sleep(0.05)
        finally:
            await server.stop()

    asyncio.run(main())
    (wav,) = (play.parent / "rec").glob("*.wav")
    return _read(wav)


def test_recording_path_is_safe_and_dated(tmp_path: Path) -> None:
    p = recording_path(tmp_path, "a/b c@host", when=0.0)
    assert p.parent == tmp_path and p.name == "19700101-000000_a_b_c@host.wav"


def test_a_recorded_call_holds_both_sides(tmp_path: Path) -> None:
    f = tmp_path / "bridge.toml"
    f.write_text(
        '[sip]\nlisten = "127.0.0.1:0"\n[rtp]\nports = "45800-45899"\n'
        '[agent]\nname = "echo"\n[agent.echo]\ndelay_s = 0.5\n[http]\nlisten = ""\n'
        '[records]\nenabled = true\ndb = "calls.sqlite"\nrecordings_dir = "rec"\n'
    )
    play = write_wav(tmp_path / "a.wav", _tone(440, 16000))
    left, right = _record_a_call(BridgeServer(load_config(f)), play, 3.0)
    assert 2.5 * 8000 <= left.size <= 3.6 * 8000
    # left: what the caller said (440 Hz from the start); right: the echo, 0.5 s later
    on_left = int(np.flatnonzero(np.abs(left) > 2000)[0])
    on_right = int(np.flatnonzero(np.abs(right) > 2000)[0])
    assert abs((on_right - on_left) - 4000) <= 320  # the echo's delay, within two frames
    assert abs(_hz(left[on_left : on_left + 8000]) - 440) < 5
    assert abs(_hz(right[on_right : on_right + 8000]) - 440) < 5
    records = CallRecords(tmp_path / "calls.sqlite", readonly=True)
    (row,) = records.list()
    shown = records.show(row["call_id"])
    records.close()
    assert shown is not None
    (wav,) = (tmp_path / "rec").glob("*.wav")
    assert [e["data"]["path"] for e in shown["events"] if e["kind"] == "recording"] == [str(wav)]


class _CardTurnAgent(Agent):
    """Listens 1 s, reports a turn; then 1.5 s later a turn in which the caller said a card
    number (as if the ASR wrote it); then plays on."""

    name = "card-turn"
    sample_rate = 8000

    def __init__(self) -> None:
        self.ticks = 0
        self.out: AgentOutput | None = None

    async def start(self, call: CallInfo, output: AgentOutput) -> None:
        self.out = output

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        self.ticks += 1
        if self.out is None:
            return
        if self.ticks == 50:
            self.out.emit(TurnCompleted("hello there", "Hi.", {}))
        elif self.ticks == 125:
            self.out.emit(TurnCompleted("my card is 4111 1111 1111 1111", "Thanks.", {}))


def test_a_turn_with_a_card_number_blanks_the_callers_side_back_to_the_turn_before(
    tmp_path: Path,
) -> None:
    """Outside a sensitive slot the card number is only known once the ASR wrote it: the
    caller's side is then silenced back to the previous turn (less a second), on disk."""
    f = tmp_path / "bridge.toml"
    f.write_text(
        '[sip]\nlisten = "127.0.0.1:0"\n[rtp]\nports = "45800-45899"\n'
        '[agent]\nname = "echo"\n[http]\nlisten = ""\n'
        '[records]\nenabled = true\ndb = "calls.sqlite"\nrecordings_dir = "rec"\n'
    )
    play = write_wav(tmp_path / "a.wav", _tone(440, 5 * 8000))
    server = BridgeServer(load_config(f), agent_factory=lambda cfg: _CardTurnAgent())
    left, _ = _record_a_call(server, play, 4.0)
    first, second = 50 * 160, 125 * 160  # the two turns' positions on the caller's side
    blank = slice(first - 8000 + 320, second - 320)  # a frame's slack at each end
    assert not left[blank].any(), "the turn with the card number, and a second before it"
    assert np.count_nonzero(left[second + 800 : second + 8000]) > 6000, "after it: kept"
    records = CallRecords(tmp_path / "calls.sqlite", readonly=True)
    (row,) = records.list()
    shown = records.show(row["call_id"])
    records.close()
    assert shown is not None
    assert [t["caller_text"] for t in shown["turns"]] == [
        "hello there",
        "my card is [redacted 16 digits]",
    ]

"""Stereo call recordings: the caller on the left, the agent on the right, in step."""

from __future__ import annotations

import asyncio
import wave
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from sipp_media import write_wav

from sip_bridge.call_recording import StereoRecorder, recording_path
from sip_bridge.caller import CallOptions, place_call
from sip_bridge.config import load_config
from sip_bridge.records import CallRecords
from sip_bridge.server import BridgeServer


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

    async def main() -> None:
        server = BridgeServer(load_config(f))
        await server.start()
        try:
            result = await place_call(CallOptions(
                f"sip:echo@127.0.0.1:{server.port}", play, tmp_path / "heard.wav",
                duration_s=3.0, rtp_ports=(45900, 45999),
            ))  # fmt: skip
            assert result.answered
            for _ in range(50):
                if not server.calls:
                    break
                await asyncio.sleep(0.05)
        finally:
            await server.stop()

    asyncio.run(main())
    (wav,) = (tmp_path / "rec").glob("*.wav")
    left, right = _read(wav)
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
    assert [e["data"]["path"] for e in shown["events"] if e["kind"] == "recording"] == [str(wav)]

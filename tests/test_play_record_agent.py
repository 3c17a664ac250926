"""PlayRecordAgent: input-paced playback and an 8 kHz recording on the same timeline."""

from __future__ import annotations

import asyncio
import wave
from pathlib import Path

import numpy as np

from agent.base import CallInfo, DtmfEvent
from agent.lines.play_record import PlayRecordAgent
from testkit.agent_capture import Capture


def test_plays_one_frame_per_frame_heard_and_records_at_8k(tmp_path: Path) -> None:
    audio = np.arange(1200, dtype=np.int16)  # 2.5 frames of 480 samples at 24 kHz
    agent = PlayRecordAgent(audio, 24000)
    out = Capture()
    asyncio.run(agent.start(CallInfo("c"), out))
    t = np.arange(480 * 50) / 24000
    heard = (8000 * np.sin(2 * np.pi * 500 * t)).astype(np.int16)
    for k in range(50):
        agent.on_audio(heard[k * 480 : (k + 1) * 480])
    assert [w.size for w in out.chunks] == [480, 480, 240]  # then nothing: file done
    assert np.array_equal(np.concatenate(out.chunks), audio)
    assert agent.finished_playing
    agent.on_event(DtmfEvent("5"))
    assert agent.digits == "5"
    seconds = agent.save(tmp_path / "r.wav")
    assert abs(seconds - 1.0) < 0.01
    with wave.open(str(tmp_path / "r.wav"), "rb") as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (8000, 1, 2)
        rec = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float64)
    tail = rec[2000:]  # past the resampler's start-up
    spec = np.abs(np.fft.rfft(tail * np.hanning(tail.size)))
    assert abs(np.argmax(spec) * 8000 / tail.size - 500) < 10
    assert abs(20 * np.log10(np.sqrt(2 * np.mean(tail**2)) / 8000)) < 0.5

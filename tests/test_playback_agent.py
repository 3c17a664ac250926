"""PlaybackAgent: WAVs at any rate come out at 24 kHz with the right tone, level and length."""

from __future__ import annotations

import asyncio
import struct
import wave
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from agent.base import CallInfo, HangupEvent
from agent.lines.playback import PlaybackAgent, WavFormatError, load_wav
from resample import SUPPORTED_RATES, Resampler
from testkit.agent_capture import Capture

FRAME = 480


def _tone(rate: int, freq: float, seconds: float, peak: float) -> NDArray[np.int16]:
    t = np.arange(round(rate * seconds)) / rate
    return np.rint(peak * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def _write_wav(path: Path, rate: int, pcm: NDArray[np.int16], channels: int = 1) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype("<i2").tobytes())
    return path


def _play(agent: PlaybackAgent, ticks: int) -> Capture:
    out = Capture()
    asyncio.run(agent.start(CallInfo(call_id="p"), out))
    silence = np.zeros(FRAME, np.int16)
    for i in range(ticks):
        out.tick = i
        agent.on_audio(silence)
    return out


def _rms_db(x: NDArray[np.float64]) -> float:
    return float(20 * np.log10(np.sqrt(np.mean(x**2))))


@pytest.mark.parametrize(
    ("rate", "freq"),
    [(8000, 1000.0), (16000, 3000.0), (22050, 2500.0), (24000, 440.0), (44100, 5000.0),
     (48000, 7000.0)],
)  # fmt: skip
def test_tone_at_any_rate_plays_at_24k_with_right_freq_level_and_length(
    tmp_path: Path, rate: int, freq: float
) -> None:
    src = _tone(rate, freq, 1.0, 10000.0)
    agent = PlaybackAgent(_write_wav(tmp_path / "t.wav", rate, src))
    assert agent.audio.size == 24000  # round(n * 24000 / rate)
    out = _play(agent, 60)
    y = out.audio.astype(np.float64)
    assert y.size == 24000  # duration to the sample, so certainly to a frame
    assert len(out.writes_at) == 50
    spec = np.abs(np.fft.rfft(y * np.hanning(y.size)))
    assert abs(int(np.argmax(spec)) - freq) <= 1  # 1 Hz bins
    mid = y[2400:-2400]  # away from the filters' start/end transients
    assert abs(_rms_db(mid) - _rms_db(src.astype(np.float64))) < 0.4
    # Aligned in time: the resampler's delay was removed to the nearest output sample, so it
    # matches the ideal 24 kHz tone delayed by only the sub-sample rest (0 for resample_poly).
    frac = 0.0
    if rate in SUPPORTED_RATES and rate != 24000:
        d = Resampler(rate, 24000).delay_samples_out
        frac = d - round(d)
    assert abs(frac) <= 0.5
    t = (np.arange(24000) - frac) / 24000
    ideal = (10000.0 * np.sin(2 * np.pi * freq * t))[2400:-2400]
    assert np.sqrt(np.mean((mid - ideal) ** 2)) / np.sqrt(np.mean(ideal**2)) < 0.05


def test_duration_of_odd_length_file_is_exact(tmp_path: Path) -> None:
    src = _tone(8000, 1000, 0.7777, 8000)  # 6222 samples -> 18666 at 24 kHz
    agent = PlaybackAgent(_write_wav(tmp_path / "t.wav", 8000, src))
    out = _play(agent, 100)
    assert out.audio.size == 18666
    assert len(out.writes_at) == -(-18666 // FRAME)  # 39 frames, the last one partial
    assert out.chunks[-1].size == 18666 % FRAME


def test_hangup_once_on_the_tick_after_the_last_samples(tmp_path: Path) -> None:
    src = _tone(24000, 440, 0.2, 8000)  # exactly 10 frames
    agent = PlaybackAgent(_write_wav(tmp_path / "t.wav", 24000, src))
    out = _play(agent, 30)
    assert out.writes_at == list(range(10))
    assert out.hangups_at == [10]
    assert out.events == [HangupEvent("playback finished")]
    assert agent.finished and agent.hung_up
    np.testing.assert_array_equal(out.audio, src)  # same rate: bit exact


def test_no_hangup_when_disabled(tmp_path: Path) -> None:
    src = _tone(24000, 440, 0.1, 8000)
    agent = PlaybackAgent(_write_wav(tmp_path / "t.wav", 24000, src), hangup_at_end=False)
    out = _play(agent, 20)
    assert out.events == [] and out.audio.size == src.size and agent.finished


def test_loop_repeats_seamlessly(tmp_path: Path) -> None:
    src = _tone(24000, 500, 0.05, 8000)  # 1200 samples: 2.5 frames, so loops cross frames
    agent = PlaybackAgent(_write_wav(tmp_path / "t.wav", 24000, src), loop=True)
    out = _play(agent, 25)
    y = out.audio
    assert y.size == 25 * FRAME  # never short, never ends
    np.testing.assert_array_equal(y, np.tile(src, 10))
    assert out.events == [] and not agent.finished
    assert agent.loops_started == 10


def test_loop_of_file_shorter_than_a_frame(tmp_path: Path) -> None:
    src = np.arange(100, dtype=np.int16)
    agent = PlaybackAgent(_write_wav(tmp_path / "t.wav", 24000, src), loop=True)
    out = _play(agent, 3)
    np.testing.assert_array_equal(out.audio, np.tile(src, 15)[: 3 * FRAME])


def test_stereo_is_downmixed(tmp_path: Path) -> None:
    left = _tone(48000, 1000, 0.5, 12000)
    right = _tone(48000, 3000, 0.5, 6000)
    inter = np.stack((left, right), axis=1).reshape(-1)
    agent = PlaybackAgent(_write_wav(tmp_path / "s.wav", 48000, inter, channels=2))
    y = agent.audio.astype(np.float64)
    assert y.size == 12000
    spec = np.abs(np.fft.rfft(y)) * 2 / y.size  # 2 Hz bins, amplitude scale
    # Each channel at half its level, within the resampler's 0.35 dB passband ripple.
    assert abs(20 * np.log10(spec[500] / 6000)) < 0.4
    assert abs(20 * np.log10(spec[1500] / 3000)) < 0.4
    # Same channel twice: downmix is that channel unchanged.
    same = np.stack((left, left), axis=1).reshape(-1)
    mono = load_wav(_write_wav(tmp_path / "m.wav", 48000, same, channels=2), 48000)
    np.testing.assert_array_equal(mono, left)


@pytest.mark.parametrize("level_db", [-6.0, 6.0])
def test_level_db_gain_and_clipping(tmp_path: Path, level_db: float) -> None:
    src = _tone(24000, 1000, 0.2, 20000)
    y = load_wav(_write_wav(tmp_path / "t.wav", 24000, src), 24000, level_db=level_db)
    if level_db < 0:
        assert abs(_rms_db(y.astype(np.float64)) - _rms_db(src.astype(np.float64)) + 6) < 0.01
    else:
        assert int(y.max()) == 32767 and int(y.min()) == -32767  # clipped symmetrically


def test_other_agent_rate(tmp_path: Path) -> None:
    src = _tone(44100, 1000, 0.5, 8000)
    y = load_wav(_write_wav(tmp_path / "t.wav", 44100, src), 16000)
    assert y.size == 8000
    assert int(np.argmax(np.abs(np.fft.rfft(y.astype(np.float64))))) == 500


def _raw_wav(path: Path, fmt: int, channels: int, rate: int, bits: int, data: bytes) -> Path:
    block = channels * bits // 8
    fmt_chunk = struct.pack("<HHIIHH", fmt, channels, rate, rate * block, block, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt_chunk
    body += b"data" + struct.pack("<I", len(data)) + data
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    return path


def _extensible(path: Path, subformat: int, bits: int) -> Path:
    """A WAVE_FORMAT_EXTENSIBLE file (what sox and most editors write for float or > 2 ch)."""
    block = bits // 8
    guid = struct.pack("<H", subformat) + bytes.fromhex("000000001000800000aa00389b71")
    fmt = struct.pack("<HHIIHH", 0xFFFE, 1, 8000, 8000 * block, block, bits)
    fmt += struct.pack("<HHI", 22, bits, 4) + guid
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", 400) + b"\0" * 400
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: _raw_wav(p, 3, 1, 24000, 32, b"\0" * 400), "32-bit float WAV is not su"),
        (lambda p: _extensible(p, 3, 32), r"32-bit float WAV \(WAVE_FORMAT_EXTENSIBLE\) is not"),
        (lambda p: _raw_wav(p, 7, 1, 8000, 8, b"\xff" * 400), "8-bit mu-law WAV is not supp"),
        (lambda p: _raw_wav(p, 1, 1, 24000, 8, b"\x80" * 400), "8-bit PCM WAV is not supported"),
        (lambda p: _raw_wav(p, 1, 1, 24000, 24, b"\0" * 300), "24-bit PCM WAV is not supported"),
        (lambda p: _raw_wav(p, 1, 4, 24000, 16, b"\0" * 800), "4 channels"),
        (lambda p: _raw_wav(p, 1, 1, 24000, 16, b""), "contains no audio"),
        (lambda p: p.write_bytes(b"ID3\x03 this is an mp3") and p, "not a WAV file"),
        (lambda p: p.write_bytes(b"") and p, "not a WAV file"),
    ],
)
def test_bad_files_give_clear_errors(tmp_path: Path, make: object, message: str) -> None:
    path = tmp_path / "bad.wav"
    make(path)  # type: ignore[operator]
    with pytest.raises(WavFormatError, match=message) as info:
        PlaybackAgent(path)
    assert str(path) in str(info.value) and "unknown format" not in str(info.value)
    if "not supported" in message or "not a WAV" in message:
        assert str(info.value).endswith(
            "use 16-bit PCM (e.g. `sox in.wav -b 16 -e signed-integer out.wav`)"
        )
    assert isinstance(info.value, ValueError)


def test_missing_file_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        PlaybackAgent(tmp_path / "nope.wav")


def test_not_started_or_stopped_writes_nothing(tmp_path: Path) -> None:
    agent = PlaybackAgent(_write_wav(tmp_path / "t.wav", 24000, _tone(24000, 440, 0.1, 1)))
    agent.on_audio(np.zeros(FRAME, np.int16))  # before start: ignored
    out = _play(agent, 1)
    asyncio.run(agent.stop())
    agent.on_audio(np.zeros(FRAME, np.int16))
    assert len(out.chunks) == 1 and agent.name == "playback" and agent.duration_s == 0.1

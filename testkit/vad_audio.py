"""Audio for the VAD's tests (tests/test_vad.py, tests/test_vad_gate.py): Silero at either
rate, speech read and brought to the line's 8 kHz, and the rate the agent's floor VAD
hears (16 kHz, upsampled as the agent does for its ASR)."""

from __future__ import annotations

import subprocess
import wave
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from agent.voice.vad import SileroVad
from resample.resampler import Resampler
from testkit.models import model_file

__all__ = ["FRAME", "RATE", "beckett_8k", "espeak_8k", "read_pcm", "resampled", "silero"]

RATE = 8000
FRAME = 160  # 20 ms at 8 kHz: what the bridge hands the agent per tick


def silero(sample_rate: int = RATE) -> SileroVad:
    """The shipped Silero VAD on one thread, at ``sample_rate``."""
    return SileroVad(model_file("silero-vad", "silero_vad.onnx"), threads=1,
                     sample_rate=sample_rate)  # fmt: skip


def read_pcm(path: Path) -> tuple[NDArray[np.int16], int]:
    """A mono 16-bit WAV's samples and rate."""
    with wave.open(str(path)) as w:
        assert w.getnchannels() == 1 and w.getsampwidth() == 2
        return np.frombuffer(w.readframes(w.getnframes()), np.int16).copy(), w.getframerate()


def resampled(x: NDArray[np.int16], rate: int, to: int) -> NDArray[np.int16]:
    """``x`` at ``rate`` brought to ``to``, the resampler flushed."""
    r = Resampler(rate, to)
    return np.concatenate((r.process(x), r.flush()))


def espeak_8k(text: str, tmp: Path, voice: str = "en-us") -> NDArray[np.int16]:
    """``text`` in espeak-ng's ``voice`` at 160 words a minute, at 8 kHz."""
    out = tmp / "speech.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-s", "160", "-w", str(out), text], check=True)
    x, rate = read_pcm(out)
    assert rate == 22050
    return resampled(x, rate, RATE)


def beckett_8k() -> NDArray[np.int16]:
    """The Beckett recording (a man, six phrases) at 8 kHz."""
    x, rate = read_pcm(model_file("beckett", "beckett.wav"))
    assert rate == 16000
    return resampled(x, rate, RATE)

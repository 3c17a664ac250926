"""VoiceModels hands the agent 8 kHz speech, resampled in the executor thread (tested with a
stand-in voice: no ONNX here; the real models are exercised by test_voice_call)."""

from __future__ import annotations

import threading
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from agent.voice.voice_models import FIRST_WORDS, VoiceModels
from agent.voice_settings import ModelSettings
from testkit.peers.support import dominant_hz


class ToneVoice:
    """22050 Hz 'speech': 0.3 s of 1 kHz per word."""

    sample_rate = 22050

    def __init__(self) -> None:
        self.said: list[str] = []

    def synthesize(self, sentence: str) -> NDArray[np.int16]:
        self.said.append(sentence)
        n = round(0.3 * self.sample_rate) * len(sentence.split())
        return (8000 * np.sin(2 * np.pi * 1000 * np.arange(n) / self.sample_rate)).astype(np.int16)


def _models(voice: ToneVoice) -> VoiceModels:
    stub = cast(Any, object())
    return VoiceModels(
        ModelSettings(workers=1), vad=stub, turn=stub, asr=stub, tts=cast(Any, voice)
    )


def test_speak_yields_each_piece_at_8k_and_stops_when_cancelled() -> None:
    voice = ToneVoice()
    models = _models(voice)
    text = "Order 1 2 3 4 5 shipped on Monday. It should arrive by Thursday."
    out = list(models.speak(text, threading.Event()))
    starts = [s for s, pcm in out if pcm is None]
    audio = [pcm for _, pcm in out if pcm is not None]
    assert starts == voice.said and len(starts) == 3  # first piece cut short for speed
    assert len(starts[0].split()) <= FIRST_WORDS + 1
    for sentence, pcm in zip(starts, audio, strict=True):
        expected = 0.3 * 8000 * len(sentence.split())
        assert abs(pcm.size - expected) <= 40  # 8 kHz (the stream's filter delay aside)
    assert abs(dominant_hz(np.concatenate(audio)[400:], 8000) - 1000) < 5
    cancel = threading.Event()
    it = models.speak(text, cancel, skip=1)
    assert next(it) == (starts[1], None)  # skip: the first piece was spoken already
    cancel.set()
    assert [s for s, pcm in it if pcm is None] == []  # nothing after the cancel


def test_synthesize_gives_a_whole_piece_at_8k() -> None:
    models = _models(ToneVoice())
    pcm = models.synthesize("one two three")
    assert 7200 <= pcm.size <= 7200 + 48  # flushed: nothing held back (a <= 6 ms tail)
    assert abs(dominant_hz(pcm, 8000) - 1000) < 5

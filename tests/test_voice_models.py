"""VoiceModels hands the agent 8 kHz speech, resampled in the executor thread (tested with a
stand-in voice: no ONNX here; the real models are exercised by test_voice_call)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from agent.dialogue.fixed_phrases import fixed_pieces
from agent.dialogue.profile_loader import load_profile
from agent.voice.voice_models import FIRST_WORDS, VoiceModels
from agent.voice_settings import ModelSettings
from testkit.peers.support import dominant_hz

DEMO = Path(__file__).resolve().parents[1] / "config" / "agents" / "demo.toml"


class ToneVoice:
    """22050 Hz 'speech': 0.3 s of 1 kHz per word."""

    sample_rate = 22050
    voice_name = "tone#0"
    length_scale = 1.0

    def __init__(self) -> None:
        self.said: list[str] = []

    def synthesize(self, sentence: str) -> NDArray[np.int16]:
        self.said.append(sentence)
        n = round(0.3 * self.sample_rate) * len(sentence.split())
        return (8000 * np.sin(2 * np.pi * 1000 * np.arange(n) / self.sample_rate)).astype(np.int16)


def _models(voice: ToneVoice, cache_mb: int = 32) -> VoiceModels:
    stub = cast(Any, object())
    settings = ModelSettings(workers=1, phrase_cache_mb=cache_mb)
    return VoiceModels(settings, vad=stub, turn=stub, asr=stub, tts=cast(Any, voice))


def test_speak_yields_each_piece_at_8k_and_stops_when_cancelled() -> None:
    voice = ToneVoice()
    models = _models(voice)
    text = "Order 1 2 3 4 5 shipped on Monday. It should arrive by Thursday."
    out = list(models.speak(text, threading.Event()))
    assert list(models.speak(text, threading.Event())) == out  # said again: from the cache
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


def test_a_profiles_fixed_phrases_are_rendered_ahead_and_calls_reuse_them() -> None:
    voice = ToneVoice()
    models = _models(voice)
    profile = load_profile(DEMO)
    pieces = fixed_pieces(profile, first_max_words=FIRST_WORDS)
    models.warm_phrases(pieces)
    deadline = time.monotonic() + 10
    while len(voice.said) < len(pieces) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(voice.said) == sorted(pieces)  # each once, in the background
    greeting = profile.greeting.render(dict(profile.variables))
    said = [s for s, pcm in models.speak(greeting, threading.Event()) if pcm is not None]
    assert said and set(said) <= set(pieces) and len(voice.said) == len(pieces)  # no render
    # a reply with the caller's order number: only the sentence holding it is rendered
    reply = "Done. I've asked for order 1 2 3 4 5 to be cancelled. Anything else?"
    list(models.speak(reply, threading.Event()))
    assert voice.said[len(pieces) :] == ["I've asked for order 1 2 3 4 5 to be cancelled."]
    models.warm_phrases(pieces)  # a reload with the same profile renders nothing again
    time.sleep(0.1)
    assert len(voice.said) == len(pieces) + 1
    models.close()


def test_with_the_cache_off_every_piece_is_rendered_when_said() -> None:
    voice = ToneVoice()
    models = _models(voice, cache_mb=0)
    for _ in range(2):
        list(models.speak("Anything else?", threading.Event()))
    assert voice.said == ["Anything else?", "Anything else?"]

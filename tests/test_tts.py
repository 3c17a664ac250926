"""Piper TTS: what the caller would hear (band, level, duration, words), streamed and cancelled.

Every check is on the audio itself; no timing assertions (the machine is shared).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from agent.voice.asr import MoonshineAsr
from agent.voice.tts import PiperTts, normalize_for_speech
from resample.g711 import ulaw_decode, ulaw_encode
from resample.resampler import Resampler
from testkit.models import model_file as _model_file

SR = PiperTts.sample_rate
OFFICE = "Our office is open from nine to five, Monday to Friday."


@pytest.fixture(scope="module")
def tts() -> PiperTts:
    voice = PiperTts(_model_file("piper-joe-medium", "en_US-joe-medium.onnx"), threads=1)
    _model_file("piper-joe-medium", "en_US-joe-medium.onnx.json")
    return voice


def _resample(x: NDArray[np.int16], rate_in: int, rate_out: int) -> NDArray[np.int16]:
    r = Resampler(rate_in, rate_out)
    return np.concatenate([r.process(x), r.flush()]).astype(np.int16)


def _band_fraction(x: NDArray[np.int16], rate: int, lo: float, hi: float) -> float:
    spec = np.abs(np.fft.rfft(x.astype(np.float64))) ** 2
    freqs = np.fft.rfftfreq(x.size, 1.0 / rate)
    return float(spec[(freqs >= lo) & (freqs <= hi)].sum() / spec.sum())


def _dbfs(x: NDArray[np.int16]) -> float:
    rms = np.sqrt(np.mean(np.square(x.astype(np.float64))))
    return float(20 * np.log10(rms / 32768.0 + 1e-12))


def _speech(pcm: NDArray[np.int16]) -> NDArray[np.int16]:
    """The samples before the trailing pause (``synthesize`` appends exact zeros)."""
    nz = np.flatnonzero(pcm)
    return pcm[: int(nz[-1]) + 1]


def test_speech_band_level_and_duration(tts: PiperTts) -> None:
    pcm = tts.synthesize(OFFICE)
    speech = _speech(pcm)
    words = len(OFFICE.split())
    assert 0.2 <= speech.size / SR / words <= 0.6
    assert _band_fraction(speech, SR, 100, 4000) > 0.85
    assert -30.0 < _dbfs(speech) < -12.0  # a normal telephone speech level
    assert np.max(np.abs(speech.astype(np.int32))) <= int(0.89 * 32767) + 1
    # active all along: no 20 ms window in the middle is digital silence
    frames = speech[: speech.size // 441 * 441].reshape(-1, 441).astype(np.float64)
    assert np.sqrt(np.mean(frames**2, axis=1)).max() > 1000


def test_speech_starts_at_once_and_ends_with_a_pause(tts: PiperTts) -> None:
    pcm = tts.synthesize("Hello there.")
    # trimmed: speech within the first 50 ms (Piper's raw output starts with ~40 ms of hush)
    assert _dbfs(pcm[: int(0.05 * SR)]) > -45
    raw = tts.raw("Hello there.")
    assert 20 * np.log10(np.sqrt(np.mean(raw[: int(0.02 * SR)] ** 2)) + 1e-12) < -40
    # a sentence end leaves 250 ms of silence, a comma 80 ms
    assert pcm.size - _speech(pcm).size == pytest.approx(0.25 * SR, abs=1)
    comma = tts.synthesize("Thank you for calling,")
    assert comma.size - _speech(comma).size == pytest.approx(0.08 * SR, abs=1)
    assert tts.synthesize("...").size == 0
    assert tts.synthesize("   ").size == 0


def test_same_text_gives_the_same_samples(tts: PiperTts) -> None:
    a = tts.synthesize("Please hold while I check that for you.")
    b = tts.synthesize("Please hold while I check that for you.")
    assert np.array_equal(a, b)


def test_two_sentences_stream_as_two_chunks(tts: PiperTts) -> None:
    chunks = list(tts.stream("Hello there. How are you today?"))
    assert len(chunks) == 2
    assert np.array_equal(chunks[0], tts.synthesize("Hello there."))
    assert np.array_equal(chunks[1], tts.synthesize("How are you today?"))
    assert chunks[1].size > chunks[0].size  # 5 syllables vs 3, same pause


def test_cancel_after_the_first_chunk_stops_the_rest(tts: PiperTts) -> None:
    cancel = threading.Event()
    got: list[NDArray[np.int16]] = []
    for chunk in tts.stream("One moment. Let me check. Still checking. Done.", cancel):
        got.append(chunk)
        cancel.set()  # the caller barged in while the first sentence played
    assert len(got) == 1
    assert list(tts.stream("Hello. Bye.", cancel)) == []  # already cancelled: nothing at all


def test_cancel_during_synthesis_yields_no_stale_audio(
    tts: PiperTts, monkeypatch: pytest.MonkeyPatch
) -> None:
    cancel = threading.Event()
    real = tts.synthesize
    done: list[str] = []

    def synthesize(sentence: str) -> NDArray[np.int16]:
        pcm = real(sentence)
        done.append(sentence)
        if len(done) == 2:
            cancel.set()  # barge-in lands while the second sentence is being made
        return pcm

    monkeypatch.setattr(tts, "synthesize", synthesize)
    chunks = list(tts.stream("First one. Second one. Third one.", cancel))
    assert len(chunks) == 1
    assert done == ["First one.", "Second one."]


def _phonemes_of(tts: PiperTts, *texts: str) -> Iterator[str]:
    yield from (tts.phonemes(t) for t in texts)


def test_numbers_and_times_are_spoken(tts: PiperTts) -> None:
    with_number = _speech(tts.synthesize("Your order number is 12345.")).size
    without = _speech(tts.synthesize("Your order number is.")).size
    # "twelve thousand three hundred forty five" takes well over a second
    assert (with_number - without) / SR > 1.2
    assert "θˈaʊzənd" in tts.phonemes("Your order number is 12345.")
    five, nine = _phonemes_of(tts, "We open at 5:00 tomorrow.", "We open at 9:30 tomorrow.")
    assert "klˈɑːk" in five and "zˈiəɹoʊ" not in five  # five o'clock, not "five zero zero"
    assert "nˈaɪn θˈɜːɾi" in nine
    assert _speech(tts.synthesize("We open at 5:00 tomorrow.")).size > _speech(
        tts.synthesize("We open tomorrow.")
    ).size + int(0.4 * SR)


def test_normalisation_for_the_phone() -> None:
    assert normalize_for_speech("Call Dr. Smith at 5:00 pm.") == "Call Doctor Smith at 5 pm."
    assert normalize_for_speech("Open 9:00 to 17:30.") == "Open 9 o'clock to 17:30."
    assert normalize_for_speech("Order #12345 costs $4.50, e.g. today.") == (
        "Order number 12345 costs 4 dollars 50, for example today."
    )
    assert normalize_for_speech("St. Mary's on Main St. now") == "Saint Mary's on Main St. now"
    assert normalize_for_speech("It is 12345.") == "It is 12345."  # numbers: espeak's job


def test_phone_path_keeps_the_speech(tts: PiperTts) -> None:
    """22050 Hz -> 8 kHz -> G.711 mu-law -> back: the speech band and level survive."""
    speech = _speech(tts.synthesize(OFFICE))
    narrow = _resample(speech, SR, 8000)
    line = ulaw_decode(ulaw_encode(narrow))
    assert line.size >= speech.size * 8000 / SR - 2  # (plus the filter's delay, flushed)
    assert _band_fraction(line, 8000, 300, 3400) > 0.8
    assert abs(_dbfs(line) - _dbfs(speech)) < 1.5  # the level is what we sent
    # the codec adds only its quantisation noise: SNR of mu-law on speech is ~35 dB
    noise = line.astype(np.float64) - narrow
    snr = 10 * np.log10(np.sum(narrow.astype(np.float64) ** 2) / np.sum(noise**2))
    assert snr > 30


@pytest.fixture(scope="module")
def asr() -> MoonshineAsr:
    _model_file("moonshine-base-en", "encoder_model.onnx")  # fails clearly if not fetched
    return MoonshineAsr(threads=1)


def test_asr_hears_the_words_over_the_phone(tts: PiperTts, asr: MoonshineAsr) -> None:
    """TTS -> 8 kHz mu-law (what the caller gets) -> 16 kHz -> Moonshine: the words come back."""
    pcm = np.concatenate(list(tts.stream(OFFICE)))
    line = ulaw_decode(ulaw_encode(_resample(pcm, SR, 8000)))
    text = asr.transcribe(_resample(line, 8000, 16000)).lower()
    for digit, word in (("9", "nine"), ("5", "five")):
        text = text.replace(digit, word)
    for word in ("office", "open", "nine", "five", "monday", "friday"):
        assert word in text, text


def test_missing_model_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nowhere\.onnx"):
        PiperTts(tmp_path / "nowhere.onnx")


def test_fixed_noise_is_normal_repeatable_and_respects_mean_and_scale() -> None:
    """The noise that replaces RandomNormalLike: N(mean, scale), the same every run."""
    import onnx
    import onnxruntime as ort  # type: ignore[import-untyped]
    from onnx import TensorProto, helper

    from agent.voice.tts import fix_noise

    node = helper.make_node("RandomNormalLike", ["x"], ["y"], mean=5.0, scale=2.0)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)], ir_version=8)
    assert fix_noise(model) == 1
    assert fix_noise(model) == 0  # already fixed
    onnx.checker.check_model(model)
    x = np.zeros((192, 400), np.float32)
    runs = [
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": x}
        )[0]
        for _ in range(2)
    ]
    assert runs[0].shape == x.shape
    assert np.array_equal(runs[0], runs[1])
    assert abs(float(runs[0].mean()) - 5.0) < 0.02 and abs(float(runs[0].std()) - 2.0) < 0.02
    # no structure along time or channels: neighbouring samples are uncorrelated
    flat = runs[0].ravel() - 5.0
    assert abs(float(np.corrcoef(flat[:-1], flat[1:])[0, 1])) < 0.02

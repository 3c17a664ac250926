"""End of turn: the log-mel features, smart-turn v3.2 on a real human voice, EndOfTurn's logic.

beckett.wav is a man reading "Ever tried. Ever failed. No matter. Try again. Fail again.
Fail better." with a pause after each sentence. The sentences are found by energy alone
(six loud runs, as the text has six sentences), then cut at a sentence end or mid-word.
"""

from __future__ import annotations

import itertools
import wave
from collections.abc import Callable
from concurrent.futures import Executor, Future
from functools import cache
from typing import Any

import numpy as np
import pytest
import scipy.signal
from numpy.typing import NDArray

from agent.voice.melspec import HOP, N_FFT, hann_periodic, log_mel, mel_filters, power_spectrogram
from agent.voice.turn import EndOfTurn, SmartTurn, TurnDecision
from agent.voice_settings import VoiceSettings
from testkit.models import model_file as _model_file

RATE = 16000
FRAME = 320  # 20 ms
THRESHOLD = VoiceSettings().turn_threshold  # the shipped default, 0.5
MARGIN = 0.15  # a decision asserted here is this far from the threshold


@cache
def _smart_turn() -> SmartTurn:
    return SmartTurn(_model_file("smart-turn-v3.2", "smart-turn-v3.2-cpu.onnx"), threads=2)


@cache
def _beckett() -> NDArray[np.int16]:
    with wave.open(str(_model_file("beckett", "beckett.wav"))) as w:
        assert w.getframerate() == RATE and w.getnchannels() == 1 and w.getsampwidth() == 2
        return np.frombuffer(w.readframes(w.getnframes()), np.int16).copy()


def _frame_db(x: NDArray[np.int16]) -> NDArray[np.float64]:
    f = x[: x.size // FRAME * FRAME].astype(np.float64).reshape(-1, FRAME)
    db: NDArray[np.float64] = 10 * np.log10(np.mean(f**2, axis=1) + 1.0)
    return db


def _sentences() -> list[tuple[int, int]]:
    """(start, end) samples of each loud run >= 100 ms, gaps < 300 ms bridged."""
    loud = _frame_db(_beckett()) > 52.0
    runs: list[list[int]] = []
    for i in np.flatnonzero(loud):
        if runs and i - runs[-1][1] <= 15:
            runs[-1][1] = int(i)
        else:
            runs.append([int(i), int(i)])
    return [(a * FRAME, (b + 1) * FRAME) for a, b in runs if b - a >= 4]


# -- features ---------------------------------------------------------------------------


def test_power_spectrum_matches_scipy_stft() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal(RATE).astype(np.float64)
    ours = power_spectrogram(x)
    # scipy's "even" boundary is numpy's reflect; its hann is periodic; undo its 1/sum(w).
    _, _, z = scipy.signal.stft(
        x, nperseg=N_FFT, noverlap=N_FFT - HOP, window="hann", boundary="even", padded=True
    )
    ref = np.abs(z * hann_periodic().sum()) ** 2
    n = x.size // HOP + 1
    assert ours.shape == (N_FFT // 2 + 1, n)
    np.testing.assert_allclose(ours, ref[:, :n], rtol=1e-9, atol=1e-9 * ref.max())


def test_mel_filters_are_slaney() -> None:
    fb = mel_filters()
    assert fb.shape == (80, N_FFT // 2 + 1)
    hz = np.linspace(0, RATE / 2, fb.shape[1])
    peaks = hz[np.argmax(fb, axis=1)]
    assert np.all(np.diff(peaks) >= 0)
    # Slaney scale: 3 mel per 200 Hz below 1 kHz, 27 mel per factor 6.4 above; 82 edges
    # evenly spaced in mel from 0 to 8 kHz, so band k peaks at (k + 1) * step Hz below 1 kHz.
    mel_top = 15 + np.log(8.0) * 27 / np.log(6.4)
    step_hz = mel_top / 81 * 200 / 3
    low = np.arange(20)
    assert np.all(np.abs(peaks[low] - (low + 1) * step_hz) <= 20.0)  # within half a bin
    # Unit area in Hz ("slaney" norm): check the wide upper bands, where bins resolve them.
    area = fb.sum(axis=1) * (hz[1] - hz[0])
    np.testing.assert_allclose(area[45:], 1.0, rtol=0.03)


def test_tone_lights_its_band_and_range_is_whisper_like() -> None:
    t = np.arange(8 * RATE) / RATE
    feats = log_mel((0.3 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32))
    assert feats.shape == (80, 800) and feats.dtype == np.float32
    band = int(np.argmax(feats[:, 400]))
    hz = np.linspace(0, RATE / 2, N_FFT // 2 + 1)
    centre = hz[np.argmax(mel_filters()[band])]
    assert abs(centre - 1000) < 60
    # log10 clamped 8 below the max, then (x + 4) / 4: a range of exactly 2.
    assert feats.max() - feats.min() == pytest.approx(2.0, abs=1e-5)


def test_short_audio_is_zero_padded_at_the_start() -> None:
    x = _beckett()[: 3 * RATE]
    st = _smart_turn()
    padded = np.concatenate([np.zeros(5 * RATE, np.int16), x])
    np.testing.assert_array_equal(st.features(x), st.features(padded))
    long = _beckett()
    np.testing.assert_array_equal(st.features(long), st.features(long[-8 * RATE :]))
    # int16 and float input are the same signal
    xf = x.astype(np.float32) / np.float32(32768)
    np.testing.assert_allclose(st.features(x), st.features(xf))


# -- smart-turn on a human voice ---------------------------------------------------------


def test_beckett_has_six_sentences() -> None:
    s = _sentences()
    assert len(s) == 6, s
    gaps = [(b[0] - a[1]) / RATE for a, b in itertools.pairwise(s)]
    assert min(gaps) > 0.3  # he pauses after every sentence


def test_sentence_end_scores_complete_and_mid_word_does_not() -> None:
    """Decisions at the shipped threshold, each with 0.15 to spare (the score is the same
    on every CPU: see test_smart_turn_computes_the_exact_graph)."""
    st, x, s = _smart_turn(), _beckett(), _sentences()
    # "Ever failed." then 200 ms of its pause (what EndOfTurn sees with stop_s=0.2)...
    end2 = st.probability(x[: s[1][1] + int(0.2 * RATE)])
    # ... vs cut in the middle of "failed" and of "better".
    mid2 = st.probability(x[: (s[1][0] + s[1][1]) // 2 + int(0.15 * RATE)])
    mid6 = st.probability(x[: (s[5][0] + s[5][1]) // 2])
    end6 = st.probability(x[: s[5][1] + int(0.3 * RATE)])
    assert min(end2, end6) >= THRESHOLD + MARGIN, (end2, end6)
    assert max(mid2, mid6) <= THRESHOLD - MARGIN, (mid2, mid6)


def test_end_of_turn_on_beckett_ends_each_sentence_by_the_model() -> None:
    """Fed live 20 ms frames with a VAD that marks the six sentences, EndOfTurn ends a turn
    200 ms after every sentence end by the model (no timeout needed), never while he
    speaks. The model hears one sentence at a time: its own turn."""
    x, s = _beckett(), _sentences()
    eot = EndOfTurn(_smart_turn(), stop_s=0.2, max_silence_s=1.0, threshold=THRESHOLD)
    decisions = []
    for i in range(x.size // FRAME):
        eot.push(x[i * FRAME : (i + 1) * FRAME], speech=any(a <= i * FRAME < b for a, b in s))
        d = eot.decide()
        if d is not None:
            decisions.append(d)
    assert [d.speech_end for d in decisions] == [b for _, b in s]
    assert all(d.complete and d.reason == "model" for d in decisions), decisions
    assert all(d.latency_s() == pytest.approx(0.2) for d in decisions)
    assert min(d.probability for d in decisions) >= THRESHOLD + MARGIN, decisions


def test_smart_turn_computes_the_exact_graph() -> None:
    """Whichever graph this CPU runs, its scores are the uint8-weight graph's, which no
    x86-64 kernel computes inexactly (model_runtime/unsigned_weights.py): so every
    threshold decision in these tests is the same on AVX2, AVX-512 and VNNI machines."""
    import onnxruntime as ort  # type: ignore[import-untyped]

    st, x, s = _smart_turn(), _beckett(), _sentences()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    exact = ort.InferenceSession(
        str(_model_file("smart-turn-v3.2", "smart-turn-v3.2-cpu-u8.onnx")),
        opts,
        providers=["CPUExecutionProvider"],
    )
    name = exact.get_inputs()[0].name
    for _, b in s[:3]:
        w = x[: b + int(0.2 * RATE)]
        want = float(np.asarray(exact.run(None, {name: st.features(w)[None]})[0]).ravel()[0])
        assert st.probability(w) == pytest.approx(want, abs=1e-5), st.kernel


# -- EndOfTurn logic on scripted probabilities -------------------------------------------


class ScriptedTurn(SmartTurn):
    """Returns the next scripted probability; records the audio length it was given."""

    def __init__(self, probs: list[float]) -> None:
        self.probs = list(probs)
        self.lengths: list[int] = []

    def probability(self, pcm16k: NDArray[np.int16] | NDArray[np.float32]) -> float:
        self.lengths.append(int(np.asarray(pcm16k).size))
        return self.probs.pop(0)


def _drive(eot: EndOfTurn, pattern: str) -> list[tuple[int, TurnDecision]]:
    """pattern: one char per 20 ms frame, 's' speech / '.' silence; returns (frame, decision)."""
    out = []
    for i, c in enumerate(pattern):
        eot.push(np.full(FRAME, 100 if c == "s" else 0, np.int16), speech=c == "s")
        d = eot.decide()
        if d is not None:
            out.append((i, d))
    return out


def test_model_says_complete_after_stop_s() -> None:
    turn = ScriptedTurn([0.9])
    eot = EndOfTurn(turn, stop_s=0.2, max_silence_s=1.0)
    got = _drive(eot, "." * 40 + "s" * 50 + "." * 60)
    assert len(got) == 1
    i, d = got[0]
    assert i == 40 + 50 + 10 - 1  # the 10th silent frame: 200 ms after speech
    assert (d.reason, d.probability, d.complete) == ("model", 0.9, True)
    assert d.speech_end == 90 * FRAME and d.at_sample == 100 * FRAME
    # audio given: the turn plus 0.5 s before it (leading silence before that is not sent)
    assert turn.lengths == [(50 + 10 + 25) * FRAME]


def test_timeout_ends_turn_when_model_says_incomplete() -> None:
    turn = ScriptedTurn([0.1])
    eot = EndOfTurn(turn, stop_s=0.2, max_silence_s=1.0)
    got = _drive(eot, "s" * 30 + "." * 80)
    assert len(turn.lengths) == 1  # asked once per pause, not every frame
    assert len(got) == 1
    i, d = got[0]
    assert i == 30 + 50 - 1  # 1.0 s of silence
    assert (d.reason, d.probability) == ("timeout", 0.1)


def test_resumed_speech_rescored_and_timeout_restarts() -> None:
    turn = ScriptedTurn([0.2, 0.3, 0.95])
    eot = EndOfTurn(turn, stop_s=0.2, max_silence_s=1.0)
    # pause 0.6 s (< timeout) twice, then a final pause
    pattern = "s" * 20 + "." * 30 + "s" * 20 + "." * 40 + "s" * 10 + "." * 20
    got = _drive(eot, pattern)
    assert len(turn.lengths) == 3
    assert [g[0] for g in got] == [20 + 30 + 20 + 40 + 10 + 10 - 1]
    assert got[0][1].reason == "model"
    # each scoring saw more of the same turn
    assert turn.lengths[0] < turn.lengths[1] < turn.lengths[2]


def test_without_model_only_timeout_and_no_speech_never_ends() -> None:
    eot = EndOfTurn(None, stop_s=0.2, max_silence_s=0.6)
    assert _drive(eot, "." * 200) == []
    got = _drive(eot, "s" * 5 + "." * 40)
    assert [g[0] for g in got] == [5 + 30 - 1]
    d = got[0][1]
    assert d.reason == "timeout" and np.isnan(d.probability)
    # after a decision it waits for new speech: silence alone decides nothing
    assert _drive(eot, "." * 100) == []
    assert len(_drive(eot, "s" * 3 + "." * 40)) == 1


def test_window_is_capped_at_8_seconds() -> None:
    turn = ScriptedTurn([0.9])
    eot = EndOfTurn(turn, stop_s=0.2)
    _drive(eot, "s" * 600 + "." * 10)  # 12 s monologue
    assert turn.lengths == [8 * RATE]


class ManualExecutor(Executor):
    """Runs nothing until told: lets a test see decide() before and after the verdict."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self.jobs.append((fut, fn, args))
        return fut

    def run_all(self) -> None:
        jobs, self.jobs = self.jobs, []
        for fut, fn, args in jobs:
            if not fut.set_running_or_notify_cancel():  # cancelled while queued: not run
                continue
            try:
                fut.set_result(fn(*args))
            except Exception as exc:
                fut.set_exception(exc)


def _frame(speech: bool) -> NDArray[np.int16]:
    return np.full(FRAME, 100 if speech else 0, np.int16)


def test_executor_verdict_arrives_without_blocking() -> None:
    turn, ex = ScriptedTurn([0.9]), ManualExecutor()
    eot = EndOfTurn(turn, stop_s=0.2, executor=ex)
    assert _drive(eot, "s" * 20 + "." * 10) == []  # submitted at the 10th silent frame
    assert len(ex.jobs) == 1 and turn.lengths == []  # not run on this thread
    ex.run_all()
    eot.push(_frame(False), speech=False)
    d = eot.decide()
    assert d is not None and (d.reason, d.probability) == ("model", 0.9)
    assert d.at_sample - d.speech_end == 11 * FRAME  # one tick after the 200 ms pause


def test_executor_stale_verdict_dropped_when_speech_resumes() -> None:
    turn, ex = ScriptedTurn([0.1]), ManualExecutor()
    eot = EndOfTurn(turn, stop_s=0.2, max_silence_s=0.6, executor=ex)
    _drive(eot, "s" * 20 + "." * 10)
    stale = ex.jobs[0][0]
    assert _drive(eot, "s" * 5) == []  # he goes on before the verdict came back
    assert stale.cancelled()  # still queued: never run (the workers have other calls' jobs)
    assert _drive(eot, "." * 10) == []
    ex.run_all()  # the new pause: 0.1, so only the timeout ends it
    assert len(turn.lengths) == 1
    got = _drive(eot, "." * 20)
    assert [(g[0], g[1].reason, g[1].probability) for g in got] == [(19, "timeout", 0.1)]


def test_executor_verdict_already_running_is_ignored_when_speech_resumes() -> None:
    turn, ex = ScriptedTurn([0.1]), ManualExecutor()
    eot = EndOfTurn(turn, stop_s=0.2, max_silence_s=0.6, executor=ex)
    _drive(eot, "s" * 20 + "." * 10)
    running = ex.jobs[0][0]
    assert running.set_running_or_notify_cancel()  # a worker took it
    assert _drive(eot, "s" * 5) == []  # he goes on
    running.set_result(0.95)  # about the old pause: must not end the new one
    ex.jobs.pop(0)
    assert _drive(eot, "." * 10) == []
    ex.run_all()
    got = _drive(eot, "." * 20)
    assert [(g[0], g[1].reason, g[1].probability) for g in got] == [(19, "timeout", 0.1)]


def test_model_failure_falls_back_to_timeout() -> None:
    class Broken(ScriptedTurn):
        def probability(self, pcm16k: NDArray[np.int16] | NDArray[np.float32]) -> float:
            raise RuntimeError("onnx runtime error")

    ex = ManualExecutor()
    eot = EndOfTurn(Broken([]), stop_s=0.2, max_silence_s=0.6, executor=ex)
    _drive(eot, "s" * 5 + "." * 10)
    ex.run_all()
    got = _drive(eot, "." * 20)
    assert [(g[0], g[1].reason) for g in got] == [(19, "timeout")]
    assert np.isnan(got[0][1].probability)


def test_huge_frame_keeps_the_clock() -> None:
    eot = EndOfTurn(ScriptedTurn([0.9]), stop_s=0.2)
    eot.push(np.ones(10 * RATE, np.int16), speech=True)
    assert eot.clock == 10 * RATE
    eot.push(np.zeros(RATE // 5, np.int16), speech=False)
    d = eot.decide()
    assert d is not None and d.speech_end == 10 * RATE and d.at_sample == 10 * RATE + RATE // 5


def test_bad_timing_rejected() -> None:
    with pytest.raises(ValueError):
        EndOfTurn(None, stop_s=1.0, max_silence_s=0.5)

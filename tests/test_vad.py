"""agent.voice.vad on real audio: Silero VAD at the line's 8 kHz, its streams and batching,
the segmenter. The 16 kHz mode and the agent's VadGate: tests/test_vad_gate.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from agent.voice.vad import (
    SileroVad,
    SpeechSegmenter,
    SpeechStarted,
    SpeechStopped,
    VadEvent,
    VadRequest,
    VadResult,
    VadStream,
)
from model_runtime.batching import TickBatcher
from model_runtime.sessions import ModelRuntimeError
from resample import g711
from testkit.vad_audio import FRAME, RATE, beckett_8k, espeak_8k, silero

WINDOW_S = 256 / RATE

# "Ever tried. Ever failed. No matter. Try again. Fail again. Fail better.": six phrases,
# labelled by hand from a 10 ms energy envelope of the 16 kHz file (onset: rise above
# -40 dBFS; offset: the last fall below -50 dBFS before the pause), in seconds.
BECKETT_PHRASES = [
    (0.34, 1.27),
    (1.87, 2.85),
    (3.54, 4.11),
    (4.94, 5.52),
    (6.67, 7.41),
    (8.16, 8.86),
]


@pytest.fixture(scope="module")
def vad() -> SileroVad:
    return silero()


@pytest.fixture(scope="module")
def beckett() -> NDArray[np.int16]:
    return beckett_8k()


def _probs(vad: SileroVad, x: NDArray[np.int16]) -> NDArray[np.float64]:
    """As the bridge feeds it: 20 ms frames, one push per tick."""
    s = VadStream(vad)
    out: list[float] = []
    for i in range(0, x.size, FRAME):
        out += s.push(x[i : i + FRAME])
    assert s.windows == len(out) == x.size // 256
    return np.array(out)


def _events(probs: NDArray[np.float64]) -> list[VadEvent]:
    seg = SpeechSegmenter()
    return [e for p in probs if (e := seg.update(float(p))) is not None]


def _segments(events: list[VadEvent]) -> list[tuple[float, float]]:
    starts = [e.sample / RATE for e in events if isinstance(e, SpeechStarted)]
    stops = [e.sample / RATE for e in events if isinstance(e, SpeechStopped)]
    assert len(starts) == len(stops)
    return list(zip(starts, stops, strict=True))


def test_speech_vs_silence_noise_and_tone(vad: SileroVad, tmp_path: Path) -> None:
    speech = espeak_8k("Hello, I would like to check the balance of my account please.", tmp_path)
    loud = np.flatnonzero(np.abs(speech) > 300)
    p = _probs(vad, speech[loud[0] : loud[-1]])  # the spoken part only
    assert np.mean(p > 0.5) > 0.85, p.round(2)
    rng = np.random.default_rng(7)
    t = np.arange(3 * RATE) / RATE
    others: dict[str, NDArray[np.float64]] = {
        "silence": np.zeros(t.size),
        "noise -50 dBFS": rng.standard_normal(t.size) * 32768 * 10 ** (-50 / 20),
        "noise -30 dBFS": rng.standard_normal(t.size) * 32768 * 10 ** (-30 / 20),
        "1 kHz -6 dBFS": np.sin(2 * np.pi * 1000 * t) * 32767 * 0.5,
        "1 kHz -20 dBFS": np.sin(2 * np.pi * 1000 * t) * 32767 * 0.1,
    }
    for name, signal in others.items():
        q = _probs(vad, signal.astype(np.int16))
        assert q.max() < 0.2, (name, q.max())


def test_espeak_segment_matches_known_onset_and_offset(vad: SileroVad, tmp_path: Path) -> None:
    speech = espeak_8k("Please transfer me to the billing department.", tmp_path)
    pad = np.zeros(RATE, np.int16)
    x = np.concatenate((pad, speech, pad))
    loud = np.flatnonzero(np.abs(x) > 300)
    onset, offset = loud[0] / RATE, loud[-1] / RATE
    events = _events(_probs(vad, x))
    (start, stop), *rest = _segments(events)
    assert rest == []
    assert abs(start - onset) <= 2 * WINDOW_S, (start, onset)
    # Silero's probability decays over a window or two after the last sound
    assert 0 <= stop - offset <= 3 * WINDOW_S, (stop, offset)
    started, stopped = events
    # decided after min_speech (100 ms -> 4 windows) and min_silence (200 ms -> 7 windows)
    assert started.at - started.sample == 4 * 256
    assert stopped.at - stopped.sample == 7 * 256


def test_beckett_phrases_found_where_the_man_speaks(
    vad: SileroVad, beckett: NDArray[np.int16]
) -> None:
    p = _probs(vad, beckett)
    segments = _segments(_events(p))
    assert len(segments) == len(BECKETT_PHRASES), segments
    for (start, stop), (onset, offset) in zip(segments, BECKETT_PHRASES, strict=True):
        assert abs(start - onset) <= 2 * WINDOW_S, (start, onset)
        # a human's word endings fade: labels are fuzzier there, Silero holds ~1 window
        assert abs(stop - offset) <= 3 * WINDOW_S, (stop, offset)
    # window by window: inside phrases mostly speech, in the pauses never
    centre = (np.arange(p.size) + 0.5) * WINDOW_S
    inside = np.zeros(p.size, bool)
    far_outside = np.ones(p.size, bool)
    for onset, offset in BECKETT_PHRASES:
        inside |= (centre > onset + 0.05) & (centre < offset - 0.05)
        far_outside &= (centre < onset - 0.1) | (centre > offset + 0.15)
    assert np.mean(p[inside] > 0.5) > 0.95
    assert p[far_outside].max() < 0.2


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
def test_beckett_through_g711_finds_the_same_phrases(
    vad: SileroVad, beckett: NDArray[np.int16], law: str
) -> None:
    if law == "ulaw":
        coded = g711.ulaw_decode(g711.ulaw_encode(beckett))
    else:
        coded = g711.alaw_decode(g711.alaw_encode(beckett))
    clean = _probs(vad, beckett)
    phone = _probs(vad, coded)
    assert np.mean(np.abs(phone - clean)) < 0.02
    for (a0, a1), (b0, b1) in zip(
        _segments(_events(clean)), _segments(_events(phone)), strict=True
    ):
        assert abs(a0 - b0) <= WINDOW_S + 1e-9 and abs(a1 - b1) <= WINDOW_S + 1e-9


def _test_signals(beckett: NDArray[np.int16], n: int) -> list[NDArray[np.int16]]:
    """n different 4 s signals: beckett at staggered offsets, plus noise and silence."""
    rng = np.random.default_rng(3)
    out = [beckett[k * 4000 : k * 4000 + 4 * RATE] for k in range(n - 2)]
    out.append((rng.standard_normal(4 * RATE) * 300).astype(np.int16))
    out.append(np.zeros(4 * RATE, np.int16))
    return out


def test_batched_run_equals_separate_runs(vad: SileroVad, beckett: NDArray[np.int16]) -> None:
    signals = _test_signals(beckett, 6)
    separate = np.stack([_probs(vad, s) for s in signals])
    b = len(signals)
    states = vad.initial_states(b)
    contexts = np.zeros((b, 32), np.float32)
    batched = []
    audio = np.stack(signals).astype(np.float32) / np.float32(32768)
    for k in range(separate.shape[1]):
        windows = audio[:, k * 256 : (k + 1) * 256]
        probs, states = vad.run(windows, states, contexts)
        contexts = windows[:, -32:]
        batched.append(probs)
    np.testing.assert_allclose(np.stack(batched, axis=1), separate, atol=1e-5)
    assert separate[:-2].max() > 0.9  # the comparison covers speech, not only silence


def test_streams_through_a_tick_batcher_match_inline(
    vad: SileroVad, beckett: NDArray[np.int16]
) -> None:
    signals = _test_signals(beckett, 5)
    inline = [_probs(vad, s) for s in signals]

    async def main() -> tuple[list[list[float]], TickBatcher[VadRequest, VadResult]]:
        batcher = vad.batcher()
        got: list[list[float]] = [[] for _ in signals]
        streams = [VadStream(vad, batcher=batcher, on_prob=g.append) for g in got]
        for i in range(0, 4 * RATE, FRAME):  # one media-clock tick: every call in one go
            for stream, s in zip(streams, signals, strict=True):
                assert stream.push(s[i : i + FRAME]) == []
            await asyncio.sleep(0)
        return got, batcher

    got, batcher = asyncio.run(main())
    for g, want in zip(got, inline, strict=True):
        np.testing.assert_allclose(g, want, atol=1e-5)
    assert batcher.stats.largest == len(signals)  # one run per tick, all calls in it
    assert batcher.stats.batches == inline[0].size


def test_several_windows_in_one_push_keep_state_order(
    vad: SileroVad, beckett: NDArray[np.int16]
) -> None:
    x = beckett[: 3 * RATE]
    want = _probs(vad, x)

    async def main() -> list[float]:
        got: list[float] = []
        stream = VadStream(vad, batcher=vad.batcher(), on_prob=got.append)
        for i in range(0, x.size, 1000):  # 125 ms bursts: up to 4 windows at once
            stream.push(x[i : i + 1000])
            assert stream.pending >= 3
            while stream.pending:  # one window per loop turn: its state feeds the next
                await asyncio.sleep(0)
        return got

    np.testing.assert_allclose(asyncio.run(main()), want, atol=1e-5)


def test_a_failing_batch_reports_no_speech_and_the_stream_recovers(
    vad: SileroVad, beckett: NDArray[np.int16]
) -> None:
    x = beckett[int(0.4 * RATE) : int(1.2 * RATE)]  # inside "Ever tried"
    broken = [False]

    def run(requests: list[VadRequest]) -> list[VadResult]:
        if broken[0]:
            raise RuntimeError("GPU fell over")
        return vad.run_items(requests)

    async def main() -> tuple[list[float], VadStream]:
        got: list[float] = []
        stream = VadStream(vad, batcher=TickBatcher(run), on_prob=got.append)
        for i in range(0, x.size, FRAME):
            broken[0] = 0.2 * RATE <= i < 0.4 * RATE
            stream.push(x[i : i + FRAME])
            await asyncio.sleep(0)
        return got, stream

    got, stream = asyncio.run(main())
    assert len(got) == x.size // 256  # every window got an answer
    assert stream.errors == 6 and got[6:12] == [0.0] * 6  # 0.2..0.4 s: no speech, no hang
    # once the model is back the stream hears the speech as if nothing had happened
    np.testing.assert_allclose(got[14:], _probs(vad, x)[14:], atol=0.05)
    assert min(got[14:20]) > 0.9


def test_push_framing_and_reset(vad: SileroVad, beckett: NDArray[np.int16]) -> None:
    x = beckett[: 2 * RATE]
    whole = VadStream(vad).push(x)
    by_frames = _probs(vad, x)
    np.testing.assert_allclose(whole, by_frames, atol=1e-6)
    s = VadStream(vad)
    s.push(x[:300])
    s.reset()
    np.testing.assert_allclose(s.push(x), whole, atol=1e-6)
    with pytest.raises(ValueError):
        s.push(x.astype(np.float32))


def test_segmenter_hysteresis_rules() -> None:
    seg = SpeechSegmenter(min_speech_ms=100, min_silence_ms=200)
    feed: Callable[[list[float]], list[VadEvent]] = lambda ps: [  # noqa: E731
        e for p in ps if (e := seg.update(p)) is not None
    ]
    assert feed([0.9, 0.9, 0.1, 0.1]) == []  # a 64 ms click is not speech
    assert feed([0.6, 0.4, 0.45, 0.9]) == [SpeechStarted(4 * 256, 8 * 256)]  # 0.4 keeps it
    assert feed([0.2] * 6 + [0.6]) == []  # 192 ms of silence, then speech again
    assert feed([0.2, 0.4, 0.4, 0.4, 0.4, 0.4]) == []
    assert feed([0.4]) == [SpeechStopped(15 * 256, 22 * 256)]  # 0.4 does not rescue it
    assert feed([0.1] * 4) == []


def test_one_window_of_a_consonant_does_not_start_speech_over() -> None:
    """The closure of a stop consonant scores one window near 0 (a caller at -15 dBFS:
    0.77, 0.91, 0.95, 0.15, 0.95): the start stays where it was, and is confirmed on the
    next window of speech, not on the dip. Two windows under neg_threshold are a pause:
    the start and its climb are dropped."""
    seg = SpeechSegmenter(min_speech_ms=100, min_silence_ms=200, max_dip_ms=32)

    def feed(ps: list[float]) -> list[VadEvent]:
        return [e for p in ps if (e := seg.update(p)) is not None]

    assert feed([0.02, 0.08, 0.48, 0.77, 0.91, 0.95]) == []
    assert feed([0.15]) == []  # 128 ms since the start, but this window is no speech
    assert feed([0.95]) == [SpeechStarted(3 * 256, 8 * 256, 2 * 256)]
    feed([0.1] * 8)  # stopped
    start = seg.position
    assert feed([0.9, 0.9, 0.1, 0.1, 0.9, 0.9, 0.9]) == []  # a 64 ms pause starts it over
    assert feed([0.9]) == [SpeechStarted(start + 4 * 256, start + 8 * 256)]
    feed([0.1] * 8)
    strict = SpeechSegmenter(min_speech_ms=100, min_silence_ms=200, max_dip_ms=0)
    assert [strict.update(p) for p in [0.77, 0.91, 0.95, 0.15, 0.95]] == [None] * 5
    assert not seg.speaking
    seg.reset()
    assert seg.position == 0


def test_a_start_carries_the_rise_of_the_probability_before_it() -> None:
    """A quiet first syllable just under the threshold is where the words began: the start
    stays where the threshold was reached, its ``rise`` goes back over the run at
    neg_threshold or more before it (not past a pause under it, nor max_rise_ms)."""
    seg = SpeechSegmenter(min_speech_ms=100, min_silence_ms=200, max_rise_ms=160)

    def feed(ps: list[float]) -> list[SpeechStarted]:
        return [e for p in ps if isinstance(e := seg.update(p), SpeechStarted)]

    started = feed([0.1, 0.2, 0.4, 0.45, 0.49, 0.9, 0.9, 0.9, 0.9])
    assert started == [SpeechStarted(5 * 256, 9 * 256, 2 * 256)]
    assert started[0].onset == 2 * 256
    feed([0.1] * 8)  # stopped
    # 0.3, 0.3 break the climb (one window under neg_threshold would not): only the
    # windows after them count
    (ev,) = feed([0.4, 0.3, 0.3, 0.4, 0.6, 0.9, 0.9, 0.9])
    assert (ev.sample - seg.position + 8 * 256, ev.onset - ev.sample) == (4 * 256, -256)
    feed([0.1] * 8)
    # a long climb is cut at max_rise_ms (160 ms: 5 windows of 32 ms)
    (ev,) = feed([0.4] * 12 + [0.6, 0.9, 0.9, 0.9])
    assert ev.sample - ev.onset == 5 * 256
    feed([0.1] * 8)
    (ev,) = feed([0.9, 0.9, 0.9, 0.9])  # no climb: the onset is the start
    assert ev.rise is None and ev.onset == ev.sample


def test_missing_model_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelRuntimeError, match="silero-vad: file not found"):
        SileroVad(tmp_path / "silero_vad.onnx")


def test_default_path_comes_from_the_model_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from model_runtime.store import ModelError

    monkeypatch.setenv("SIP_BRIDGE_MODELS", str(tmp_path))
    with pytest.raises(ModelError, match="silero-vad"):
        SileroVad()


def test_a_stalled_loop_drops_the_oldest_windows_instead_of_lagging(
    vad: SileroVad, beckett: NDArray[np.int16]
) -> None:
    async def main() -> tuple[list[float], VadStream]:
        got: list[float] = []
        stream = VadStream(vad, batcher=vad.batcher(), on_prob=got.append, max_backlog=16)
        stream.push(beckett[: 20 * 256])  # 20 windows while the loop is busy elsewhere
        assert stream.pending == 17 and stream.dropped == 3  # 1 in flight + 16 queued
        while stream.pending:
            await asyncio.sleep(0)
        return got, stream

    got, stream = asyncio.run(main())
    assert len(got) == 17 and stream.windows == 17

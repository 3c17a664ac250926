"""The models every voice call shares: loaded and warmed once per bridge, not per call.

One process holds one VAD, one end-of-turn model, one ASR and one TTS voice, plus the
executor their inference runs on, so the hundredth call costs no more memory than the
first and the first caller does not pay for loading. Per-call state (VAD recurrent state,
the utterance being transcribed) lives in the small objects made here for each call.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import partial
from typing import TypeVar, cast

import numpy as np
from numpy.typing import NDArray

from agent.dialogue.sentences import split_sentences
from agent.voice.asr import IncrementalTranscriber, MoonshineAsr
from agent.voice.phrase_cache import PhraseCache, PhraseKey
from agent.voice.tts import PiperTts
from agent.voice.turn import EndOfTurn, SmartTurn
from agent.voice.vad import (
    SileroVad,
    SpeechSegmenter,
    SpeechStarted,
    SpeechStopped,
    VadRequest,
    VadResult,
    VadStream,
)
from agent.voice_settings import ModelSettings, VoiceSettings
from model_runtime.batching import TickBatcher
from model_runtime.sessions import Device
from resample import Resampler

__all__ = ["VoiceModels"]

log = logging.getLogger(__name__)

# A reply's first piece is cut short (at a comma, else after this many words): the caller
# hears the answer begin after the time to synthesise ~1 s of speech, not a whole sentence.
FIRST_WORDS = 6
LINE_RATE = 8000  # what the voice agent hears and says (the bridge's G.711 rate)
# the VAD that hears the caller while none of our voice can come back: at 16 kHz, on the
# call upsampled as for the ASR (at 8 kHz it scored quiet one-word answers too low to be
# speech: see agent/voice/vad.py)
FLOOR_VAD_RATE = 16000
WARM_NICE = 10  # the phrase-warming thread's niceness above the models': calls' runs go first

T = TypeVar("T")


def thread_niceness() -> int:
    """The calling thread's niceness (0 where threads have none of their own)."""
    with contextlib.suppress(AttributeError, OSError):
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    return 0


def renice(steps: int, *, base: int | None = None) -> None:
    """Make the calling thread ``steps`` nicer than ``base`` (default: than it is now, that
    is than the thread that started it, whose niceness it inherits), at most 19. Linux,
    where a thread is a task; raising it needs no privilege. Elsewhere the thread keeps its
    priority."""
    if steps > 0:
        target = min(19, (thread_niceness() if base is None else base) + steps)
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), target)


def made_at_niceness(nice: int, make: Callable[[], T]) -> T:
    """``make()`` run in a thread ``nice`` steps nicer, for what it starts: ONNX Runtime's
    session threads are started with the session and inherit their creator's niceness.
    Why: the media loop sends every call's frames each 20 ms tick; model runs (ASR,
    smart-turn, TTS) on the same two cores made 1-2 % of them late at 16 callers."""
    if nice <= 0:
        return make()
    made: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        renice(nice)
        try:
            made.append(make())
        except BaseException as exc:  # raised again in the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=run, name="voice-model-loader")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]


class VoiceModels:
    """Loads, warms and shares the cascade's models."""

    def __init__(
        self,
        settings: ModelSettings | None = None,
        *,
        vad: SileroVad | None = None,
        floor_vad: SileroVad | None = None,
        turn: SmartTurn | None = None,
        asr: MoonshineAsr | None = None,
        tts: PiperTts | None = None,
        length_scale: float | None = None,
        phrases: PhraseCache | None = None,
    ) -> None:
        """``phrases``: where rendered pieces are kept (shared by the models of every profile
        of a process); default: a cache of ``settings.phrase_cache_mb`` of its own.
        ``vad`` hears the call while our voice may come back, ``floor_vad`` the rest of the
        time (see :class:`VadGate`); given ``vad`` alone, it hears everything."""
        s = self.settings = settings or ModelSettings()
        t0 = time.monotonic()
        device = cast(Device, s.device)
        # (both run on the media loop)
        self.vad = vad or SileroVad(threads=1, device=device)
        self.floor_vad = floor_vad or (
            self.vad
            if vad is not None
            else SileroVad(threads=1, device=device, sample_rate=FLOOR_VAD_RATE)
        )
        # the models whose runs go to the workers are made at the models' niceness: their
        # sessions' own threads, started with them, inherit it (as the workers get it)
        self.turn, self.asr, self.tts = made_at_niceness(
            s.nice,
            lambda: (
                turn or SmartTurn(threads=s.threads),
                asr or MoonshineAsr(threads=s.threads, device=device, weights=s.asr_weights),
                tts or PiperTts(threads=s.threads, length_scale=length_scale, device=device),
            ),
        )
        # the workers (started by whichever thread submits first) and the phrase warmer
        # are niced from the niceness of the thread that made the models, not their starter's
        self._nice_base = thread_niceness()
        self.executor = ThreadPoolExecutor(
            s.workers,
            thread_name_prefix="voice-model",
            initializer=partial(renice, s.nice, base=self._nice_base),
        )
        self.phrases = phrases or PhraseCache(s.phrase_cache_mb << 20)
        self._voice = (self.tts.voice_name, self.tts.length_scale)
        self._warm_queue: list[str] = []
        self._warm_lock = threading.Lock()
        self._warmer: threading.Thread | None = None
        self._closed = threading.Event()
        # one per VAD, made on the running loop at first use
        self._batchers: dict[int, TickBatcher[VadRequest, VadResult]] = {}
        self._batcher_lock = threading.Lock()
        log.info("voice models loaded in %.1f s", time.monotonic() - t0)

    def warm_up(self) -> float:
        """Run each model once so the first caller does not pay for it; returns seconds."""
        t0 = time.monotonic()
        Resampler(self.tts.sample_rate, LINE_RATE)  # filter designs are cached: made now,
        Resampler(LINE_RATE, 16000)  # not on the media loop when the first call starts
        self.tts.warm_up()
        self.asr.transcribe(np.zeros(16000, dtype=np.int16))
        self.turn.probability(np.zeros(16000, dtype=np.int16))
        for vad in {self.vad, self.floor_vad}:
            VadStream(vad).push(np.zeros(4 * vad.window, dtype=np.int16))
        took = time.monotonic() - t0
        log.info("voice models warmed up in %.2f s", took)
        return took

    # -- per call ----------------------------------------------------------------------------

    def vad_stream(self, on_vad: Callable[[bool, int | None, bool | None], None]) -> VadGate:
        """``on_vad(speech, onset_lag, confirmed)`` per window: see :class:`VadGate`."""
        batch = self.settings.batch_vad
        talk, floor = (
            (self._vad_batcher(self.vad), self._vad_batcher(self.floor_vad))
            if batch
            else (None, None)
        )
        return VadGate(self.vad, talk, on_vad, floor_vad=self.floor_vad, floor_batcher=floor)

    def transcriber(self, executor: Executor | None = None) -> IncrementalTranscriber:
        """``executor``: where its runs go (a call's guarded view of :attr:`executor`)."""
        # the open segment is sent off as early as smart-turn is asked: both are done by
        # the time the pause is long enough to end the turn
        return IncrementalTranscriber(self.asr, executor or self.executor, early_s=0.06)

    def end_of_turn(self, s: VoiceSettings, executor: Executor | None = None) -> EndOfTurn:
        return EndOfTurn(
            self.turn,
            threshold=s.turn_threshold,
            stop_s=s.pause_ms / 1000,
            max_silence_s=s.max_silence_ms / 1000,
            executor=executor or self.executor,
        )

    def speak(
        self, text: str, cancel: threading.Event, *, skip: int = 0
    ) -> Iterator[tuple[str, NDArray[np.int16] | None]]:
        """Sentence by sentence: (sentence, None) when one starts, then (sentence, audio at
        8 kHz). Runs in the executor, resampling included (seconds of audio at once would
        stall the media loop); checks ``cancel`` between sentences; ``skip``: pieces
        already spoken (a speculation's first)."""
        down: Resampler | None = None  # no phrase cache: one stream, as before it existed
        for sentence in split_sentences(text, first_max_words=FIRST_WORDS)[skip:]:
            if cancel.is_set():
                return
            yield sentence, None
            if self.phrases.max_bytes:
                yield sentence, self.synthesize(sentence)
                continue
            down = down or Resampler(self.tts.sample_rate, LINE_RATE)
            yield sentence, down.process(self.tts.synthesize(sentence))

    def synthesize(self, sentence: str) -> NDArray[np.int16]:
        """One piece at 8 kHz, complete and read-only: from the phrase cache, else rendered
        (blocking) and kept there."""
        return self.phrases.render(self._key(sentence), partial(self._render, sentence))

    def cached(self, sentence: str) -> NDArray[np.int16] | None:
        """The piece's audio if the phrase cache has it (never blocks: the event loop asks)."""
        return self.phrases.get(self._key(sentence))

    def warm_phrases(self, pieces: Iterable[str]) -> None:
        """Render ``pieces`` (a profile's fixed ones) into the phrase cache in a background
        thread of low priority, one after another, skipping those already there: the bridge
        starts at once, and a caller who asks for a piece before it is warm gets it rendered
        on demand (once: the warmer then finds it)."""
        pieces = list(pieces)
        with self._warm_lock:
            self._warm_queue.extend(pieces)
            self.phrases.queued(len(pieces))
            if self._warmer is None or not self._warmer.is_alive():
                self._warmer = threading.Thread(
                    target=self._warm, name="voice-phrase-warmer", daemon=True
                )
                self._warmer.start()

    def _warm(self) -> None:
        renice(self.settings.nice + WARM_NICE, base=self._nice_base)
        t0, done = time.monotonic(), 0
        while not self._closed.is_set():
            with self._warm_lock:
                if not self._warm_queue:
                    self._warmer = None
                    break
                piece = self._warm_queue.pop(0)
            try:
                if self._key(piece) not in self.phrases:
                    self.phrases.render(self._key(piece), partial(self._render, piece), ahead=True)
                    done += 1
            except Exception:  # that piece is rendered when said, as without a cache
                log.exception("phrase %r could not be rendered ahead", piece)
            finally:
                self.phrases.queued(-1)
        if not done:
            return
        st = self.phrases.stats
        log.info(
            "phrase cache: %d pieces rendered ahead in %.1f s; %d held, %.1f of %.0f MB",
            done, time.monotonic() - t0, st.entries, st.bytes / 2**20, st.max_bytes / 2**20,
        )  # fmt: skip

    def _key(self, sentence: str) -> PhraseKey:
        return (*self._voice, sentence)

    def _render(self, sentence: str) -> NDArray[np.int16]:
        down = Resampler(self.tts.sample_rate, LINE_RATE)
        pcm = self.tts.synthesize(sentence)
        return np.concatenate([down.process(pcm), down.flush()])

    def _vad_batcher(self, vad: SileroVad) -> TickBatcher[VadRequest, VadResult]:
        """One batcher per VAD for every call of this process (made on the bridge's loop)."""
        with self._batcher_lock:
            if id(vad) not in self._batchers:
                self._batchers[id(vad)] = vad.batcher()
            return self._batchers[id(vad)]

    def close(self) -> None:
        self._closed.set()
        self.executor.shutdown(wait=False, cancel_futures=True)


class VadGate:
    """One call's VAD, reported two ways: per window, speech yes/no with hysteresis but no
    hangover (the end-of-turn pause is timed from the caller's real last word), and
    confirmed speech starts and stops (a click is not speech; barge-in counts from the
    onset the segmenter found, its rise included, not from when it was sure). Onset lags
    are in samples of the line (8 kHz), whatever the VAD's rate.

    With a ``floor_vad`` two VADs hear the call all along (each keeps its state), and the
    agent says, each tick, whether none of our voice can come back (:attr:`floor`). While
    it may, the line-rate VAD alone is reported: it rarely takes what the echo canceller
    leaves of our voice for speech. On the floor, speech is what either VAD hears: the 16
    kHz one hears a quiet one-word answer the other misses, and the line-rate one holds
    soft word endings longer (the 16 kHz one alone ended "Yes that is right." 180 ms
    early, and a slowly read order number was cut between two digits). Measured in the
    conversations bench with the 16 kHz VAD alone while we talked, too: a reply held twice
    in six calls, 3 s into it, on residual echo at ERL 12 dB that the line-rate VAD never
    took for speech."""

    def __init__(
        self,
        vad: SileroVad,
        batcher: TickBatcher[VadRequest, VadResult] | None,
        on_vad: Callable[[bool, int | None, bool | None], None],
        *,
        floor_vad: SileroVad | None = None,
        floor_batcher: TickBatcher[VadRequest, VadResult] | None = None,
    ) -> None:
        self._on_vad = on_vad
        self._talk = _VadSource(vad, batcher, self._prob)
        self._wide = (
            None
            if floor_vad is None or floor_vad is vad
            else _VadSource(floor_vad, floor_batcher, self._prob)
        )
        self._sources = (self._talk,) if self._wide is None else (self._talk, self._wide)
        #: set by the agent each tick: none of our voice can come back now
        self.floor = False
        self._on_floor = False  # what was reported last came from both VADs
        self._speaking = False  # ... and said the caller was talking

    def push(self, line: NDArray[np.int16], wide: NDArray[np.int16]) -> None:
        """The same audio at the line's rate and at 16 kHz (each VAD takes its own)."""
        if self._wide is not None and self.floor != self._on_floor:
            self._switch()
        for src in self._sources:
            src.stream.push(wide if src.wide else line)

    @property
    def errors(self) -> int:
        """Windows whose VAD run failed (a batch that raised)."""
        return sum(src.stream.errors for src in self._sources)

    @property
    def pending(self) -> int:
        """Windows cut but without a probability yet, the most of any of its VADs."""
        return max(src.stream.pending for src in self._sources)

    @property
    def max_backlog(self) -> int:
        """The most windows a VAD keeps waiting before it drops the oldest."""
        return self._talk.stream.max_backlog

    def _either(self) -> tuple[bool, bool]:
        """(this window is speech, the caller is talking) by either VAD."""
        assert self._wide is not None
        talk, wide = self._talk, self._wide
        return talk.raw or wide.raw, talk.segmenter.speaking or wide.segmenter.speaking

    def _switch(self) -> None:
        """From now on the other view: where it differs on whether the caller is talking,
        reported as a start (with no lag: it began before we listened) or a stop."""
        before = self._speaking if self._on_floor else self._talk.segmenter.speaking
        self._on_floor = self.floor
        raw, speaking = self._either() if self._on_floor else (
            self._talk.raw, self._talk.segmenter.speaking)  # fmt: skip
        self._speaking = speaking
        if speaking != before:
            self._on_vad(raw, None, speaking)

    def _prob(self, src: _VadSource, p: float) -> None:
        seg = src.segmenter
        src.raw = p >= seg.threshold or (src.raw and p >= seg.neg_threshold)
        ev = seg.update(p)
        if self._on_floor:
            if src is self._wide:  # (one report a window: the line-rate VAD's latest with it)
                self._report_either(src, ev)
            return
        if src is not self._talk:
            return
        if isinstance(ev, SpeechStarted):
            self._on_vad(src.raw, src.lag(ev), True)
        elif isinstance(ev, SpeechStopped):
            self._on_vad(src.raw, None, False)
        else:
            self._on_vad(src.raw, None, None)

    def _report_either(self, src: _VadSource, ev: SpeechStarted | SpeechStopped | None) -> None:
        raw, speaking = self._either()
        was, self._speaking = self._speaking, speaking
        if speaking and not was:
            self._on_vad(raw, src.lag(ev) if isinstance(ev, SpeechStarted) else None, True)
        elif was and not speaking:
            self._on_vad(raw, None, False)
        else:
            self._on_vad(raw, None, None)


class _VadSource:
    """One VAD's stream for a call, its segmenter and its latest per-window verdict."""

    def __init__(
        self,
        vad: SileroVad,
        batcher: TickBatcher[VadRequest, VadResult] | None,
        deliver: Callable[[_VadSource, float], None],
    ) -> None:
        self.wide = vad.sample_rate != LINE_RATE
        self._per_line_sample = vad.sample_rate // LINE_RATE
        self.segmenter = SpeechSegmenter(window=vad.window, sample_rate=vad.sample_rate)
        self.raw = False
        self.stream = VadStream(vad, batcher=batcher, on_prob=partial(deliver, self))

    def lag(self, start: SpeechStarted) -> int:
        """How long before it was decided the speech began, in line (8 kHz) samples."""
        return (start.at - start.onset) // self._per_line_sample

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
        turn: SmartTurn | None = None,
        asr: MoonshineAsr | None = None,
        tts: PiperTts | None = None,
        length_scale: float | None = None,
        phrases: PhraseCache | None = None,
    ) -> None:
        """``phrases``: where rendered pieces are kept (shared by the models of every profile
        of a process); default: a cache of ``settings.phrase_cache_mb`` of its own."""
        s = self.settings = settings or ModelSettings()
        t0 = time.monotonic()
        device = cast(Device, s.device)
        self.vad = vad or SileroVad(threads=1, device=device)  # runs on the media loop
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
        self._batcher: TickBatcher[VadRequest, VadResult] | None = (
            None  # made on the running loop, at first use
        )
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
        VadStream(self.vad).push(np.zeros(1024, dtype=np.int16))
        took = time.monotonic() - t0
        log.info("voice models warmed up in %.2f s", took)
        return took

    # -- per call ----------------------------------------------------------------------------

    def vad_stream(self, on_vad: Callable[[bool, int | None, bool | None], None]) -> VadGate:
        """``on_vad(speech, onset_lag, confirmed)`` per window: see :class:`VadGate`."""
        batcher = self._vad_batcher() if self.settings.batch_vad else None
        return VadGate(self.vad, batcher, on_vad)

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

    def _vad_batcher(self) -> TickBatcher[VadRequest, VadResult]:
        """One batcher for every call of this process (made on the bridge's loop)."""
        with self._batcher_lock:
            if self._batcher is None:
                self._batcher = self.vad.batcher()
            return self._batcher

    def close(self) -> None:
        self._closed.set()
        self.executor.shutdown(wait=False, cancel_futures=True)


class VadGate:
    """One call's VAD, reported two ways: per window, speech yes/no with hysteresis but no
    hangover (the end-of-turn pause is timed from the caller's real last word), and
    confirmed speech starts and stops (a click is not speech; barge-in counts from the
    onset the segmenter found, its rise included, not from when it was sure)."""

    def __init__(
        self,
        vad: SileroVad,
        batcher: TickBatcher[VadRequest, VadResult] | None,
        on_vad: Callable[[bool, int | None, bool | None], None],
    ) -> None:
        self._segmenter = SpeechSegmenter()
        self._on_vad = on_vad
        self._raw = False
        self._stream = VadStream(vad, batcher=batcher, on_prob=self._prob)

    def push(self, pcm8k: NDArray[np.int16]) -> None:
        self._stream.push(pcm8k)

    @property
    def errors(self) -> int:
        """Windows whose VAD run failed (a batch that raised)."""
        return self._stream.errors

    def _prob(self, p: float) -> None:
        seg = self._segmenter
        self._raw = p >= seg.threshold or (self._raw and p >= seg.neg_threshold)
        ev = seg.update(p)
        if isinstance(ev, SpeechStarted):
            self._on_vad(self._raw, ev.at - ev.onset, True)
        elif isinstance(ev, SpeechStopped):
            self._on_vad(self._raw, None, False)
        else:
            self._on_vad(self._raw, None, None)

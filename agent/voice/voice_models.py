"""The models every voice call shares: loaded and warmed once per bridge, not per call.

One process holds one VAD, one end-of-turn model, one ASR and one TTS voice, plus the
executor their inference runs on, so the hundredth call costs no more memory than the
first and the first caller does not pay for loading. Per-call state (VAD recurrent state,
the utterance being transcribed) lives in the small objects made here for each call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import cast

import numpy as np
from numpy.typing import NDArray

from agent.dialogue.profile import AgentProfile
from agent.dialogue.sentences import split_sentences
from agent.voice.asr import IncrementalTranscriber, MoonshineAsr
from agent.voice.phrase_cache import PhraseCache, profile_pieces
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
        cache: PhraseCache | None = None,
    ) -> None:
        """``cache``: where rendered pieces are kept (one per process serves every voice:
        its keys name the voice and speed); default, one of ``settings.tts_cache_bytes``."""
        s = self.settings = settings or ModelSettings()
        t0 = time.monotonic()
        device = cast(Device, s.device)
        self.vad = vad or SileroVad(threads=1, device=device)
        self.turn = turn or SmartTurn(threads=s.threads)
        self.asr = asr or MoonshineAsr(threads=s.threads, device=device)
        self.tts = tts or PiperTts(threads=s.threads, length_scale=length_scale, device=device)
        self.executor = ThreadPoolExecutor(s.workers, thread_name_prefix="voice-model")
        self._batcher: TickBatcher[VadRequest, VadResult] | None = (
            None  # made on the running loop, at first use
        )
        self._batcher_lock = threading.Lock()
        self.cache = cache if cache is not None else PhraseCache(s.tts_cache_bytes)
        self.warming: Future[int] | None = None  # the latest warm_phrases job
        # the pieces a loaded profile says the same on every call: only these are cached (a
        # piece with a caller's name, date or number is rendered for its call and dropped)
        self._fixed: frozenset[str] = frozenset()
        self._closed = False
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

    def pieces(self, text: str) -> list[str]:
        """How a reply is cut for speaking (a short first piece: an early first audio)."""
        return split_sentences(text, first_max_words=FIRST_WORDS)

    def speak(
        self, text: str, cancel: threading.Event, *, skip: int = 0
    ) -> Iterator[tuple[str, NDArray[np.int16] | None]]:
        """Piece by piece: (piece, None) when one starts, then (piece, audio at 8 kHz), as
        :meth:`synthesize` makes it (cached or fresh, the same samples). Runs in the
        executor (seconds of audio at once would stall the media loop); checks ``cancel``
        between pieces; ``skip``: pieces already spoken (a speculation's first)."""
        for sentence in self.pieces(text)[skip:]:
            if cancel.is_set():
                return
            yield sentence, None
            yield sentence, self.synthesize(sentence)

    def synthesize(self, sentence: str) -> NDArray[np.int16]:
        """One piece at 8 kHz, complete and read-only. A fixed phrase (:meth:`fix`) comes
        from the cache when this voice said it at this speed before, else is rendered now
        and kept; any other piece is rendered now and kept nowhere.

        Each piece is resampled on its own, from and to silence: the TTS ends every piece
        with at least 80 ms of it (longer than the filter), so pieces join without a click,
        a cached piece is bit for bit what a fresh render gives, and a reply lasts what one
        stream across its pieces gave (no filter tail flushed per piece: the barge-in and
        backchannel timings were tuned on that stream)."""
        if sentence not in self._fixed:
            pcm = self._render(sentence)
            pcm.flags.writeable = False
            return pcm
        key = (self.tts.voice_id, self.tts.length_scale, sentence)
        return self.cache.get_or_make(key, lambda: self._render(sentence))

    def fix(self, pieces: Iterable[str]) -> None:
        """Mark ``pieces`` as fixed phrases, said alike on every call: the only ones cached
        (callers' values never stay in memory after their call)."""
        self._fixed = self._fixed | frozenset(pieces)

    def _render(self, sentence: str) -> NDArray[np.int16]:
        down = Resampler(self.tts.sample_rate, LINE_RATE)
        pcm = self.tts.synthesize(sentence)
        return down.process(pcm)

    def warm_phrases(self, profiles: Iterable[AgentProfile]) -> Future[int]:
        """Render, in the executor, every piece the profiles say the same on every call
        (greeting first) that is not cached yet: one job, so calls keep the other workers.
        Returns its future (the number of pieces it rendered); also :attr:`warming`."""
        pieces = list(dict.fromkeys(p for pr in profiles for p in profile_pieces(pr, self.pieces)))
        self.fix(pieces)

        def work() -> int:
            t0 = time.monotonic()
            made = 0
            for piece in pieces:
                if self._closed:
                    break
                if (self.tts.voice_id, self.tts.length_scale, piece) not in self.cache:
                    self.synthesize(piece)
                    made += 1
            st = self.cache.stats()
            log.info(
                "phrase cache: %d fixed pieces, %d rendered now in %.2f s; %d entries, "
                "%.1f of %.1f MiB", len(pieces), made, time.monotonic() - t0, st.entries,
                st.bytes / 2**20, st.max_bytes / 2**20,
            )  # fmt: skip
            return made

        self.warming = self.executor.submit(work)
        return self.warming

    def _vad_batcher(self) -> TickBatcher[VadRequest, VadResult]:
        """One batcher for every call of this process (made on the bridge's loop)."""
        with self._batcher_lock:
            if self._batcher is None:
                self._batcher = self.vad.batcher()
            return self._batcher

    def close(self) -> None:
        self._closed = True
        self.executor.shutdown(wait=False, cancel_futures=True)


class VadGate:
    """One call's VAD, reported two ways: per window, speech yes/no with hysteresis but no
    hangover (the end-of-turn pause is timed from the caller's real last word), and
    confirmed speech starts and stops (a click is not speech; barge-in counts from the
    onset the segmenter found, not from when it was sure)."""

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
            self._on_vad(self._raw, ev.at - ev.sample, True)
        elif isinstance(ev, SpeechStopped):
            self._on_vad(self._raw, None, False)
        else:
            self._on_vad(self._raw, None, None)

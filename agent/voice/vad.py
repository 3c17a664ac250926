"""Voice activity detection: Silero VAD v6 at 8 kHz (the line's rate) or 16 kHz.

Silero accepts 8 kHz natively (256-sample windows, 32 ms) and 16 kHz (512 samples, also
32 ms). The calls' agent runs both (agent/voice/voice_models.py: VadGate): 8 kHz alone
while our own voice may come back as echo; while the floor is the caller's, speech is
what either hears, the 16 kHz one on the upsampled audio the agent makes for the ASR
anyway. On G.711 speech the 8 kHz mode scores quiet words far lower (measured: a recorded
"hours" at -25 dBFS, 0.25-0.65 for most of the word and depending on where the windows
fell, against 0.7-0.99 at 16 kHz; at -38 dBFS 19, 2, 0 and 2 windows of speech against
15-19), and a caller's one-word answer went unheard; but it takes less of what the echo
canceller leaves of our voice for speech. 16 kHz costs 0.03 ms a window in a batch of 32
(0.02 at 8 kHz); on stationary noise neither mode scores over 0.15.

The model is stateful: each window is fed with the last 32 (64) samples of the previous
one (its "context") and an LSTM state of shape (2, B, 128), so one session serves any
number of calls, each keeping its own state and context, and windows from many calls can
be stacked into one batch (:class:`~model_runtime.batching.TickBatcher`).

Three layers: :class:`SileroVad` (the session; batch in, batch out),
:class:`VadStream` (one call: 20 ms frames -> windows -> probabilities, inline or through
a batcher) and :class:`SpeechSegmenter` (probabilities -> speech start/stop events with
hysteresis, positioned in samples of the call's audio clock).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeAlias

import numpy as np
from numpy.typing import NDArray

from model_runtime.batching import TickBatcher
from model_runtime.sessions import Device, create_session

__all__ = [
    "SileroVad",
    "SpeechSegmenter",
    "SpeechStarted",
    "SpeechStopped",
    "VadEvent",
    "VadRequest",
    "VadResult",
    "VadStream",
]

MODEL = "silero-vad"
MODEL_FILE = "silero_vad.onnx"
_SCALE = np.float32(1.0 / 32768.0)  # int16 -> [-1, 1), exact (a power of two)


def _default_path() -> Path:
    """Where the model store keeps the model (imported late: the store may fetch)."""
    from model_runtime.store import default_store

    return default_store().path(MODEL, MODEL_FILE)


class VadRequest(NamedTuple):
    """One call's next window for a batched run: audio, LSTM state, 32-sample context."""

    window: NDArray[np.float32]  # (256,)
    state: NDArray[np.float32]  # (2, 128)
    context: NDArray[np.float32]  # (32,)


class VadResult(NamedTuple):
    """Speech probability of the window and the LSTM state to feed with the next one."""

    prob: float
    state: NDArray[np.float32]  # (2, 128)


class SileroVad:
    """The Silero VAD session at 8 or 16 kHz; stateless itself, so one serves every call
    (every stream and batch of a session is at its rate)."""

    state_size = 128

    def __init__(
        self,
        path: Path | None = None,
        *,
        threads: int = 1,
        device: Device = "cpu",
        sample_rate: int = 8000,
    ) -> None:
        if sample_rate not in (8000, 16000):
            raise ValueError(f"Silero VAD runs at 8000 or 16000 Hz, not {sample_rate}")
        self.sample_rate = sample_rate
        self.window = sample_rate * 32 // 1000  # samples per model run: 32 ms
        self.context = sample_rate // 250  # samples of the previous window it wants in front
        # CPU by default: a window costs ~0.15 ms of CPU (B=1), about a GPU round trip.
        self.path = Path(path) if path is not None else _default_path()
        self.session = create_session(self.path, name=MODEL, device=device, threads=threads)
        self._sr = np.array(self.sample_rate, dtype=np.int64)

    def initial_states(self, batch: int = 1) -> NDArray[np.float32]:
        """Zero LSTM states for ``batch`` new streams, shape (2, batch, 128)."""
        return np.zeros((2, batch, self.state_size), dtype=np.float32)

    def run(
        self,
        windows: NDArray[np.float32],
        states: NDArray[np.float32],
        contexts: NDArray[np.float32],
    ) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
        """B windows (B, 256) in [-1, 1) with states (2, B, 128) and contexts (B, 32) ->
        speech probabilities (B,) and the new states (2, B, 128)."""
        w = np.asarray(windows, dtype=np.float32)
        c = np.asarray(contexts, dtype=np.float32)
        s = np.asarray(states, dtype=np.float32)
        b = w.shape[0] if w.ndim == 2 else -1
        if w.shape != (b, self.window) or b < 1:
            raise ValueError(f"windows must be (B, {self.window}), got {w.shape}")
        if c.shape != (b, self.context):
            raise ValueError(f"contexts must be ({b}, {self.context}), got {c.shape}")
        if s.shape != (2, b, self.state_size):
            raise ValueError(f"states must be (2, {b}, {self.state_size}), got {s.shape}")
        feeds = {"input": np.concatenate((c, w), axis=1), "state": s, "sr": self._sr}
        prob, new_state = self.session.run(None, feeds)
        return np.asarray(prob, dtype=np.float32).reshape(b), np.asarray(new_state, np.float32)

    def run_items(self, requests: list[VadRequest]) -> list[VadResult]:
        """Many calls' windows as one model run: the ``run_batch`` of a TickBatcher."""
        windows = np.stack([r.window for r in requests])
        states = np.stack([r.state for r in requests], axis=1)
        contexts = np.stack([r.context for r in requests])
        probs, new = self.run(windows, states, contexts)
        return [VadResult(float(p), new[:, i, :]) for i, p in enumerate(probs)]

    def batcher(
        self, *, max_batch: int = 256, loop: asyncio.AbstractEventLoop | None = None
    ) -> TickBatcher[VadRequest, VadResult]:
        """A batcher that runs every window submitted in one loop turn as one run."""
        return TickBatcher(self.run_items, max_batch=max_batch, loop=loop)


class VadStream:
    """One call's VAD: buffers 20 ms frames into 32 ms windows (at the VAD's rate).

    Without a batcher each completed window runs inline and :meth:`push` returns the
    probabilities. With one, windows are submitted to it and their probabilities arrive
    later through ``on_prob`` (after the loop turn); :meth:`push` then returns ``[]``.
    ``on_prob`` is called for every window in both modes, in order. A stream keeps at
    most one window in flight, because the next window's state comes out of this one;
    a backlog longer than ``max_backlog`` windows (the loop stalled) drops the oldest
    rather than let latency grow. A window whose batch failed reports 0.0 (no speech)
    and counts in :attr:`errors`: a broken model must not invent speech.
    """

    def __init__(
        self,
        vad: SileroVad,
        *,
        batcher: TickBatcher[VadRequest, VadResult] | None = None,
        on_prob: Callable[[float], None] | None = None,
        max_backlog: int = 16,
    ) -> None:
        self.vad = vad
        self.batcher = batcher
        self.on_prob = on_prob
        self.max_backlog = max_backlog
        self._buf = np.zeros(vad.window, dtype=np.int16)
        self._fill = 0
        self._state = np.zeros((2, vad.state_size), dtype=np.float32)
        self._context = np.zeros(vad.context, dtype=np.float32)
        self._backlog: deque[NDArray[np.float32]] = deque()
        self._in_flight = False
        self._generation = 0
        self.windows = 0  # windows whose probability is known
        self.errors = 0
        self.dropped = 0

    @property
    def pending(self) -> int:
        """Windows cut but without a probability yet (batched mode)."""
        return len(self._backlog) + int(self._in_flight)

    def reset(self) -> None:
        """Forget the audio history (state, context, partial window)."""
        self._fill = 0
        self._state = np.zeros_like(self._state)
        self._context = np.zeros_like(self._context)
        self._backlog.clear()
        self._in_flight = False
        self._generation += 1  # a result still in flight belongs to the old audio

    def push(self, pcm: NDArray[np.int16]) -> list[float]:
        """Add int16 audio at the VAD's rate, of any length; returns the probabilities
        computed now."""
        a = np.asarray(pcm)
        if a.dtype != np.int16 or a.ndim != 1:
            raise ValueError("pcm must be a 1-D int16 array")
        probs: list[float] = []
        n, pos, size = self.vad.window, 0, a.size
        while pos < size:  # int16 until a window is whole: one conversion per window
            take = min(n - self._fill, size - pos)
            self._buf[self._fill : self._fill + take] = a[pos : pos + take]
            self._fill += take
            pos += take
            if self._fill == n:
                self._fill = 0
                window = self._buf.astype(np.float32) * _SCALE
                if self.batcher is None:
                    probs.append(self._run_inline(window))
                else:
                    self._queue(window)
        return probs

    def _run_inline(self, window: NDArray[np.float32]) -> float:
        p, st = self.vad.run(window[None, :], self._state[:, None, :], self._context[None, :])
        self._state = st[:, 0, :]
        self._context = window[-self.vad.context :]
        self._deliver(float(p[0]))
        return float(p[0])

    def _queue(self, window: NDArray[np.float32]) -> None:
        self._backlog.append(window)
        while len(self._backlog) > self.max_backlog:
            self._backlog.popleft()
            self.dropped += 1
        self._pump()

    def _pump(self) -> None:
        if self._in_flight or not self._backlog or self.batcher is None:
            return
        window = self._backlog.popleft()
        request = VadRequest(window, self._state, self._context)
        # the context is audio, known now; only the state must wait for the result
        self._context = window[-self.vad.context :]
        self._in_flight = True
        generation = self._generation
        self.batcher.submit(request, lambda result: self._done(result, generation))

    def _done(self, result: VadResult | Exception, generation: int) -> None:
        if generation != self._generation:
            return
        self._in_flight = False
        if isinstance(result, Exception):
            self.errors += 1
            prob = 0.0
        else:
            self._state = result.state
            prob = result.prob
        self._deliver(prob)
        self._pump()

    def _deliver(self, prob: float) -> None:
        self.windows += 1
        if self.on_prob is not None:
            self.on_prob(prob)


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    """Speech began at ``sample``; decided at ``at`` (both in samples of the stream).

    ``rise``: where the probability began the climb that reached the threshold (the
    first of the windows at ``neg_threshold`` or more right before ``sample``, at most
    ``max_rise_ms`` back; ``sample`` when there were none). A quiet caller's first syllable
    often sits just under the threshold for a few windows (measured: a recorded "hours"
    at -25 dBFS over the greeting scored 0.41-0.49 for 120 ms): the words began there."""

    sample: int
    at: int
    rise: int | None = None

    @property
    def onset(self) -> int:
        return self.sample if self.rise is None else self.rise


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    """Speech ended at ``sample``; decided at ``at`` (``at - sample`` is the hangover)."""

    sample: int
    at: int


VadEvent: TypeAlias = SpeechStarted | SpeechStopped


class SpeechSegmenter:
    """Hysteresis over window probabilities -> speech start/stop events.

    Speech starts where a window reaches ``threshold`` and is confirmed once it has lasted
    ``min_speech_ms`` (a click is not a turn) without more than ``max_dip_ms`` in a row
    below ``neg_threshold``: the closure of a stop consonant ("What_are") can score one
    window near 0 (measured: 0.77, 0.91, 0.95, 0.15, 0.95 for a caller at -15 dBFS), and
    starting over there delays a barge-in by the length of the first syllable.
    It stops at the first window below ``neg_threshold`` once that silence has lasted
    ``min_silence_ms`` without a window back at ``threshold``; probabilities in between
    neither start nor end anything. Positions count samples from the first update, so
    they line up with the audio that was pushed; ``at`` says when the decision was made.
    """

    def __init__(
        self,
        *,
        threshold: float = 0.5,
        neg_threshold: float = 0.35,
        min_speech_ms: float = 100,
        min_silence_ms: float = 200,
        max_rise_ms: float = 160,
        max_dip_ms: float = 32,
        window: int = 256,
        sample_rate: int = 8000,
    ) -> None:
        if not 0.0 < neg_threshold <= threshold < 1.0:
            raise ValueError("need 0 < neg_threshold <= threshold < 1")
        self.threshold = threshold
        self.neg_threshold = neg_threshold
        self.window = window
        self.sample_rate = sample_rate
        self.min_speech = round(min_speech_ms * sample_rate / 1000)
        self.min_silence = round(min_silence_ms * sample_rate / 1000)
        self.max_rise = round(max_rise_ms * sample_rate / 1000)
        self.max_dips = int(max_dip_ms * sample_rate / 1000) // window  # whole windows
        self.position = 0  # samples seen: the end of the latest window
        self.speaking = False
        self._start: int | None = None  # candidate speech start (not yet confirmed)
        self._silence: int | None = None  # candidate speech end while speaking
        self._climb: int | None = None  # first window of the run at neg_threshold or more
        self._dips = 0  # windows in a row under neg_threshold (while not speaking)

    def update(self, prob: float) -> SpeechStarted | SpeechStopped | None:
        """Feed the next window's probability; returns an event when one is decided."""
        begin = self.position
        self.position += self.window
        end = self.position
        if not self.speaking:
            dip = prob < self.neg_threshold
            self._dips = self._dips + 1 if dip else 0
            if self._dips > self.max_dips:  # a pause, not a consonant: start over
                self._climb = self._start = None
            elif not dip and self._climb is None:
                self._climb = begin
            if self._start is None and prob >= self.threshold:
                self._start = begin
            if self._start is not None and not dip and end - self._start >= self.min_speech:
                self.speaking, start, self._start = True, self._start, None
                # (the climb is the one the start was on: a pause since would have
                # dropped the start too)
                rise = max(self._climb if self._climb is not None else start, start - self.max_rise)
                return SpeechStarted(start, end, rise if rise < start else None)
            return None
        if prob >= self.threshold:
            self._silence = None
        elif prob < self.neg_threshold and self._silence is None:
            self._silence = begin
        if self._silence is not None and end - self._silence >= self.min_silence:
            self.speaking, stop, self._silence = False, self._silence, None
            self._climb = None
            return SpeechStopped(stop, end)
        return None

    def reset(self) -> None:
        """Back to silence at position 0."""
        self.position = 0
        self.speaking = False
        self._start = self._silence = self._climb = None
        self._dips = 0

"""End of turn: has the caller finished speaking, or only paused?

A pure VAD endpoint (say 500 ms of silence) either cuts people off mid-thought or makes
every reply late. smart-turn v3.2 (pipecat-ai, BSD-2) looks at the prosody and wording of
the last 8 s of speech and says "complete" early when the sentence is done. It scores some
audio wrongly (synthetic speech, odd callers), so :class:`EndOfTurn` always keeps a silence
timeout as well: the model can end a turn early, never hold it open forever.
"""

from __future__ import annotations

import logging
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from agent.voice.melspec import HOP, log_mel
from model_runtime.sessions import create_session

__all__ = ["EndOfTurn", "SmartTurn", "TurnDecision"]

log = logging.getLogger(__name__)

_MODEL = "smart-turn-v3.2"
_FILE = "smart-turn-v3.2-cpu.onnx"
_UNSIGNED_FILE = "smart-turn-v3.2-cpu-u8.onnx"  # model_runtime.unsigned_weights
#: Largest difference between the two graphs on the probe that still counts as the same
#: (exact kernels agree to float rounding; a saturating one was 0.035 off on it).
_SAME = 1e-5


def _default_path(file: str) -> Path:
    """The store's verified copy (imported here so that passing a path needs no store)."""
    from model_runtime.store import default_store

    return default_store().path(_MODEL, file)


def _probe() -> NDArray[np.float32]:
    """2.5 s of a vowel-like buzz (harmonics of a gliding 110 Hz pitch, 4 syllables a
    second) and a little noise, at the end of an 8 s window: speech-like enough to drive
    every layer's integer products into the range where a saturating kernel goes wrong."""
    t = np.arange(int(2.5 * SmartTurn.sample_rate)) / SmartTurn.sample_rate
    phase = 2 * np.pi * np.cumsum(110 + 30 * np.sin(2 * np.pi * 0.7 * t)) / SmartTurn.sample_rate
    buzz = sum(np.sin(k * phase) / k for k in range(1, 30))
    envelope = 0.5 * (1 - np.cos(2 * np.pi * 4 * t))
    noise = np.random.default_rng(7).standard_normal(t.size)
    return (0.2 * buzz * envelope + 0.01 * noise).astype(np.float32)


class SmartTurn:
    """smart-turn v3.2: P(turn complete) from the last 8 s of 16 kHz mono audio.

    Shorter audio is zero-padded at the start (as in training); longer audio keeps its end.
    The ONNX graph ends in a sigmoid, so its output is already a probability.

    The same score on every CPU: the shipped int8 graph is exact only where ONNX Runtime
    has VNNI or AMX kernels for it; elsewhere its products saturate (see
    :mod:`model_runtime.unsigned_weights`). Both graphs score a probe when the model loads;
    the shipped one is kept only if it agrees with the always-exact uint8-weight graph.
    :attr:`kernel` says which runs.
    """

    sample_rate = 16000
    window_samples = 8 * 16000
    n_frames = window_samples // HOP

    def __init__(
        self, path: Path | None = None, *, unsigned: Path | None = None, threads: int = 1
    ) -> None:
        """``path``: the shipped graph; ``unsigned``: its uint8-weight twin (default: the
        store's, or ``<stem>-u8.onnx`` beside ``path``)."""
        if path is None:
            self.path = _default_path(_FILE)
            unsigned = unsigned if unsigned is not None else _default_path(_UNSIGNED_FILE)
        else:
            self.path = Path(path)
            unsigned = Path(unsigned or self.path.with_name(self.path.stem + "-u8.onnx"))
        for p in (self.path, unsigned):
            if not p.is_file():
                raise FileNotFoundError(f"smart-turn model not found: {p}")
        # CPU only: the store ships smart-turn's CPU export (the "-cpu" graph).
        shipped = create_session(self.path, name=_MODEL, device="cpu", threads=threads)
        inputs = shipped.get_inputs()
        if len(inputs) != 1 or list(inputs[0].shape[1:]) != [80, self.n_frames]:
            got = [(i.name, i.shape) for i in inputs]
            raise ValueError(f"{self.path}: expected one (batch, 80, 800) input, got {got}")
        self._input = inputs[0].name
        exact = create_session(unsigned, name=_MODEL, device="cpu", threads=threads)
        probe = self.features(_probe())[None]
        self._session = shipped
        fast, sure = self._run(probe), self._run(probe, exact)
        if abs(fast - sure) <= _SAME:
            self.kernel = "int8 weights (exact on this CPU)"
        else:
            self._session, self.path = exact, unsigned
            self.kernel = "uint8 weights (this CPU's int8 kernels saturate)"
        log.info("smart-turn: %s; probe %.6f vs exact %.6f", self.kernel, fast, sure)

    def features(self, pcm16k: NDArray[np.int16] | NDArray[np.float32]) -> NDArray[np.float32]:
        """The (80, 800) log-mel input for this audio (int16, or float in [-1, 1])."""
        x = np.asarray(pcm16k)
        if x.ndim != 1:
            raise ValueError(f"expected mono audio, got shape {x.shape}")
        xf = x.astype(np.float32) / 32768.0 if x.dtype == np.int16 else x.astype(np.float32)
        xf = xf[-self.window_samples :]
        if xf.size < self.window_samples:
            xf = np.concatenate([np.zeros(self.window_samples - xf.size, np.float32), xf])
        return log_mel(xf, self.n_frames)

    def _run(self, feats: NDArray[np.float32], session: Any = None) -> float:
        (out,) = (session or self._session).run(None, {self._input: feats})
        return float(np.asarray(out).reshape(-1)[0])

    def probability(self, pcm16k: NDArray[np.int16] | NDArray[np.float32]) -> float:
        """P(the speaker has finished) for audio that ends now."""
        return self._run(self.features(pcm16k)[None])


@dataclass(frozen=True, slots=True)
class TurnDecision:
    """The caller's turn is over. ``probability`` is the model's last score (NaN when it
    was never asked); times are sample counts on :class:`EndOfTurn`'s clock."""

    complete: bool
    probability: float
    reason: Literal["model", "timeout"]
    at_sample: int  # clock when decided (end of the audio pushed so far)
    speech_end: int  # clock when the last speech frame ended

    def latency_s(self, sample_rate: int = 16000) -> float:
        """Time from the end of speech to the decision."""
        return (self.at_sample - self.speech_end) / sample_rate


class EndOfTurn:
    """Decides the caller is done: smart-turn on the last 8 s when the VAD says speech
    stopped, plus a silence timeout so synthetic / odd speech never hangs the call.

    Fed once per frame with the caller's 16 kHz audio and the VAD's verdict for it; the
    clock is the number of samples pushed. A turn starts at the first speech frame. Once
    ``stop_s`` of non-speech follows speech, :meth:`decide` asks the model once for that
    pause; ``>= threshold`` ends the turn. If speech resumes the pause is forgotten and the
    next pause is scored again. The model hears only this turn (from ``pre_speech_s``
    before its first speech frame, at most the last 8 s), as pipecat feeds it: with earlier
    sentences in the window, beckett's sentence ends scored far lower. ``max_silence_s``
    of non-speech ends the turn whatever the model said (or with no model at all). After a
    decision it waits for the next turn.

    The model costs tens of ms of CPU: give an ``executor`` and :meth:`decide` only submits
    it and collects the verdict later (call push/decide from one thread, the loop's); it is
    asked after ``early_s`` of a pause, so that it runs while the rest of the pause passes.
    """

    sample_rate = 16000
    #: Audio kept before a turn's first speech frame (the VAD starts a little late).
    pre_speech_s = 0.5

    def __init__(
        self,
        turn: SmartTurn | None,
        *,
        threshold: float = 0.5,
        stop_s: float = 0.2,
        max_silence_s: float = 1.0,
        executor: Executor | None = None,
        early_s: float = 0.06,
    ) -> None:
        if not 0.0 <= stop_s <= max_silence_s:
            raise ValueError("need 0 <= stop_s <= max_silence_s")
        # With an executor the model is asked once early_s of a pause has passed, so its
        # tens of ms overlap the rest of the pause; its verdict counts from stop_s on.
        self.early = min(round(early_s * self.sample_rate), round(stop_s * self.sample_rate))
        self.turn = turn
        self.threshold = threshold
        self.stop = round(stop_s * self.sample_rate)
        self.max_silence = round(max_silence_s * self.sample_rate)
        self.executor = executor
        self._window = SmartTurn.window_samples
        self._pre = round(self.pre_speech_s * self.sample_rate)
        self._ring = np.zeros(self._window + self._pre, np.int16)  # the latest audio
        self.clock = 0
        self._in_turn = False
        self._turn_start = 0  # clock of the turn's first speech sample
        self._speech_end = 0  # clock at the end of the last speech frame
        self._scored = False  # the model was asked about the current pause
        self._pending: Future[float] | None = None  # that question, when on the executor
        self._pause_p = float("nan")  # its answer
        #: Every model verdict: (clock when it arrived, probability), for logs and tests.
        self.evaluations: list[tuple[int, float]] = []

    @property
    def in_turn(self) -> bool:
        """Speech has been heard and no decision taken yet."""
        return self._in_turn

    @property
    def last_probability(self) -> float:
        """The model's latest verdict (NaN before the first)."""
        return self.evaluations[-1][1] if self.evaluations else float("nan")

    def reset(self) -> None:
        """Forget the current turn (e.g. the agent took the floor)."""
        self._in_turn = False
        self._new_pause()

    def _new_pause(self) -> None:
        self._scored = False
        if self._pending is not None:  # a verdict about audio that is now stale: one still
            self._pending.cancel()  # queued is not run (at 24 callers it waited ~90 ms, and
        self._pending = None  # the caller had often gone on by the time it ran)
        self._pause_p = float("nan")

    def push(self, pcm16k: NDArray[np.int16], speech: bool) -> None:
        """One frame of caller audio and whether the VAD heard speech in it."""
        x = np.asarray(pcm16k, dtype=np.int16).reshape(-1)
        keep = x[-self._ring.size :]
        first = self.clock + x.size - keep.size
        self._ring[(first + np.arange(keep.size)) % self._ring.size] = keep
        if speech:
            if not self._in_turn:
                self._in_turn = True
                self._turn_start = self.clock
            self._new_pause()
            self._speech_end = self.clock + x.size
        self.clock += x.size

    def _turn_audio(self) -> NDArray[np.int16]:
        """This turn's audio (from just before its first speech), at most the last 8 s."""
        n = min(self.clock - (self._turn_start - self._pre), self._window, self.clock)
        out: NDArray[np.int16] = self._ring[(self.clock - n + np.arange(n)) % self._ring.size]
        return out  # a copy (fancy indexing): safe to hand to another thread

    def decide(self) -> TurnDecision | None:
        """None while the caller may still be talking; a decision once the turn is over.

        With an ``executor`` the model runs there and this never blocks: the verdict is
        picked up by a later call (one tick later, typically)."""
        if not self._in_turn:
            return None
        silence = self.clock - self._speech_end
        ex, model = self.executor, self.turn
        if ex is not None and model is not None and not self._scored and silence >= self.early:
            self._scored = True  # asked now; the answer counts from stop_s on
            self._pending = ex.submit(model.probability, self._turn_audio())
        if silence < self.stop:
            return None
        if self.turn is not None and not self._scored:
            self._scored = True
            if self._verdict(self.turn.probability(self._turn_audio())):
                return self._end("model")
        if self._pending is not None and self._pending.done():
            done, self._pending = self._pending, None
            try:
                p = done.result()
            except Exception:  # the timeout still ends the turn
                log.exception("smart-turn failed; waiting for the silence timeout")
            else:
                if self._verdict(p):
                    return self._end("model")
        if silence >= self.max_silence:
            return self._end("timeout")
        return None

    def _verdict(self, p: float) -> bool:
        self._pause_p = p
        self.evaluations.append((self.clock, p))
        return p >= self.threshold

    def _end(self, reason: Literal["model", "timeout"]) -> TurnDecision:
        decision = TurnDecision(True, self._pause_p, reason, self.clock, self._speech_end)
        self._in_turn = False
        self._new_pause()
        return decision

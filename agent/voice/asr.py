"""Speech to text: Moonshine base-en (16 kHz), one-shot and incremental.

Why incremental: the caller hears nothing until the transcript is ready, so the work is
done while they are still talking. :class:`IncrementalTranscriber` closes a segment at each
pause (or every ``max_segment_s``) and transcribes it in an executor while audio keeps
arriving; at end of turn only the last short segment is left (latency budget: <= 100 ms).

The decode loop and the token -> text step are our own (no ``tokenizers`` package): a
greedy search over ``decoder_model_merged`` with past key values, capped at a token count
proportional to the audio so a confused decoder cannot loop forever.
"""

from __future__ import annotations

import concurrent.futures
import heapq
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from agent.transcript import Transcript, joined
from agent.voice.asr_tokenizer import Tokenizer
from agent.voice.phrase_bias import CANDIDATES, PhraseBias, bias_text

__all__ = [
    "LEAD_S",
    "PREROLL_S",
    "TAIL_S",
    "IncrementalTranscriber",
    "MoonshineAsr",
    "framed",
]

log = logging.getLogger(__name__)

MODEL = "moonshine-base-en"
#: The decoder's file in the store, by ``[models] asr_weights``.
_DECODERS = {"float": "decoder_model_merged.onnx", "int8": "decoder_model_merged-int8.onnx"}
_START, _EOS = 1, 2
_TOKENS_PER_S = 6.5  # Moonshine's own cap; fast English speech is ~4-5 tokens/s
_MIN_S = 0.1  # shorter audio is below what the encoder's convolutions accept
_MAX_S = 64.0  # the model's trained limit (rotary positions)
_WORDS_EXPECTED_S = 0.5  # a segment with this much speech (by the VAD) holds words
_SILENCE_RMS = 10.0 ** (-60 / 20)  # -60 dBFS: nothing to transcribe (no hallucinated words)
#: The quiet a clip keeps before its first sound and after its last (see :func:`framed`).
LEAD_S = 0.15
TAIL_S = 0.15
#: audio kept before the first speech frame, by the transcriber and the voice agent alike:
#: VAD onsets are late (up to ~140 ms), and the model is given LEAD_S before the first sound
PREROLL_S = 0.3
_FRAME_S = 0.005  # the step at which framed() finds a clip's first and last sound
_SOUND_MIN = 10.0 ** (-55 / 20)  # a sound is at least this loud (in digital silence)...
_SOUND_MAX = 10.0 ** (-40 / 20)  # ...and no louder than this needs to be (on a noisy line)


def _store_path(name: str) -> Path:
    from model_runtime.store import default_store  # lazy: explicit paths need no store

    return Path(default_store().path(MODEL, name))


def _gpu(device: str) -> bool:
    """Whether ``device`` puts the sessions on a GPU here."""
    from model_runtime.sessions import CPU, Device, select_providers

    return select_providers(cast(Device, device))[0] != CPU


def _session(path: Path, threads: int, device: str) -> Any:
    """The one place this module opens ONNX Runtime (the project's session factory)."""
    from model_runtime.sessions import Device, create_session

    dev = cast(Device, device)
    return create_session(path, name=f"{MODEL}/{path.stem}", threads=threads, device=dev)


def _to_float(pcm: NDArray[np.int16] | NDArray[np.float32]) -> NDArray[np.float32]:
    x = np.asarray(pcm).reshape(-1)
    if x.dtype == np.int16:
        return x.astype(np.float32) / 32768.0
    return x.astype(np.float32, copy=False)


def framed(x: NDArray[np.float32], rate: int) -> NDArray[np.float32]:
    """``x`` with exactly :data:`LEAD_S` of what came before its first sound and
    :data:`TAIL_S` after its last (zeros where it had less).

    Moonshine's words move with a clip's framing: the same "Could I come in on Wednesday?"
    was heard right with 85 ms of quiet before it and as "Come back home in on Wednesday."
    with 105 ms, and "Six in the evening." cut 40 ms late as "Fix ...". A live clip's
    framing comes from the VAD's windows and the pauses' timing, so it moved from call to
    call; framed, the same words are the same clip. 150 ms each way heard the most of 120
    espeak renderings (30 script phrases, 4 voices and levels) word for word: 62, against
    51 to 59 for 0 to 300 ms. A sound: a 5 ms step 6 dB over the clip's quietest tenth,
    between -55 and -40 dBFS."""
    step = max(1, round(_FRAME_S * rate))
    n = x.size // step
    if n == 0:
        return x
    rms = np.sqrt(np.mean(np.square(x[: n * step].reshape(n, step), dtype=np.float64), axis=1))
    floor = float(np.percentile(rms, 10))
    loud = np.flatnonzero(rms > min(max(2.0 * floor, _SOUND_MIN), _SOUND_MAX))
    if loud.size == 0:
        return x
    start = int(loud[0]) * step - round(LEAD_S * rate)
    end = (int(loud[-1]) + 1) * step + round(TAIL_S * rate)
    clip = x[max(0, start) : end]
    before, after = max(0, -start), max(0, end - x.size)
    if before or after:
        clip = np.concatenate([np.zeros(before, x.dtype), clip, np.zeros(after, x.dtype)])
    return clip


@dataclass
class _Hypothesis:
    """A decode under way: the decoder's state to go on from and the tokens said so far."""

    past: dict[str, NDArray[np.float32]]
    token: int  # the token to feed the decoder next
    step: int
    out: list[int]
    least: float  # the probability of the least certain word token said
    logp: float  # the model's log probability of the tokens said
    branch: _Hypothesis | None = None  # where a lean first overruled the model


class MoonshineAsr:
    """Moonshine base-en: 16 kHz mono audio in, English text out. Thread-safe."""

    sample_rate = 16000

    def __init__(
        self,
        encoder: Path | None = None,
        decoder: Path | None = None,
        tokenizer: Path | None = None,
        *,
        threads: int = 1,
        device: str = "auto",
        weights: str = "float",
    ) -> None:
        """``weights``: "int8" takes the decoder with 8-bit matrix weights
        (:mod:`model_runtime.int8_matmuls`) where it runs on the CPU; a GPU runs the float
        one (its integer kernels are no faster there)."""
        if weights not in _DECODERS:
            raise ValueError(f"weights {weights!r}: expected one of {', '.join(_DECODERS)}")
        if weights == "int8" and _gpu(device):
            log.info("asr_weights int8: a GPU is there, the float decoder runs on it")
            weights = "float"
        self.weights = weights
        enc = Path(encoder) if encoder else _store_path("encoder_model.onnx")
        dec = Path(decoder) if decoder else _store_path(_DECODERS[weights])
        tok = Path(tokenizer) if tokenizer else _store_path("tokenizer.json")
        self.encoder = _session(enc, threads, device)
        self.decoder = _session(dec, threads, device)
        self.tokenizer = Tokenizer(tok)
        self._past = [
            i.name for i in self.decoder.get_inputs() if i.name.startswith("past_key_values.")
        ]
        shape = next(i.shape for i in self.decoder.get_inputs() if i.name == self._past[0])
        self._heads, self._head_dim = int(shape[1]), int(shape[3])

    def max_tokens(self, samples: int) -> int:
        """The decode cap for this much audio: stops hallucination loops early."""
        return math.ceil(samples / self.sample_rate * _TOKENS_PER_S) + 4

    def tokens(self, pcm: NDArray[np.int16] | NDArray[np.float32]) -> list[int]:
        """Greedy decode; the token ids without start and end tokens."""
        return self.decode(pcm)[0]

    def decode(
        self,
        pcm: NDArray[np.int16] | NDArray[np.float32],
        *,
        words_expected: bool = False,
        bias: PhraseBias | None = None,
    ) -> tuple[list[int], float]:
        """Greedy decode: the token ids (without start and end tokens), and the softmax
        probability of the least certain word token chosen (1.0 when nothing was said).

        ``words_expected``: the clip holds speech for sure (half a second and more of it,
        by the VAD); the end of text may not come first. Moonshine sometimes ends at once
        on a clear short sentence (6 of 48 espeak phrases over G.711 here: "Bob Jones.",
        "Tomorrow at ten."), leaving the caller unanswered; barred, its next choice is
        mostly the words (and its low probability marks the doubt).

        ``bias``: the phrases to lean toward (:mod:`agent.voice.phrase_bias`); the chosen
        token's own probability still counts for the confidence."""
        x = _to_float(pcm)
        if x.size < _MIN_S * self.sample_rate:
            return [], 1.0
        if float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) < _SILENCE_RMS:
            return [], 1.0
        x = framed(x, self.sample_rate)[: int(_MAX_S * self.sample_rate)]
        hidden = self.encoder.run(None, {"input_values": x[None, :]})[0]
        empty = np.zeros((1, self._heads, 0, self._head_dim), dtype=np.float32)
        start = _Hypothesis(dict.fromkeys(self._past, empty), _START, 0, [], 1.0, 0.0)
        cap = self.max_tokens(x.size)
        leaned = self._greedy(hidden, start, cap, words_expected, bias)
        if bias is None or leaned.branch is None:
            return leaned.out, leaned.least
        # the lean changed a word: the model's own words from there on are the other
        # hypothesis, and a phrase only counts once it is whole (a started one is no gain)
        plain = self._greedy(hidden, leaned.branch, cap, words_expected, None)
        if self._credit(plain, bias) >= self._credit(leaned, bias):
            return plain.out, plain.least
        return leaned.out, leaned.least

    def _credit(self, h: _Hypothesis, bias: PhraseBias) -> float:
        """A finished hypothesis's worth: the model's log probability of its tokens, plus
        the bonus of the whole phrases its text holds."""
        return h.logp + bias.whole(bias_text(self.tokenizer.decode(h.out)))

    def _greedy(
        self,
        hidden: NDArray[np.float32],
        h: _Hypothesis,
        cap: int,
        words_expected: bool,
        bias: PhraseBias | None,
    ) -> _Hypothesis:
        """Decode on from ``h`` to the end of text (or ``cap`` tokens), leaning toward
        ``bias``; the result's ``branch`` is where the lean first overruled the model, with
        the model's choice there (None if it never did)."""
        h = _Hypothesis(dict(h.past), h.token, h.step, list(h.out), h.least, h.logp)
        for step in range(h.step, cap):
            feeds: dict[str, Any] = {
                "input_ids": np.array([[h.token]], dtype=np.int64),
                "encoder_hidden_states": hidden,
                "use_cache_branch": np.array([step > 0]),
                **h.past,
            }
            logits, *present = self.decoder.run(None, feeds)
            last = logits[0, -1].astype(np.float64)
            top = float(np.max(last))
            norm = top + math.log(float(np.sum(np.exp(last - top))))  # log p = logit - norm
            choice = last
            if step == 0 and words_expected:
                choice = np.where(np.arange(last.size) == _EOS, -np.inf, last)
            token = int(np.argmax(choice))
            # the cross-attention cache is computed once, on the first step
            h.past.update(
                (name, value)
                for name, value in zip(self._past, present, strict=True)
                if step == 0 or ".decoder." in name
            )
            if bias is not None and bias.active:
                leaned = self._leaning(choice, h.out, bias)
                if leaned != token and h.branch is None:
                    h.branch = _Hypothesis(dict(h.past), 0, step + 1, list(h.out), h.least, h.logp)
                    self._take(h.branch, token, float(last[token]) - norm, cap)
                token = leaned
            if self._take(h, token, float(last[token]) - norm, cap):
                break
        return h

    def _take(self, h: _Hypothesis, token: int, logp: float, cap: int) -> bool:
        """``h`` with ``token`` said next (of log probability ``logp``); True if it ended."""
        h.logp += logp
        h.token = token
        if token == _EOS:
            h.step = cap  # nothing more to decode
            return True
        h.out.append(token)
        if self.tokenizer.has_word(token):
            h.least = min(h.least, math.exp(logp))
        return False

    def _leaning(self, logits: NDArray[np.float64], out: list[int], bias: PhraseBias) -> int:
        """The best of the decoder's few best candidates once each has its phrase bonus
        (the end of text has none)."""
        # only a candidate within the most a bonus can be worth of the best can overtake
        # it (and no SIMD partition: numpy's crashed under qemu's Haswell here)
        near = np.flatnonzero(logits >= float(np.max(logits)) - bias.reach).tolist()
        top = heapq.nlargest(CANDIDATES, near, key=logits.__getitem__)
        before = bias_text(self.tokenizer.decode(out))
        best, best_score = -1, -np.inf
        for t in top:
            score = float(logits[t])
            if t != _EOS and score > -np.inf:
                score += bias.bonus(before, bias_text(self.tokenizer.decode([*out, t])))
            if score > best_score:
                best, best_score = t, score
        return best

    def transcribe(
        self,
        pcm: NDArray[np.int16] | NDArray[np.float32],
        *,
        words_expected: bool = False,
        bias: PhraseBias | None = None,
    ) -> Transcript:
        """Text of a whole utterance ("" for silence or under 0.1 s of audio), with how
        sure the decoder was of its least certain token (``words_expected``, ``bias``: see
        :meth:`decode`)."""
        ids, least = self.decode(pcm, words_expected=words_expected, bias=bias)
        return Transcript(self.tokenizer.decode(ids).strip(), least)


class IncrementalTranscriber:
    """Transcribes while the caller is still speaking so that little is left at end of turn."""

    def __init__(
        self,
        asr: MoonshineAsr,
        executor: concurrent.futures.Executor | None = None,
        *,
        pause_s: float = 0.3,
        max_segment_s: float = 6.0,
        early_s: float = 0.1,
    ) -> None:
        """``early_s``: after this much non-speech the open segment is already sent for
        transcription; if the caller stays quiet that result is the segment's (no second
        pass), if they go on it is cancelled or, when already running, thrown away."""
        self.asr = asr
        self._own_executor = executor is None
        self.executor = executor or concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="asr"
        )
        rate = asr.sample_rate
        self._pause = round(pause_s * rate)
        self._early = min(round(early_s * rate), self._pause)
        self._max = round(max_segment_s * rate)
        self._preroll = round(PREROLL_S * rate)
        self._lock = threading.Lock()
        self._chunks: list[NDArray[np.int16]] = []
        self._size = 0
        self._voiced = False  # the open segment holds speech
        self._quiet = 0  # samples of non-speech since the last speech
        self._done: list[concurrent.futures.Future[str]] = []
        self._early_job: concurrent.futures.Future[str] | None = None  # open segment's
        self._said: list[NDArray[np.int16]] = []  # the closed segments' audio, in order
        self._speech = 0  # samples the VAD called speech in the open segment
        self._sure = round(_WORDS_EXPECTED_S * rate)
        #: what to lean toward, asked as each segment is sent (the dialogue's point then)
        self.bias_source: Callable[[], PhraseBias | None] | None = None

    def push(self, pcm16k: NDArray[np.int16], speech: bool) -> None:
        """Add 16 kHz audio and the VAD's verdict for it; never waits for inference."""
        pcm = np.asarray(pcm16k, dtype=np.int16).reshape(-1).copy()
        with self._lock:
            self._chunks.append(pcm)
            self._size += pcm.size
            if speech:
                self._voiced, self._quiet = True, 0
                self._speech += pcm.size
                if self._early_job is not None:  # the caller went on: that guess is stale
                    self._early_job.cancel()
                    self._early_job = None
            elif self._voiced:
                self._quiet += pcm.size
            else:
                self._trim_preroll()
            if self._voiced and (self._quiet >= self._pause or self._size >= self._max):
                self._close()
            elif self._voiced and self._quiet >= self._early and self._early_job is None:
                audio = np.concatenate(self._chunks)
                self._early_job = self._submit(audio)

    @property
    def open_seconds(self) -> float:
        """Audio in the open segment: what finish() will still have to transcribe."""
        return self._size / self.asr.sample_rate

    def finish(self) -> concurrent.futures.Future[str]:
        """The whole utterance's text (segments joined by spaces); starts a new utterance."""
        with self._lock:
            if self._voiced:
                self._close()
            futures, self._done = self._done, []
            self._said = []
            self._clear()
        return _joined(futures)

    def snapshot(self) -> concurrent.futures.Future[str]:
        """The text so far, without ending the utterance (a reply prepared during a pause
        that may not be the end): closed segments, then the open one as it stands."""
        with self._lock:
            futures = list(self._done)
            if self._voiced and self._early_job is not None:
                futures.append(self._early_job)  # only non-speech came after it
            elif self._voiced:
                audio = np.concatenate(self._chunks)
                futures.append(self._submit(audio))
        return _joined(futures)

    def utterance_audio(self) -> NDArray[np.int16]:
        """The utterance so far as one clip (its segments and the open one, as they are
        transcribed): a turn whose halves were heard apart is heard again whole."""
        with self._lock:
            parts = [*self._said, *(self._chunks if self._voiced else [])]
        return np.concatenate(parts) if parts else np.zeros(0, np.int16)

    def forget(self) -> None:
        """Start a new utterance without cancelling anything: a snapshot took it over."""
        with self._lock:
            self._done = []
            self._said = []
            self._clear()

    def reset(self) -> None:
        """Forget the utterance in progress (barge-in, hang-up); pending work is cancelled."""
        with self._lock:
            for fut in self._done:
                fut.cancel()
            if self._early_job is not None:
                self._early_job.cancel()
            self._done = []
            self._said = []
            self._clear()

    def close(self) -> None:
        """Stop the executor if this transcriber made it."""
        if self._own_executor:
            self.executor.shutdown(wait=False, cancel_futures=True)

    def _close(self) -> None:
        audio = np.concatenate(self._chunks)
        if self._early_job is not None:  # only non-speech came after it: it has every word
            self._done.append(self._early_job)
        else:
            # trailing non-speech beyond the pause adds decode work and nothing else
            audio = audio[: audio.size - max(0, self._quiet - self._pause)]
            self._done.append(self._submit(audio))
        self._said.append(audio)
        self._clear()

    def _submit(self, audio: NDArray[np.int16]) -> concurrent.futures.Future[str]:
        """Transcribe the open segment's ``audio`` in the executor."""
        sure = self._speech >= self._sure  # half a second of speech holds words
        bias = self.bias_source() if self.bias_source is not None else None
        return self.executor.submit(self.asr.transcribe, audio, words_expected=sure, bias=bias)

    def _clear(self) -> None:
        self._chunks, self._size, self._voiced, self._quiet = [], 0, False, 0
        self._speech = 0
        self._early_job = None

    def _trim_preroll(self) -> None:
        while self._chunks and self._size - self._chunks[0].size >= self._preroll:
            self._size -= self._chunks.pop(0).size


def _joined(futures: list[concurrent.futures.Future[str]]) -> concurrent.futures.Future[str]:
    """One future for the texts of ``futures`` in order, without tying up a worker."""
    result: concurrent.futures.Future[str] = concurrent.futures.Future()
    if not futures:
        result.set_result("")
        return result
    remaining = [len(futures)]
    lock = threading.Lock()

    def done(_: concurrent.futures.Future[str]) -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0]:
                return
        try:
            texts = [f.result() for f in futures]
        except BaseException as exc:  # a failed or cancelled segment fails the utterance
            result.set_exception(exc)
        else:
            result.set_result(joined(texts))

    for fut in futures:
        fut.add_done_callback(done)
    return result

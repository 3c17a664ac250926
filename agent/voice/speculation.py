"""A reply prepared during the caller's pause, before the end of the turn is certain.

Why: after the caller's last word the bridge must wait a pause (agent.voice.pause_ms) and
ask smart-turn before it may answer; done one after the other, ASR of the last words, the
dialogue and the first sentence's synthesis add a few hundred ms on top. Started as soon as
a short pause begins, they run during that wait instead. If the turn ends, the reply is
adopted (its first audio is often ready already); if the caller goes on talking, it is
dropped and its words open the continued turn. The dialogue runs on a fork of the engine,
so a dropped speculation leaves no trace in the conversation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import Executor, Future
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from agent.dialogue.engine import DialogueEngine, ReplyPart, Say
from agent.dialogue.sentences import split_sentences
from agent.transcript import joined

__all__ = ["Speculation", "join_texts"]


class _Synth(Protocol):
    def synthesize(self, sentence: str) -> NDArray[np.int16]: ...
    def cached(self, sentence: str) -> NDArray[np.int16] | None: ...


async def join_texts(texts: list[Future[str]]) -> str:
    """The ASR texts of one turn's pieces, in order (a :class:`Transcript`, as sure as its
    least sure piece)."""
    return joined([await asyncio.shield(asyncio.wrap_future(f)) for f in texts])


class Speculation:
    """ASR text -> first reply parts -> the first piece of speech, all ahead of time."""

    def __init__(
        self,
        texts: list[Future[str]],
        engine: DialogueEngine,
        tts: _Synth,
        executor: Executor,
        *,
        first_words: int,
        audio: list[NDArray[np.int16]] | None = None,
    ) -> None:
        self.texts = texts  # the turn's ASR, piece by piece (carried ones first)
        self.audio = audio or []  # the turn's audio, piece by piece (16 kHz), if known
        self.engine = engine  # a fork: adopted on commit
        self.text = ""
        self.head: list[ReplyPart] = []  # reply parts up to and including the first Say
        self.rest: AsyncIterator[ReplyPart] | None = None  # the reply's other parts
        self.first_audio: tuple[str, NDArray[np.int16]] | None = None  # (piece, 8 kHz)
        self.asr_done = self.reply_ready = self.tts_first = 0.0
        self._tts = tts
        self._executor = executor
        self._first_words = first_words
        self.heard = asyncio.Event()  # the ASR text is known
        self.aborted = False
        self.task: asyncio.Task[None] = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        self.text = await join_texts(self.texts)
        self.asr_done = time.monotonic()
        self.heard.set()
        if not self.text:
            return
        self.rest = self.engine.respond(self.text)
        async for part in self.rest:
            self.head.append(part)
            self.reply_ready = self.reply_ready or time.monotonic()
            if isinstance(part, Say):
                break
        say = next((p for p in self.head if isinstance(p, Say)), None)
        pieces = split_sentences(say.text, first_max_words=self._first_words) if say else []
        if pieces:
            pcm = self._tts.cached(pieces[0])  # a phrase every call says: no model job
            if pcm is None:
                loop = asyncio.get_running_loop()
                pcm = await loop.run_in_executor(self._executor, self._tts.synthesize, pieces[0])
            self.first_audio = (pieces[0], pcm)
            self.tts_first = time.monotonic()

    def abort(self) -> list[Future[str]]:
        """The caller went on: stop, and hand back the texts it was given (the last is
        the transcriber's snapshot; the ones before it, words carried from earlier)."""
        self.aborted = True
        self.task.cancel()
        return self.texts

"""What of the agent's reply the caller has actually heard, counted in the agent's own ticks.

The bridge paces whatever an agent writes at one frame per tick, and calls ``on_audio``
once per tick, so an agent that counts ticks knows which of its samples is on the wire
now without asking the bridge. That gives barge-in two things it needs: the level of our
own voice at this moment (line echo of it must not count as the caller talking), and,
when the caller cuts in, how much of each sentence was heard, so the transcript records
only that.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["ReplyPlayout"]


@dataclass
class _Sentence:
    text: str
    start: int  # sample offsets on the reply's timeline
    end: int


class ReplyPlayout:
    """A model of the bridge's outbound queue for one call (pure: no clock, no I/O)."""

    def __init__(self) -> None:
        self._audio: deque[NDArray[np.int16]] = deque()
        self._offset = 0  # samples of _audio[0] already played
        self.written = 0  # samples written since the last reset
        self.head = 0  # samples played since the last reset
        self._sentences: list[_Sentence] = []
        self._reported = 0  # sentences already handed out by take_heard()
        self._played = 0  # samples of the last tick that were audio

    @property
    def queued(self) -> int:
        """Samples written but not yet played."""
        return self.written - self.head

    @property
    def playing(self) -> bool:
        return self.written > self.head

    def begin_sentence(self, text: str) -> None:
        self._sentences.append(_Sentence(text, self.written, self.written))

    def write(self, pcm: NDArray[np.int16]) -> None:
        if not pcm.size:
            return
        self._audio.append(pcm)
        self.written += pcm.size
        if self._sentences:
            self._sentences[-1].end = self.written

    def play(self, n: int) -> NDArray[np.int16]:
        """One tick of ``n`` samples went out: returns them (zeros where nothing played),
        the echo canceller's reference for this tick."""
        out = np.zeros(n, np.int16)
        filled = 0
        while filled < n and self._audio:
            chunk = self._audio[0]
            take = min(n - filled, chunk.size - self._offset)
            out[filled : filled + take] = chunk[self._offset : self._offset + take]
            filled += take
            self._offset += take
            if self._offset >= chunk.size:
                self._audio.popleft()
                self._offset = 0
        self.head += filled
        self._played = filled
        return out

    def advance(self, n: int) -> float:
        """One tick of ``n`` samples went out; returns their RMS (0 when nothing played)."""
        frame = self.play(n)[: self._played].astype(np.float64)
        return float(np.sqrt(np.mean(frame * frame))) if frame.size else 0.0

    def take_heard(self) -> str:
        """Text of sentences fully played since the last call (for the transcript)."""
        done: list[str] = []
        last = len(self._sentences) - 1
        for i in range(self._reported, last + 1):
            s = self._sentences[i]
            if s.end > self.head or (i == last and s.end == s.start):
                break  # still playing, or announced and its audio not here yet
            self._reported = i + 1
            if s.end > s.start:  # a sentence without audio was not heard
                done.append(s.text)
        return " ".join(done)

    def cut(self, fade: NDArray[np.float64] | None = None) -> str:
        """Barge-in: everything unplayed is dropped; returns what was heard and not yet
        reported: whole sentences, then the words of the sentence being played in
        proportion to its samples played (speech is roughly even in words per second).
        ``fade``: the bridge plays the next ``fade.size`` samples faded by it first
        (:meth:`~agent.base.AgentOutput.fade_out`); they stay queued here, faded the same
        way, so :meth:`play` goes on telling what is on the wire."""
        tail = self._unplayed(0 if fade is None else int(fade.size))
        heard = [self.take_heard()] if self._reported < len(self._sentences) else []
        if self._reported < len(self._sentences):
            s = self._sentences[self._reported]
            span = max(1, s.end - s.start)
            frac = min(1.0, max(0.0, (self.head - s.start) / span))
            words = s.text.split()
            part = words[: int(len(words) * frac)]
            if part:
                heard.append(" ".join(part) + " ...")
        self.reset()
        if fade is not None and tail.size:
            self.write(np.rint(tail * fade[: tail.size]).astype(np.int16))
        return " ".join(h for h in heard if h)

    def _unplayed(self, n: int) -> NDArray[np.float64]:
        """The next ``n`` samples queued (fewer if less is queued)."""
        out: list[NDArray[np.int16]] = []
        got, offset = 0, self._offset
        for chunk in self._audio:
            if got >= n:
                break
            piece = chunk[offset : offset + n - got]
            out.append(piece)
            got += piece.size
            offset = 0
        return np.concatenate(out).astype(np.float64) if out else np.zeros(0)

    def reset(self) -> None:
        self._audio.clear()
        self._offset = 0
        self.written = 0
        self.head = 0
        self._sentences.clear()
        self._reported = 0

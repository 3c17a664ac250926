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

__all__ = ["REWIND", "ReplyPlayout"]

REWIND = 2400  # samples (300 ms): how far back a held reply may go on from, to a word gap
_GAP = 80  # 10 ms: the resolution of the search for the gap between two words


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
        # a hold (a backchannel, maybe): the reply waits, its fade plays, then silence
        self.paused = False
        self._tail: NDArray[np.int16] = np.zeros(0, np.int16)  # the fade, off the timeline
        self._recent: deque[NDArray[np.int16]] = deque()  # last REWIND samples played
        self._recent_size = 0
        # ringback or hold audio the bridge has queued ahead of any reply (see
        # write_background); and where the reply's audio began in the last tick
        self._background: deque[NDArray[np.int16]] = deque()
        self._reply_from = 0
        self._tones: list[tuple[int, int]] = []  # where a tone lies on the reply's timeline
        #: The last tick's samples held ringback, hold audio or a tone: nothing an echo
        #: canceller can learn the line from (see EchoCanceller.process).
        self.last_tone = False

    @property
    def last_played(self) -> int:
        """Samples of the last tick that were reply audio (0: silence went out)."""
        return self._played

    @property
    def queued(self) -> int:
        """Samples written but not yet played."""
        return self.written - self.head

    @property
    def playing(self) -> bool:
        return self.written > self.head or self._tail.size > 0

    def begin_sentence(self, text: str) -> None:
        self._sentences.append(_Sentence(text, self.written, self.written))

    def texts(self) -> list[str]:
        """The text of every sentence on the timeline since the last reset (fillers too):
        what the line can be sending back to us as echo."""
        return [s.text for s in self._sentences if s.text]

    def write(self, pcm: NDArray[np.int16]) -> None:
        if not pcm.size:
            return
        self._audio.append(pcm)
        self.written += pcm.size
        if self._sentences:
            self._sentences[-1].end = self.written

    def write_aside(self, pcm: NDArray[np.int16], text: str = "") -> None:
        """Audio that is not part of the reply being written: a filler saying ``text``, or
        a tone (``text`` ""). It gets a sentence of its own, ahead of a reply sentence
        announced whose audio is not here yet (that one's audio comes after it)."""
        if not pcm.size:
            return
        waiting = self._sentences.pop() if self._sentences and self._open_last() else None
        self._sentences.append(_Sentence(text, self.written, self.written + pcm.size))
        if not text:
            self._tones.append((self.written, self.written + pcm.size))
        self._audio.append(pcm)
        self.written += pcm.size
        if waiting is not None:
            self._sentences.append(_Sentence(waiting.text, self.written, self.written))

    def write_background(self, pcm: NDArray[np.int16]) -> None:
        """Audio that goes out beside the reply: ringback or hold audio while a transfer
        rings, a frame a tick and only while no reply is queued, so on the wire ahead of
        any reply written after it. It is in what :meth:`play` returns (the echo canceller
        must know it: measured, its echo taken for the caller cut the apology after a
        refused transfer over and over), never in the reply's timeline: not heard, not
        waited for, not counted in :attr:`last_played`."""
        if pcm.size:
            self._background.append(pcm)

    def _open_last(self) -> bool:
        s = self._sentences[-1]
        return s.end == s.start == self.written and len(self._sentences) > self._reported

    def play(self, n: int) -> NDArray[np.int16]:
        """One tick of ``n`` samples went out: returns them (zeros where nothing played),
        the echo canceller's reference for this tick."""
        out = np.zeros(n, np.int16)
        filled = 0
        while filled < n and self._background:  # (queued before any reply audio now)
            chunk = self._background[0]
            take = min(n - filled, chunk.size)
            out[filled : filled + take] = chunk[:take]
            filled += take
            if take < chunk.size:
                self._background[0] = chunk[take:]
            else:
                self._background.popleft()
        start = self._reply_from = filled
        self.last_tone = filled > 0
        if self._tail.size or self.paused:  # held: the fade, then silence
            k = min(n - start, self._tail.size)
            out[start : start + k] = self._tail[:k]
            self._tail = self._tail[k:]
            self._played = k
            return out
        while filled < n and self._audio:
            chunk = self._audio[0]
            take = min(n - filled, chunk.size - self._offset)
            out[filled : filled + take] = chunk[self._offset : self._offset + take]
            filled += take
            self._offset += take
            if self._offset >= chunk.size:
                self._audio.popleft()
                self._offset = 0
        played = self._played = filled - start
        before, self.head = self.head, self.head + played
        if played and self._tones:
            self._tones = [t for t in self._tones if t[1] > before]  # (the rest played)
            self.last_tone = self.last_tone or any(a < self.head for a, _ in self._tones)
        if played:
            self._recent.append(out[start:filled].copy())
            self._recent_size += played
            while self._recent_size - self._recent[0].size >= REWIND:
                self._recent_size -= self._recent.popleft().size
        return out

    def hold(self, fade: NDArray[np.float64]) -> None:
        """The reply waits where it is (the caller said something: maybe only "uh-huh"):
        the bridge plays the next ``fade.size`` samples faded by ``fade``, then nothing;
        what was not played stays queued here, and what comes from the TTS meanwhile
        queues behind it, for :meth:`resume` or :meth:`cut`."""
        self._tail = np.rint(self._unplayed(fade.size) * fade[: min(fade.size, self.queued)])
        self._tail = self._tail.astype(np.int16)
        self.paused = True
        self._background.clear()  # (the bridge's fade drops all it had queued)

    def resume(self, rewind: int = REWIND) -> NDArray[np.int16]:
        """Go on after a hold, from the quietest 10 ms of the last ``rewind`` samples
        played before it (a gap between words: the caller hears the word we stopped in
        again, whole). Returns everything queued from there, for the bridge to play."""
        recent = np.concatenate(self._recent)[-rewind:] if self._recent else np.zeros(0)
        back = 0
        if recent.size >= _GAP:
            whole = recent[recent.size % _GAP :].astype(np.float64).reshape(-1, _GAP)
            energy = np.einsum("ij,ij->i", whole, whole)
            last_quietest = energy.size - 1 - int(np.argmin(energy[::-1]))
            back = (energy.size - last_quietest) * _GAP
        if self._audio and self._offset:
            self._audio[0] = self._audio[0][self._offset :]
            self._offset = 0
        if back:
            self._audio.appendleft(recent[recent.size - back :].astype(np.int16))
            self.head -= back
        self._recent.clear()
        self._recent_size = 0
        self.paused = False
        self._tail = np.zeros(0, np.int16)
        return np.concatenate(self._audio) if self._audio else np.zeros(0, np.int16)

    def advance(self, n: int) -> float:
        """One tick of ``n`` samples went out; returns their RMS (0 when nothing played)."""
        out = self.play(n)
        frame = out[self._reply_from : self._reply_from + self._played].astype(np.float64)
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
            if s.end > s.start and s.text:  # a sentence without audio was not heard
                done.append(s.text)
        return " ".join(done)

    def cut(self, fade: NDArray[np.float64] | None = None) -> str:
        """Barge-in: everything unplayed is dropped; returns what was heard and not yet
        reported: whole sentences, then the words of the sentence being played in
        proportion to its samples played (speech is roughly even in words per second).
        ``fade``: the bridge plays the next ``fade.size`` samples faded by it first
        (:meth:`~agent.base.AgentOutput.fade_out`); they stay queued here, faded the same
        way, so :meth:`play` goes on telling what is on the wire."""
        if self.paused:  # held: the bridge's queue is empty already, nothing left to fade
            fade = None
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
        self.paused = False
        self._background.clear()
        self._tones.clear()
        self._tail = np.zeros(0, np.int16)
        self._recent.clear()
        self._recent_size = 0
        self._audio.clear()
        self._offset = 0
        self.written = 0
        self.head = 0
        self._sentences.clear()
        self._reported = 0

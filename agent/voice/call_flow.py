"""What the caller hears between the agent's replies, decided once per tick (sans-I/O).

The voice agent tells :class:`CallFlow` each 20 ms tick whether its frame carried our
audio, whether a reply is in the works and whether the caller is speaking; the flow
measures dead air (:mod:`agent.voice.dead_air`), and answers with audio to play now, if any:

- while a transfer is pending and no reply audio is queued: a frame of ringback (or the
  configured hold audio), every tick, until the transfer's outcome is known;
- when a wait has gone ``filler.after_ms`` in silence while the agent works (thinking,
  looking up, preparing the next sentence): the profile's filler phrase, once per wait,
  then a short tone pip each time the wait goes on that long again.

The phrase is synthesised once per process and text (:func:`phrase_for`), before it is
needed; until it exists the pip stands in for it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from agent.dialogue.profile import Filler
from agent.voice.dead_air import DeadAirMeter
from agent.voice.hold_audio import LoopedAudio, Ringback, tone_pip

__all__ = ["CallFlow", "Play", "phrase_for"]

log = logging.getLogger(__name__)

FRAME = 160  # 20 ms at 8 kHz


@dataclass(frozen=True)
class Play:
    """Audio for the caller now: a filler (``text``: its words, "" for a tone), heard like
    the reply (a barge-in cuts it, the transcript keeps it), or a ``background`` frame of
    ringback or hold audio, which goes out beside the reply queue and is never waited for."""

    pcm: NDArray[np.int16]
    text: str = ""
    background: bool = False


_phrases: dict[tuple[int, str], NDArray[np.int16]] = {}
_lock = threading.Lock()


def phrase_for(
    owner: object, text: str, synthesize: Callable[[str], NDArray[np.int16]]
) -> NDArray[np.int16]:
    """``text`` spoken by ``synthesize`` (8 kHz), made once per ``owner`` (the shared
    voice models) and text. Blocking: call it in the models' executor."""
    key = (id(owner), text)
    with _lock:
        pcm = _phrases.get(key)
    if pcm is None:
        pcm = _trimmed(synthesize(text))
        pcm.flags.writeable = False
        with _lock:
            _phrases[key] = pcm
    return pcm


def _trimmed(pcm: NDArray[np.int16], floor: int = 100, keep: int = 80) -> NDArray[np.int16]:
    """Without the TTS's leading and trailing silence (below ``floor``, about -50 dBFS;
    ``keep`` samples of it stay): a filler must be heard the moment it is sent."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > floor)
    if loud.size == 0:
        return pcm
    return pcm[max(0, loud[0] - keep) : loud[-1] + 1 + keep].copy()


class CallFlow:
    """One call's dead-air meter, fillers and transfer hold audio."""

    def __init__(self, filler: Filler, hold_audio: NDArray[np.int16] | None = None) -> None:
        self.filler = filler
        self._hold_audio = hold_audio
        self.meter = DeadAirMeter(0.0)
        self.hold: Ringback | LoopedAudio | None = None  # playing while a transfer rings
        self.transfer_pending = False
        self.phrase: NDArray[np.int16] | None = None  # the filler phrase, once synthesised
        self._pip = tone_pip(filler.tone_hz) if filler.tone_hz > 0 else None
        self._said = False  # the phrase was said in the current wait
        self._rang = False  # a ringback/hold frame went out last tick (it plays this one)
        self.fillers = 0  # fillers played (phrase or pip)

    def start(self, now: float) -> None:
        """The call is answered: the caller waits for the greeting from ``now``."""
        self.meter = DeadAirMeter(now)

    def prepare_phrase(
        self, executor: Executor, synthesize: Callable[[str], NDArray[np.int16]], owner: object
    ) -> None:
        """Synthesise the filler phrase in ``executor`` now (once per ``owner`` and text), so
        it is there before a wait needs it; until then (or if it fails) the pip fills."""
        text = self.filler.text
        if not text:
            return

        def work() -> None:
            try:
                self.phrase = phrase_for(owner, text, synthesize)
            except Exception:  # no phrase: the tone fills instead
                log.exception("filler phrase %r could not be synthesised", text)

        executor.submit(work)

    def transfer_started(self) -> None:
        """A REFER went out: ringback (or hold audio) once the reply before it is out."""
        self.transfer_pending = True

    def transfer_ended(self) -> None:
        """The transfer's outcome is known: the ringback stops (and starts afresh next time)."""
        self.transfer_pending = False
        self.hold = None

    def tick(
        self,
        now: float,
        *,
        played: bool,
        replying: bool,
        queued: bool,
        caller: bool,
        holding: bool = False,
    ) -> tuple[Play | None, float | None]:
        """One tick: ``played`` reply or filler audio went out in this frame, ``replying`` a
        reply is being produced or played, ``queued`` more of it waits to go out, ``caller``
        the caller spoke in this frame, ``holding`` the reply is ready and held back on
        purpose (the caller may go on: no filler then; the wait still counts). Returns
        (what to play now, a dead-air gap that just ended in seconds), either None.
        Ringback pauses while reply audio is queued (an operator's words, the apology) and
        goes on through the caller's own turns."""
        owed = replying or self.transfer_pending
        audible, self._rang = played or self._rang, False
        gap = self.meter.tick(now, audible=audible, owed=owed, caller=caller)
        if not owed:
            self._said = False
        if self.transfer_pending and not queued:
            size = FRAME
            if self.hold is None:
                pcm = self._hold_audio
                self.hold = LoopedAudio(pcm) if pcm is not None else Ringback()
                size = 2 * FRAME  # a frame ahead: a late tick must not leave a gap in it
            self._rang = True
            return Play(self.hold.next_frame(size), background=True), gap
        if (
            owed
            and not queued
            and not holding
            and self.meter.waiting(now) >= self.filler.after_ms / 1000
        ):
            return self._filler(), gap
        return None, gap

    def _filler(self) -> Play | None:
        phrase = self.phrase if self.filler.text else None
        out: Play | None = None
        if phrase is not None and (not self._said or self._pip is None):
            out = Play(phrase, self.filler.text)
        elif self._pip is not None:
            out = Play(self._pip)
        if out is not None:
            self._said = True
            self.fillers += 1
        return out

    def caller_acted(self, now: float) -> float | None:
        """A key, or a keypad entry's timeout: the caller's turn runs until ``now``."""
        return self.meter.caller_acted(now)

    def agent_spoke_up(self, now: float) -> None:
        """The agent speaks up unasked (a no-input prompt): no dead air, no filler, for the
        silence the floor was the caller's."""
        self.meter.agent_spoke_up(now)

    def close(self, now: float) -> float | None:
        """The call ended: the last wait's gap, if it counts."""
        return self.meter.close(now)

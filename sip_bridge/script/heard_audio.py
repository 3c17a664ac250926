"""What a caller heard, and the conversation figures measured on it (no I/O).

:class:`HeardAudio` keeps every 20 ms frame the caller received with its arrival time and
level; "speech" is a frame louder than ``threshold_dbfs`` (G.711 idle noise is about
-70 dBFS, the agent's voice -15 to -25). Everything is measured on that, at the caller's
socket, so it is what a person on the line would perceive:

- :func:`turn_latency`: the caller's last packet with speech -> the first received one.
- :func:`barge_in_reaction`: the caller starts talking over the agent -> the agent's audio
  stops (the start of a silence of at least ``stop_silence_s``: shorter ones are the
  pauses between words and sentences of a reply that goes on).
- :func:`dead_air_gaps`: silences while the caller waits for the agent (the script says
  when it waits: :class:`Span`), including the wait for the first word.

Ringback (the 440 + 480 Hz pair a transfer plays while the target rings) is told apart
from speech, frame by frame as it arrives: it is sound, and its cadence's off time after
a burst (4 s) is part of it, not dead air (a caller hears it as progress: the agent's own
meter counts it the same way, :mod:`agent.voice.dead_air`); but it has no words, so what is
transcribed (:meth:`HeardAudio.segments` and :meth:`HeardAudio.audio` with
``speech_only``) leaves it out.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from agent.voice.hold_audio import RINGBACK

__all__ = [
    "CALLER_FLOOR_S",
    "FRAME_S",
    "RINGBACK_OFF_S",
    "SPEECH_DBFS",
    "STOP_SILENCE_S",
    "Gap",
    "HeardAudio",
    "Reaction",
    "Segment",
    "Span",
    "answer_end",
    "barge_in_reaction",
    "dead_air_gaps",
    "frame_dbfs",
    "merge_spans",
    "ringback_like",
    "turn_latency",
]

FRAME_S = 0.02
#: A frame louder than this carries speech (or a tone): the agent is making a sound.
SPEECH_DBFS = -45.0
#: Silence inside a reply (between words, sentences) is shorter than this.
STOP_SILENCE_S = 0.5
#: Ringback: the tone pair, and the silence after each burst (what the bridge plays).
RINGBACK_HZ: tuple[float, ...] = RINGBACK[0]
RINGBACK_OFF_S: float = RINGBACK[2]
#: Frames of the tone pair in a row before they count as ringback (speech has moments
#: near 440/480 Hz too), and frames either side of such a run that count with it (a
#: burst's first and last frames, part tone and part silence, may not look like it).
RINGBACK_RUN = 10
RINGBACK_EDGE = 2
_RATE = 8000
_probes: dict[int, NDArray[np.complex128]] = {}


def ringback_like(pcm: NDArray[np.int16]) -> bool:
    """Most of the frame's energy at 440 and 480 Hz, and a good share at each (a lone
    440 Hz tone is not ringback)."""
    probe = _probes.get(pcm.size)
    if probe is None:
        n = np.arange(pcm.size)
        probe = _probes[pcm.size] = np.exp(-2j * np.pi * np.outer(RINGBACK_HZ, n) / _RATE)
    x = pcm.astype(np.float64)
    total = float(np.dot(x, x))
    if total <= 0.0:
        return False
    shares = 2 * np.abs(probe @ x) ** 2 / (pcm.size * total)
    return bool(shares.min() > 0.3 and shares.sum() > 0.7)


def frame_dbfs(pcm: NDArray[np.int16]) -> float:
    """RMS level in dBFS (-100 for an empty or all-zero frame)."""
    if pcm.size == 0:
        return -100.0
    rms = math.sqrt(float(np.mean(np.square(pcm, dtype=np.float64))))
    return max(-100.0, 20.0 * math.log10(max(rms, 1e-5) / 32768.0))


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of sound: from the first loud frame's arrival to the end of the last."""

    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Gap:
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


class HeardAudio:
    """The received frames of one call, in arrival order (times on the caller's clock)."""

    def __init__(self, threshold_dbfs: float = SPEECH_DBFS) -> None:
        self.threshold_dbfs = threshold_dbfs
        self.times: list[float] = []
        self.frames: list[NDArray[np.int16]] = []
        self.ringback: list[bool] = []  # per frame: part of a ringback burst
        self._loud: list[float] = []  # arrival times of loud frames, ascending
        self._speech: list[float] = []  # ... of the loud frames that are not ringback
        self._rang: list[float] = []  # ... of the ringback frames
        self._tone_run = 0  # ringback-like frames in a row, up to the last one
        self._after_ring = 0  # frames after a burst that still count with it

    def add(self, t: float, pcm: NDArray[np.int16]) -> None:
        """One received frame; ``t`` never goes back (arrival order)."""
        if self.times and t < self.times[-1]:
            t = self.times[-1]
        i = len(self.frames)
        self.times.append(t)
        self.frames.append(pcm)
        ring = False
        if ringback_like(pcm):
            self._tone_run += 1
            if self._tone_run == RINGBACK_RUN:  # the run is ringback, and the edge before it
                self._mark_ringback(max(0, i - RINGBACK_RUN + 1 - RINGBACK_EDGE))
            ring = self._tone_run >= RINGBACK_RUN
        else:
            if self._tone_run >= RINGBACK_RUN:
                self._after_ring = RINGBACK_EDGE
            self._tone_run = 0
            if self._after_ring:
                self._after_ring -= 1
                ring = True
        self.ringback.append(ring)
        if ring:
            self._rang.append(t)
        if frame_dbfs(pcm) > self.threshold_dbfs:
            self._loud.append(t)
            if not ring:
                self._speech.append(t)

    def _mark_ringback(self, first: int) -> None:
        """Frames ``first`` up to the last one are ringback after all (they are the most
        recent ones: the tail of the speech list)."""
        since = self.times[first]
        while self._speech and self._speech[-1] >= since:
            self._speech.pop()
        for k in range(first, len(self.ringback)):
            if not self.ringback[k]:
                self.ringback[k] = True
                bisect.insort(self._rang, self.times[k])

    def ringback_at(self, t: float) -> bool:
        """The frame that arrived at ``t`` (the last one by then) was ringback."""
        i = bisect.bisect_right(self.times, t)
        return i > 0 and self.ringback[i - 1]

    def loud_between(self, t0: float, t1: float) -> list[float]:
        """Arrival times of loud frames in [t0, t1]."""
        i = bisect.bisect_left(self._loud, t0)
        j = bisect.bisect_right(self._loud, t1)
        return self._loud[i:j]

    def speaking(self, now: float, hold_s: float = 0.1) -> bool:
        """A loud frame ended within the last ``hold_s`` (at ``now``)."""
        return bool(self.loud_between(now - hold_s - FRAME_S, now))

    def last_loud_end(self, before: float = math.inf) -> float | None:
        """The end of the last loud frame that arrived at or before ``before``."""
        i = bisect.bisect_right(self._loud, before)
        return self._loud[i - 1] + FRAME_S if i else None

    def first_loud(self, since: float) -> float | None:
        i = bisect.bisect_left(self._loud, since)
        return self._loud[i] if i < len(self._loud) else None

    def segments(
        self, t0: float, t1: float, gap_s: float, *, speech_only: bool = False
    ) -> list[Segment]:
        """Sound between ``t0`` and ``t1``, split where it was quiet for ``gap_s`` or more
        (``speech_only``: ringback is not sound here, it has no words)."""
        loud = self._speech if speech_only else self._loud
        out: list[Segment] = []
        start = end = None
        for t in loud[bisect.bisect_left(loud, t0) : bisect.bisect_right(loud, t1)]:
            if end is not None and t - end >= gap_s:
                assert start is not None
                out.append(Segment(start, end))
                start = None
            if start is None:
                start = t
            end = t + FRAME_S
        if start is not None and end is not None:
            out.append(Segment(start, end))
        return out

    def audio(self, t0: float, t1: float, *, speech_only: bool = False) -> NDArray[np.int16]:
        """The samples of the frames that arrived in [t0, t1) (``speech_only``: without
        the ringback frames)."""
        i = bisect.bisect_left(self.times, t0)
        j = bisect.bisect_left(self.times, t1)
        frames = [
            f for k, f in enumerate(self.frames[i:j], i) if not (speech_only and self.ringback[k])
        ]
        return np.concatenate(frames) if frames else np.zeros(0, np.int16)


def turn_latency(heard: HeardAudio, caller_end: float, until: float) -> float | None:
    """Seconds from the caller's last speech to the agent's first sound after it, if the
    agent was quiet when the caller stopped and answered before ``until`` (the caller's
    next action or the end of the call)."""
    if heard.speaking(caller_end):
        return None
    t = heard.first_loud(caller_end)
    return t - caller_end if t is not None and t < until else None


@dataclass(frozen=True, slots=True)
class Reaction:
    """The caller began talking at ``onset`` and talked until ``caller_end``.

    ``talking``: the agent was talking then. ``stop``: when its audio stopped (None: it
    kept talking through the caller's speech and ``keep_s`` after)."""

    onset: float
    caller_end: float
    talking: bool
    stop: float | None

    @property
    def stopped(self) -> bool:
        return self.stop is not None

    @property
    def seconds(self) -> float | None:
        return None if self.stop is None else max(0.0, self.stop - self.onset)

    @property
    def overlap_s(self) -> float:
        """How long the agent talked over the caller (the reaction, or all of it)."""
        if not self.talking:
            return 0.0
        end = self.caller_end if self.stop is None else min(self.stop, self.caller_end)
        return max(0.0, end - self.onset)


def barge_in_reaction(
    heard: HeardAudio,
    onset: float,
    caller_end: float,
    now: float,
    *,
    stop_silence_s: float = STOP_SILENCE_S,
    keep_s: float = 1.0,
) -> Reaction | None:
    """How the agent reacted to the caller talking from ``onset`` to ``caller_end``; None
    while that cannot be told yet (at ``now``)."""
    # talking: a sound within a stop's length before (a pause between sentences is not
    # the end of what the agent is saying)
    before = heard.loud_between(onset - stop_silence_s, onset)
    if not before:
        return Reaction(onset, caller_end, False, None)
    limit = max(caller_end, onset) + keep_s
    end = before[-1] + FRAME_S
    for t in heard.loud_between(onset + 1e-9, math.inf):
        if t - end >= stop_silence_s:
            return _stopped(onset, caller_end, end)
        end = t + FRAME_S
        if end > limit:
            return Reaction(onset, caller_end, True, None)
    if now - end >= stop_silence_s:
        return _stopped(onset, caller_end, end)
    return None


def _stopped(onset: float, caller_end: float, stop: float) -> Reaction:
    """A stop that came before the caller began (echo had cut the agent already) is not a
    reaction to the caller: the agent was not talking."""
    if stop <= onset:
        return Reaction(onset, caller_end, False, None)
    return Reaction(onset, caller_end, True, stop)


@dataclass(frozen=True, slots=True)
class Span:
    """A time the caller waited for the agent. ``open_end``: the silence before ``end``
    counts too (what was awaited never came, or was not a sound: a transfer's outcome)."""

    start: float
    end: float
    open_end: bool = False


def merge_spans(spans: Sequence[Span], slack_s: float = 0.05) -> list[Span]:
    """Waits that follow each other are one wait (the caller heard nothing in between)."""
    out: list[Span] = []
    for s in sorted(spans, key=lambda s: s.start):
        if s.end < s.start:
            continue
        if out and s.start <= out[-1].end + slack_s:
            last = out[-1]
            later = s if s.end >= last.end else last
            out[-1] = Span(last.start, max(last.end, s.end), later.open_end)
        else:
            out.append(s)
    return out


# A silence this long after the agent's words, and then more of them: the floor was the
# caller's and the agent asked again (a profile's no-input prompt, "Are you still there?",
# after limits.no_input_s, 3 s at the least). Longer than a ringback's off time, whose
# silence is part of a sound still going on.
CALLER_FLOOR_S = max(3.0, RINGBACK_OFF_S + 0.5)


def answer_end(heard: HeardAudio, start: float, end: float) -> float | None:
    """When the agent's answer heard from ``start`` ended: its sound up to the first
    silence of CALLER_FLOOR_S or more (what comes after asks the caller again); None if
    nothing was heard before ``end``."""
    first = heard.segments(start, end, CALLER_FLOOR_S)
    return first[0].end if first else None


def dead_air_gaps(heard: HeardAudio, spans: Sequence[Span], merge_s: float = 0.7) -> list[Gap]:
    """Silences while the caller waited: before the agent's first sound, between its
    sounds (pauses under ``merge_s`` are part of speech; after a ringback burst, its
    cadence's off time, give or take a packet's jitter), and at the end of a wait whose
    ``open_end`` says so."""
    gaps: list[Gap] = []
    for span in merge_spans(spans):
        cursor = span.start
        for seg in heard.segments(span.start - merge_s, span.end, merge_s):
            if seg.start > cursor:
                gaps.append(Gap(cursor, min(seg.start, span.end)))
            end = seg.end
            if heard.ringback_at(seg.end - FRAME_S):  # the burst's off time rings on
                end += RINGBACK_OFF_S + 2 * FRAME_S
            cursor = max(cursor, end)
        if span.open_end and span.end > cursor:
            gaps.append(Gap(cursor, span.end))
    return [g for g in gaps if g.seconds > 0]

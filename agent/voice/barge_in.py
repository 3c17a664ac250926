"""Is the caller talking over us, or is it our own voice coming back? Decided per 20 ms tick.

Two gates with one interface, both pure (no clock, no I/O): each takes the tick heard and
the tick of our reply that went out at the same time, returns what the rest of the agent
should hear (VAD, ASR, end of turn), and says whether the last ``window`` ticks hold more
than our echo could explain.

- :class:`EchoGate` (the default): a line echo canceller (:mod:`agent.voice.echo_canceller`)
  takes our echo out, and the decision is on the residual. How much of our voice can be
  left in the residual is learnt, not assumed: while we talk, each window's residual
  energy relative to our recent voice's joins a history (``history_s``, windows decided as
  the caller's excepted), and its 90th percentile bounds what echo leaves (relative to the
  canceller's own echo estimate too, once it has one: tighter, and in step with the echo).
  The caller counts when the residual over the window beats that bound (plus the line's
  noise floor) by ``margin_db``, and at least half the window's ticks do on their own. So
  a quiet caller is heard once the canceller has converged (about a second of our voice:
  it finds the echo's delay first), a line without echo lets any caller through within
  half a second of our first word, and a loud echo before convergence cannot pass. A
  percentile, not a running maximum, and recent windows counted late: the first windows of
  a caller's speech must not raise the bound they are measured against.
- :class:`LoudnessGate`: the rule this replaced (the caller's mean energy over the window
  against our loudest window within ``ECHO_S``, minus ``margin_db``), kept to measure
  against (bench/barge_in.py) and for operators who set ``agent.voice.echo_canceller =
  false``.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from agent.ticks import ECHO_S, TICK_S
from agent.voice.echo_canceller import EchoCanceller

__all__ = ["BargeInGate", "EchoGate", "LoudnessGate"]

_QUIET = 10.0 ** (-70 / 10) * 32768.0**2 * 160  # a tick's energy at -70 dBFS
_ERL = 0.25  # before any evidence: echo 6 dB under our voice (G.168), none of it cancelled
_PRIORS = 3
_CONFUSED = 0.5  # while the canceller relearns: echo as loud as our voice 3 dB down
_NOISE_S = 1.5
_NOISE_OVER_MIN = 1.5  # a tick of noise is rarely under 2/3 of its mean power (160 samples)
_BOUND_EVERY = 5  # ticks between updates of the learnt bounds
#: the residual's correlation with the echo estimate at which the estimate is wrong (a
#: caller's voice over a right one: about 0; the error of a wrong one: -0.5 and below)
_AGAINST = 0.25
_MIN_EVIDENCE = 25  # windows (half a second) before the estimate-relative bound is used


class BargeInGate(Protocol):
    window: int
    speech_heard: bool  # the listener's VAD hears speech in what the gate returned

    def process(
        self, heard: NDArray[np.int16], ours: NDArray[np.int16], *, learn: bool = True
    ) -> NDArray[np.int16]:
        """One tick: what the caller's side sent, what we sent (``learn`` False: a tone or
        hold audio, nothing to learn the echo path from); returns what to listen to."""
        ...

    def caller_louder(self) -> bool:
        """Over the last ``window`` ticks, more came back than our echo explains."""
        ...

    def caller_now(self) -> bool:
        """The last tick alone held more than our echo explains (a word too short for a
        barge-in, said over the reply's last moment)."""
        ...

    def forget_recent(self) -> None:
        """The caller barged in: what was heard lately is not our echo."""
        ...


class EchoGate:
    """Echo canceller, then the residual against a learnt bound of what echo is left."""

    def __init__(
        self,
        window: int,
        *,
        margin_db: float = 6.0,
        tail_ms: float = 480.0,
        history_s: float = 1.0,
    ) -> None:
        self.window = max(1, window)
        self.canceller = EchoCanceller(tail_ms=tail_ms)
        self._margin = 10 ** (margin_db / 10)
        tail = self.canceller.partitions
        self._ours: deque[float] = deque([0.0] * tail, maxlen=tail)  # our ticks' energies
        self._env: deque[float] = deque([0.0] * self.window, maxlen=self.window)  # loudest
        self._left: deque[float] = deque([0.0] * self.window, maxlen=self.window)  # residual
        self._est: deque[float] = deque([0.0] * self.window, maxlen=self.window)  # echo taken
        # ... and the echo the canceller expected but could not take out (it is lost)
        self._unfitted: deque[float] = deque([0.0] * self.window, maxlen=self.window)
        # residual . echo taken out: about none when the estimate was our echo, minus the
        # estimate's energy when it was not (what is left is then the estimate's error)
        self._cross: deque[float] = deque([0.0] * self.window, maxlen=self.window)
        self._above: deque[bool] = deque([False] * self.window, maxlen=self.window)
        self._mic: deque[float] = deque([0.0] * self.window, maxlen=self.window)  # heard
        # the line's noise floor: the quietest residual tick of the last 1.5 s (speech, ours
        # or the caller's, has gaps between words), a little above that minimum
        self._recent: deque[float] = deque(maxlen=round(_NOISE_S / TICK_S))
        self._noise = _QUIET
        # residual / our voice of the windows while we talked (the caller's excepted); until
        # there is evidence, a few priors that make the rule the old one: the caller must
        # beat our voice 6 dB down (G.168's minimum return loss, nothing cancelled)
        prior = _ERL / self._margin
        self._ratios: deque[float] = deque([prior] * _PRIORS, maxlen=round(history_s / TICK_S))
        self.bound = prior  # residual / our voice that echo alone reaches (90th percentile)
        # the latest windows' ratios wait before they count: if the caller turns out to have
        # been talking in them (a barge-in), they are dropped (forget_recent)
        self._pending: deque[tuple[float, float | None]] = deque(maxlen=2 * self.window)
        # the same, relative to the echo the canceller took out: once it has converged, that
        # estimate follows the echo in time (no delay to allow for) and bounds it tighter
        self._est_ratios: deque[float] = deque(maxlen=self._ratios.maxlen)
        self._learnt = 0
        self._shifts = 0  # the canceller's moves seen (see _forget_unfollowed)
        self.est_bound = float("inf")
        self.residual_db = -120.0  # the last tick's residual level, for logs and benches
        # set by the listener: its VAD hears speech in the residual. Until half a second of
        # evidence is in, such a window with more left than the prior lets echo leave (our
        # voice 6 dB down, less the margin) is not learnt from: a caller who talks from our
        # first words ("hello?" as the greeting starts) would otherwise be learnt as our
        # echo before their speech had the windows it needs to count, and never be heard
        self.speech_heard = False
        self._prior = prior

    def process(
        self, heard: NDArray[np.int16], ours: NDArray[np.int16], *, learn: bool = True
    ) -> NDArray[np.int16]:
        """``learn`` False: ``ours`` is a tone or hold audio (see EchoCanceller.process):
        its echo is taken out, but neither the canceller nor the bounds learn from it."""
        res = self.canceller.process(heard, ours, learn=learn)
        e_ours = float(np.dot(ours.astype(np.float64), ours))
        e_left = float(np.dot(res, res))
        self._ours.append(e_ours)
        self._env.append(max(self._ours))  # our loudest tick that can still come back
        self._left.append(e_left)
        self._mic.append(float(np.dot(heard.astype(np.float64), heard)))
        echo = self.canceller.echo
        self._est.append(float(np.dot(echo, echo)))
        self._cross.append(float(np.dot(res, echo)))
        self._unfitted.append(self.canceller.unfitted)
        if self.canceller.shifts != self._shifts:
            self._shifts = self.canceller.shifts
            self._forget_unfollowed(self.canceller.moved_late, e_left)
        self.residual_db = float(10 * np.log10(e_left / (32768.0**2 * res.size) + 1e-12))
        # this tick on its own against the echo it may hold (half the margin): a barge-in
        # needs half the window's ticks above it, so a click or a cough (a tick or two,
        # however loud) does not stop us, nor does one loud syllable of residual echo
        echo_now = min(self.bound * self._env[-1], self.est_bound * self._est[-1])
        confused = self.confused
        if confused:
            echo_now = max(echo_now, _CONFUSED * self._env[-1] / self._margin)
        self._recent.append(max(e_left, _QUIET))
        self._noise = _NOISE_OVER_MIN * min(self._recent)
        self._above.append(e_left > self._margin**0.5 * (echo_now + self._noise))
        if (
            self.canceller.active
            and self.canceller.learning
            and not confused
            and not self.caller_louder()
        ):
            self._learn()
        out: NDArray[np.int16] = np.clip(np.rint(res), -32768, 32767).astype(np.int16)
        return out

    def _forget_unfollowed(self, blocks: int, e_left: float) -> None:
        """The echo's delay moved and the canceller found it there this tick: the ticks
        before, ``blocks`` of them, were cancelled where the echo no longer was, and what
        they left was our own voice, not the caller. They count for no more than this
        tick's residual, and none of them was above. Why: at a reply's start after the
        greeting (the jitter buffers settled, the echo 20-40 ms from where it was), the
        first two ticks of its echo came back whole (-44 dBFS at ERL 12 dB): those in the
        window made it louder than the bound for the next 13 ticks, the VAD heard our
        voice in them, and the reply was taken back as the caller going on ("We're
        open... we're open Monday to Friday", tests/test_voice_call_echo.py)."""
        for back in range(1, min(blocks, self.window - 1) + 1):
            self._left[-1 - back] = min(self._left[-1 - back], e_left)
            self._above[-back] = False  # (this tick's is not in yet)

    def _learn(self) -> None:
        """This window had our echo (and noise) only: its ratio joins the history."""
        env = sum(self._env)
        if env <= _QUIET * self.window * 100:  # we were too quiet to learn from
            return
        left = max(0.0, sum(self._left) - self.window * self._noise)
        if self.speech_heard and left > self._prior * env and self._learnt < _MIN_EVIDENCE:
            return
        est = sum(self._est)
        if len(self._pending) == self._pending.maxlen:
            by_voice, by_estimate = self._pending[0]
            self._ratios.append(by_voice)
            if by_estimate is not None:
                self._est_ratios.append(by_estimate)
            self._learnt += 1
            if self._learnt % _BOUND_EVERY == 0:  # a percentile each tick is most of the cost
                self.bound = _p90(self._ratios)
                if len(self._est_ratios) >= _MIN_EVIDENCE:
                    self.est_bound = _p90(self._est_ratios)
        self._pending.append((left / env, left / est if est > env * 1e-4 else None))

    def forget_recent(self) -> None:
        """The caller barged in: the windows not yet counted held their voice, not echo,
        and the canceller learns nothing while our last words leave the tail under it."""
        self._pending.clear()
        self.canceller.caller_talking()

    @property
    def confused(self) -> bool:
        """The canceller takes out little of what it estimates as echo: its estimate is
        at least half of what came back, yet the residual is not 6 dB under that. The echo
        path moved a lot (a jitter buffer resized, a line rerouted) and it has to learn it
        again: until then its residual can be mostly echo, and only a caller louder than
        our own voice 3 dB down counts (the old rule, a little stricter). A caller over a
        canceller that works leaves it far from this: the residual is them, and what came
        back is much more than the estimate (a loud caller) or than the residual (a quiet
        one). An estimate that fitted nothing (not taken out: the residual is what came back)
        counts as taken out for this: measured, a reply's echo 20 ms off the filters' (whole
        partitions away from none) was left whole and, the gate not confused, stopped the
        reply as the caller.

        And what is left must be the estimate's error, not someone else: when the
        estimate is wrong, the residual (what came back less the estimate) goes against
        it (their correlation is about minus the estimate's share of the two); when it is
        our echo, the residual is the caller's voice, which has nothing to do with it.
        Measured in the barge-in simulation: a -35 dBFS caller over echo at ERL 6-12 dB
        (what came back is mostly our echo, the residual all theirs, 5-7 dB under it)
        made a converged canceller look confused by energies alone, and the reply went
        on over them for 480-900 ms."""
        mic, left = sum(self._mic), sum(self._left)
        est, unfitted = sum(self._est), sum(self._unfitted)
        if not (est + unfitted > 0.5 * mic and mic < 4.0 * left):
            return False
        if unfitted >= 0.25 * (est + unfitted):
            return True  # (an estimate not taken out has no residual to go against)
        return -sum(self._cross) > _AGAINST * math.sqrt(left * est)

    def caller_now(self) -> bool:
        return self._above[-1]

    def caller_louder(self) -> bool:
        if 2 * sum(self._above) < self.window:
            return False
        env, left = sum(self._env), sum(self._left)
        floor = self.window * self._noise
        echo = min(self.bound * env, self.est_bound * sum(self._est))
        if self.confused:
            echo = max(echo, _CONFUSED * env / self._margin)
        return left > self._margin * (echo + floor)


def _p90(values: deque[float]) -> float:
    a = np.fromiter(values, np.float64, len(values))
    k = min(a.size - 1, int(0.9 * a.size))
    return float(np.partition(a, k)[k])


class LoudnessGate:
    """The caller's mean energy over the window against our loudest such window within
    ECHO_S, ``margin_db`` down (G.168's minimum echo return loss): the old rule."""

    def __init__(self, window: int, *, margin_db: float = 6.0) -> None:
        self.window = max(1, window)
        self._factor = 10 ** (-margin_db / 10)
        self._ours: deque[float] = deque([0.0], maxlen=self.window + round(ECHO_S / TICK_S))
        self._heard: deque[float] = deque([0.0], maxlen=self.window)
        self.speech_heard = False  # (not used: nothing is learnt)

    def process(
        self, heard: NDArray[np.int16], ours: NDArray[np.int16], *, learn: bool = True
    ) -> NDArray[np.int16]:
        self._ours.append(float(np.mean(ours.astype(np.float64) ** 2)))
        self._heard.append(float(np.mean(heard.astype(np.float64) ** 2)))
        return heard

    def forget_recent(self) -> None:
        pass

    def caller_now(self) -> bool:
        loudest = max(self._ours)
        return self._heard[-1] > loudest * self._factor

    def caller_louder(self) -> bool:
        heard = list(self._heard)
        ours = np.asarray(self._ours)
        run = min(self.window, ours.size)
        loudest = float(np.convolve(ours, np.ones(run), mode="valid").max()) / run
        return sum(heard) / len(heard) > loudest * self._factor

"""Dead air: silence the caller sits through while waiting on us, measured tick by tick.

The definition (what operators see in the call record, metrics and console):

- A **wait** is a time when the caller is waiting on the agent: from the end of the
  caller's turn (their last word, their last key; for a keypad entry that ended by its
  inter-digit timeout, the timeout) until the agent's answer is out and the floor is the
  caller's again. It also covers the agent's own work between pieces of audio: between
  the sentences of a reply, before a transfer's ringback, while a transfer is pending.
- **Dead air** is the silence inside a wait: from the later of the caller's last input and
  the end of our last audio, to the next audio we send (reply, filler, ringback or hold
  audio). A ringback cadence's off time is part of the ringback signal, not dead air, and
  pauses inside synthesised speech are part of the speech.
- Not dead air: silence after we finished a prompt or an answer and the caller is
  expected to speak (the floor is theirs), and silence while the caller types an entry
  that is not complete.
- A wait also ends when the caller speaks again: the silence until then counts only if it
  lasted :data:`RESUME_S` or more (a shorter one was a pause inside the caller's own turn),
  and speech within :data:`ECHO_S` of our last audio is taken for line echo, not the
  caller. A wait the call ends in counts when it had lasted :data:`RESUME_S` or more (a
  shorter one is the moment between our last words and the hang-up).

:class:`DeadAirMeter` is sans-I/O: the agent calls :meth:`DeadAirMeter.tick` once per
20 ms frame with what that frame carried and whether the caller is owed something, and
gets back each gap as it ends.
"""

from __future__ import annotations

from agent.ticks import ECHO_S, TICK_S

__all__ = ["RESUME_S", "DeadAirMeter"]

RESUME_S = 1.0  # silence before the caller speaks again that still counts as dead air


class DeadAirMeter:
    """One call's dead air: the gaps (seconds), the longest and the total.

    ``start`` is when the call was answered: the caller waits for the greeting from then.
    Times are one clock's seconds (the agent's ``time.monotonic``); a tick's ``now`` is
    when its frame went out.
    """

    def __init__(self, start: float) -> None:
        self.gaps: list[float] = []
        self._audio_end = start  # the tick that carried our last audio (at first: the answer)
        self._echo_until = start  # "caller speech" before this is our echo
        self._caller_end = start  # the caller's last speech or key
        self._open: float | None = None  # silence of the current wait began here
        self._owed = False

    @property
    def longest(self) -> float:
        return max(self.gaps, default=0.0)

    @property
    def total(self) -> float:
        return sum(self.gaps)

    def waiting(self, now: float) -> float:
        """How long the caller has waited in silence so far (0 outside a wait)."""
        return 0.0 if self._open is None else max(0.0, now - self._open)

    def tick(self, now: float, *, audible: bool, owed: bool, caller: bool) -> float | None:
        """One frame: ``audible`` our audio went out in it (speech, filler, ringback...),
        ``owed`` the caller waits on us, ``caller`` the caller was speaking in it. Returns
        a gap that ended with this frame (seconds), else None."""
        self._owed = owed
        if audible:
            gap = self._close(now - TICK_S) if self._open is not None else None
            self._audio_end = now
            self._echo_until = now + ECHO_S
            return gap
        if caller and now > self._echo_until:
            return self.caller_acted(now)
        if not owed:
            self._open = None
        elif self._open is None:
            self._open = max(self._audio_end, self._caller_end)
        return None

    def caller_acted(self, now: float) -> float | None:
        """The caller spoke or pressed a key (or their keypad entry timed out) at ``now``:
        their turn runs until then. Ends an open wait (a gap, if it lasted RESUME_S)."""
        gap = None
        if self._open is not None and now - TICK_S - self._open >= RESUME_S:
            gap = self._close(now - TICK_S)
        self._open = None
        self._caller_end = max(self._caller_end, now)
        return gap

    def agent_spoke_up(self, now: float) -> None:
        """The agent takes the floor on its own at ``now`` (a prompt for a caller who said
        nothing): the silence before was the caller's; a wait for it starts now."""
        self._open = None
        self._audio_end = max(self._audio_end, now)

    def close(self, now: float) -> float | None:
        """The call ended at ``now``: the wait it ended in, if it had lasted RESUME_S."""
        if self._open is None or not self._owed or now - self._open < RESUME_S:
            return None
        return self._close(now)

    def _close(self, end: float) -> float:
        assert self._open is not None
        gap = max(0.0, end - self._open)
        self._open = None
        self.gaps.append(gap)
        return gap

"""The call-script player: steps in, actions out (:mod:`sip_bridge.script.script_actions`), no I/O
and no clock of its own.

The runner (:mod:`sip_bridge.script.script_runner`) owns the call. It tells the player what
happened (:meth:`ScriptPlayer.tick` with the time, the caller's audio or keys having gone
out, a transcript, the far end hanging up, a REFER, a transfer's outcome) and carries out
what the player asks (:data:`Action`: send a step's audio or keys, transcribe a stretch of
what was heard, hang up). What the caller heard is the runner's :class:`HeardAudio`, read
here. Times are the runner's clock (seconds); results are reported relative to the answer.

How steps end:

- ``say``/``play``/``dtmf``: when all of it has gone out; with ``barge_in``, once the
  agent's reaction is known (see :func:`~sip_bridge.script.heard_audio.barge_in_reaction`).
- ``expect``: what the agent said since the caller last acted (or the previous ``expect``
  matched) is transcribed reply by reply (a reply ends after ``quiet_ms`` of quiet) and
  matched after each; it fails at ``timeout_s``, or when ``not`` matches. A whole reply
  matching ``repeat_on`` (and not the pattern) has the caller say what they said since the
  last ``expect`` or ``wait`` again, once (keys, pauses and all); then it listens afresh.
- ``wait``: ``silence``: the agent was quiet for ``quiet_ms``; ``speech``: it made a sound.
- ``expect_hangup``, ``expect_refer``: the event came (before this step or during it).
- ``expect_no_dead_air``: judged when the call is over, on every wait from here on.

After a failed step the rest are skipped (``keep_going`` plays them anyway).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from sip_bridge.script.heard_audio import (
    STOP_SILENCE_S,
    HeardAudio,
    Span,
    answer_end,
    barge_in_reaction,
    dead_air_gaps,
    turn_latency,
)
from sip_bridge.script.script_actions import (
    Action,
    CallerTiming,
    HangUp,
    StepResult,
    Summary,
    TalkOver,
    Transcribe,
    normalize_transcript,
    send_action,
    transcript_key,
)
from sip_bridge.script.script_file import (
    CallerHangup,
    Dtmf,
    Expect,
    ExpectHangup,
    ExpectRefer,
    NoDeadAir,
    Script,
    Speak,
    Step,
    Wait,
    WaitSeconds,
)

__all__ = ["ScriptPlayer"]

HOLD_PAUSE_S = 1.0  # barge_in = false: a silence this long is a stop (a hold is shorter)
_TRANSCRIPT_GRACE_S = 10.0  # after a timeout, how long the last transcripts may take


def _stop_silence(barge_in: bool | None) -> float:
    """How long the agent's silence after the caller began must be to count as a stop. A
    step that must not stop it: a backchannel's hold (the reply fades while the caller says
    "uh-huh", and goes on at their pause: 0.4-0.7 s) is a pause, not a stop."""
    return HOLD_PAUSE_S if barge_in is False else STOP_SILENCE_S


@dataclass
class _CallerAction:
    step: Speak | Dtmf
    timing: CallerTiming | None = None


class ScriptPlayer:
    """Plays one :class:`~sip_bridge.script.script_file.Script` against what a call delivers."""

    def __init__(
        self,
        script: Script,
        heard: HeardAudio,
        answered_at: float,
        *,
        keep_going: bool = False,
    ) -> None:
        self.script = script
        self.heard = heard
        self.t0 = answered_at
        self.keep_going = keep_going
        self.results: list[StepResult] = []
        self.finished = False
        self.hung_up_at: float | None = None  # the far end's BYE
        self.refers: list[tuple[float, str]] = []
        self.transfer: tuple[float, str, int] | None = None  # (time, result, SIP status)
        self._i = -1
        self._step_start = answered_at
        self._failed = False
        # The next expect hears from _mark: the start of the first thing the caller did
        # after the last expect or wait (a backchannel does not count), else where that ended.
        self._mark = answered_at
        self._mark_set = False
        # What an expect heard after its match (the agent said two things in one breath):
        # the next expect hears it first. A new caller action or a wait drops it.
        self._carry = ""
        self._wait_from = answered_at  # the caller is waiting for the agent from here
        self._spans: list[Span] = []
        self._scopes: list[tuple[NoDeadAir, float, int]] = []  # step, from, result index
        self._actions: list[_CallerAction] = []
        self._transcripts: dict[tuple[int, int], str] = {}
        self._asked: set[tuple[int, int]] = set()
        self._refers_seen = 0
        self._deadline: float | None = None  # an expect's last chance for its transcripts
        self._final_stop = 0.0  # and the end of what it judges
        self._aborted: str | None = None
        self._ended_at: float | None = None
        self._clock = answered_at  # an expect times out from here (its start, or a repeat's end)
        self._repeats = 0  # times the current expect had the caller say it again
        self._asked_again = ""  # what the agent said then
        self._replay: list[Step] = []  # the caller's answer, still to be said again
        self._replaying: _CallerAction | float | None = None  # going out, or a pause's end

    # ------------------------------------------------------------------ inputs
    def start(self, now: float) -> list[Action]:
        return self._advance(now)

    def tick(self, now: float) -> list[Action]:
        if self.finished:
            return []
        return self._run(now)

    def caller_done(self, step: int, timing: CallerTiming, now: float) -> list[Action]:
        for action in self._actions:
            if action.step.index != step or action.timing is not None:
                continue  # (a step said again is a second action of the same index)
            action.timing = timing
            end = timing.done if isinstance(action.step, Dtmf) else timing.end
            if end is not None and action.step.barge_in is not False:
                if not self._mark_set:  # the agent's answer to it is heard from here on
                    self._mark, self._mark_set, self._carry = timing.start, True, ""
                self._wait_from = end
            break
        return self.tick(now)

    def transcript(self, start: float, end: float, text: str, now: float) -> list[Action]:
        self._transcripts[transcript_key(start, end)] = normalize_transcript(text)
        return self.tick(now)

    def far_end_hung_up(self, now: float) -> list[Action]:
        if self.hung_up_at is None:
            self.hung_up_at = now
        return self.tick(now)

    def refer(self, target: str, now: float) -> list[Action]:
        self.refers.append((now, target))
        return self.tick(now)

    def transfer_result(self, result: str, status: int, now: float) -> list[Action]:
        if self.transfer is None:
            self.transfer = (now, result, status)
        return self.tick(now)

    def abort(self, reason: str, now: float) -> list[Action]:
        """The call cannot go on (the script's time is up, the call failed): the current
        step fails with ``reason``, the rest are skipped."""
        self._aborted = reason
        if self._i < 0:  # before the call started: its first step fails
            return self._advance(now)
        return self.tick(now)

    def finish(self, now: float) -> Summary:
        """The call is over: judge what waits for the end, and measure the call."""
        if not self.finished:
            self._aborted = self._aborted or "the call ended"
            self._run(now)
        self._ended_at = self._ended_at or now
        summary = Summary()
        gaps = dead_air_gaps(self.heard, self._spans)
        summary.dead_air = gaps
        for step, since, idx in self._scopes:
            mine = [g for g in gaps if g.end > since]
            worst = max(mine, key=lambda g: g.seconds, default=None)
            res = self.results[idx]
            if worst is None:
                res.passed, res.detail = True, "no wait for the agent was silent"
            else:
                res.passed = worst.seconds <= step.max_s
                res.detail = (
                    f"longest silence {worst.seconds:.2f} s at {worst.start - self.t0:.1f} s "
                    f"({len(mine)} waits, {sum(g.seconds for g in mine):.1f} s in all)"
                )
        sent = [(a.step, a.timing) for a in self._actions if a.timing is not None]
        summary.sent = sent
        summary.transfer_at = self.transfer[0] if self.transfer is not None else None
        for n, (act, t) in enumerate(sent):
            until = sent[n + 1][1].start if n + 1 < len(sent) else now
            end = t.done if isinstance(act, Dtmf) else t.end
            if end is not None:
                lat = turn_latency(self.heard, end, until)
                if lat is not None:
                    summary.turn_latencies_s.append(lat)
            key = isinstance(act, Dtmf)
            onset, over = (t.start, t.done) if key else (t.onset, t.end)
            if onset is not None and over is not None:
                pause = _stop_silence(act.barge_in)  # judged as its step was
                r = barge_in_reaction(self.heard, onset, over, math.inf, stop_silence_s=pause)
                if r is not None and r.talking:
                    summary.talk_overs.append(TalkOver(act.index, key, act.barge_in, r))
        return summary

    # ------------------------------------------------------------------ stepping
    @property
    def _current(self) -> Step | None:
        steps = self.script.steps
        return steps[self._i] if 0 <= self._i < len(steps) else None

    def _rel(self, t: float) -> float:
        return round(t - self.t0, 3)

    def _advance(self, now: float) -> list[Action]:
        self._i += 1
        self._step_start = self._clock = now
        self._deadline = None
        self._repeats, self._asked_again = 0, ""
        step = self._current
        if step is None:
            self.finished = True
            return []
        if self._failed and not self.keep_going:
            self.results.append(StepResult(step, None, self._rel(now), self._rel(now), "skipped"))
            return self._advance(now)
        if isinstance(step, Speak | Dtmf):
            self._actions.append(_CallerAction(step))
            return [send_action(step), *self._run(now)]
        if isinstance(step, NoDeadAir):
            self.results.append(StepResult(step, None, self._rel(now), self._rel(now),
                                           "judged at the end of the call"))  # fmt: skip
            self._scopes.append((step, now, len(self.results) - 1))
            return self._advance(now)
        if isinstance(step, CallerHangup):
            self._done(step, True, now, "hung up")
            return [HangUp(), *self._advance(now)]
        return self._run(now)

    def _done(self, step: Step, passed: bool, now: float, detail: str) -> None:
        if self._repeats:
            detail += f' (said again after "{self._asked_again}")'
        self.results.append(StepResult(step, passed, self._rel(self._step_start), self._rel(now),
                                       detail, self._repeats))  # fmt: skip
        if not passed:
            self._failed = True

    def _run(self, now: float) -> list[Action]:
        out: list[Action] = []
        while not self.finished:
            step = self._current
            assert step is not None
            verdict = self._check(step, now, out)
            if verdict is None:
                if self._aborted is None or self._transcribing(now):
                    return out
                verdict = (False, self._aborted)
            self._done(step, verdict[0], now, verdict[1])
            if self._aborted is not None:
                self._failed = True
            out += self._advance(now)
        return out

    def _transcribing(self, now: float) -> bool:
        """Transcripts asked for and not back yet (and still worth waiting for)."""
        pending = any(k not in self._transcripts for k in self._asked)
        return pending and (self._deadline is None or now < self._deadline)

    def _ended(self) -> bool:
        return self.hung_up_at is not None

    def _wait_span(self, end: float, open_end: bool) -> None:
        """The caller waited for the agent from ``_wait_from`` to ``end``."""
        start = self._wait_from
        self._spans.append(Span(start, max(start, end), open_end))
        self._wait_from = max(self._wait_from, end)

    # ------------------------------------------------------------------ one step
    def _check(self, step: Step, now: float, out: list[Action]) -> tuple[bool, str] | None:
        """(passed, detail) once the step is over; None while it runs."""
        if isinstance(step, Speak | Dtmf):
            return self._check_caller(step, now)
        if isinstance(step, WaitSeconds):
            if now - self._step_start >= step.seconds:
                return True, ""
            return (False, "the far end hung up") if self._ended() else None
        if isinstance(step, Wait):
            return self._check_wait(step, now)
        if isinstance(step, Expect):
            return self._check_expect(step, now, out)
        if isinstance(step, ExpectHangup):
            if self.hung_up_at is not None:
                self._wait_span(self.heard.last_loud_end(self.hung_up_at) or self._wait_from, False)
                return True, f"BYE after {self.hung_up_at - self.t0:.2f} s"
            if now - self._step_start >= step.timeout_s:
                self._wait_span(now, True)
                return False, f"no hang-up within {step.timeout_s:g} s"
            return None
        if isinstance(step, ExpectRefer):
            return self._check_refer(step, now)
        raise AssertionError(f"unexpected step {step!r}")

    def _check_caller(self, step: Speak | Dtmf, now: float) -> tuple[bool, str] | None:
        action = next(a for a in self._actions if a.step is step)
        t = action.timing
        if t is None:
            return (False, "the far end hung up") if self._ended() else None
        what = f"{t.done - t.start:.2f} s"
        if step.barge_in is None:
            return True, what
        onset, end = (t.start, t.done) if isinstance(step, Dtmf) else (t.onset, t.end)
        if onset is None or end is None:
            return False, "nothing audible was sent"
        silence = _stop_silence(step.barge_in)
        r = barge_in_reaction(self.heard, onset, end, now, stop_silence_s=silence)
        if r is None:
            return None
        if not r.talking:
            return False, "the agent was not talking when the caller began"
        if step.barge_in:
            if r.seconds is None:
                return False, f"the agent kept talking over all {end - onset:.2f} s"
            ms = 1000 * r.seconds
            return ms <= step.within_ms, f"the agent stopped after {ms:.0f} ms"
        if r.seconds is not None:
            return False, f"the agent stopped after {1000 * r.seconds:.0f} ms"
        return True, "the agent kept talking"

    def _check_wait(self, step: Wait, now: float) -> tuple[bool, str] | None:
        quiet = step.quiet_ms / 1000.0
        if step.until == "speech":
            t = self.heard.first_loud(self._step_start - 0.1)
            if t is not None:
                self._wait_span(t, False)
                self._mark, self._mark_set, self._carry = t, False, ""
                return True, f"the agent spoke at {t - self.t0:.2f} s"
        else:
            last = self.heard.last_loud_end(now)
            since = now - max(last or -math.inf, self._step_start)
            if since >= quiet and (last is None or now - last >= quiet):
                self._wait_span(last or self._wait_from, False)
                self._mark, self._mark_set, self._carry = now, False, ""  # not expected
                return True, ""
        if self._ended():
            return (True, "") if step.until == "silence" else (False, "the far end hung up")
        if now - self._step_start >= step.timeout_s:
            self._wait_span(now, step.until == "speech")
            return False, f"no {step.until} within {step.timeout_s:g} s"
        return None

    def _check_expect(self, step: Expect, now: float, out: list[Action]) -> tuple[bool, str] | None:
        quiet = step.quiet_ms / 1000.0
        ended = self._ended() or self._aborted is not None
        if not ended and self._repeating(now, out):
            return None
        timed_out = now - self._clock >= step.timeout_s
        if self._deadline is None and (timed_out or ended):
            self._deadline = now + _TRANSCRIPT_GRACE_S
            self._final_stop = min(now, self.hung_up_at or now)  # what was heard by then
        final = self._deadline is not None
        stop = self._final_stop if final else now
        replies = self.heard.segments(self._mark, stop, quiet, speech_only=True)  # words
        texts: list[str] = []
        complete = True
        for seg in replies:
            start = max(seg.start, self._mark)
            if seg.end > now - quiet and not final:
                complete = False  # the agent may still be talking: not a whole reply yet
                break
            key = transcript_key(start, seg.end)
            if key not in self._transcripts:
                complete = False
                if key not in self._asked:
                    self._asked.add(key)
                    out.append(Transcribe(start, seg.end))
                continue
            texts.append(self._transcripts[key])
        heard = " ".join(t for t in (self._carry, *texts) if t)
        if step.forbid and re.search(step.forbid, heard, re.IGNORECASE):
            self._wait_span(replies[-1].end if replies else now, False)
            return False, f'heard "{heard}" (matches not /{step.forbid}/)'
        match = re.search(step.pattern, heard, re.IGNORECASE)
        if not (match or final) and complete and replies and self._repeat(step, heard):
            self._wait_span(replies[-1].end, False)  # the agent answered: it asked again
            self._repeating(now, out)
            return None
        if match and (complete or final):
            end = replies[-1].end if replies else self._wait_from
            self._wait_span(end, False)
            self._mark, self._mark_set = max(end, self._mark), False
            self._carry = heard[match.end() :].strip()
            return True, f'heard "{heard}"'
        if final and (complete or now >= (self._deadline or now)):
            # silence to the end is dead air when the agent said nothing since the caller
            # waited; after an answer (even a wrong one) it was the caller's turn, and a
            # prompt asking them again after a long silence ("Are you still there?") does
            # not make that silence ours
            said = self.heard.last_loud_end(stop)
            if said is not None and said > self._wait_from:
                self._wait_span(answer_end(self.heard, self._wait_from, stop) or said, False)
            else:
                self._wait_span(now if timed_out else stop, True)
            why = "timed out" if timed_out else self._aborted or "the far end hung up"
            return False, f'{why}; heard "{heard}"' if heard else f"{why}; heard nothing"
        return None

    def _repeat(self, step: Expect, heard: str) -> bool:
        """The agent asked the caller to say it again: queue what they said since the last
        ``expect`` or ``wait`` (False: not asked, already repeated, or nothing said)."""
        if not step.repeat_on or self._repeats or not re.search(step.repeat_on, heard, re.I):
            return False
        steps = self.script.steps
        first = step.index - 1  # back to the step after the last one that listened
        while first > 0 and isinstance(steps[first - 1], Speak | Dtmf | WaitSeconds):
            first -= 1
        answer = steps[first : step.index - 1]
        if not any(isinstance(s, Speak | Dtmf) for s in answer):
            return False
        self._replay = list(answer)
        self._repeats, self._asked_again = 1, heard
        self._mark_set, self._carry = False, ""  # heard afresh from the answer said again
        return True

    def _repeating(self, now: float, out: list[Action]) -> bool:
        """Say the queued answer again, a step at a time; True until all of it is out (and
        then the expect listens afresh, its timeout counted from there)."""
        going = self._replaying
        if isinstance(going, _CallerAction) and going.timing is None:
            return True
        if isinstance(going, float) and now < going:
            return True
        self._replaying = None
        if not self._replay:
            if going is not None:
                self._clock = now  # the answer is out: listen from here
            return False
        step = self._replay.pop(0)
        if isinstance(step, WaitSeconds):
            self._replaying = now + step.seconds
        elif isinstance(step, Speak | Dtmf):
            again = _CallerAction(replace(step, barge_in=None))  # just said, over nothing
            self._actions.append(again)
            self._replaying = again
            out.append(send_action(step))
        return True

    def _check_refer(self, step: ExpectRefer, now: float) -> tuple[bool, str] | None:
        if self._refers_seen < len(self.refers):
            t, target = self.refers[self._refers_seen]
            if step.target and not _same_uri(step.target, target):
                self._refers_seen += 1
                self._wait_span(t, True)
                return False, f"REFER to {target}"
            if not step.result:
                self._refers_seen += 1
                self._wait_span(t, True)
                return True, f"REFER to {target} at {t - self.t0:.2f} s"
            if self.transfer is not None:
                self._refers_seen += 1
                at, result, status = self.transfer
                self._wait_span(at, True)
                ok = result == step.result
                return ok, f"REFER to {target}; the transfer was {result} ({status})"
        if now - self._step_start >= step.timeout_s:
            self._wait_span(now, True)
            if self._refers_seen < len(self.refers):
                return False, f"REFER came, but no transfer result within {step.timeout_s:g} s"
            return False, f"no REFER within {step.timeout_s:g} s"
        if self._ended() and self._refers_seen >= len(self.refers):
            return False, "the far end hung up"
        return None


def _same_uri(a: str, b: str) -> bool:
    """URIs compared as a phone would: without <>, case-insensitive scheme and host."""

    def norm(u: str) -> str:
        u = u.strip().strip("<>").split(";")[0].split("?")[0]
        scheme, _, rest = u.partition(":")
        user, at, host = rest.rpartition("@")
        return f"{scheme.lower()}:{user}{at}{host.lower()}"

    return norm(a) == norm(b)

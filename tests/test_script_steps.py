"""The call-script player, driven by a simulated call (no sockets, no clock)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sip_bridge.script.heard_audio import FRAME_S, HeardAudio
from sip_bridge.script.script_actions import (
    Action,
    CallerTiming,
    HangUp,
    SendAudio,
    SendDtmf,
    Summary,
    Transcribe,
    normalize_transcript,
)
from sip_bridge.script.script_file import parse_script_text
from sip_bridge.script.script_steps import ScriptPlayer

LOUD = np.full(160, 3000, np.int16)
QUIET = np.zeros(160, np.int16)


@dataclass
class Call:
    """The far end as a timetable: what the agent says when; the caller's audio takes
    ``say_s`` to go out. Transcripts are the texts of what was heard in the range."""

    speech: list[tuple[float, float, str]] = field(default_factory=list)
    say_s: float = 1.0
    hangup_at: float | None = None
    refers: list[tuple[float, str]] = field(default_factory=list)
    transfer: tuple[float, str, int] | None = None
    reply_to_caller: tuple[float, float, str] | None = (
        None  # (after the caller's end: delay, length, text)
    )
    replies: list[tuple[float, float, str]] = field(default_factory=list)  # one per say, in turn

    def text(self, start: float, end: float) -> str:
        return " ".join(t for a, b, t in self.speech if a < end and b > start)

    def loud(self, t: float) -> bool:
        return any(a <= t < b for a, b, _ in self.speech)


class Sim:
    def __init__(self, text: str, call: Call, tmp_path: Path, keep_going: bool = False):
        self.script = parse_script_text(text, tmp_path / "s.toml")
        self.call = call
        self.heard = HeardAudio()
        self.player = ScriptPlayer(self.script, self.heard, 0.0, keep_going=keep_going)
        self.t = 0.0
        self.pending: list[tuple[float, str, Any]] = []  # (when, what, data)
        self.log: list[Action] = []
        self.hung_up = False
        self._do(self.player.start(0.0))

    def _do(self, actions: list[Action]) -> None:
        for act in actions:
            self.log.append(act)
            if isinstance(act, SendAudio):
                end = self.t + self.call.say_s
                timing = CallerTiming(self.t, self.t + 0.02, end, end + 0.02)
                self.pending.append((end + 0.02, "sent", (act.step, timing)))
                reply = self.call.replies.pop(0) if self.call.replies else self.call.reply_to_caller
                if reply is not None:
                    delay, length, words = reply
                    self.call.speech.append((end + delay, end + delay + length, words))
            elif isinstance(act, SendDtmf):
                done = self.t + 0.1 * len(act.digits)
                timing = CallerTiming(self.t, None, None, done)
                self.pending.append((done, "sent", (act.step, timing)))
            elif isinstance(act, Transcribe):
                words = self.call.text(act.start, act.end)
                self.pending.append((self.t + 0.1, "text", (act.start, act.end, words)))
            elif isinstance(act, HangUp):
                self.hung_up = True

    def run(self, until: float = 120.0) -> Summary:
        events = sorted(self.call.refers)
        while not self.player.finished and self.t < until:
            self.t = round(self.t + FRAME_S, 6)
            self.heard.add(self.t, LOUD if self.call.loud(self.t) else QUIET)
            for when, what, data in sorted(self.pending, key=lambda p: p[0]):
                if when <= self.t:
                    self.pending.remove((when, what, data))
                    if what == "sent":
                        step, timing = data
                        self._do(self.player.caller_done(step, timing, self.t))
                    else:
                        a, b, words = data
                        self._do(self.player.transcript(a, b, words, self.t))
            while events and events[0][0] <= self.t:
                _, target = events.pop(0)
                self._do(self.player.refer(target, self.t))
            tr = self.call.transfer
            if tr is not None and tr[0] <= self.t and self.player.transfer is None:
                self._do(self.player.transfer_result(tr[1], tr[2], self.t))
            if self.call.hangup_at is not None and self.t >= self.call.hangup_at:
                self._do(self.player.far_end_hung_up(self.t))
            self._do(self.player.tick(self.t))
        return self.player.finish(self.t)

    def statuses(self) -> list[str]:
        return [r.status for r in sorted(self.player.results, key=lambda r: r.step.index)]

    def detail(self, index: int) -> str:
        return next(r.detail for r in self.player.results if r.step.index == index)


GREETING = (0.3, 4.0, "Thanks for calling Acme Support. Press 1 for hours.")


def test_transcripts_normalised() -> None:
    assert normalize_transcript("We're open 8 a.m. to 6 p.m., Monday!") == (
        "we're open 8 a m to 6 p m monday"
    )


def test_a_conversation_passes(tmp_path: Path) -> None:
    call = Call([GREETING], reply_to_caller=(0.6, 2.0, "We're open Monday to Friday."))
    sim = Sim(
        '[[step]]\nexpect = "acme support"\n[[step]]\nsay = "Hours?"\n'
        '[[step]]\nexpect = "monday to friday"\n',
        call,
        tmp_path,
    )
    summary = sim.run()
    assert sim.statuses() == ["PASS", "PASS", "PASS"]
    assert "we're open monday to friday" in sim.detail(3)
    # the second expect heard only the answer, not the greeting again
    assert "acme" not in sim.detail(3)
    assert [round(x, 2) for x in summary.turn_latencies_s] == [0.6]
    r = sim.player.results
    assert r[0].start == 0.0 and 4.9 <= r[0].end <= 5.3  # the greeting, then 1 s of quiet
    assert any(isinstance(a, Transcribe) for a in sim.log)


def test_expect_times_out_with_what_it_heard_and_the_rest_is_skipped(tmp_path: Path) -> None:
    sim = Sim(
        '[[step]]\nexpect = "goodbye"\ntimeout_s = 6\n[[step]]\nsay = "x"\n',
        Call([GREETING]),
        tmp_path,
    )
    sim.run()
    assert sim.statuses() == ["FAIL", "SKIP"]
    assert 'timed out; heard "thanks for calling acme support' in sim.detail(1)
    assert not any(isinstance(a, SendAudio) for a in sim.log)


def test_keep_going_plays_on_after_a_failure(tmp_path: Path) -> None:
    sim = Sim(
        '[[step]]\nexpect = "goodbye"\ntimeout_s = 6\n[[step]]\nsay = "x"\n',
        Call([GREETING]),
        tmp_path,
        keep_going=True,
    )
    sim.run()
    assert sim.statuses() == ["FAIL", "PASS"]


def test_not_fails_an_expect(tmp_path: Path) -> None:
    sim = Sim('[[step]]\nexpect = "hours"\nnot = "acme"\n', Call([GREETING]), tmp_path)
    sim.run()
    assert sim.statuses() == ["FAIL"] and "matches not /acme/" in sim.detail(1)


def test_the_goodbye_just_before_the_bye_is_still_heard(tmp_path: Path) -> None:
    call = Call([(0.5, 2.0, "Thanks for calling. Goodbye!")], hangup_at=2.2)
    sim = Sim('[[step]]\nexpect = "goodbye"\n[[step]]\nexpect_hangup = true\n', call, tmp_path)
    sim.run()
    assert sim.statuses() == ["PASS", "PASS"]
    assert "BYE after 2.2" in sim.detail(2)


def test_a_hang_up_that_never_comes(tmp_path: Path) -> None:
    sim = Sim("[[step]]\nexpect_hangup = true\ntimeout_s = 2\n", Call(), tmp_path)
    sim.run()
    assert sim.statuses() == ["FAIL"] and "no hang-up within 2 s" in sim.detail(1)


@pytest.mark.parametrize(
    ("agent_stops_after", "within", "status", "words"),
    [
        (0.3, 400, "PASS", "stopped after 3"),
        (0.6, 400, "FAIL", "stopped after 6"),
        (None, 400, "FAIL", "kept talking over all"),
    ],
)
def test_barge_in_over_a_long_prompt(
    tmp_path: Path, agent_stops_after: float | None, within: int, status: str, words: str
) -> None:
    # the agent talks from 0.2 s; the caller starts at 2.0 s (1 s of speech)
    end = 30.0 if agent_stops_after is None else 2.02 + agent_stops_after
    sim = Sim(
        f'[[step]]\nwait_s = 2.0\n[[step]]\nsay = "Hours?"\nbarge_in = true\n'
        f"within_ms = {within}\n",
        Call([(0.2, end, "a long prompt")]),
        tmp_path,
    )
    sim.run(until=40)
    assert sim.statuses() == ["PASS", status]
    assert words in sim.detail(2)


def test_a_backchannel_must_not_stop_the_agent(tmp_path: Path) -> None:
    text = '[[step]]\nwait_s = 2.0\n[[step]]\nsay = "uh-huh"\nbarge_in = false\n'
    sim = Sim(text, Call([(0.2, 8.0, "a long answer")], say_s=0.4), tmp_path)
    sim.run()
    assert sim.statuses() == ["PASS", "PASS"] and sim.detail(2) == "the agent kept talking"
    sim = Sim(text, Call([(0.2, 2.3, "a long answer")], say_s=0.4), tmp_path)
    sim.run()
    assert sim.statuses() == ["PASS", "FAIL"] and "stopped after" in sim.detail(2)
    # a backchannel's hold: the answer pauses 0.7 s and goes on (a pause, not a stop);
    # 1.2 s of silence is a stop
    # and the summary (the bench's false barge-ins, the printed reactions) says the same
    held = [(0.2, 2.25, "a long answer"), (2.95, 8.0, "the rest of it")]
    sim = Sim(text, Call(held, say_s=0.4), tmp_path)
    (over,) = sim.run().talk_overs
    assert sim.statuses() == ["PASS", "PASS"] and sim.detail(2) == "the agent kept talking"
    assert over.barge_in is False and not over.reaction.stopped
    gone = [(0.2, 2.25, "a long answer"), (3.45, 8.0, "the rest of it")]
    sim = Sim(text, Call(gone, say_s=0.4), tmp_path)
    (over,) = sim.run().talk_overs
    assert sim.statuses() == ["PASS", "FAIL"] and "stopped after" in sim.detail(2)
    assert over.reaction.stopped


def test_barge_in_needs_the_agent_talking(tmp_path: Path) -> None:
    sim = Sim(
        '[[step]]\nwait_s = 5\n[[step]]\nsay = "x"\nbarge_in = true\n', Call([GREETING]), tmp_path
    )
    sim.run()
    assert sim.statuses() == ["PASS", "FAIL"] and "was not talking" in sim.detail(2)


def test_reactions_are_measured_for_every_talk_over(tmp_path: Path) -> None:
    sim = Sim('[[step]]\nwait_s = 2.0\n[[step]]\nsay = "x"\n', Call([(0.2, 2.35, "p")]), tmp_path)
    summary = sim.run()
    assert len(summary.reactions) == 1
    assert summary.reactions[0].seconds == pytest.approx(0.33, abs=0.03)


def test_waits(tmp_path: Path) -> None:
    sim = Sim(
        '[[step]]\nwait = "speech"\n[[step]]\nwait = "silence"\nquiet_ms = 500\n',
        Call([GREETING]),
        tmp_path,
    )
    sim.run()
    assert sim.statuses() == ["PASS", "PASS"]
    r = sim.player.results
    assert 0.3 <= r[0].end <= 0.4 and 4.5 <= r[1].end <= 4.6
    sim = Sim('[[step]]\nwait = "speech"\ntimeout_s = 1\n', Call(), tmp_path)
    sim.run()
    assert sim.statuses() == ["FAIL"]


def test_keys_and_hang_up(tmp_path: Path) -> None:
    sim = Sim('[[step]]\ndtmf = "54321#"\n[[step]]\nhangup = true\n', Call(), tmp_path)
    sim.run()
    assert sim.statuses() == ["PASS", "PASS"] and sim.hung_up
    keys = [a for a in sim.log if isinstance(a, SendDtmf)]
    assert keys == [SendDtmf(1, "54321#", "rfc4733", 100, 200)]


@pytest.mark.parametrize(
    ("refer", "result", "want", "words"),
    [
        ("sip:agent@127.0.0.1:5070", "", "PASS", "REFER to sip:agent@127.0.0.1:5070"),
        ("<sip:agent@127.0.0.1:5070;transport=udp>", "", "PASS", "REFER"),
        ("sip:other@127.0.0.1", "", "FAIL", "REFER to sip:other"),
        ("sip:agent@127.0.0.1:5070", "answered", "PASS", "was answered (200)"),
        ("sip:agent@127.0.0.1:5070", "rejected", "FAIL", "was answered (200)"),
    ],
)
def test_expect_refer(tmp_path: Path, refer: str, result: str, want: str, words: str) -> None:
    call = Call(refers=[(1.0, refer)], transfer=(2.0, "answered", 200))
    res = f'\nresult = "{result}"' if result else ""
    sim = Sim(f'[[step]]\nexpect_refer = "sip:agent@127.0.0.1:5070"{res}\n', call, tmp_path)
    sim.run()
    assert sim.statuses() == [want] and words in sim.detail(1)


def test_a_no_input_prompt_after_a_wrong_answer_makes_no_dead_air(tmp_path: Path) -> None:
    """The caller asks, the agent answers wrongly (the floor is the caller's again), and 8 s
    later asks "Are you still there?": the expect times out, and those 8 s were the
    caller's turn, not a wait for the agent. When nothing came before the prompt, the
    caller did wait for it: that silence is dead air."""
    text = (
        '[[step]]\nsay = "hours"\n[[step]]\nexpect = "monday"\ntimeout_s = 15\n'
        "[[step]]\nexpect_no_dead_air = 1.5\n"
    )
    wrong = Call([(1.6, 3.0, "Sorry, I didn't catch that."), (11.0, 12.0, "Are you still there?")])
    summary = Sim(text, wrong, tmp_path).run()
    assert summary.longest_dead_air_s == pytest.approx(0.6, abs=0.05)  # the answer's delay
    nothing = Call([(8.0, 9.0, "Are you still there?")])
    sim = Sim(text, nothing, tmp_path)
    summary = sim.run()
    assert sim.statuses() == ["PASS", "FAIL", "SKIP"]
    assert summary.longest_dead_air_s == pytest.approx(7.0, abs=0.05)


def test_dead_air_is_judged_at_the_end(tmp_path: Path) -> None:
    # "please hold", then 6 s of silence before the agent comes back
    call = Call([(0.2, 2.0, "Please hold."), (8.0, 10.0, "Nobody is free.")])
    text = (
        '[[step]]\nexpect = "hold"\n[[step]]\nexpect_no_dead_air = 1.5\n'
        '[[step]]\nexpect = "nobody"\n'
    )
    sim = Sim(text, call, tmp_path)
    summary = sim.run()
    assert sim.statuses() == ["PASS", "FAIL", "PASS"]
    assert "longest silence 6.00 s" in sim.detail(2)
    assert summary.longest_dead_air_s == pytest.approx(6.0, abs=0.05)
    call = Call([(0.2, 2.0, "Please hold."), (2.8, 4.0, "Nobody is free.")])
    sim = Sim(text.replace('"hold"', '"hold"\nquiet_ms = 300'), call, tmp_path)
    sim.run()
    assert sim.statuses() == ["PASS", "PASS", "PASS"]


def test_a_call_that_fails_fails_its_first_step(tmp_path: Path) -> None:
    sim = Sim('[[step]]\nexpect = "x"\n[[step]]\nsay = "y"\n', Call(), tmp_path)
    sim._do(sim.player.abort("the call failed: 486 Busy Here", 0.0))
    sim.player.finish(0.0)
    assert sim.statuses() == ["FAIL", "SKIP"]
    assert sim.detail(1).startswith("the call failed: 486 Busy Here")


def test_two_things_in_one_breath_are_two_expects(tmp_path: Path) -> None:
    """The transfer fails at once: "Please hold. Sorry, nobody is free." is one reply; the
    second expect hears what the first did not need."""
    call = Call([(0.2, 4.0, "Sure, please hold. Sorry, nobody is free.")])
    text = '[[step]]\nexpect = "hold"\n[[step]]\nexpect = "nobody is free"\ntimeout_s = 3\n'
    sim = Sim(text, call, tmp_path)
    sim.run()
    assert sim.statuses() == ["PASS", "PASS"]
    assert sim.detail(2) == 'heard "sorry nobody is free"'
    # a new caller action starts afresh: what was left over is not its answer
    call = Call([(0.2, 4.0, "Sure, please hold. Sorry, nobody is free.")])
    sim = Sim(
        '[[step]]\nexpect = "hold"\n[[step]]\nsay = "x"\n[[step]]\nexpect = "nobody"\n'
        "timeout_s = 3\n",
        call,
        tmp_path,
    )
    sim.run()
    assert sim.statuses() == ["PASS", "PASS", "FAIL"]


ORDER = '[[step]]\nexpect = "order number"\n[[step]]\nsay = "One two three four five."\n'
ASKED_AGAIN = (0.5, 2.5, "Sorry, I need the five digit order number. Please say it again.")
ANSWER = (0.5, 2.0, "Order 12345 shipped on Monday.")
PROMPT = (0.3, 2.0, "What is your order number?")


def test_a_caller_asked_again_says_it_again_once(tmp_path: Path) -> None:
    call = Call([PROMPT], replies=[ASKED_AGAIN, ANSWER])
    sim = Sim('[script]\nrepeat_on = "sorry"\n' + ORDER + '[[step]]\nexpect = "on monday"\n',
              call, tmp_path)  # fmt: skip
    summary = sim.run()
    assert sim.statuses() == ["PASS", "PASS", "PASS"]
    said = [a.step for a in sim.log if isinstance(a, SendAudio)]
    assert said == [2, 2]  # the answer, then the same answer again
    result = sim.player.results[2]
    assert result.repeats == 1
    assert "shipped on monday" in result.detail and "said again after" in result.detail
    assert "sorry i need the five digit" in result.detail
    # the repeat is a turn of its own: two answers, two latencies, each 0.5 s
    assert [round(x, 1) for x in summary.turn_latencies_s] == [0.5, 0.5]
    assert [step.index for step, _ in summary.sent] == [2, 2]


def test_without_repeat_on_a_request_to_say_it_again_fails_the_step(tmp_path: Path) -> None:
    call = Call([PROMPT], replies=[ASKED_AGAIN, ANSWER])
    sim = Sim(ORDER + '[[step]]\nexpect = "on monday"\ntimeout_s = 8\n', call, tmp_path)
    sim.run()
    assert sim.statuses() == ["PASS", "PASS", "FAIL"]
    assert [a.step for a in sim.log if isinstance(a, SendAudio)] == [2]
    assert sim.player.results[2].repeats == 0


def test_the_caller_says_it_again_only_once(tmp_path: Path) -> None:
    call = Call([PROMPT], replies=[ASKED_AGAIN, ASKED_AGAIN, ASKED_AGAIN])
    sim = Sim(ORDER + '[[step]]\nexpect = "on monday"\nrepeat_on = "sorry"\ntimeout_s = 8\n',
              call, tmp_path)  # fmt: skip
    sim.run()
    assert sim.statuses() == ["PASS", "PASS", "FAIL"]
    assert [a.step for a in sim.log if isinstance(a, SendAudio)] == [2, 2]
    assert "timed out" in sim.detail(3) and sim.player.results[2].repeats == 1


def test_what_matches_the_expectation_is_never_asked_again(tmp_path: Path) -> None:
    """``expect`` first: a reply both expected and matching ``repeat_on`` passes."""
    call = Call([PROMPT], replies=[(0.5, 2.0, "Sorry, that order shipped on Monday.")])
    sim = Sim(ORDER + '[[step]]\nexpect = "on monday"\nrepeat_on = "sorry"\n', call, tmp_path)
    sim.run()
    assert sim.statuses() == ["PASS", "PASS", "PASS"]
    assert sim.player.results[2].repeats == 0


def test_a_repeat_says_keys_pauses_and_words_again_in_order(tmp_path: Path) -> None:
    """Everything since the last expect goes again, the pause between included; a step
    that barged in is said again over nothing, as a plain answer."""
    call = Call([PROMPT], replies=[ASKED_AGAIN, ANSWER])
    text = (
        '[[step]]\nexpect = "order number"\n[[step]]\ndtmf = "12"\n[[step]]\nwait_s = 1.5\n'
        '[[step]]\nsay = "three four five"\n[[step]]\nexpect = "on monday"\n'
        'repeat_on = "say it again"\n'
    )
    sim = Sim(text, call, tmp_path)
    summary = sim.run()
    assert sim.statuses() == ["PASS"] * 5
    sent = [(type(a).__name__, a.step) for a in sim.log if isinstance(a, SendAudio | SendDtmf)]
    assert sent == [("SendDtmf", 2), ("SendAudio", 4)] * 2
    went = [(step.index, round(t.start, 1)) for step, t in summary.sent]
    assert [i for i, _ in went] == [2, 4, 2, 4]
    assert went[1][1] - went[0][1] > 1.65 and went[3][1] - went[2][1] > 1.65  # keys, the pause

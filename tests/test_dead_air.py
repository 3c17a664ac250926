"""Dead air, fillers and ringback, sans-I/O: the meter's definition, tick by tick.

A tick is one 20 ms frame; the tests drive :class:`DeadAirMeter` and :class:`CallFlow`
with explicit times and say what each frame carried, as the voice agent does.
"""

from __future__ import annotations

import numpy as np
import pytest

from agent.dialogue.profile import Filler
from agent.voice.call_flow import CallFlow, phrase_for
from agent.voice.dead_air import DeadAirMeter
from agent.voice.hold_audio import LoopedAudio, Ringback, tone_pip

TICK = 0.02


class Ticks:
    """Drives a meter: ``run(n, audible=..., owed=..., caller=...)`` n frames from ``t``."""

    def __init__(self, meter: DeadAirMeter, t: float = 0.0) -> None:
        self.meter, self.t = meter, t
        self.gaps: list[float] = []

    def run(
        self, n: int, *, audible: bool = False, owed: bool = False, caller: bool = False
    ) -> Ticks:
        for _ in range(n):
            self.t = round(self.t + TICK, 6)
            gap = self.meter.tick(self.t, audible=audible, owed=owed, caller=caller)
            if gap is not None:
                self.gaps.append(round(gap, 3))
        return self


def test_the_wait_runs_from_the_callers_last_word_to_our_first_audio() -> None:
    d = Ticks(DeadAirMeter(0.0))
    d.run(50, audible=True)  # the greeting (1 s)
    d.run(100)  # the caller's floor: 2 s of thinking, not dead air
    d.run(40, caller=True)  # they speak for 0.8 s
    d.run(30)  # the end-of-turn pause: not owed yet, but the wait began at their last word
    d.run(10, owed=True)  # the agent works
    d.run(5, audible=True, owed=True)  # the answer starts
    assert d.gaps == [pytest.approx(0.8)]  # 40 silent frames since the last word
    d.run(50, audible=True, owed=True)
    d.run(3, owed=True)  # between two sentences: 60 ms of silence
    d.run(5, audible=True, owed=True)
    d.run(200)  # done: the caller's floor again
    assert d.gaps == [0.8, 0.06]
    assert d.meter.longest == pytest.approx(0.8) and d.meter.total == pytest.approx(0.86)


def test_silence_after_a_prompt_is_the_callers_floor() -> None:
    d = Ticks(DeadAirMeter(0.0))
    d.run(50, audible=True, owed=True)
    d.run(2, owed=True)  # the reply's task notices it is done a tick later
    d.run(500)  # then the caller thinks for 10 s
    assert d.gaps == []


def test_the_greeting_wait_counts_from_the_answer() -> None:
    d = Ticks(DeadAirMeter(0.0))
    d.run(15, owed=True)
    d.run(1, audible=True, owed=True)
    assert d.gaps == [0.3]


def test_caller_speech_in_a_short_wait_was_a_pause_in_their_turn() -> None:
    d = Ticks(DeadAirMeter(0.0))
    d.run(30, caller=True)
    d.run(30, owed=True)  # 0.6 s: the agent thought the turn was over
    d.run(20, caller=True, owed=True)  # but the caller goes on: not dead air
    d.run(10, owed=True)
    d.run(1, audible=True, owed=True)
    assert d.gaps == [0.2]  # only from their last word


def test_caller_speaking_up_after_a_long_wait_ends_it_as_dead_air() -> None:
    d = Ticks(DeadAirMeter(0.0))
    d.run(10, caller=True)
    d.run(100, owed=True)  # 2 s of nothing
    d.run(10, caller=True, owed=True)  # "hello?"
    assert d.gaps == [2.0]


def test_our_echo_right_after_our_audio_is_not_the_caller() -> None:
    d = Ticks(DeadAirMeter(0.0))
    d.run(50, audible=True, owed=True)
    d.run(10, caller=True, owed=True)  # VAD on the line echo of our last word (200 ms)
    d.run(10, owed=True)
    d.run(1, audible=True, owed=True)
    assert d.gaps == [0.4]  # from our audio's end, the echo ignored


def test_a_call_ending_in_a_long_wait_counts_it_a_short_one_does_not() -> None:
    d = Ticks(DeadAirMeter(0.0))
    d.run(10, caller=True)
    d.run(40, owed=True)  # 0.8 s: the moment between our goodbye and the BYE, say
    assert d.meter.close(d.t) is None
    d = Ticks(DeadAirMeter(0.0))
    d.run(10, caller=True)
    d.run(400, owed=True)  # 8 s of silence: the caller hangs up
    assert d.meter.close(d.t) == pytest.approx(8.0)


def test_keys_end_the_callers_turn_where_they_are_pressed() -> None:
    d = Ticks(DeadAirMeter(0.0))
    d.run(100)
    d.meter.caller_acted(d.t)  # the last key of an entry
    d.run(10, owed=True)
    d.run(1, audible=True, owed=True)
    assert d.gaps == [0.2]


def _flow(**kw: object) -> CallFlow:
    flow = CallFlow(Filler(**kw))  # type: ignore[arg-type]
    flow.start(0.0)
    return flow


def _run(flow: CallFlow, n: int, t: float, **kw: bool) -> tuple[float, list[tuple[float, str]]]:
    """n ticks; what the flow asked to play (time, text), the audio played the tick after."""
    out: list[tuple[float, str]] = []
    queued = 0
    for _ in range(n):
        t = round(t + TICK, 6)
        played = queued > 0
        queued = max(0, queued - 160)
        audio, _ = flow.tick(
            t,
            played=played or kw.get("played", False),
            replying=kw.get("replying", False),
            queued=queued > 0 or kw.get("queued", False),
            caller=kw.get("caller", False),
            holding=kw.get("holding", False),
        )
        if audio is not None:
            out.append((t, audio.text))
            if not audio.background:  # (ringback goes beside the reply queue)
                queued += audio.pcm.size
    return t, out


def test_a_slow_reply_gets_the_phrase_then_pips_each_filler_after_ms() -> None:
    flow = _flow(text="One moment.", tone_hz=440, after_ms=1000)
    flow.phrase = np.full(4000, 1000, np.int16)  # 0.5 s
    t, played = _run(flow, 50, 0.0, played=True, replying=True)  # the greeting
    t, played = _run(flow, 30, t)  # the caller's floor
    t, played = _run(flow, 20, t, caller=True)  # the caller asks
    t, played = _run(flow, 200, t, replying=True)  # and the agent thinks for 4 s
    times = [round(x - 2.0, 2) for x, _ in played]
    assert [w for _, w in played] == ["One moment.", "", ""]  # the phrase, then pips
    assert times[0] == pytest.approx(1.0, abs=0.03)  # at filler_after_ms
    # each pip after the previous sound + filler_after_ms (phrase 0.5 s, pip 0.2 s)
    assert times[1] == pytest.approx(1.0 + 0.5 + 1.0, abs=0.05)
    assert times[2] == pytest.approx(2.5 + 0.2 + 1.0, abs=0.05)
    assert max(flow.meter.gaps) <= 1.02
    assert flow.fillers == 3


def test_a_reply_held_on_purpose_gets_no_filler_but_its_wait_counts() -> None:
    """A reply to words not understood waits for a longer pause (the caller may go on):
    a filler then would talk into that pause; the silence is still the caller's wait."""
    flow = _flow(text="", tone_hz=440, after_ms=1000)
    t, _ = _run(flow, 20, 0.0, caller=True)  # the caller speaks
    t, played = _run(flow, 60, t, replying=True, holding=True)  # 1.2 s held
    assert played == [] and flow.fillers == 0
    t, _ = _run(flow, 5, t, played=True, replying=True)  # the reply goes out
    assert flow.meter.gaps == [pytest.approx(1.2, abs=0.03)]


def test_no_filler_before_the_phrase_is_ready_unless_a_tone_is_allowed() -> None:
    flow = _flow(text="One moment.", tone_hz=0, after_ms=500)
    _, played = _run(flow, 100, 0.0, replying=True)
    assert played == []  # phrase not synthesised yet, no tone allowed: nothing to play
    flow = _flow(text="", tone_hz=600, after_ms=500)
    _, played = _run(flow, 40, 0.0, replying=True)
    assert [w for _, w in played] == [""]


def test_ringback_runs_every_tick_while_the_transfer_is_pending() -> None:
    flow = _flow(after_ms=500)
    flow.transfer_started()
    t, played = _run(flow, 10, 0.0, played=True, replying=True, queued=True)  # the reply
    assert played == []  # no ring over it
    t, played = _run(flow, 10, t, replying=True, caller=True)  # the caller talks: it rings on
    assert len(played) == 10
    t, played = _run(flow, 400, t)  # 8 s of ringing, no gaps counted (the cadence is signal)
    assert len(played) == 400
    assert all(g <= 0.02 for g in flow.meter.gaps), flow.meter.gaps  # the tick before it
    flow.transfer_ended()
    t, played = _run(flow, 100, t)
    assert played == [] and flow.hold is None


def test_ringback_is_440_plus_480_hz_two_seconds_on_four_off() -> None:
    rb = Ringback()
    pcm = np.concatenate([rb.next_frame(160) for _ in range(600)])  # 12 s
    burst = pcm[:16000].astype(np.float64)
    spectrum = np.abs(np.fft.rfft(burst))
    peaks = sorted(np.argsort(spectrum)[-2:] * 8000 / burst.size)
    assert peaks == pytest.approx([440, 480], abs=1)
    # 2 s on, 4 s off, then on again: every 6 s
    assert np.all(pcm[16000:48000] == 0) and np.any(pcm[48000:48160] != 0)
    assert np.count_nonzero(pcm[48000:64000]) > 15000 and np.all(pcm[64000:96000] == 0)
    level = 10 * np.log10(np.mean(burst**2) / 32768**2)
    assert level == pytest.approx(-22 + 10 * np.log10(2), abs=0.3)  # two tones at -22 each


def test_hold_audio_loops_and_the_pip_is_short_and_soft() -> None:
    loop = LoopedAudio(np.arange(500, dtype=np.int16))
    got = np.concatenate([loop.next_frame(160) for _ in range(5)])
    assert np.array_equal(got, np.arange(800) % 500)
    with pytest.raises(ValueError):
        LoopedAudio(np.zeros(0, np.int16))
    pip = tone_pip(440)
    assert pip.size == 1600 and abs(int(pip[0])) < 50 and abs(int(pip[-1])) < 50
    assert 20 * np.log10(np.sqrt(np.mean(pip.astype(np.float64) ** 2)) / 32768) < -24


def test_the_filler_phrase_is_made_once_and_starts_with_its_first_sound() -> None:
    made: list[str] = []

    def synthesize(text: str) -> np.ndarray:
        made.append(text)
        return np.concatenate([np.zeros(800, np.int16), np.full(1600, 3000, np.int16),
                               np.zeros(1200, np.int16)])  # fmt: skip

    owner = object()
    a = phrase_for(owner, "One moment.", synthesize)
    b = phrase_for(owner, "One moment.", synthesize)
    assert a is b and made == ["One moment."]  # once per process (per models) and text
    assert a.size == 1600 + 2 * 80 and int(a[80]) == 3000  # 10 ms of its silences kept
    assert not a.flags.writeable  # shared by every call


def test_the_agent_speaking_up_unasked_starts_a_new_wait() -> None:
    """A no-input prompt after 8 s of the caller's silence: those 8 s were the caller's
    floor, not dead air; only the prompt's own delay counts."""
    m = DeadAirMeter(0.0)
    t = 0.0
    for _ in range(10):  # our last words
        t += TICK
        m.tick(t, audible=True, owed=True, caller=False)
    for _ in range(400):  # the floor is the caller's: nothing owed
        t += TICK
        m.tick(t, audible=False, owed=False, caller=False)
    m.agent_spoke_up(t)
    for _ in range(5):  # the prompt is being rendered
        t += TICK
        assert m.tick(t, audible=False, owed=True, caller=False) is None
    t += TICK
    gap = m.tick(t, audible=True, owed=True, caller=False)
    assert gap is not None and gap == pytest.approx(5 * TICK)

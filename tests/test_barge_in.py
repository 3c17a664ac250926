"""Barge-in on the real models: callers at line levels stop the agent, its own echo never does.

The agent (VAD, echo canceller, the demo profile's greeting and replies in Piper's voice)
runs tick by tick over a simulated line (testkit/barge_in_sim.py): our voice comes back late,
down by the echo return loss, through a hybrid's band-pass and G.711, over line noise. The
callers are espeak-ng voices and two human recordings (beckett.wav; an Asterisk prompt) at
exact active-speech levels. What is checked is behaviour: the tick the agent flushed its
reply against the tick the caller started talking, and that a reply with only echo coming
back plays out whole with no turn taken.
"""

from __future__ import annotations

import asyncio
import wave
from collections.abc import Callable, Coroutine
from functools import cache, wraps
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from agent.base import DeadAir, HangupEvent
from agent.voice.voice_agent import VoiceSettings
from sip_bridge.script.script_voice import espeak_ng
from testkit.barge_in_sim import REPLIES, Line, Sim, beckett, models, onset_sample
from testkit.line_echo import at_level

# serial: reaction times, and what a backchannel is taken for, move with other tests' load
pytestmark = pytest.mark.serial

QUESTION = "Hello, I would like to ask about my order, it has not arrived yet."
ASTERISK = Path("/usr/share/asterisk/sounds/en/vm-intro.wav")  # asterisk-core-sounds-en-wav
MIN_SPEECH_MS = 250  # the demo profile's [barge_in] min_speech_ms
VOICES = ["en-us", "en+m3", "en+f3", "en-gb", "beckett", "asterisk"]


def aio(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    @wraps(test)
    def sync(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return sync


@cache
def voice(name: str) -> NDArray[np.int16]:
    if name == "beckett":
        return beckett()
    if name == "asterisk":
        with wave.open(str(ASTERISK)) as w:  # a missing package fails here, never skips
            assert w.getframerate() == 8000
            return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    return espeak_ng(QUESTION, name)


@pytest.fixture(scope="module", autouse=True)
def _models() -> None:
    models()  # load and warm once for the module


async def _reaction_ms(line: Line, pcm: NDArray[np.float64], at_s: float) -> float | None:
    """The caller starts ``pcm`` ``at_s`` into the greeting: ms from their first word to
    the agent's flush of its reply (None: it never stopped)."""
    sim = Sim(line)
    await sim.start()
    tick = round(at_s * 50)
    line.say_at(tick, pcm)
    onset = tick + onset_sample(pcm) / 160
    try:
        await sim.run(tick + 100, lambda: bool(sim.out.flush_ticks))
    finally:
        await sim.stop()
    return (sim.out.flush_ticks[0] - onset) * 20 if sim.out.flush_ticks else None


@pytest.mark.parametrize("level", [-15, -25, -30, -38])
@pytest.mark.parametrize("name", VOICES)
@aio
async def test_a_caller_at_any_line_level_stops_the_agent_in_time(name: str, level: int) -> None:
    """Light echo (ERL 20 dB, 60 ms) and line noise, 3 s into the greeting."""
    pcm = at_level(voice(name), level)
    took = await _reaction_ms(Line(20, 60, noise_dbfs=-60), pcm, 3.0)
    assert took is not None, "the agent talked over the caller"
    # not before the caller made a sound: beckett.wav breathes for 330 ms before its first
    # word (at -33 dBFS in the -15 dBFS clip, 18 dB under its speech: under the onset's
    # threshold), which the VAD may join to the run it started on our residual echo
    lead_ms = onset_sample(pcm) / 8
    assert -lead_ms < took <= MIN_SPEECH_MS + 150, took


@pytest.mark.parametrize(("erl", "delay_ms"), [(6, 10), (6, 150), (12, 60), (20, 200)])
@aio
async def test_a_caller_stops_the_agent_over_its_echo(erl: float, delay_ms: float) -> None:
    """Double talk: a caller at -30 dBFS over our echo, 3 s into the greeting."""
    pcm = at_level(voice("en+m3"), -30)
    took = await _reaction_ms(Line(erl, delay_ms), pcm, 3.0)
    assert took is not None and 0 < took <= MIN_SPEECH_MS + 150, took


@pytest.mark.parametrize(("erl", "delay_ms", "at_s"), [(12, 60, 2.5), (6, 150, 4.0)])
@aio
async def test_a_quiet_caller_over_a_loud_echo_stops_the_agent_in_time(
    erl: float, delay_ms: float, at_s: float
) -> None:
    """A -35 dBFS caller over echo 6-12 dB under our voice: what comes back is mostly our
    echo, what the canceller leaves is all theirs. Judged by energies alone, that looked
    like a canceller that had lost the echo (the gate then wants a caller as loud as our
    voice 3 dB down), and the greeting went on over them for 880 and 480 ms."""
    pcm = at_level(espeak_ng("What are your opening hours?", "en-us"), -35)
    took = await _reaction_ms(Line(erl, delay_ms, noise_dbfs=-60), pcm, at_s)
    assert took is not None and 0 < took <= MIN_SPEECH_MS + 150, took


@aio
async def test_a_first_syllable_the_vad_doubts_counts_from_its_sound() -> None:
    """A recorded "hours" (Asterisk's prompt) at -25 dBFS: the VAD scores its first 220 ms
    0.25-0.42 while it is 35 dB over the line's noise. The agent counts min_speech_ms from
    where that sound began, not from the VAD's first sure window (it stopped after 440 ms)."""
    with wave.open(str(ASTERISK.with_name("hours.wav"))) as w:
        pcm = at_level(np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16), -25)
    took = await _reaction_ms(Line(None, 60, noise_dbfs=-60), pcm, 3.0)
    assert took is not None and 0 < took <= MIN_SPEECH_MS + 150, took


@pytest.mark.parametrize("at_s", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("erl", [None, 20])
@aio
async def test_a_caller_who_talks_as_the_greeting_starts_stops_it(
    erl: float | None, at_s: float
) -> None:
    """A caller's "hello?" at pickup: the greeting (synthesised before the first tick, so
    out at once, as a fast or cached one is) and the caller start together, before the
    canceller has heard a second of our voice. The caller's windows
    must not be learnt as our echo; the agent stops before their question is over."""
    pcm = at_level(espeak_ng("What are your opening hours?", "en-us"), -20)
    took = await _reaction_ms(Line(erl, 60, noise_dbfs=-60), pcm, at_s)
    spoken_ms = (pcm.size - onset_sample(pcm)) / 8
    assert took is not None and 0 < took < spoken_ms, (took, spoken_ms)


async def _echo_only(line: Line, replies: list[str], settings: VoiceSettings | None = None) -> Sim:
    sim = Sim(line, settings=settings)
    await sim.start()
    try:
        await sim.run_until_quiet()
        for text in replies:
            await sim.say(text)
            await sim.run_until_quiet()
    finally:
        await sim.stop()
    return sim


@pytest.mark.parametrize(
    ("erl", "delay_ms", "colour", "noise"),
    [
        (6, 10, True, -65),
        (6, 150, True, -65),
        (6, 200, True, -65),
        (12, 60, True, -65),
        (20, 200, True, -65),
        (6, 150, False, -65),
        (None, 0, True, -65),
        (6, 150, True, -50),  # a noisy line: its hiss is not the caller either
        (None, 0, True, -45),
    ],
)
@aio
async def test_our_own_echo_never_stops_the_agent(
    erl: float | None, delay_ms: float, colour: bool, noise: float
) -> None:
    """The greeting and three replies (about 25 s of our voice) with only echo and line
    noise coming back: all of it is played, nothing is flushed, no turn is taken."""
    line = Line(erl, delay_ms, colour=colour, noise_dbfs=noise)
    sim = await _echo_only(line, REPLIES[:3])
    assert sim.agent.barge_ins == 0 and sim.out.flush_ticks == []
    assert sim.agent.turns == []
    spoken = sum(sim.out.sizes) / 8000
    assert spoken > 20.0 and sim.out.queue.queued_samples == 0


@aio
async def test_the_old_loudness_rule_fails_both_ways() -> None:
    """Kept selectable for comparison (agent.voice.echo_canceller = false), the rule this
    replaced stops for a loud echo and misses a quiet caller: why it was replaced."""
    old = VoiceSettings(echo_canceller=False)
    sim = await _echo_only(Line(6, 150), [], settings=old)
    assert sim.agent.barge_ins > 0  # its own echo at ERL 6 dB stopped the greeting
    quiet = at_level(voice("en-us"), -38)
    line = Line(None, 0)
    sim = Sim(line, settings=old)
    await sim.start()
    line.say_at(150, quiet)
    await sim.run(300)
    await sim.stop()
    assert sim.out.flush_ticks == []  # a -38 dBFS caller never did


@pytest.mark.slow
@aio
async def test_ten_minutes_of_our_voice_with_echo_and_no_false_barge_in() -> None:
    """ERL 6 dB at 150 ms through the hybrid: ten minutes of replies, zero barge-ins."""
    line = Line(6, 150)
    sim = Sim(line)
    await sim.start()
    try:
        await sim.run_until_quiet()
        k = 0
        while sim.tick < 10 * 60 * 50:
            await sim.say(REPLIES[k % len(REPLIES)])
            await sim.run_until_quiet()
            k += 1
    finally:
        await sim.stop()
    assert sim.agent.barge_ins == 0 and sim.agent.turns == []


@pytest.mark.parametrize("word", ["Okay.", "Right.", "Uh-huh."])
@aio
async def test_a_backchannel_does_not_stop_the_greeting_and_is_no_turn(word: str) -> None:
    """ "Okay." 3 s into the greeting, over its echo: the greeting pauses at most, goes on
    from where it was, and plays to its end; no turn, no barge-in in the record."""
    line = Line(12, 60, noise_dbfs=-60)
    sim = Sim(line)
    await sim.start()
    greeting = sum(sim.out.sizes)
    line.say_at(150, at_level(espeak_ng(word, "en-us"), -25))
    try:
        await sim.run(3000, lambda: sim.tick > 200 and not sim.agent.playout.playing, realtime=True)
    finally:
        await sim.stop()
    agent = sim.agent
    # a pause inside "uh-huh" may let the reply go on between its halves: each is one
    assert agent.backchannels >= 1 and agent.barge_ins == 0 and agent.turns == []
    # no turn, no gap of dead air: nothing but the call measured from its start
    assert [e for e in sim.out.events if not isinstance(e, HangupEvent)] == [DeadAir(None)]
    played = sim.out.queue.popped_samples
    assert played >= greeting  # all of it went out (the word it paused in, twice)
    assert agent.engine is not None and len(agent.engine.transcript) == 1  # the greeting


@aio
async def test_words_after_okay_are_a_barge_in() -> None:
    line = Line(12, 60, noise_dbfs=-60)
    sim = Sim(line)
    await sim.start()
    line.say_at(150, at_level(espeak_ng("Okay, what are your opening hours?", "en-us"), -25))
    try:
        await sim.run(
            600, lambda: bool(sim.agent.turns and sim.agent.turns[0].asr_done), realtime=True
        )
    finally:
        await sim.stop()
    # the reply may go on in the pause after "Okay," (where the transcriber is quick), then
    # stops again for good at the question: one barge-in, the question is the turn
    assert sim.agent.barge_ins == 1 and sim.agent.backchannels <= 1
    assert "hours" in sim.agent.turns[0].text.lower()

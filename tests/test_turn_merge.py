"""A caller who pauses mid-utterance: one turn, one answer, and nothing they said is lost.

The agent runs on its real models over a simulated line (testkit/barge_in_sim.py), ticking in
real time so that end of turn, ASR and TTS take the time they take. The caller pauses long
enough for the agent to end the turn and start a reply, then goes on within a second: the
reply stops, the halves are answered together, and the call record (the agent's
TurnCompleted events) has one turn. Checked on what was answered and reported, never on a
model's score; the words come from our ASR, so checks allow its slips ("ask her about").
"""

from __future__ import annotations

import asyncio
import wave
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from agent.base import HangupEvent, TurnCompleted
from sip_bridge.script.script_voice import espeak_ng
from testkit.barge_in_sim import Line, Sim, models
from testkit.line_echo import at_level

# serial: pauses measured in ms against the agent's reply, which other tests' load moves
pytestmark = pytest.mark.serial

GOODBYE = Path("/usr/share/asterisk/sounds/en/goodbye.wav")  # a person saying it


@pytest.fixture(scope="module", autouse=True)
def _models() -> None:
    models()


def _reported(sim: Sim) -> list[TurnCompleted]:
    return [e for e in sim.out.events if isinstance(e, TurnCompleted)]


async def _say_with_pauses(pieces: list[NDArray[np.float64]], pause_ms: int) -> Sim:
    """After the greeting, the caller says ``pieces`` with ``pause_ms`` between them
    (``sim.pauses``: each pause's first tick and the tick the caller goes on)."""
    line = Line(12, 60, noise_dbfs=-60)
    sim = Sim(line)
    await sim.start()
    await sim.run_until_quiet()
    tick = sim.tick + 10
    pauses = []
    for pcm in pieces:
        line.say_at(tick, pcm)
        tick += pcm.size // 160 + pause_ms // 20
        pauses.append((tick - pause_ms // 20, tick))
    sim.pauses = pauses[:-1]  # type: ignore[attr-defined]
    try:
        await sim.run(tick - sim.tick + 300, realtime=True)
    finally:
        await sim.stop()
    return sim


@pytest.mark.parametrize("pause_ms", [700, 1000])
def test_a_pause_mid_question_is_one_turn_with_one_answer(pause_ms: int) -> None:
    first = at_level(espeak_ng("Hi, I would like to ask about", "en-us"), -25)
    rest = at_level(espeak_ng("my order, please.", "en-us"), -25)
    sim = asyncio.run(_say_with_pauses([first, rest], pause_ms))
    (turn,) = _reported(sim)
    heard = turn.caller_text.lower()
    assert "ask" in heard and "order" in heard, heard  # both halves, in one turn
    assert "order number" in turn.agent_text, turn.agent_text  # answered as one question
    assert not turn.barged_in and len(sim.agent.turns) == 1
    assert sim.agent.merges >= 1
    callers = [t for who, t in sim.agent.engine.transcript if who == "caller"]  # type: ignore[union-attr]
    assert callers == [turn.caller_text]
    if pause_ms < 900:  # the first half is not understood: no "Sorry, I didn't..." in the
        assert not _spoke_in_pauses(sim), "the agent spoke in the pause"  # pause


@pytest.mark.parametrize("pause_ms", [700, 1200])
def test_the_goodbye_after_pauses_is_never_lost(pause_ms: int) -> None:
    """ "Great, thanks. [pause] That's all. [pause] Goodbye.": however the pauses split it,
    the agent says goodbye and hangs up, and no turn is reported with nothing heard."""
    with wave.open(str(GOODBYE)) as w:
        bye = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    pieces = [
        at_level(espeak_ng("Great, thanks.", "en-us"), -25),
        at_level(espeak_ng("That's all.", "en-us"), -25),
        at_level(bye, -25),
    ]
    sim = asyncio.run(_say_with_pauses(pieces, pause_ms))
    assert any(isinstance(e, HangupEvent) for e in sim.out.events)
    turns = _reported(sim)
    assert turns and "goodbye" in turns[-1].agent_text.lower(), turns
    assert all(t.caller_text for t in turns), turns
    if pause_ms < 900:
        assert len(turns) == 1, turns
        # "Great, thanks." is not understood: its pause hears nothing of a fallback
        # ("That's all." is a goodbye, answered at once: the merge stops that one)
        assert not _spoke_in_pauses(sim, 1), "the agent spoke in the pause"


def test_a_goodbye_said_over_our_closing_is_answered_and_the_call_ends() -> None:
    """The demo's pauses script: "Great, thanks. [0.8 s] That's all. [0.8 s] No thanks,
    goodbye." Two merges in a row, then the 0.8 s pause (plus the VAD's lag) ends the turn
    at max_silence_ms, and the caller's last words come over our goodbye and stop it.
    Their words are answered (the dialogue goes on from before the goodbye they stopped)
    and the call ends; before, the ended dialogue answered nothing and the line stayed
    silent until the caller hung up."""
    pieces = [
        at_level(espeak_ng(text, "en-us"), -20)
        for text in ("Great, thanks.", "That's all.", "No thanks, goodbye.")
    ]
    sim = asyncio.run(_say_with_pauses(pieces, 800))
    assert any(isinstance(e, HangupEvent) for e in sim.out.events)
    turns = _reported(sim)
    assert turns and "goodbye" in turns[-1].agent_text.lower(), turns
    assert all(t.caller_text for t in turns), turns


def _spoke_in_pauses(sim: Sim, first: int | None = None, after_ms: int = 300) -> bool:
    """Did the agent send sound in a pause between the caller's pieces (the ``first`` ones),
    or ``after_ms`` into the next piece (a reply begun in the pause, before it was stopped)?
    -45 dBFS: far above the silence it sends, far below speech."""
    pauses: list[tuple[int, int]] = sim.pauses[:first]  # type: ignore[attr-defined]
    return any(
        level > -45 for a, b in pauses for level in sim.sent_level[a - 1 : b + after_ms // 20]
    )

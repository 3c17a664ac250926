"""The barge-in gate over the echo canceller (agent/voice/barge_in.py: EchoGate), fed a
SIP call through the bridge as the agent saw it: is what is left the caller, or our echo?"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from agent.voice.barge_in import EchoGate
from resample.g711 import ulaw_decode, ulaw_encode
from sip_bridge.script.script_voice import espeak_ng
from testkit.line_echo import at_level

N = 160  # samples a 20 ms tick
WINDOW = 13  # the voice agent's gate window: the default barge-in min_speech_ms, 250, in ticks
MOVED_CALL = Path(__file__).parent / "data" / "echo_moved_at_reply.npz"
REPLY_TICK = 794  # the answer's first sound in the capture (its echo from tick 800)


def _capture() -> tuple[NDArray[np.int16], NDArray[np.int16]]:
    data = np.load(MOVED_CALL)
    return ulaw_decode(data["heard"]), ulaw_decode(data["ours"])


def _louder_ticks(heard: NDArray[np.int16], ours: NDArray[np.int16]) -> tuple[list[int], int]:
    """The ticks from the reply's start on where the gate found the caller louder than our
    echo, and the canceller's moves over the call."""
    gate = EchoGate(WINDOW)
    louder = []
    for t in range(heard.size // N):
        gate.process(heard[t * N : (t + 1) * N], ours[t * N : (t + 1) * N])
        if t >= REPLY_TICK and gate.caller_louder():
            louder.append(t)
    return louder, gate.canceller.shifts


@cache
def _caller() -> NDArray[np.float64]:
    return at_level(espeak_ng("Actually, I have another question.", "en-us+m3"), -30.0)


def test_the_echo_of_a_reply_that_came_back_moved_is_not_the_caller() -> None:
    """tests/data/README.md: the greeting at ERL 12 dB / 60 ms, the caller's question (at
    -30 dBFS, ticks 700-784), then the answer. Its echo came back 20-40 ms from where the
    greeting's had: the canceller found it there on its third tick (tick 802), and the two
    before came back whole (-44 dBFS). They made the gate's window louder than our echo
    for 13 ticks, the agent's VAD heard our voice in them, and the answer was taken back
    as the caller going on ("We're open... we're open Monday to Friday"). Nothing of it is
    the caller now."""
    heard, ours = _capture()
    louder, moves = _louder_ticks(heard, ours)
    assert moves >= 1  # the case: the echo moved at the reply's start
    assert louder == []


@pytest.mark.parametrize("onset_tick", [800, 805, 812])
def test_a_caller_over_the_moved_echo_is_still_heard(onset_tick: int) -> None:
    """The same call with a caller who talks over the answer's start (-30 dBFS, an espeak
    voice), from the tick its echo came back on, or a little after: the gate hears them
    within a window of their start (a barge-in needs half a window of ticks above)."""
    heard, ours = _capture()
    caller = _caller()[: heard.size - onset_tick * N]
    mixed = heard.astype(np.float64)
    mixed[onset_tick * N : onset_tick * N + caller.size] += caller
    line = ulaw_decode(ulaw_encode(np.clip(np.rint(mixed), -32768, 32767).astype(np.int16)))
    louder, _ = _louder_ticks(line, ours)
    assert louder and louder[0] <= onset_tick + WINDOW, louder[:5]

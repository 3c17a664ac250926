"""Barge-in over real SIP calls with line echo of our own voice.

The bridge runs the shipped config (voice agent, demo profile, real models); the caller is
the packet-level phone (`wire_caller.py`) on loopback, whose line sends back what it plays,
down by the echo return loss, late, through a hybrid's band-pass (testkit/line_echo.py), as
a 2-wire line does. It plays our packets by RTP timestamp on its own clock, so the echo's
delay as the agent counts it moves by whole frames from one reply to the next (our send
grid restarts at each talkspurt, the jitter buffers on both ends adapt): the canceller
must follow it (agent/voice/echo_canceller.py), and its echo must never stop the agent.

Checked on the wire and by ear: the caller's packets and what it heard, transcribed back
(after the call: a transcription during it would take CPU from the bridge). A call of
echo only hears the greeting and the answer to their ends; a caller at -30 dBFS over our
echo stops the greeting and has the question answered. Each call takes 10-20 s.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from agent.base import FADE_MS
from agent.voice.voice_agent import VoiceAgent
from resample import Resampler
from sip_bridge.agents import make_agent, prepare_agents
from sip_bridge.config.loader import BridgeConfig, load_config
from sip_bridge.script.script_voice import espeak_ng
from sip_bridge.server import BridgeServer
from testkit.barge_in_sim import onset_sample
from testkit.line_echo import LineEcho, at_level
from testkit.sipp_media import random_port_range
from testkit.wire_caller import SPEECH_DBFS, WireCaller

ROOT = Path(__file__).resolve().parents[1]
# its first 400 ms are voice with no gap ("Hello what", in one breath: a comma's 140 ms
# pause may end the turn there). A question that opens with "What" alone gives the VAD
# 140 ms, then the "t"'s 80 ms of silence: the barge-in then often waits for the next
# word, 300 ms later. In espeak's en-us voice Moonshine makes out "opening" in it at -30
# dBFS, over noise too (en+m3, en+f3: "what's up? You're going for the out", "").
QUESTION = "Hello what are your opening hours?"
VOICE = "en-us"
STOPPED_S = 0.7  # a silence longer than the greeting's pauses (400 ms at most): it stopped
HOURS = "We're open Monday to Friday, 8 a.m. to 6 p.m., and Saturday 9 to 1."  # the answer
CALL_S = 40.0  # one call, dialled to hung up: about 20 s; a hang fails it


pytestmark = pytest.mark.usefixtures("quiet_gc")  # tests/conftest.py


@pytest.fixture(scope="module")
def config() -> BridgeConfig:
    cfg = load_config(ROOT / "config" / "bridge.toml")
    low, high = random_port_range(40, 32000, 39000)
    cfg = replace(
        cfg,
        sip=replace(cfg.sip, listen="127.0.0.1:0"),
        http=replace(cfg.http, listen=""),
        rtp=replace(cfg.rtp, ports=f"{low}-{high}"),
        records=replace(cfg.records, enabled=False),
    )
    prepare_agents(cfg)  # load and warm the models once for the module
    return cfg


@pytest.fixture(scope="module")
def question() -> NDArray[np.int16]:
    """The caller: a voice other than the agent's, at -30 dBFS active speech level."""
    pcm = at_level(espeak_ng(QUESTION, VOICE), -30.0)
    return np.clip(np.rint(pcm), -32768, 32767).astype(np.int16)


@dataclass
class Heard:
    """One call as the caller lived it; transcribed after it ended (a transcription while
    the call runs takes CPU from the bridge under test)."""

    greeting: NDArray[np.int16]  # what the caller heard of the greeting (empty: barged in)
    answer: NDArray[np.int16]  # ... from the first sound after the question
    agent: VoiceAgent
    seconds: float  # the call, dialled to hung up
    onset: float = 0.0  # the caller's first word left (loop time)
    stopped: float = 0.0  # the greeting's last packet with speech arrived


def transcribe(config: BridgeConfig, pcm8k: NDArray[np.int16]) -> list[str]:
    """The words a listener hears in ``pcm8k``, lower case, punctuation gone; from just
    before its first sound (Moonshine may hear nothing after seconds of silence)."""
    models, _ = prepare_agents(config)
    loud = np.flatnonzero(np.abs(pcm8k.astype(np.int32)) > 300)  # ~ -40 dBFS
    pcm8k = pcm8k[max(0, int(loud[0]) - 800) :] if loud.size else pcm8k
    text = models.asr.transcribe(Resampler(8000, 16000).process(pcm8k))
    return re.findall(r"[a-z0-9']+", text.lower())


def _spoken_s(pcm: NDArray[np.int16]) -> float:
    """From the first word's onset to the last word's end (the same criterion backwards)."""
    return (pcm.size - onset_sample(pcm[::-1]) - onset_sample(pcm)) / 8000


def _since(caller: WireCaller, mark: int) -> NDArray[np.int16]:
    heard = caller.log.heard[mark:]
    return np.concatenate(heard) if heard else np.zeros(0, np.int16)


async def _answered(caller: WireCaller, since: float) -> NDArray[np.int16]:
    """What the caller hears from the first speech after ``since`` to a silence after it."""
    start = await caller.wait_speech(since, 10.0)
    assert start is not None, "no answer"
    assert await caller.wait_quiet(1.2, 15.0) is not None, "the answer never ended"
    return _since(caller, sum(1 for t, _ in caller.log.received if t < start))


async def _call(
    config: BridgeConfig, echo: LineEcho, question: NDArray[np.int16], barge_in_at_s: float | None
) -> Heard:
    """One call. ``barge_in_at_s``: the caller asks that far into the greeting (None: after
    it, in the silence that follows)."""
    agents: list[VoiceAgent] = []

    def factory(cfg: BridgeConfig) -> VoiceAgent:
        agent = make_agent(cfg)
        assert isinstance(agent, VoiceAgent)
        agents.append(agent)
        return agent

    loop = asyncio.get_running_loop()
    dialled = loop.time()
    server = BridgeServer(config, agent_factory=factory)
    await server.start()
    caller = WireCaller(server.uri, line_echo=echo)
    try:
        await caller.connect(("127.0.0.1", server.port))
        assert caller.status == 200
        start = await caller.wait_speech(0.0, 10.0)
        assert start is not None, "no greeting"
        if barge_in_at_s is None:
            assert await caller.wait_quiet(1.2, 20.0) is not None, "the greeting never ended"
            greeting = _since(caller, 0)
            answer = await _answered(caller, await caller.say_all(question))
            return Heard(greeting, answer, agents[0], loop.time() - dialled)
        await asyncio.sleep(max(0.0, start + barge_in_at_s - loop.time()))
        first = len(caller.log.sent)  # the question's frames leave from the next packet on
        caller.say(question)
        while caller.speaking:
            await asyncio.sleep(0.02)
        onset = caller.log.sent[first + onset_sample(question) // 160][0]
        asked = onset + _spoken_s(question)  # their last word ended
        answer = await _answered(caller, asked)
        # the greeting's last packet with speech: the one before the first silence after
        # their first word that outlasts the greeting's pauses (their onset if they began
        # in a pause of it and it did not go on)
        rx = caller.log.received
        playing = any(onset - 2 * STOPPED_S < t <= onset and db > SPEECH_DBFS for t, db in rx)
        assert playing, "the greeting had stopped before the caller spoke"
        stopped = onset
        for t, db in rx:
            if t <= stopped:
                continue
            if db > SPEECH_DBFS:
                stopped = t
            elif t - stopped >= STOPPED_S:
                break
        return Heard(
            np.zeros(0, np.int16), answer, agents[0], loop.time() - dialled, onset, stopped
        )
    finally:
        await caller.hangup()
        await server.stop()


def _run(
    config: BridgeConfig, echo: LineEcho, question: NDArray[np.int16], at: float | None
) -> Heard:
    """The call, bounded: a hang fails it instead of holding the run."""
    return asyncio.run(asyncio.wait_for(_call(config, echo, question, at), CALL_S))


LINES = [(6.0, 150.0), (12.0, 60.0)]  # ERL dB, delay ms: the bench lines


@pytest.mark.parametrize(("erl_db", "delay_ms"), LINES)
def test_our_echo_never_stops_the_greeting_or_the_answer(
    config: BridgeConfig, question: NDArray[np.int16], erl_db: float, delay_ms: float
) -> None:
    """Only our own echo comes back while we talk: the greeting and the answer to the
    question asked after it both play to their last word, and nothing stopped them."""
    heard = _run(config, LineEcho(erl_db, delay_ms), question, None)
    agent = heard.agent
    greeting, answer = transcribe(config, heard.greeting), transcribe(config, heard.answer)
    print(f"ERL {erl_db:g} dB, {delay_ms:g} ms, {heard.seconds:.1f} s: {greeting}, {answer}")
    assert (agent.barge_ins, agent.merges, agent.backchannels) == (0, 0, 0)
    # one turn, the question, answered whole (nothing of our echo made one); what the ASR
    # made of the question is the models' business, the answer shows it was understood
    assert len(agent.turns) == 1 and not agent.turns[0].barged_in, agent.turns
    assert " ".join(agent.turns[0].heard).endswith(HOURS), agent.turns  # (after a filler)
    # "Thanks for calling Acme support. ... or 0 for a person.": from the first word to
    # the last
    assert "acme" in greeting[:5] and "person" in greeting[-3:], greeting
    assert {"monday", "friday"} <= set(answer) and "saturday" in answer[-7:], answer


@pytest.mark.parametrize(("erl_db", "delay_ms", "within_s"), [(*LINES[0], None), (*LINES[1], 1.0)])
def test_a_quiet_caller_stops_the_greeting_over_our_echo(
    config: BridgeConfig,
    question: NDArray[np.int16],
    erl_db: float,
    delay_ms: float,
    within_s: float | None,
) -> None:
    """Double talk: the caller at -30 dBFS over our echo, 3 s into the greeting; it
    stops, as the caller hears it, while they are still asking, and the question is
    answered; our echo stops nothing else.

    The issue's target, min_speech_ms + 150 ms of their first word (plus the 100 ms fade:
    500 ms on the wire), is printed, not asserted: over these calls it is missed now and
    then. At ERL 12 dB / 60 ms: 305-390 ms in about 60 calls, once 560 ms (so 1 s is
    asserted: within their first words). At ERL 6 dB / 150 ms (our echo 6 dB louder than
    they are): 180-380 ms, but in about a quarter of the calls the gate takes their first
    word for echo and the barge-in comes on the next, 480-640 ms (once 955 ms on one
    loaded core), so only the question's length is asserted. See docs/voice-agent.md, "What
    barge-in still misses". 0: they began in a pause of the greeting, which did not go on."""
    heard = _run(config, LineEcho(erl_db, delay_ms), question, 3.0)
    agent = heard.agent
    took_ms = 1000 * (heard.stopped - heard.onset)
    answer = transcribe(config, heard.answer)
    target_ms = agent.settings.barge_in_ms + 150 + FADE_MS
    met = "met" if took_ms <= target_ms else "missed"
    print(f"ERL {erl_db:g} dB, {delay_ms:g} ms, {heard.seconds:.1f} s: the greeting stopped "
          f"{took_ms:.0f} ms after the caller's first word (the issue's target, "
          f"{target_ms:.0f} ms: {met}); merges {agent.merges}; {answer}")  # fmt: skip
    # their first word's onset to their last's end, or less
    bound_ms = 1000 * (_spoken_s(question) if within_s is None else within_s)
    assert took_ms <= bound_ms, (took_ms, bound_ms)
    # one barge-in: the question is a turn, answered whole (our echo at the answer's start
    # did not pass for the caller going on: no merge)
    assert (agent.barge_ins, agent.merges, agent.backchannels) == (1, 0, 0)
    assert len(agent.turns) == 1 and " ".join(agent.turns[0].heard).endswith(HOURS), agent.turns
    assert {"monday", "friday", "saturday"} <= set(answer), answer

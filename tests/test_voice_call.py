"""End to end over SIP: a caller asks the demo agent questions aloud and hears the answers.

The bridge runs the shipped config (voice agent, demo profile, real models); the caller
is a packet-level phone (`wire_caller.py`) speaking espeak-ng questions. What it heard is
transcribed back with our ASR and must contain the answer's words, so these tests check
the whole cascade (VAD, end of turn, ASR, dialogue, TTS, pacing) through G.711.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from agent.base import FADE_MS
from agent.voice.voice_agent import VoiceAgent
from resample import Resampler
from sip_bridge.agents import prepare_agents
from sip_bridge.config.loader import BridgeConfig, load_config
from sip_bridge.ops.records import CallRecords
from sip_bridge.script.script_voice import espeak_ng
from sip_bridge.server import BridgeServer
from testkit.sipp_media import random_port_range
from testkit.voice_agents import VoiceAgents
from testkit.wire_caller import SPEECH_DBFS, WireCaller

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("quiet_gc")  # tests/conftest.py


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> BridgeConfig:
    cfg = load_config(ROOT / "config" / "bridge.toml")
    low, high = random_port_range(40, 32000, 39000)
    db = tmp_path_factory.mktemp("records") / "calls.sqlite"
    cfg = replace(
        cfg,
        sip=replace(cfg.sip, listen="127.0.0.1:0"),
        http=replace(cfg.http, listen=""),
        rtp=replace(cfg.rtp, ports=f"{low}-{high}"),
        records=replace(cfg.records, enabled=True, db=str(db)),
    )
    prepare_agents(cfg)  # load and warm the models once for the module
    return cfg


async def transcribe(config: BridgeConfig, pcm8k: NDArray[np.int16]) -> str:
    """What a listener hears in ``pcm8k``, by our ASR, in a thread: the bridge under test
    shares this event loop, and a second of blocking it would garble the call."""
    models, _ = prepare_agents(config)
    pcm16k = Resampler(8000, 16000).process(pcm8k)
    return (await asyncio.to_thread(models.asr.transcribe, pcm16k)).lower()


class Conversation:
    """One call: the caller's side of it, plus the bridge's agent for its timestamps and
    the bridge itself for what an operator sees of the call (``sip-bridge status``)."""

    def __init__(self, caller: WireCaller, agent: VoiceAgent, server: BridgeServer) -> None:
        self.caller = caller
        self.agent = agent
        self.server = server
        self._mark = 0  # received packets already handed out by heard_since_mark()

    async def wait_speech(self, since: float, timeout_s: float = 15.0) -> float:
        """Arrival time of the first received speech packet after ``since``."""
        t = await self.caller.wait_speech(since, timeout_s)
        assert t is not None, f"no speech from the bridge within {timeout_s} s"
        return t

    async def wait_quiet(self, quiet_s: float = 1.2, cap_s: float = 30.0) -> float:
        """Until the bridge has sent no speech for ``quiet_s``; returns its last speech."""
        last = await self.caller.wait_quiet(quiet_s, cap_s)
        assert last is not None, f"the bridge kept talking for {cap_s} s"
        return last

    def heard_since_mark(self) -> NDArray[np.int16]:
        heard = self.caller.log.heard[self._mark :]
        self._mark = len(self.caller.log.heard)
        return np.concatenate(heard) if heard else np.zeros(0, np.int16)

    async def ask(self, pcm8k: NDArray[np.int16]) -> float:
        """Say it; returns the send time of its last packet with speech."""
        self.heard_since_mark()
        return await self.caller.say_all(pcm8k)


class LoopStalls:
    """When this event loop (the bridge's and the caller's both) ran nothing for longer
    than ``slack_s``: time a loaded machine took from both, not the bridge's reaction."""

    def __init__(self, slack_s: float = 0.01) -> None:
        self.slack_s = slack_s
        self.stalls: list[tuple[float, float]] = []  # (when it ended, how long past slack)

    async def watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.005)
            late = loop.time() - before - 0.005
            if late > self.slack_s:
                self.stalls.append((loop.time(), late - self.slack_s))

    def within(self, start: float, end: float) -> float:
        """Seconds stalled past the slack between ``start`` and ``end``."""
        return sum(s for t, s in self.stalls if start < t <= end + s)


async def _call(config: BridgeConfig, codec: str, script, **caller_opts):  # type: ignore[no-untyped-def]
    agents = VoiceAgents()
    server = BridgeServer(config, agent_factory=agents)
    await server.start()
    caller = WireCaller(server.uri, codec=codec, **caller_opts)
    try:
        await caller.connect(("127.0.0.1", server.port))
        assert caller.status == 200
        # `sip-bridge status` says where each model runs (CPU here; CUDA on a GPU machine)
        models = server.status()["models"]
        assert {"silero-vad", "smart-turn-v3.2", "piper-joe-medium"} <= set(models), models
        assert all(p.endswith("ExecutionProvider") for p in models.values()), models
        return await script(Conversation(caller, agents.made[0], server))
    finally:
        await caller.hangup()
        await server.stop()


@pytest.mark.parametrize("codec", ["PCMU", "PCMA"])
def test_caller_asks_the_opening_hours_and_hears_them(config: BridgeConfig, codec: str) -> None:
    question = espeak_ng("What are your opening hours?")

    async def script(conv: Conversation) -> tuple[str, str, list[str]]:
        await conv.wait_speech(0.0)  # the greeting
        await conv.wait_quiet()
        greeting = await transcribe(config, conv.heard_since_mark())
        end = await conv.ask(question)
        await conv.wait_speech(end)
        await conv.wait_quiet()
        heard = [t.text for t in conv.agent.turns]
        return greeting, await transcribe(config, conv.heard_since_mark()), heard

    greeting, answer, heard = asyncio.run(_call(config, codec, script))
    assert "acme" in greeting and "support" in greeting, greeting
    # "We're open Monday to Friday, 8 a.m. to 6 p.m., and Saturday 9 to 1."
    ok = "monday" in answer and "friday" in answer and "saturday" in answer
    assert ok, f"the bridge heard {heard!r} and answered {answer!r}"
    # the call record holds the turn: what the caller said, what was played, the stages
    records = CallRecords(config.records.db, readonly=True)
    call = records.show(records.list(limit=1)[0]["call_id"])
    records.close()
    assert call is not None and call["call"]["outcome"] == "answered"
    # which profile answered, by its own name ([agent] name), not only "voice"
    assert (call["call"]["agent"], call["call"]["profile"]) == ("voice", "acme-demo")
    turn = call["turns"][-1]
    assert "hours" in turn["caller_text"].lower() and "Monday" in turn["agent_text"], turn
    assert turn["timings"]["end_of_turn"] > 0 and not turn["timings"]["barged_in"]


def test_order_status_over_two_turns_with_a_spoken_order_number(config: BridgeConfig) -> None:
    async def script(conv: Conversation) -> list[str]:
        await conv.wait_speech(0.0)
        await conv.wait_quiet()
        replies = []
        for q in ("Where is my order?", "One two three four five."):
            end = await conv.ask(espeak_ng(q))
            await conv.wait_speech(end)
            await conv.wait_quiet()
            replies.append(await transcribe(config, conv.heard_since_mark()))
        return replies

    prompt, status = asyncio.run(_call(config, "PCMU", script))
    assert "order number" in prompt, prompt
    # "Order 1 2 3 4 5 shipped on Monday and should arrive by Thursday."
    assert "monday" in status and "thursday" in status, status


def test_barge_in_stops_the_greeting_on_the_wire_and_the_question_is_answered(
    config: BridgeConfig,
) -> None:
    question = espeak_ng("What are your opening hours?")

    stalls = LoopStalls()

    async def script(conv: Conversation) -> tuple[float, float, str, int, float]:
        watcher = asyncio.ensure_future(stalls.watch())
        start = await conv.wait_speech(0.0)
        await asyncio.sleep(max(0.0, start + 2.0 - asyncio.get_running_loop().time()))
        conv.heard_since_mark()
        conv.caller.say(question)
        await asyncio.sleep(0.1)
        onset = min(t for t, db in conv.caller.log.sent if db > SPEECH_DBFS and t > start)
        while conv.caller.speaking:
            await asyncio.sleep(0.01)
        # the greeting's last packet: speech, then a second of nothing until the answer
        rx = conv.caller.log.received
        stopped = max(t for t, db in rx if db > SPEECH_DBFS and t < onset + 1.5)
        gap = [t for t, db in rx if db > SPEECH_DBFS and stopped < t < stopped + 1.0]
        assert not gap, "the greeting went on after the barge-in"
        # how deep the bridge's receive jitter buffer was as it heard the question
        (call,) = conv.server.status()["calls"]
        buffered_ms = float(call["jitter_delay_ms"])
        await conv.wait_speech(stopped + 0.5)
        await conv.wait_quiet()
        after = await transcribe(config, conv.heard_since_mark())
        watcher.cancel()
        return onset, stopped, after, conv.agent.settings.barge_in_ms, buffered_ms

    onset, stopped, after, barge_in_ms, buffered_ms = asyncio.run(_call(config, "PCMU", script))
    stalled_ms = 1000 * stalls.within(onset, stopped)
    print(
        f"barge-in: the greeting stopped {1000 * (stopped - onset):.0f} ms after speech onset"
        f" (receive jitter buffer {buffered_ms:.0f} ms, event loop stalled {stalled_ms:.0f} ms)"
    )
    # the bound: stopped on the wire within 100 ms of onset + the barge-in duration,
    # plus the fade-out (FADE_MS) that replaced the hard cut. It holds on a clean line and an
    # unloaded machine. Here caller and bridge share one event loop: on a loaded machine (CI:
    # 1 run of many measured 458 ms) a stall of it delays both, and the packets it delays
    # look like line jitter, so the bridge's receive buffer grows past its clean-line depth
    # and the caller's words reach the agent that much later. Neither is the barge-in's
    # reaction: both are added to the bound (bench/barge_in.py measures it without them)
    extra_ms = max(0.0, buffered_ms - config.jitter.min_delay_ms) + stalled_ms
    bound = (barge_in_ms + 100 + FADE_MS + extra_ms) / 1000
    assert stopped - onset <= bound, (stopped - onset, barge_in_ms, buffered_ms, stalled_ms)
    assert "monday" in after and "friday" in after, after  # the interrupting question's answer


def test_line_echo_of_the_reply_does_not_interrupt_it(config: BridgeConfig) -> None:
    """A 2-wire line sends our voice back 10 dB down and 120 ms late: the agent must not
    take that for the caller barging in, and the whole answer is heard."""
    question = espeak_ng("What are your opening hours?")

    async def script(conv: Conversation) -> tuple[str, int, int]:
        await conv.wait_speech(0.0)
        await conv.wait_quiet()
        end = await conv.ask(question)
        await conv.wait_speech(end)
        await conv.wait_quiet()
        heard = await transcribe(config, conv.heard_since_mark())
        return heard, len(conv.agent.turns), conv.agent.barge_ins

    answer, turns, barge_ins = asyncio.run(_call(config, "PCMU", script, echo_db=10.0))
    assert turns == 1 and barge_ins == 0, (turns, barge_ins)  # greeting and answer played out
    assert "monday" in answer and "saturday" in answer, answer

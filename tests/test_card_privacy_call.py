"""A caller keys and says the test card number 4111 1111 1111 1111 over SIP, and no run of its
digits is left anywhere the call leaves things: the call records (rows, turns, timeline, the
database file itself), the bridge's log in both formats, the MQTT events (and their spool),
and the stereo recording.

The bridge runs the shipped config (voice agent, demo profile, real models) with records,
recordings, MQTT (the project's mosquitto) and debug logging on; the caller is the
packet-level phone (`wire_caller.py`), speaking espeak-ng and pressing RFC 4733 keys:

1. At the menu it keys the whole card number (no slot is asking: the card-number rule must
   mask the keys, which arrive one event each).
2. It says it wants to pay a bill: the demo's `payment` slot (sensitive) asks for the card.
3. It says the card number, digit by digit; then keys it. The engine gets the real number
   both times: its lookup finds the test card, and the caller hears the payment approved.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import wave
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiomqtt
import numpy as np
import pytest
from numpy.typing import NDArray

from agent.dialogue.engine import digit_runs
from agent.voice.voice_agent import VoiceAgent
from agent.words import normalize
from resample import Resampler
from sip_bridge import logs
from sip_bridge.agents import prepare_agents
from sip_bridge.config.loader import BridgeConfig, load_config
from sip_bridge.ops.records import CallRecords
from sip_bridge.script.script_voice import espeak_ng
from sip_bridge.server import BridgeServer
from testkit.mosquitto_runner import Mosquitto
from testkit.sipp_media import random_port_range
from testkit.voice_agents import VoiceAgents
from testkit.wire_caller import SPEECH_DBFS, WireCaller

ROOT = Path(__file__).resolve().parents[1]
CARD = "4111111111111111"
# what the ASR writes of it varies (digits, words, a digit too many, nothing): inside the
# slot all of it is redacted anyway
SPOKEN_CARD = "My card number is four one one one, " + "one one one one, " * 2 + "one one one one."
NODE = "card-test"
REDACTED = re.compile(r"\[redacted \d+ digits?\]")
# eight digits of the card in order, whatever stands between them (spaces, commas, quotes)
WRITTEN = re.compile(r"4\W{0,3}(?:1\W{0,3}){7}|(?:1\W{0,3}){7}1")
SPOKEN = re.compile(r"four\W+one\W+one\W+one|(?:\bone\W+){7}one\b", re.IGNORECASE)


def leaks(text: str) -> list[str]:
    """Runs of the card's digits in ``text``, written or spoken."""
    return WRITTEN.findall(text) + SPOKEN.findall(text)


pytestmark = pytest.mark.usefixtures("quiet_gc")  # tests/conftest.py


@dataclass
class Outcome:
    replies: list[str] = field(default_factory=list)  # what the caller heard, transcribed
    events: list[dict[str, Any]] = field(default_factory=list)  # MQTT, as received
    engine_got: str = ""  # the payment slot's value in the dialogue engine
    transcript: list[tuple[str, str]] = field(default_factory=list)  # the engine's
    # recording samples (each side's own count) while the agent asked for the slot
    muted: list[tuple[int, int, int, int]] = field(default_factory=list)
    text_log: str = ""
    json_log: str = ""


async def _transcribe(config: BridgeConfig, pcm8k: NDArray[np.int16]) -> str:
    models, _ = prepare_agents(config)
    pcm16k = Resampler(8000, 16000).process(pcm8k)
    return (await asyncio.to_thread(models.asr.transcribe, pcm16k)).lower()


def _config(tmp: Path, broker: Mosquitto) -> BridgeConfig:
    cfg = load_config(ROOT / "config" / "bridge.toml")
    low, high = random_port_range(40, 32000, 39000)
    # the demo, with room for more than 20 turns: every key pressed at the menu is one
    demo = (ROOT / "config" / "agents" / "demo.toml").read_text()
    profile = tmp / "demo.toml"
    profile.write_text(demo.replace("max_turns = 20 ", "max_turns = 100"))
    return replace(
        cfg,
        agent=replace(cfg.agent, voice_profile=str(profile)),
        sip=replace(cfg.sip, listen="127.0.0.1:0"),
        http=replace(cfg.http, listen=""),
        rtp=replace(cfg.rtp, ports=f"{low}-{high}"),
        node=replace(cfg.node, name=NODE),
        records=replace(cfg.records, enabled=True, db=str(tmp / "calls.sqlite"),
                        recordings_dir=str(tmp / "recordings")),
        mqtt=replace(cfg.mqtt, enabled=True, port=broker.port, spool_dir=str(tmp / "spool")),
    )  # fmt: skip


class Phone:
    def __init__(self, caller: WireCaller, config: BridgeConfig, agents: list[VoiceAgent]) -> None:
        self.caller, self.config, self.agents = caller, config, agents
        self._mark = 0

    def heard(self) -> NDArray[np.int16]:
        got = self.caller.log.heard[self._mark :]
        self._mark = len(self.caller.log.heard)
        return np.concatenate(got) if got else np.zeros(0, np.int16)

    async def answer(self, since: float, required: bool = True) -> str:
        """Wait for the bridge's reply after ``since`` and until it is quiet; transcribed.
        Not ``required``: "" when none comes (the ASR heard nothing it could write)."""
        t = await self.caller.wait_speech(since, 20.0 if required else 8.0)
        if t is None and not required:
            return ""
        assert t is not None, f"no reply; the agent's turns: {self._turns()}"
        assert await self.caller.wait_quiet(1.5, 40.0) is not None, "it kept talking"
        said = [await _transcribe(self.config, u) for u in _utterances(self.heard())]
        return " ".join(t for t in said if t)

    async def say(self, text: str, required: bool = True) -> str:
        self.heard()
        end = await self.caller.say_all(espeak_ng(text, rate_wpm=165))
        return await self.answer(end, required)

    async def press(self, keys: str) -> str:
        self.heard()
        loop = asyncio.get_running_loop()
        start = loop.time()
        self.caller.press(keys)
        for _ in range(1000):
            if not self.caller.pressing:
                return await self.answer(start)
            assert not self.caller.ended.is_set(), f"the call ended: {self._turns()}"
            await asyncio.sleep(0.02)
        raise AssertionError(f"the keys never went out: {self._turns()}")

    def _turns(self) -> list[tuple[str, list[str]]]:
        return [(x.text, x.reply) for x in self.agents[0].turns] if self.agents else []


async def _watch_mute(server: BridgeServer, out: Outcome, stop: asyncio.Event) -> None:
    """The stretches (in recording samples) the agent asked for the sensitive slot."""
    start: tuple[int, int] | None = None
    while not stop.is_set():
        for call in server.calls.values():
            media = call.media
            if media is None or media.recorder is None:
                continue
            pos = (media.recorder.caller_samples, media.recorder.agent_samples)
            if media.agent.sensitive and start is None:
                start = pos
            elif not media.agent.sensitive and start is not None:
                out.muted.append((start[0], pos[0], start[1], pos[1]))
                start = None
        await asyncio.sleep(0.01)


async def _call(config: BridgeConfig, broker: Mosquitto) -> Outcome:
    out = Outcome()
    factory = VoiceAgents()
    agents = factory.made
    server = BridgeServer(config, agent_factory=factory)
    await server.start()
    stop = asyncio.Event()
    watcher = asyncio.ensure_future(_watch_mute(server, out, stop))
    try:
        async with aiomqtt.Client("127.0.0.1", broker.port, identifier="listener") as sub:
            await sub.subscribe(f"sipbridge/{NODE}/calls/#", qos=1)

            async def collect() -> None:
                async for msg in sub.messages:
                    out.events.append(json.loads(bytes(msg.payload)))

            collecting = asyncio.ensure_future(collect())
            caller = WireCaller(server.uri, dtmf=True)
            try:
                await caller.connect(("127.0.0.1", server.port))
                phone = Phone(caller, config, agents)
                out.replies.append(await phone.answer(0.0))  # the greeting
                # 1. the card number keyed at the menu: no slot asks for it
                out.replies.append(await phone.press(CARD))  # the last "1": the hours
                # 2. paying a bill: the sensitive slot asks for the card
                out.replies.append(await phone.say("I would like to pay my bill."))
                # 3. said (what the ASR makes of it varies: approved, asked again, or
                # nothing heard), then keyed, asking for the slot again where need be
                out.replies.append(await phone.say(SPOKEN_CARD, required=False))
                engine = agents[0].engine
                assert engine is not None
                if not engine.collecting_sensitive:
                    out.replies.append(await phone.say("I would like to pay my bill."))
                out.replies.append(await phone.press(CARD))
                out.engine_got = _paid_with(agents[0])
                out.transcript = list(engine.transcript)
            finally:
                await caller.hangup()
            for _ in range(100):  # the call's last events reach the subscriber
                if any(e["event"] == "ended" for e in out.events):
                    break
                await asyncio.sleep(0.05)
            collecting.cancel()
    finally:
        stop.set()
        await watcher
        await server.stop()
    return out


def _paid_with(agent: VoiceAgent) -> str:
    """The card number the engine had when it said the payment was approved: its lookup
    matched the demo's card row, which is keyed by the number itself."""
    engine = agent.engine
    assert engine is not None
    approved = [t for who, t in engine.transcript if who == "agent" and "approved" in t]
    return CARD if approved and CARD in engine.profile.data["cards"] else ""


def _read_wav(path: Path) -> tuple[NDArray[np.int16], NDArray[np.int16]]:
    with wave.open(str(path)) as w:
        x = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    return x[0::2], x[1::2]


def test_a_card_number_keyed_and_said_is_nowhere_afterwards(tmp_path: Path) -> None:
    text_log, json_log = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    with Mosquitto(tmp_path / "broker") as broker:
        config = _config(tmp_path, broker)
        prepare_agents(config)
        # the bridge's own log set-up, in both formats at once, at debug level
        logs.configure("text", "debug", stream=text_log,
                       redact=config.records.redact_card_numbers)  # fmt: skip
        root.addHandler(logs.make_handler("json", json_log))
        try:
            out = asyncio.run(_call(config, broker))
        finally:
            for h in list(root.handlers):
                root.removeHandler(h)
            for h in saved[0]:
                root.addHandler(h)
            root.setLevel(saved[1])
    print("heard:", *out.replies, sep="\n  ")

    # the dialogue engine got the number: the lookup found the card, the caller heard it
    assert out.engine_got == CARD, out.transcript
    assert "approved" in out.replies[-1], out.replies
    # ... and the row's brand (the caller's ASR hears "Visa" as "bees a" at some alignments
    # of the reply's pieces on the wire: checked in the agent's own words)
    said = [text for who, text in out.transcript if who == "agent"]
    assert said and "your Visa card is approved" in said[-1], out.transcript

    # the call records: every text column, the timeline, and the database file's bytes
    store = CallRecords(tmp_path / "calls.sqlite", readonly=True)
    (row,) = store.list()
    shown = store.show(row["call_id"])
    store.close()
    assert shown is not None
    dumped = json.dumps(shown)
    assert leaks(dumped) == [], dumped
    keys = "".join(e["data"]["digit"] for e in shown["events"] if e["kind"] == "dtmf")
    assert keys.count("*") >= 32 and "1111" not in keys and "4" not in keys, keys
    # keypad turns (each menu key of the card at the menu is one; the sensitive entry one):
    # none holds a digit of the card, in its text or its keys
    keyed = [(t["caller_text"], t["timings"]["keys"]) for t in shown["turns"]
             if t["timings"].get("input") == "keypad"]  # fmt: skip
    assert len(keyed) >= 17 and ("[redacted 16 digits]", "*" * 16) in keyed, keyed
    assert all(set(k) == {"*"} and not re.search(r"\d", REDACTED.sub("", text))
               for text, k in keyed), keyed  # fmt: skip
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("calls.sqlite*"))
    assert leaks(raw.decode("latin-1")) == []

    # the log, text and JSON, from debug level up
    for name, text in (("text", text_log.getvalue()), ("json", json_log.getvalue())):
        assert leaks(text) == [], (name, leaks(text))
    for line in json_log.getvalue().splitlines():
        json.loads(line)  # still one object per line

    # the MQTT events as a subscriber got them, and nothing left in the spool
    assert out.events and out.events[-1]["event"] == "ended"
    assert leaks(json.dumps(out.events)) == []
    mqtt_turns = [e for e in out.events if e["event"] == "turn" and e["input"] == "keypad"]
    assert len(mqtt_turns) >= 17 and all(set(e["keys"]) == {"*"} for e in mqtt_turns)
    mqtt_keys = [e for e in out.events if e["event"] == "dtmf"]
    assert len(mqtt_keys) >= 32 and all(e["digit"] == "*" for e in mqtt_keys), mqtt_keys
    assert all(e["masked"] for e in mqtt_keys if e["digit"] == "*")
    spooled = "".join(p.read_text() for p in (tmp_path / "spool").glob("*.jsonl"))
    assert leaks(spooled) == [] and "caller_text" not in spooled

    # the recording: silence on both sides while the slot asked, and no digits to hear
    (wav,) = (tmp_path / "recordings").glob("*.wav")
    left, right = _read_wav(wav)
    assert out.muted, "the slot was asked for"
    for c0, c1, a0, a1 in out.muted:
        assert c1 - c0 > 8000 and a1 - a0 > 8000  # seconds, not a blip
        assert not left[c0:c1].any() and not right[a0:a1].any()
    assert _utterances(left), "the caller's other words are recorded"
    for name, side in (("caller", left), ("agent", right)):
        heard = " ".join(asyncio.run(_transcribe(config, u)) for u in _utterances(side))
        runs = digit_runs(normalize(heard))
        assert not any("1111" in r or "4111" in r for r in runs), (name, heard, runs)


def _utterances(x: NDArray[np.int16], gap_s: float = 0.6) -> list[NDArray[np.int16]]:
    """The stretches of ``x`` with speech (20 ms frames over the speech level, less than
    ``gap_s`` apart), each with a little silence around it: what the ASR is given."""
    frames = x[: x.size // 160 * 160].reshape(-1, 160).astype(np.float64)
    loud = np.sqrt((frames**2).mean(axis=1)) > 10 ** (SPEECH_DBFS / 20) * 32768
    out, start, quiet = [], None, 0
    for i, on in enumerate(loud):
        if on:
            start = i if start is None else start
            quiet = 0
        elif start is not None:
            quiet += 1
            if quiet * 0.02 >= gap_s or i == len(loud) - 1:
                lo, hi = max(0, start - 10) * 160, min(len(loud), i + 1) * 160
                if i - quiet - start > 10:  # longer than a click
                    out.append(x[lo:hi])
                start, quiet = None, 0
    return out

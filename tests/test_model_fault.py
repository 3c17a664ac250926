"""A model that raises or hangs mid-call: that caller hears the fallback prompt, then a BYE
(or a REFER to the configured target); the record, the event and the metric say so; the
other call goes on as if nothing happened.

Two calls are up in one in-process bridge, each dialled by a packet-level caller
(`wire_caller.py`). The stub agents play a tone and run a "model" through the same
:class:`~agent.model_guard.ModelGuard` the voice agent uses; the last test runs the real
voice agent with an ASR that raises once the caller speaks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from agent.base import Agent, AgentOutput, CallInfo
from agent.lines.playback import load_wav
from agent.model_guard import ModelGuard
from agent.voice.voice_agent import VoiceAgent
from sip_bridge.agents import prepare_agents
from sip_bridge.config.loader import BridgeConfig, load_config
from sip_bridge.ops.metrics import BridgeMetrics
from sip_bridge.ops.records import CallRecords
from sip_bridge.script.script_voice import espeak_ng
from sip_bridge.server import BridgeServer
from testkit.sipp_media import random_port_range
from testkit.voice_agents import VoiceAgents
from testkit.wire_caller import SPEECH_DBFS, WireCaller

ROOT = Path(__file__).resolve().parents[1]
PROMPT = ROOT / "config" / "prompts" / "technical_difficulty.wav"
RATE = 8000
FRAME = 160


pytestmark = pytest.mark.usefixtures("quiet_gc")  # tests/conftest.py


def _config(tmp_path: Path, **agent: Any) -> BridgeConfig:
    cfg = load_config(ROOT / "config" / "bridge.toml")
    low, high = random_port_range(40, 32000, 39000)
    return replace(
        cfg,
        sip=replace(cfg.sip, listen="127.0.0.1:0"),
        http=replace(cfg.http, listen=""),
        rtp=replace(cfg.rtp, ports=f"{low}-{high}"),
        records=replace(cfg.records, enabled=True, db=str(tmp_path / "calls.sqlite")),
        agent=replace(cfg.agent, **agent),
    )


class ModelToneAgent(Agent):
    """A tone, and a "model" run every 200 ms through a :class:`ModelGuard`, as the voice
    agent runs ASR: ``model`` raises or hangs to fault the call."""

    name = "model-tone"
    sample_rate = RATE

    def __init__(
        self, freq_hz: float, model: Callable[[int], None], executor: Any, timeout_s: float
    ) -> None:
        self.guard = ModelGuard(executor, timeout_s)
        self._model = model
        self._phase = 0
        self._freq = freq_hz
        self._job: concurrent.futures.Future[None] | None = None
        self._runs = 0
        self._out: AgentOutput | None = None
        self.call_id = ""

    async def start(self, call: CallInfo, output: AgentOutput) -> None:
        self.call_id, self._out = call.call_id, output
        self.guard.bind(asyncio.get_running_loop(), output.emit)

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        if self._out is None:
            return
        t = (self._phase + np.arange(pcm.size)) / RATE
        self._phase += pcm.size
        self._out.write((8000 * np.sin(2 * np.pi * self._freq * t)).astype(np.int16))
        if self._phase % (10 * FRAME) == 0 and (self._job is None or self._job.done()):
            self._runs += 1
            self._job = self.guard.executor("asr").submit(self._model, self._runs)

    async def stop(self) -> None:
        self.guard.close()
        self._out = None


def _prompt_at(heard: NDArray[np.int16], prompt: NDArray[np.int16]) -> tuple[int, float]:
    """Where ``prompt`` starts in ``heard`` and the normalised correlation there."""
    h, p = heard.astype(np.float64), prompt.astype(np.float64)
    n = 1 << int(np.ceil(np.log2(h.size + p.size)))
    xc = np.fft.irfft(np.fft.rfft(h, n) * np.conj(np.fft.rfft(p, n)), n)[: h.size - p.size + 1]
    c = np.concatenate([[0.0], np.cumsum(h * h)])
    energy = c[p.size :] - c[: h.size - p.size + 1]  # of each window as long as the prompt
    score = xc / np.sqrt(np.maximum(energy, 1e-9) * float(p @ p))
    at = int(np.argmax(score))
    return at, float(score[at])


def _max_gap(caller: WireCaller, start: float, end: float) -> float:
    """The longest time between packets that arrived in [start, end]."""
    t = [a for a, _ in caller.log.received if start <= a <= end]
    assert len(t) > 10, "no media arrived"
    gaps = np.diff(t)
    i = int(np.argmax(gaps))
    print(f"longest gap {1000 * gaps[i]:.0f} ms, {t[i] - start:.2f} s in")
    return float(gaps[i])


def _record(db: str, call_id: str) -> dict[str, Any]:
    records = CallRecords(db, readonly=True)
    try:
        shown = records.show(call_id)
    finally:
        records.close()
    assert shown is not None, call_id
    return shown


class Bridge:
    """A started bridge with its outgoing SIP, telemetry events and metrics captured."""

    def __init__(self, server: BridgeServer) -> None:
        self.server = server
        self.events: list[tuple[str, str, dict[str, object]]] = []
        self.sent: list[bytes] = []

    async def __aenter__(self) -> Bridge:
        s = self.server
        await s.start()
        s.telemetry.events = lambda call_id, kind, fields: self.events.append(
            (call_id, kind, fields)
        )
        s.telemetry.metrics = BridgeMetrics()
        send = s.transport.send_nowait

        def capture(data: bytes, *args: Any, **kwargs: Any) -> Any:
            self.sent.append(bytes(data))
            return send(data, *args, **kwargs)

        s.transport.send_nowait = capture  # type: ignore[method-assign]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop()

    async def dial(self) -> tuple[WireCaller, str]:
        before = set(self.server.calls)
        caller = WireCaller(self.server.uri)
        await caller.connect(("127.0.0.1", self.server.port))
        assert caller.status == 200
        (call_id,) = set(self.server.calls) - before
        return caller, call_id


def _heard(caller: WireCaller) -> NDArray[np.int16]:
    return np.concatenate(caller.log.heard)


def _after_fault(bridge: Bridge, caller: WireCaller, fault_call: str) -> tuple[int, float]:
    """The faulted caller heard the whole prompt after its tone, and nothing after it."""
    prompt = load_wav(PROMPT, RATE)
    heard = _heard(caller)
    at, score = _prompt_at(heard, prompt)
    assert score > 0.9, f"the fallback prompt is not in what the caller heard ({score:.2f})"
    assert at + prompt.size <= heard.size, "the prompt was cut short"
    tail = heard[at + prompt.size :]
    assert not tail.size or np.sqrt(np.mean(tail.astype(np.float64) ** 2)) < 100  # silence
    kinds = [(cid, kind) for cid, kind, _ in bridge.events]
    assert (fault_call, "model_fault") in kinds
    return at, score


async def _wait_ended(caller: WireCaller, timeout_s: float) -> None:
    await asyncio.wait_for(caller.ended.wait(), timeout_s)


def _check_other_call(bridge: Bridge, other: WireCaller, other_id: str, start: float) -> None:
    """The other call's tone kept arriving, packet after packet, and it ended normally."""
    end = asyncio.get_running_loop().time()
    gap = _max_gap(other, start, end)
    assert gap < 0.1, f"the other call's media stopped for {1000 * gap:.0f} ms"
    quiet = [round(t - start, 2) for t, db in other.log.received if start + 0.2 <= t <= end
             and db < SPEECH_DBFS]  # fmt: skip
    assert not quiet, f"the other call's tone dropped out at {quiet} s"
    assert not [k for cid, k, _ in bridge.events if cid == other_id and k == "model_fault"]


def test_a_raising_model_gets_the_prompt_then_a_bye_and_the_other_call_goes_on(
    tmp_path: Path,
) -> None:
    cfg = _config(tmp_path, name="tone", model_timeout_s=5.0)
    pool = concurrent.futures.ThreadPoolExecutor(4)
    made: list[ModelToneAgent] = []

    def broken(run: int) -> None:
        if run >= 5:  # about a second into the call
            raise RuntimeError("injected inference failure")

    def factory(c: BridgeConfig) -> Agent:
        model = broken if not made else (lambda run: None)
        made.append(ModelToneAgent(600.0 if not made else 1000.0, model, pool, 5.0))
        return made[-1]

    async def run() -> None:
        async with Bridge(BridgeServer(cfg, agent_factory=factory)) as bridge:
            faulty, fault_id = await bridge.dial()
            other, other_id = await bridge.dial()
            start = asyncio.get_running_loop().time()
            try:
                await _wait_ended(faulty, 15.0)  # the prompt (4.8 s), then our BYE
                await asyncio.sleep(0.5)
                _check_other_call(bridge, other, other_id, start)
                at, _ = _after_fault(bridge, faulty, fault_id)
                assert at >= 0.8 * RATE  # after about a second of tone
            finally:
                await other.hangup()
                await faulty.hangup()
            assert bridge.server.telemetry.metrics is not None
            text = bridge.server.telemetry.metrics.render().decode()
            assert 'sipbridge_model_faults_total{stage="asr"} 1.0' in text
            fault = next(f for cid, k, f in bridge.events if k == "model_fault")
            assert fault["stage"] == "asr" and "injected inference failure" in str(fault["reason"])
            assert fault["action"] == "hangup"
        rec = _record(cfg.records.db, fault_id)
        assert rec["call"]["outcome"] == "answered"
        assert rec["call"]["end_reason"] == "model_fault"
        assert any(e["kind"] == "model_fault" for e in rec["events"])
        assert _record(cfg.records.db, other_id)["call"]["end_reason"] != "model_fault"

    try:
        asyncio.run(run())
    finally:
        pool.shutdown(wait=False)


def test_a_hanging_model_times_out_then_the_caller_is_transferred(tmp_path: Path) -> None:
    target = "sip:desk@127.0.0.1"
    cfg = _config(
        tmp_path, name="tone", model_timeout_s=1.0, on_model_fault="transfer",
        fault_transfer_to=target,
    )  # fmt: skip
    release = threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(4)
    made: list[ModelToneAgent] = []

    def hangs(run: int) -> None:
        if run >= 3:
            release.wait(30.0)  # a wedged inference: its thread stays busy

    def factory(c: BridgeConfig) -> Agent:
        model = hangs if not made else (lambda run: None)
        made.append(ModelToneAgent(600.0 if not made else 1000.0, model, pool, 1.0))
        return made[-1]

    async def run() -> None:
        async with Bridge(BridgeServer(cfg, agent_factory=factory)) as bridge:
            faulty, fault_id = await bridge.dial()
            other, other_id = await bridge.dial()
            start = asyncio.get_running_loop().time()
            try:
                # this caller declines the REFER (NOTIFY 603): the bridge then hangs up
                await _wait_ended(faulty, 15.0)
                await asyncio.sleep(0.5)
                _check_other_call(bridge, other, other_id, start)
                _after_fault(bridge, faulty, fault_id)
                assert not release.is_set()  # the model never returned: a timeout did it
                refers = [m for m in bridge.sent if m.startswith(b"REFER ")]
                assert refers, "no REFER was sent"
                assert f"Refer-To: <{target}>".encode() in refers[0]
                byes = [m for m in bridge.sent if m.startswith(b"BYE ")]
                assert byes and bridge.sent.index(byes[0]) > bridge.sent.index(refers[0])
            finally:
                release.set()
                await other.hangup()
                await faulty.hangup()
            fault = next(f for cid, k, f in bridge.events if k == "model_fault")
            assert fault["action"] == "transfer" and "no result after 1 s" in str(fault["reason"])
            transfer = next(f for cid, k, f in bridge.events if k == "transfer")
            assert transfer["target"] == target and transfer["outcome"] == "failed"
        assert _record(cfg.records.db, fault_id)["call"]["end_reason"] == "model_fault"

    try:
        asyncio.run(run())
    finally:
        release.set()
        pool.shutdown(wait=False)


class BrokenAsr:
    """Moonshine's stand-in for one call: every transcription raises."""

    def __init__(self, real: Any) -> None:
        self.sample_rate = real.sample_rate
        self.calls = 0

    def transcribe(self, pcm: Any, **_: object) -> str:
        self.calls += 1
        raise RuntimeError("injected ASR failure")


def test_the_voice_agent_whose_asr_raises_mid_call_hands_the_call_to_the_prompt(
    tmp_path: Path,
) -> None:
    cfg = _config(tmp_path, name="voice")
    prepare_agents(cfg)  # load and warm the models before any call
    broken: list[BrokenAsr] = []

    def break_the_first(a: VoiceAgent) -> None:
        if not broken:  # the first call's ASR breaks; the second call's is the real one
            broken.append(BrokenAsr(a._stt.asr))
            a._stt.asr = broken[0]  # type: ignore[assignment]

    factory = VoiceAgents(break_the_first)
    agents = factory.made

    question = espeak_ng("What are your opening hours?")

    async def run() -> None:
        async with Bridge(BridgeServer(cfg, agent_factory=factory)) as bridge:
            faulty, fault_id = await bridge.dial()
            other, other_id = await bridge.dial()
            loop = asyncio.get_running_loop()
            start = loop.time()
            try:
                assert await faulty.wait_speech(0.0, 15.0) is not None  # the greeting
                assert await faulty.wait_quiet(1.0, 20.0) is not None
                asking = loop.time()
                await faulty.say_all(question)
                await _wait_ended(faulty, 20.0)
                await asyncio.sleep(0.5)
                gap = _max_gap(other, start, loop.time())
                assert gap < 0.1, f"the other call's media stopped for {1000 * gap:.0f} ms"
                assert broken[0].calls >= 1
                at, _ = _after_fault(bridge, faulty, fault_id)
                # the prompt came once the caller spoke (the ASR ran), after the greeting
                arrivals = [t for t, _ in faulty.log.received]
                assert arrivals[at // FRAME] > asking
                assert await other.wait_speech(0.0, 1.0) is not None  # its greeting
            finally:
                await other.hangup()
                await faulty.hangup()
            fault = next(f for cid, k, f in bridge.events if k == "model_fault")
            assert fault["stage"] == "asr" and "injected ASR failure" in str(fault["reason"])
            assert agents[1].guard.fault is None
        assert _record(cfg.records.db, fault_id)["call"]["end_reason"] == "model_fault"
        other_rec = _record(cfg.records.db, other_id)["call"]
        assert other_rec["outcome"] == "answered" and other_rec["end_reason"] != "model_fault"

    asyncio.run(run())


# ---- the pieces, without a call --------------------------------------------------------


def test_the_guard_reports_a_raise_once_and_a_hang_after_its_time_limit() -> None:
    async def run() -> list[tuple[str, str]]:
        pool = concurrent.futures.ThreadPoolExecutor(2)
        seen: list[tuple[str, str]] = []
        guard = ModelGuard(pool, timeout_s=0.3)
        guard.bind(asyncio.get_running_loop(), lambda f: seen.append((f.stage, f.reason)))
        ok = guard.executor("turn").submit(lambda: 0.7)
        assert await asyncio.wrap_future(ok) == 0.7
        await asyncio.sleep(0.5)  # a run that finished in time is no fault, later either
        assert seen == []
        release = threading.Event()
        hung = guard.executor("tts").submit(release.wait, 5.0)
        await asyncio.sleep(0.6)
        assert seen == [("tts", "no result after 0.3 s")] and not hung.done()
        with pytest.raises(ZeroDivisionError):
            await asyncio.wrap_future(guard.executor("asr").submit(lambda: 1 / 0))
        await asyncio.sleep(0.05)
        assert len(seen) == 1  # only the first fault of a call counts
        release.set()
        guard.close()
        pool.shutdown()
        return seen

    asyncio.run(run())


def test_the_guard_counts_time_from_the_start_of_a_run_not_its_queueing() -> None:
    async def run() -> list[str]:
        pool = concurrent.futures.ThreadPoolExecutor(1)
        seen: list[str] = []
        guard = ModelGuard(pool, timeout_s=0.4)
        guard.bind(asyncio.get_running_loop(), lambda f: seen.append(f.reason))
        jobs = [guard.executor("asr").submit(threading.Event().wait, 0.25) for _ in range(3)]
        await asyncio.wrap_future(jobs[-1])  # 0.75 s in all, each run 0.25 s
        await asyncio.sleep(0.1)
        pool.shutdown()
        return seen

    assert asyncio.run(run()) == []


def test_a_speech_model_that_raises_reports_one_fault() -> None:
    from agent.speech_to_speech import SpeechToSpeechAgent

    class Model:
        spec = type("Spec", (), {"sample_rate": 16000, "frame_samples": 320})()

        def new_state(self) -> object:
            return None

        def run(self, frames: Any, states: Any) -> Any:
            raise RuntimeError("CUDA error: device lost")

    class Out(AgentOutput):
        def __init__(self) -> None:
            self.events: list[object] = []

        def write(self, pcm: NDArray[np.int16]) -> None: ...
        def flush(self) -> float:
            return 0.0

        def hangup(self, reason: str = "") -> None: ...
        def emit(self, event: Any) -> None:
            self.events.append(event)

    agent = SpeechToSpeechAgent(Model())  # type: ignore[arg-type]
    out = Out()
    asyncio.run(agent.start(CallInfo("c"), out))
    for _ in range(5):
        agent.on_audio(np.zeros(320, np.int16))
    assert [(e.stage, e.reason) for e in out.events] == [  # type: ignore[attr-defined]
        ("speech_model", "RuntimeError: CUDA error: device lost")
    ]


def test_a_transfer_that_fails_after_the_prompt_hangs_up() -> None:
    from agent.base import TransferRequest, TransferResult
    from agent.lines.fallback_prompt import FAULT_REASON, FallbackPromptAgent

    class Out(AgentOutput):
        def __init__(self) -> None:
            self.log: list[object] = []

        def write(self, pcm: NDArray[np.int16]) -> None:
            self.log.append(pcm.size)

        def flush(self) -> float:
            return 0.0

        def hangup(self, reason: str = "") -> None:
            self.log.append(("hangup", reason))

        def emit(self, event: Any) -> None:
            self.log.append(event)

    agent = FallbackPromptAgent(
        np.ones(400, np.int16), RATE, action="transfer", transfer_to="sip:a@b", tail_s=0.04
    )
    out = Out()
    asyncio.run(agent.start(CallInfo("c"), out))
    for _ in range(6):
        agent.on_audio(np.zeros(FRAME, np.int16))
    assert out.log == [160, 160, 80, TransferRequest("sip:a@b")]
    agent.on_event(TransferResult("sip:a@b", "failed", 501))
    assert out.log[-1] == ("hangup", FAULT_REASON)


class QueueOut(AgentOutput):
    """A call's way out with a queue: 160 samples leave it per :meth:`send`."""

    def __init__(self) -> None:
        self.queue: list[NDArray[np.int16]] = []
        self.sent: list[NDArray[np.int16]] = []
        self.log: list[object] = []

    def write(self, pcm: NDArray[np.int16]) -> None:
        self.queue.append(pcm.copy())

    def flush(self) -> float:
        dropped = 1000.0 * sum(q.size for q in self.queue) / RATE
        self.queue.clear()
        return dropped

    def queued_ms(self) -> float:
        return 1000.0 * sum(q.size for q in self.queue) / RATE

    def send(self) -> None:
        if self.queue:
            whole = np.concatenate(self.queue)
            self.sent.append(whole[:FRAME])
            self.queue = [whole[FRAME:]] if whole.size > FRAME else []

    def hangup(self, reason: str = "") -> None:
        self.log.append(("hangup", reason))

    def emit(self, event: Any) -> None:
        self.log.append(event)


def test_the_prompt_hangs_up_only_once_all_of_it_was_sent() -> None:
    """Audio queued ahead of the prompt delays it; the hang-up waits for the last of it."""
    from agent.lines.fallback_prompt import FAULT_REASON, FallbackPromptAgent

    prompt = np.arange(1, 801, dtype=np.int16)  # 100 ms
    agent = FallbackPromptAgent(prompt, RATE, tail_s=0.04)
    out = QueueOut()
    out.write(np.full(8 * FRAME, -1, np.int16))  # 160 ms of something else ahead of it
    asyncio.run(agent.start(CallInfo("c"), out))
    ticks = 0
    while not out.log and ticks < 100:
        agent.on_audio(np.zeros(FRAME, np.int16))
        out.send()
        ticks += 1
    heard = np.concatenate(out.sent)
    assert np.array_equal(heard[8 * FRAME :], prompt), "the whole prompt went out"
    assert out.log == [("hangup", FAULT_REASON)]
    assert ticks == 8 + 5 + 2  # what was ahead, the prompt, then the 40 ms tail


def test_the_take_over_drops_what_the_failed_agent_writes_while_it_stops() -> None:
    from agent.lines.fallback_prompt import FallbackPromptAgent
    from sip_bridge.agents import take_over

    class Failed(Agent):
        name = "failed"
        sample_rate = RATE

        def __init__(self, out: AgentOutput) -> None:
            self.out = out

        async def start(self, call: CallInfo, output: AgentOutput) -> None: ...
        def on_audio(self, pcm: NDArray[np.int16]) -> None: ...

        async def stop(self) -> None:
            await asyncio.sleep(0.01)
            self.out.write(np.full(RATE, 7, np.int16))  # a second of a stale reply

    class LegStub:
        def __init__(self) -> None:
            self.output = QueueOut()
            self.agent: Agent = Failed(self.output)
            self.call = CallInfo("c")

    leg = LegStub()
    leg.output.write(np.full(RATE, 5, np.int16))  # queued when the fault came
    cfg = load_config(ROOT / "config" / "bridge.toml")
    asyncio.run(take_over(leg, cfg.agent))
    assert isinstance(leg.agent, FallbackPromptAgent) and leg.agent.prompt.size > RATE
    assert leg.output.queued_ms() == 0.0
    for _ in range(3):
        leg.agent.on_audio(np.zeros(FRAME, np.int16))
        leg.output.send()
    heard = np.concatenate(leg.output.sent)
    assert np.array_equal(heard, leg.agent.prompt[: heard.size]), "only the prompt is heard"


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ('on_model_fault = "reboot"', "agent.on_model_fault: 'reboot' is not one of"),
        ('on_model_fault = "transfer"', "agent.fault_transfer_to: is required"),
        ('fault_transfer_to = "a desk"', "agent.fault_transfer_to: 'a desk' is not a SIP URI"),
        ("model_timeout_s = -1", "agent.model_timeout_s: must be 0"),
        ('fallback_prompt = "nope.wav"', "agent.fallback_prompt: no such file"),
        ('fallback_prompt = "bridge.toml"', "agent.fallback_prompt: "),
    ],
)
def test_model_fault_keys_are_checked_with_file_and_line(lines: str, message: str) -> None:
    from sip_bridge.config.loader import ConfigError, parse_config_text

    where = str(ROOT / "config" / "x.toml")
    with pytest.raises(ConfigError) as err:
        parse_config_text(f'[agent]\nname = "echo"\n{lines}\n', where)
    assert str(err.value).startswith(f"{where}:3: {message}"), str(err.value)


def test_a_stereo_or_44k_prompt_is_refused(tmp_path: Path) -> None:
    import wave

    from sip_bridge.config.loader import ConfigError, parse_config_text

    bad = tmp_path / "p.wav"
    with wave.open(str(bad), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(44100)
        w.writeframes(b"\0\0\0\0" * 100)
    with pytest.raises(ConfigError, match="need mono 16-bit PCM at 8, 16 or 24 kHz"):
        parse_config_text(f'[agent]\nfallback_prompt = "{bad}"\n', str(tmp_path / "b.toml"))
    ok = parse_config_text(
        '[agent]\non_model_fault = "transfer"\nfault_transfer_to = "+4420555"\n'
        'fallback_prompt = ""\nmodel_timeout_s = 0\n',
        str(tmp_path / "b.toml"),
    )
    assert (ok.agent.on_model_fault, ok.agent.fault_transfer_to) == ("transfer", "+4420555")
    assert ok.agent.fallback_prompt == "" and ok.agent.model_timeout_s == 0.0


@pytest.mark.parametrize("how", ["raises", "hangs"])
def test_the_voice_agent_reports_its_tts_failing_and_says_nothing_more(how: str) -> None:
    from test_voice_agent import Call

    from agent.base import ModelFault

    release = threading.Event()

    def speak(text: str, cancel: threading.Event, *, skip: int = 0) -> Iterator[Any]:
        yield text, None
        if how == "raises":
            raise RuntimeError("piper: phonemizer crashed")
        release.wait(5.0)
        yield text, np.full(1600, 1000, np.int16)  # too late: the call is not ours now

    async def run() -> tuple[list[object], int]:
        call = Call(greeted=False)
        call.agent.guard.timeout_s = 0.3
        call.models.speak = speak  # type: ignore[method-assign]
        await call.agent.start(CallInfo("call-1"), call.out)
        for _ in range(300):  # the fault comes at once (raise) or after 0.3 s (hang)
            if call.out.of("emit"):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        release.set()
        await asyncio.sleep(0.1)
        emitted = [e for _, e in call.out.of("emit")]
        await call.agent.stop()
        call.models.executor.shutdown(wait=True)
        return emitted, len(call.out.writes)

    emitted, writes = asyncio.run(run())
    reason = "RuntimeError: piper: phonemizer crashed" if how == "raises" else None
    assert emitted == [ModelFault(reason or "no result after 0.3 s", "tts")]
    assert writes == 0  # the late audio of a hung synthesis never reaches the call

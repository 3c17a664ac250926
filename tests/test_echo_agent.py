"""EchoAgent: the caller comes back delayed by exactly delay_s, to the sample."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from numpy.typing import NDArray

from agent import Agent, AgentOutput, CallInfo, DtmfEvent, EchoAgent, HangupEvent
from testkit.agent_capture import Capture


class KeyCapture(Capture):
    """A capture that also records the keys the agent presses."""

    def __init__(self) -> None:
        super().__init__()
        self.keys = ""

    def send_dtmf(self, digits: str) -> None:
        self.keys += digits


def _run(agent: EchoAgent, frames: list[NDArray[np.int16]]) -> KeyCapture:
    out = KeyCapture()
    asyncio.run(agent.start(CallInfo(call_id="c1"), out))
    for f in frames:
        agent.on_audio(f)
    return out


@pytest.mark.parametrize(
    ("delay_s", "expected"), [(0.3, 7200), (0.5, 12000), (0.0123, 295), (0.0, 0)]
)
def test_echo_is_delayed_by_exactly_delay_samples(delay_s: float, expected: int) -> None:
    rng = np.random.default_rng(1)
    frames = [rng.integers(-32768, 32767, 480, dtype=np.int16) for _ in range(60)]
    agent = EchoAgent(delay_s=delay_s)
    assert agent.delay_samples == expected
    out = _run(agent, frames)
    heard = np.concatenate(frames)
    want = np.concatenate((np.zeros(expected, np.int16), heard))[: heard.size]
    assert out.audio.size == heard.size  # one sample out per sample in: no drift
    np.testing.assert_array_equal(out.audio, want)


def test_odd_frame_sizes_and_other_rates_stay_sample_accurate() -> None:
    rng = np.random.default_rng(2)
    sizes = rng.integers(0, 900, 80)
    frames = [rng.integers(-1000, 1000, int(n), dtype=np.int16) for n in sizes]
    agent = EchoAgent(delay_s=0.25, sample_rate=16000)
    out = _run(agent, frames)
    heard = np.concatenate(frames)
    want = np.concatenate((np.zeros(4000, np.int16), heard))[: heard.size]
    np.testing.assert_array_equal(out.audio, want)
    assert agent.heard_samples == heard.size


def test_events_are_kept_and_stop_ends_output() -> None:
    agent = EchoAgent(delay_s=0.0)
    out = _run(agent, [np.ones(480, np.int16)])
    agent.on_event(DtmfEvent("5", 100.0))
    agent.on_event(DtmfEvent("#", 80.0))
    agent.on_event(HangupEvent("bye"))
    assert agent.events == [DtmfEvent("5", 100.0), DtmfEvent("#", 80.0), HangupEvent("bye")]
    assert out.keys == "5#"  # every key pressed back
    asyncio.run(agent.stop())
    agent.on_audio(np.ones(480, np.int16))
    assert out.audio.size == 480  # nothing written after stop
    assert agent.call == CallInfo(call_id="c1")


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        EchoAgent(delay_s=-0.1)
    with pytest.raises(ValueError):
        EchoAgent(delay_s=float("nan"))
    agent = EchoAgent()
    with pytest.raises(ValueError):
        agent.on_audio(np.zeros(10, np.float32))


def test_agent_interface_is_abstract() -> None:
    with pytest.raises(TypeError):
        Agent()  # type: ignore[abstract]
    with pytest.raises(TypeError):
        AgentOutput()  # type: ignore[abstract]
    with pytest.raises(NotImplementedError):
        Capture().send_dtmf("1")  # an output that cannot press keys says so
    assert EchoAgent.sample_rate == 24000 and EchoAgent.name == "echo"

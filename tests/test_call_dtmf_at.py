"""`sip-bridge call --dtmf-at`: keys pressed when a caller would press them, at a time after
the answer or once the far end's prompt ended, so that a menu or a slot can be line-checked
by keypad."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from test_call_command import ECHO_DELAY_S, _config, _tone_wav

from agent.base import Agent, AgentEvent, CallInfo, DtmfEvent
from agent.lines.echo import EchoAgent
from sip_bridge import cli
from sip_bridge.config.loader import BridgeConfig
from sip_bridge.script.caller import CallOptions, place_call, prompt_ended
from sip_bridge.server import BridgeServer

TONE_S = 1.0


def _speech(seconds: float, rate: int = 8000) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (3000 * np.sin(2 * np.pi * 300 * t)).astype(np.int16)  # about -24 dBFS


def test_a_prompt_ends_after_speech_and_enough_quiet() -> None:
    quiet = np.zeros(8000, np.int16)
    noise = (np.random.default_rng(1).normal(0, 30, 8000)).astype(np.int16)  # ~ -60 dBFS
    assert not prompt_ended(quiet)  # nothing said yet: keep waiting
    assert not prompt_ended(_speech(1.0))  # still talking
    assert not prompt_ended(np.concatenate([_speech(1.0), quiet[:4000]]))  # a pause
    assert prompt_ended(np.concatenate([_speech(1.0), noise[:7000]]))  # 0.875 s of line noise
    assert not prompt_ended(np.concatenate([_speech(0.06), quiet]))  # a click is no prompt


def _call_and_time_the_keys(tmp_path: Path, **dtmf: object) -> list[float]:
    """Seconds from the bridge's answer to each key the echo agent got."""
    play = tmp_path / "tone.wav"
    _tone_wav(play, TONE_S)
    times: list[float] = []

    async def main() -> None:
        server = BridgeServer(_config())
        make = server.agent_factory
        loop = asyncio.get_running_loop()
        started: list[float] = []

        def keep(config: BridgeConfig) -> Agent:
            agent = make(config)
            assert isinstance(agent, EchoAgent)
            start, on_event = agent.start, agent.on_event

            async def timed_start(call: CallInfo, output: object) -> None:
                started.append(loop.time())
                await start(call, output)  # type: ignore[arg-type]

            def timed_event(event: AgentEvent) -> None:
                if isinstance(event, DtmfEvent):
                    times.append(loop.time() - started[0])
                on_event(event)

            agent.start, agent.on_event = timed_start, timed_event  # type: ignore[method-assign]
            return agent

        server.agent_factory = keep
        await server.start()
        try:
            opts = CallOptions(
                f"sip:echo@127.0.0.1:{server.port}", play, tmp_path / "heard.wav",
                duration_s=4.5, dtmf="12#", rtp_ports=(44300, 44399), local_host="127.0.0.1",
                **dtmf,  # type: ignore[arg-type]
            )  # fmt: skip
            result = await place_call(opts)
            assert result.answered
        finally:
            await server.stop()

    asyncio.run(main())
    assert len(times) == 3, times
    return times


def test_keys_at_a_given_second_after_the_answer(tmp_path: Path) -> None:
    times = _call_and_time_the_keys(tmp_path, dtmf_at_s=2.5)
    assert 2.4 <= times[0] <= 3.0, times  # not the 0.5 s of before
    assert np.diff(times).min() >= 0.2, times  # 0.3 s apart


def test_keys_once_the_far_end_stopped_talking(tmp_path: Path) -> None:
    """The echo agent says our 1 s tone back 0.4 s late: its "prompt" ends ~1.4 s after the
    answer, and the keys follow 0.8 s of quiet later."""
    times = _call_and_time_the_keys(tmp_path, dtmf_after_prompt=True)
    prompt_end = ECHO_DELAY_S + TONE_S
    assert prompt_end + 0.7 <= times[0] <= prompt_end + 1.5, times


@pytest.mark.parametrize("bad", ["soon", "-1"])
def test_a_bad_dtmf_at_is_refused(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["call", "sip:x@127.0.0.1", "--play", "a.wav", "--record", "b.wav",
                  "--dtmf", "1", "--dtmf-at", bad])  # fmt: skip
    assert exc.value.code == 2
    assert "--dtmf-at" in capsys.readouterr().err

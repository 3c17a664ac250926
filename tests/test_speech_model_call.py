"""A user's own speech-to-speech ONNX model, declared in bridge.toml, answering real calls.

The model is built by the test (out = 0.5 x the previous 25 ms frame at 16 kHz, so every
sample goes through the model's state), and three calls at once must each hear their own
tone back 6 dB down, with one model run per tick serving all of them.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import numpy as np
from test_speech_to_speech import delay_model

from model_runtime.batching import TickBatcher
from sip_bridge import agents
from sip_bridge.config.loader import ConfigError, load_config
from sip_bridge.server import BridgeServer
from testkit.peers.support import dominant_hz
from testkit.sipp_media import random_port_range
from testkit.wire_caller import WireCaller


def _config(tmp_path: Path, model: Path) -> Path:
    low, high = random_port_range(40, 32000, 39000)
    p = tmp_path / "bridge.toml"
    p.write_text(
        f'[sip]\nlisten = "127.0.0.1:0"\n[rtp]\nports = "{low}-{high}"\n'
        f'[agent]\nname = "speech_model"\n'
        f'[agent.speech_model]\npath = "{model.name}"\ninput = "audio"\noutput = "out"\n'
        f'sample_rate = 16000\nframe_samples = 400\nstate = [["held", "hold"]]\n'
        '[http]\nlisten = ""\n[records]\nenabled = false\n'
    )
    return p


def _tone(hz: float, seconds: float, amp: float = 8000.0) -> np.ndarray:
    t = np.arange(int(8000 * seconds)) / 8000
    return (amp * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def test_three_calls_hear_their_tones_through_the_declared_model(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, delay_model(tmp_path / "delay.onnx")))

    async def main() -> list[np.ndarray]:
        server = BridgeServer(config)
        await server.start()
        callers = [WireCaller(server.uri) for _ in range(3)]
        try:
            await asyncio.gather(*(c.connect(("127.0.0.1", server.port)) for c in callers))
            for c, hz in zip(callers, (500.0, 1000.0, 1500.0), strict=True):
                c.say(_tone(hz, 2.0))
            await asyncio.sleep(2.6)
        finally:
            for c in callers:
                await c.hangup()
            await server.stop()
        return [np.concatenate(c.log.heard) for c in callers]

    heard = asyncio.run(main())
    for pcm, hz in zip(heard, (500.0, 1000.0, 1500.0), strict=True):
        loud = pcm[np.abs(pcm) > 500]
        assert loud.size > 8000, "no tone came back"
        mid = pcm[np.flatnonzero(np.abs(pcm) > 500)[0] :][4000:12000]  # steady part
        assert abs(dominant_hz(mid, 8000) - hz) < 20
        rms_in = 8000 / np.sqrt(2)
        ratio_db = 20 * np.log10(np.sqrt(np.mean(mid.astype(float) ** 2)) / rms_in)
        assert -7.5 < ratio_db < -4.5, ratio_db  # the model's gain of 0.5 (-6 dB), via G.711
    _, batcher = agents._speech_model(config)
    assert isinstance(batcher, TickBatcher)
    assert batcher.stats.largest >= 2  # the calls shared model runs


def test_a_speech_model_config_names_what_is_wrong(tmp_path: Path) -> None:
    p = tmp_path / "bridge.toml"
    p.write_text('[agent]\nname = "speech_model"\n')
    try:
        load_config(p)
    except ConfigError as exc:
        assert "agent.speech_model" in str(exc) and "required" in str(exc)
    else:
        raise AssertionError("accepted a speech_model agent without a model")
    p.write_text(
        '[agent.speech_model]\npath = "none.onnx"\ninput = "a"\noutput = "b"\n'
        "sample_rate = 16000\nframe_samples = 320\n"
    )
    try:
        load_config(p)
    except ConfigError as exc:
        assert ":2: agent.speech_model.path: no such file" in str(exc), str(exc)
    else:
        raise AssertionError("accepted a missing model file")


def test_a_model_that_does_not_fit_its_declaration_stops_the_start_in_one_line(
    tmp_path: Path,
) -> None:
    """Checked before the bridge listens, not at the first call: the line names the key
    and the names the model really has."""
    model = delay_model(tmp_path / "delay.onnx")
    cfg = _config(tmp_path, model)
    cfg.write_text(cfg.read_text().replace('input = "audio"', 'input = "mic"'))
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-m", "sip_bridge.cli", "run", "--config", str(cfg)],
        capture_output=True, text=True, cwd=root, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("sip-bridge: agent.speech_model:") and "mic" in line, line
    assert "audio" in line, line  # what the model does take

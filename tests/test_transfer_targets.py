"""Transfer targets are checked when the file loads (templates only of known names; what the
file alone decides, rendered and checked then), the rendered value when the call gets there;
and every transfer that does not succeed is a WARNING with call id, target and status, and a
count in Prometheus."""

from __future__ import annotations

import asyncio
import logging
import wave
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_sipp_refer import TransferringAgent

from agent.base import Agent, TransferResult
from agent.dialogue.engine import DialogueEngine, Transfer
from agent.dialogue.profile import ProfileError
from agent.dialogue.profile_loader import load_profile
from agent.dialogue.transfer_target import target_problem
from sip_bridge.cli import main as cli_main
from sip_bridge.config.loader import BridgeConfig
from sip_bridge.ops.call_telemetry import CallTelemetry
from sip_bridge.ops.metrics import BridgeMetrics
from sip_bridge.script.caller import CallOptions, place_call
from sip_bridge.server import BridgeServer
from sip_bridge.sip.transfer import refer_target

ROOT = Path(__file__).resolve().parents[1]

TARGETS = [
    "sip:desk@pbx.example.com", "sip:pbx.example.com", "sips:1001@10.0.0.1:5061;transport=tls",
    "sip:desk@[::1]:5060", "SIP:desk@Pbx", "sip:a@b;user=phone", "sip:a@b?x=y", "sip:a@b_c",
    "tel:+15551234", "+1 (555) 123-4567", "1001", "*72#",
    "sip:@x", "sip:", "sip:desk@", "tel:", "{reception}", "reception", "sip:desk pbx", "",
    "sip:a@b:99999", "sip:a@b@c", "sip:desk@pbx:5060:1",
]  # fmt: skip


@pytest.mark.parametrize("target", TARGETS)
def test_the_load_time_check_accepts_what_the_bridge_can_refer_to(target: str) -> None:
    try:
        refer_target(target, "<sip:caller@127.0.0.1:5070>")
        referable = True
    except ValueError:
        referable = False
    assert (target_problem(target) is None) == referable


PROFILE = """\
[agent]
greeting = "Dental practice."
[variables]
reception = "{reception}"
[slots.ext]
type = "digits"
min_length = 3
max_length = 4
prompt = "Which extension?"
[intents.desk]
dtmf = "1"
keywords = ["reception"]
reply = "Putting you through."
transfer = "{target}"
[intents.extension]
dtmf = "2"
keywords = ["extension"]
slots = ["ext"]
reply = "Calling {ext:spell}."
transfer = "sip:{ext}@pbx.example.com"
"""


def _profile(tmp_path: Path, reception: str, target: str = "{reception}") -> Path:
    f = tmp_path / "dentist.toml"
    f.write_text(PROFILE.replace("{target}", target).replace("{reception}", reception, 1))
    return f


@pytest.mark.parametrize(
    ("reception", "target", "words"),
    [
        ("sip:desk@pbx.example.com", "{front_desk}", "unknown placeholder {front_desk}"),
        ("sip:desk@pbx.example.com", "reception", "'reception' is not a SIP URI"),
        ("the desk", "{reception}", "'{reception}' gives 'the desk': 'the desk' is not a SIP"),
        ("sip:desk@pbx.example.com", "sip:{nobody}@pbx", "unknown placeholder {nobody}"),
    ],
)
def test_a_bad_target_is_refused_when_the_profile_loads(
    tmp_path: Path, reception: str, target: str, words: str
) -> None:
    f = _profile(tmp_path, reception, target)
    with pytest.raises(ProfileError) as err:
        load_profile(f)
    line = PROFILE.splitlines().index('transfer = "{target}"') + 1
    assert err.value.line == line and err.value.key == "intents.desk.transfer"
    assert str(err.value).startswith(f"{f}:{line}: intents.desk.transfer: ")
    assert words in str(err.value)
    bridge = tmp_path / "bridge.toml"
    bridge.write_text(f'[agent.voice]\nprofile = "{f.name}"\n')
    assert cli_main(["config", "check", str(bridge)]) == 2  # `config check` says it too


def test_escalate_transfer_is_checked_like_transfer(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    good = PROFILE.replace("{target}", "1000", 1).replace("{reception}", "1000", 1)
    f.write_text(good + '[fallback]\nescalate_after = 2\nescalate_transfer = "front desk"\n')
    line = len(good.splitlines()) + 3
    with pytest.raises(ProfileError, match=rf":{line}: fallback\.escalate_transfer: 'front desk'"):
        load_profile(f)


def test_templates_render_with_variables_and_slots_in_the_call(tmp_path: Path) -> None:
    profile = load_profile(_profile(tmp_path, "sip:desk@pbx.example.com"))
    engine = DialogueEngine(profile)

    async def say(text: str) -> list[object]:
        return [p async for p in engine.respond(text)]

    parts = asyncio.run(say("reception please"))
    assert Transfer("sip:desk@pbx.example.com") in parts
    engine = DialogueEngine(profile)
    for key in "2204#":
        turn = engine.press(key)
    assert turn is not None and Transfer("sip:204@pbx.example.com") in turn.parts


def test_a_failed_transfer_is_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    metrics = BridgeMetrics()
    telemetry = CallTelemetry("n1", metrics=metrics)
    with caplog.at_level(logging.WARNING, logger="sip_bridge.ops.call_telemetry"):
        telemetry.transfer_ended("c-9", "sip:1001@pbx", "failed", 501, "REFER rejected: 501")
        telemetry.transfer_ended("c-9", "sip:1001@pbx", "succeeded", 200, "200 OK")
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == "call c-9: transfer to sip:1001@pbx failed: status 501 (REFER rejected: 501)"
    value = metrics.registry.get_sample_value
    assert value("sipbridge_transfers_total", {"outcome": "failed", "status": "501"}) == 1
    assert value("sipbridge_transfers_total", {"outcome": "succeeded", "status": "200"}) == 1


def test_a_bad_rendered_target_in_a_real_call_fails_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The bridge gets a target it cannot REFER to (a template rendered badly): the agent is
    told at once (status 0), the log has a WARNING with the call id, target and status, and
    /metrics counts it."""
    base = BridgeConfig.line_check()
    config = replace(
        base,
        sip=replace(base.sip, listen="127.0.0.1:0"),
        rtp=replace(base.rtp, ports="41600-41699"),
        metrics=replace(base.metrics, listen="127.0.0.1:0"),
    )
    agents: list[TransferringAgent] = []

    def factory(_: BridgeConfig) -> Agent:
        agents.append(TransferringAgent("front desk", after_s=0.3))
        return agents[-1]

    play = tmp_path / "quiet.wav"
    with wave.open(str(play), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(np.zeros(8000, np.int16).tobytes())

    async def main() -> float | None:
        server = BridgeServer(config, factory)
        await server.start()
        try:
            uri = f"sip:transfer@127.0.0.1:{server.port}"
            heard = tmp_path / "heard.wav"
            opts = CallOptions(uri, play, heard, duration_s=1.5, rtp_ports=(41700, 41799))
            result = await place_call(opts)
            assert result.answered
        finally:
            await server.stop()
        metrics = server.telemetry.metrics
        assert metrics is not None
        return metrics.registry.get_sample_value(
            "sipbridge_transfers_total", {"outcome": "failed", "status": "0"}
        )

    with caplog.at_level(logging.WARNING):
        counted = asyncio.run(main())
    assert counted == 1
    [agent] = agents
    [result] = [e for e in agent.events if isinstance(e, TransferResult)]
    assert (result.outcome, result.status) == ("failed", 0)
    warnings = [r for r in caplog.records if "transfer to" in r.getMessage()]
    (record,) = warnings
    assert record.levelno == logging.WARNING
    text = record.getMessage()
    assert text.startswith("call ") and "transfer to front desk failed: status 0" in text
    assert "neither a URI nor a number" in text

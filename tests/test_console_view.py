"""What the talk page offers and how the console reports turns (no sockets)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sip_bridge.config.loader import BridgeConfig
from sip_bridge.config.routes import RouteConfig
from sip_bridge.ops.call_telemetry import turn_total_ms
from sip_bridge.web.console_view import talk_profiles

ROOT = Path(__file__).resolve().parents[1]


def test_the_talk_page_offers_the_default_each_route_and_the_profiles_beside_it(
    tmp_path: Path,
) -> None:
    agents = tmp_path / "agents"
    agents.mkdir()
    demo = agents / "demo.toml"
    for name in ("demo", "sales", "billing"):
        (agents / f"{name}.toml").write_text((ROOT / "config/agents/demo.toml").read_text())
    base = BridgeConfig.line_check()
    cfg = dataclasses.replace(
        base,
        agent=dataclasses.replace(base.agent, name="voice", voice_profile=str(demo)),
        routes=(
            RouteConfig(name="check", called="7001", agent="tone"),
            RouteConfig(name="sales-line", called="5*", profile=str(agents / "sales.toml")),
            RouteConfig(name="again", called="6*", profile=str(demo)),  # the default's twin
        ),
    )
    offered = talk_profiles(cfg)
    assert list(offered) == ["demo", "route:check", "route:sales-line", "billing"]
    # labelled with the profile's own name ([agent] name), as records and events give it
    assert offered["demo"][0] == "acme-demo (voice agent, demo.toml) (default)"
    label, check = offered["route:check"]
    assert check.agent.name == "tone" and "route check" in label
    _, billing = offered["billing"]
    assert billing.agent.name == "voice" and billing.agent.voice_profile.endswith("billing.toml")
    # a line-check default is offered by its agent name
    echo = dataclasses.replace(cfg, agent=dataclasses.replace(cfg.agent, name="echo"), routes=())
    assert next(iter(talk_profiles(echo))) == "echo"


def test_a_turns_latency_is_its_total_or_the_sum_of_its_stages() -> None:
    stages = {"end_of_turn": 250.04, "asr_tail": 40.0, "dialogue": 0.5, "tts_first_audio": 90.0}
    assert turn_total_ms(stages) == 380.5
    assert turn_total_ms({**stages, "barged_in": True}) == 380.5
    assert turn_total_ms({**stages, "total": 401.26}) == 401.3
    assert turn_total_ms({"barged_in": False}) is None


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata", "America/St_Johns"])
def test_console_and_cli_write_one_timestamp_format(zone: str) -> None:
    """ISO 8601 in local time with its zone, the same string from the console's script (run
    by node) and `sip-bridge calls` for one instant, in zones with odd offsets."""
    js = (ROOT / "sip_bridge/web/static/console.js").read_text()
    wanted = ("const pad2", "const isoLocal")
    lines = [line for line in js.splitlines() if line.strip().startswith(wanted)]
    assert len(lines) == 2, lines
    helpers = "\n".join(lines)
    at = 1795631187.4  # 2026-11-25 18:26:27 UTC
    env = {**os.environ, "TZ": zone}
    console = subprocess.run(
        ["node", "-e", f"{helpers}\nprocess.stdout.write(isoLocal(new Date({at} * 1000)))"],
        env=env, capture_output=True, text=True, check=True, timeout=30,
    ).stdout  # fmt: skip
    cli = subprocess.run(
        [sys.executable, "-c", f"from sip_bridge.ops.records_cli import _when; print(_when({at}))"],
        env=env, capture_output=True, text=True, check=True, timeout=30, cwd=ROOT,
    ).stdout.strip()  # fmt: skip
    want = {"UTC": "2026-11-25T18:26:27+00:00", "Asia/Kolkata": "2026-11-25T23:56:27+05:30",
            "America/St_Johns": "2026-11-25T14:56:27-03:30"}[zone]  # fmt: skip
    assert console == cli == want

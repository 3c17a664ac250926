"""What the talk page offers and how the console reports turns (no sockets)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sip_bridge.config import BridgeConfig
from sip_bridge.console_view import talk_profiles, turn_total_ms
from sip_bridge.routes import RouteConfig

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

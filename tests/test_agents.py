"""Which agent answers, from config (sip_bridge/agents.py)."""

from __future__ import annotations

from dataclasses import replace

from agent.lines.echo import EchoAgent
from agent.lines.tone import ToneAgent
from sip_bridge.agents import make_agent
from sip_bridge.config.loader import BridgeConfig


def test_the_echo_line_check_runs_at_the_line_rate() -> None:
    """No resampler either way: the caller hears the line back bit-exact (G.711 decoded and
    re-encoded), and 200 echo calls cost two resamplers less each."""
    agent = make_agent(BridgeConfig.line_check())
    assert isinstance(agent, EchoAgent) and agent.sample_rate == 8000
    assert agent.delay_samples == 4000  # agent.echo.delay_s = 0.5 at 8 kHz


def test_the_tone_agent_from_config() -> None:
    cfg = BridgeConfig()
    cfg = replace(cfg, agent=replace(cfg.agent, name="tone", tone_freq_hz=440.0))
    agent = make_agent(cfg)
    assert isinstance(agent, ToneAgent) and agent.freq_hz == 440.0

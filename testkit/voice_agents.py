"""An agent factory for a test's or a benchmark's in-process bridge: it makes the configured
voice agent for each call, as the bridge would, and keeps every one it made, so the caller's
side can read its call's agent (turns, barge-ins, timings)."""

from __future__ import annotations

from collections.abc import Callable

from agent.voice.voice_agent import VoiceAgent
from sip_bridge.agents import make_agent
from sip_bridge.config.loader import BridgeConfig

__all__ = ["VoiceAgents"]


class VoiceAgents:
    """``BridgeServer(config, agent_factory=VoiceAgents())``; ``made`` in call order.
    ``adapt`` changes each agent before its call starts (a benchmark's settings, a fault)."""

    def __init__(self, adapt: Callable[[VoiceAgent], None] | None = None) -> None:
        self.made: list[VoiceAgent] = []
        self.adapt = adapt

    def __call__(self, config: BridgeConfig) -> VoiceAgent:
        agent = make_agent(config)
        assert isinstance(agent, VoiceAgent), f"not a voice agent: {agent.name}"
        if self.adapt is not None:
            self.adapt(agent)
        self.made.append(agent)
        return agent

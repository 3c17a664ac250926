"""An agent as it looks on an overloaded node: its turns keep callers waiting.

What the node's headroom ([load], sip_bridge.ops.headroom) reads is the agent's
TurnCompleted events: this agent reports ``turns`` of them, each ``turn_ms`` long, when its
call starts, and says nothing. Tests of load shedding use it to overload one node of
several without loading the machine that runs them all.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from agent.base import Agent, AgentOutput, CallInfo, TurnCompleted


class SlowTurnsAgent(Agent):
    name = "slow-turns"

    def __init__(self, turn_ms: float, turns: int) -> None:
        self.turn_ms, self.turns = turn_ms, turns

    async def start(self, call: CallInfo, output: AgentOutput) -> None:
        for _ in range(self.turns):
            stages = {"end_of_turn": 300.0, "total": self.turn_ms}
            output.emit(TurnCompleted("where is my order?", "Let me look.", stages))

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        pass

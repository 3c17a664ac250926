"""An AgentOutput that records what an agent says and does, for the agent unit tests."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from agent.base import AgentEvent, AgentOutput, HangupEvent


class Capture(AgentOutput):
    """Keeps every write (unless `keep` is False: sizes only), events, and when they came.

    Tests that drive an agent tick by tick set `tick` so writes and hang-ups are dated.
    """

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.chunks: list[NDArray[np.int16]] = []
        self.sizes: list[int] = []
        self.events: list[AgentEvent] = []
        self.flushes = 0
        self.tick = 0
        self.writes_at: list[int] = []
        self.hangups_at: list[int] = []

    def write(self, pcm: NDArray[np.int16]) -> None:
        self.sizes.append(int(pcm.size))
        self.writes_at.append(self.tick)
        if self.keep:
            self.chunks.append(pcm.copy())

    def flush(self) -> float:
        self.flushes += 1
        return 0.0

    def hangup(self, reason: str = "") -> None:
        self.events.append(HangupEvent(reason))
        self.hangups_at.append(self.tick)

    def emit(self, event: AgentEvent) -> None:
        self.events.append(event)

    @property
    def audio(self) -> NDArray[np.int16]:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.int16)

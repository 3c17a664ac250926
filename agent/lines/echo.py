"""An agent that plays the caller back to themselves: the bridge's loopback test."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from agent.base import Agent, AgentEvent, AgentOutput, CallInfo, DtmfEvent

__all__ = ["EchoAgent"]


class EchoAgent(Agent):
    """Writes back every frame it hears, delayed by exactly ``delay_s``.

    The delay is a delay line in samples (``round(delay_s * sample_rate)``), not a timer:
    each frame heard releases a frame of the same length from ``delay`` samples ago, so
    the echo is sample-accurate and stays in step with the caller's clock. The bridge feeds
    one frame per tick even in silence, which is what makes samples a clock. Events are
    kept in :attr:`events` (handy in tests). Every key the caller presses is pressed back
    (``output.send_dtmf``): a line check covers the keys too.
    """

    name = "echo"

    def __init__(self, delay_s: float = 0.5, sample_rate: int = 24000) -> None:
        if not delay_s >= 0:
            raise ValueError("delay_s must be >= 0")
        if sample_rate <= 0:
            raise ValueError("sample_rate must be positive")
        self.sample_rate = sample_rate
        self.delay_s = delay_s
        self.delay_samples = round(delay_s * sample_rate)
        self._line: NDArray[np.int16] = np.zeros(self.delay_samples, dtype=np.int16)
        self._pos = 0  # the ring's oldest sample
        self._output: AgentOutput | None = None
        self.call: CallInfo | None = None
        self.events: list[AgentEvent] = []
        self.heard_samples = 0

    async def start(self, call: CallInfo, output: AgentOutput) -> None:
        self.call = call
        self._output = output

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        a = np.asarray(pcm)
        if a.dtype != np.int16 or a.ndim != 1:
            raise ValueError("pcm must be a 1-D int16 array")
        n = a.size
        self.heard_samples += n
        d = self.delay_samples
        if n > d - self._pos or not n:  # wraps (or longer than the line): the general way
            line = np.concatenate((self._line[self._pos :], self._line[: self._pos], a))
            out, self._line, self._pos = line[:n], line[n:], 0
        else:  # a frame in place: the line is a ring, no copy of the whole delay per frame
            p = self._pos
            out = self._line[p : p + n].copy()
            self._line[p : p + n] = a
            self._pos = p + n if p + n < d else 0
        if self._output is not None and n:
            self._output.write(out)

    def on_event(self, event: AgentEvent) -> None:
        self.events.append(event)
        if isinstance(event, DtmfEvent) and self._output is not None:
            self._output.send_dtmf(event.digit)

    async def stop(self) -> None:
        self._output = None

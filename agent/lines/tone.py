"""An agent that plays a steady test tone: the operator's line check for the outbound leg.

A 1 kHz tone at a known level lets a technician (or a test) verify gain, codec and clipping
on the path from the bridge to the caller without any model in the loop.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from agent.base import Agent, AgentOutput, CallInfo

__all__ = ["ToneAgent"]

#: Peak of a 0 dBFS sine (AES17); clipped symmetrically to +-32767 so it stays undistorted.
FULL_SCALE = 32768.0


class ToneAgent(Agent):
    """Writes a continuous sine, one frame of tone per frame heard; the input is ignored.

    Pacing by the caller's frames (as :class:`~agent.lines.echo.EchoAgent` does) means the output
    queue never grows and the tone's length equals the call's length to the sample. The phase
    is carried between frames as a fraction of a cycle, so frame joins are seamless and it
    does not drift however long the call lasts. ``level_dbfs`` is the sine's peak relative to
    full scale (0 dBFS = peak 32768, clipped to +-32767).
    """

    name = "tone"

    def __init__(
        self, freq_hz: float = 1000.0, level_dbfs: float = -10.0, sample_rate: int = 24000
    ) -> None:
        if sample_rate <= 0:
            raise ValueError("sample_rate must be positive")
        if not 0.0 < freq_hz < sample_rate / 2:
            raise ValueError(f"freq_hz must be in (0, {sample_rate / 2}), got {freq_hz}")
        if not level_dbfs <= 0.0:
            raise ValueError(f"level_dbfs must be <= 0, got {level_dbfs}")
        self.freq_hz = freq_hz
        self.level_dbfs = level_dbfs
        self.sample_rate = sample_rate
        self.amplitude = FULL_SCALE * 10.0 ** (level_dbfs / 20.0)
        self._cycles_per_sample = freq_hz / sample_rate
        self._phase = 0.0  # in cycles, in [0, 1): where the next frame starts
        self._output: AgentOutput | None = None
        self.call: CallInfo | None = None
        self.samples_written = 0

    async def start(self, call: CallInfo, output: AgentOutput) -> None:
        self.call = call
        self._output = output

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        n = int(np.asarray(pcm).size)
        if self._output is None or n == 0:
            return
        self._output.write(self.next_frame(n))

    def next_frame(self, n: int) -> NDArray[np.int16]:
        """The next ``n`` samples of the tone (advances the phase)."""
        cycles = self._phase + np.arange(n, dtype=np.float64) * self._cycles_per_sample
        y = self.amplitude * np.sin(2.0 * np.pi * cycles)
        # Wrap to [0, 1) every frame: the float error stays at one frame's worth (~1e-13).
        self._phase = (self._phase + n * self._cycles_per_sample) % 1.0
        self.samples_written += n
        out: NDArray[np.int16] = np.clip(np.rint(y), -32767, 32767).astype(np.int16)
        return out

    async def stop(self) -> None:
        self._output = None

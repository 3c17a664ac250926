"""What answers a call after its agent's model failed: a recorded apology, then the exit.

Why a separate agent: the failed agent cannot be trusted to speak (its TTS may be what
broke), so the bridge stops it and puts this one in its place on the call, at the same
sample rate (the call's resamplers stay as they are). It plays the prompt one frame per
frame heard, like the playback agent, so little is queued; once its last samples have left
the call's queue (:meth:`~agent.base.AgentOutput.queued_ms`: a hang-up would cut what is
still there, and audio the failed agent left ahead of the prompt delays it), and ``tail_s``
later (the caller's phone plays them out), it asks for the configured exit: a hang-up, or
a transfer (the agent's ordinary :class:`~agent.base.TransferRequest`, so REFER goes the
usual way). A transfer that fails ends in a hang-up: the caller is never left in silence.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import NDArray

from agent.base import Agent, AgentEvent, AgentOutput, CallInfo, TransferRequest, TransferResult

__all__ = ["FAULT_REASON", "FallbackPromptAgent"]

#: The end reason of a call that a model fault ended (call records, events, logs).
FAULT_REASON = "model_fault"


class FallbackPromptAgent(Agent):
    """Plays ``prompt`` (mono int16 at ``sample_rate``) once, then hangs up or transfers."""

    name = "fallback-prompt"

    def __init__(
        self,
        prompt: NDArray[np.int16],
        sample_rate: int,
        *,
        action: Literal["hangup", "transfer"] = "hangup",
        transfer_to: str = "",
        tail_s: float = 0.3,
    ) -> None:
        if action == "transfer" and not transfer_to:
            raise ValueError("a transfer needs a target")
        self.prompt = prompt
        self.sample_rate = sample_rate
        self.action = action
        self.transfer_to = transfer_to
        self.played = 0  # samples written
        self._tail = round(tail_s * sample_rate)  # samples heard after the last one was sent
        self.exited = False  # the hang-up or transfer was asked for
        self.transfer: TransferResult | None = None
        self._out: AgentOutput | None = None

    async def start(self, call: CallInfo, output: AgentOutput) -> None:
        self._out = output

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        out = self._out
        if out is None or self.exited:
            return
        if self.played < self.prompt.size:
            chunk = self.prompt[self.played : self.played + pcm.size]
            self.played += chunk.size
            out.write(chunk.copy())
            return
        if out.queued_ms() > 0:  # not all sent yet: the tail starts once it is
            return
        self._tail -= pcm.size
        if self._tail > 0:
            return
        self.exited = True  # the prompt is out on the wire
        if self.action == "transfer":
            out.emit(TransferRequest(self.transfer_to))
        else:
            out.hangup(FAULT_REASON)

    def on_event(self, event: AgentEvent) -> None:
        if isinstance(event, TransferResult):
            self.transfer = event
            if event.outcome != "succeeded" and self._out is not None:
                self._out.hangup(FAULT_REASON)  # (success: the bridge hangs up itself)

    async def stop(self) -> None:
        self._out = None

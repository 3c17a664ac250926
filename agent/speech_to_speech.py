"""An agent that is one native speech-to-speech model: caller audio in, model audio out.

The bridge ticks every 20 ms; the model wants its own frame size. This agent re-chunks the
caller's audio into model frames, runs each frame (directly, or through a cross-call
:class:`~model_runtime.batching.TickBatcher` so one session run serves every call in the
tick) and writes whatever the model says, in frame order, to the call. Turn-taking and
barge-in are the model's business: it hears the caller continuously.

A model run that raises (inline, or a batch that failed) is a fault of the call: its
frame is skipped and the agent emits one :class:`~agent.base.ModelFault`, on which the
bridge stops it and takes the call over (fallback prompt, then hang-up or transfer). Runs
happen on the event loop's thread here, so a run that hangs cannot be timed out from
inside the process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from agent.base import Agent, AgentOutput, CallInfo, ModelFault
from model_runtime.speech_to_speech import SpeechToSpeechModel, StreamState

__all__ = ["FrameBatcher", "SpeechToSpeechAgent"]

_Item = tuple[NDArray[np.float32], StreamState]


class FrameBatcher(Protocol):
    """What this agent needs of ``model_runtime.batching.TickBatcher`` (built with
    ``TickBatcher(model.run_batch, ...)``): queue an item, later call ``done`` with its
    result or with the exception that failed its batch."""

    def submit(self, item: Any, done: Callable[[Any], None]) -> None: ...


class SpeechToSpeechAgent(Agent):
    """Feeds the caller's 20 ms ticks to a :class:`SpeechToSpeechModel` frame by frame.

    Without a batcher each model frame runs inside :meth:`on_audio` (fine for small models
    or one call); with one, frames are submitted and their outputs written when the batch
    comes back. Outputs are written strictly in frame order even if batches finish out of
    order.
    """

    name = "speech-to-speech"

    def __init__(self, model: SpeechToSpeechModel, *, batcher: FrameBatcher | None = None) -> None:
        self.model = model
        self.batcher = batcher
        self.sample_rate = model.spec.sample_rate
        self._n = model.spec.frame_samples
        self._pending = np.zeros(0, np.float32)  # caller audio not yet a whole frame
        self.state = model.new_state()
        self._output: AgentOutput | None = None
        self.call: CallInfo | None = None
        self._next_seq = 0  # next frame number to submit
        self._next_write = 0  # next frame number to write
        self._done: dict[int, NDArray[np.float32]] = {}
        self.frames_in = 0
        self.samples_out = 0
        self.failed_frames = 0
        self.fault: ModelFault | None = None

    async def start(self, call: CallInfo, output: AgentOutput) -> None:
        self.call = call
        self._output = output

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        if self._output is None:
            return
        x = np.asarray(pcm, dtype=np.float32).reshape(-1) / 32768.0
        buf = np.concatenate([self._pending, x])
        whole = buf.size // self._n * self._n
        self._pending = buf[whole:]
        for frame in buf[:whole].reshape(-1, self._n):
            self.frames_in += 1
            seq = self._next_seq
            self._next_seq += 1
            if self.batcher is None:
                try:
                    y = self.model.run(frame[None], [self.state])[0]
                except Exception as exc:  # skip the frame, as a failed batch does
                    self.failed_frames += 1
                    self._fault(exc)
                    y = np.zeros(0, np.float32)
                self._deliver(seq, y)
            else:
                self.batcher.submit((frame, self.state), self._done_callback(seq))

    def _done_callback(self, seq: int) -> Callable[[Any], None]:
        def done(result: Any) -> None:
            if isinstance(result, Exception):  # the batch failed (TickBatcher logged it)
                self.failed_frames += 1
                self._fault(result)
                result = np.zeros(0, np.float32)  # skip the frame, keep the order
            self._deliver(seq, np.asarray(result, dtype=np.float32))

        return done

    def _fault(self, exc: Exception) -> None:
        """The first failed run of the call: tell the bridge (once)."""
        if self.fault is None:
            self.fault = ModelFault(f"{type(exc).__name__}: {exc}", "speech_model")
            if self._output is not None:
                self._output.emit(self.fault)

    def _deliver(self, seq: int, y: NDArray[np.float32]) -> None:
        """Write frame ``seq`` once every earlier frame is written."""
        self._done[seq] = y
        while self._next_write in self._done:
            out = self._done.pop(self._next_write)
            self._next_write += 1
            if self._output is not None and out.size:
                pcm = np.clip(np.rint(out * 32768.0), -32768, 32767).astype(np.int16)
                self.samples_out += pcm.size
                self._output.write(pcm)

    async def stop(self) -> None:
        self._output = None  # late batch results are dropped
        self._done.clear()

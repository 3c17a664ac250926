"""An agent for outbound test calls: says a WAV file and records everything it hears."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from agent.base import Agent, AgentEvent, AgentOutput, CallInfo, DtmfEvent
from resample import Resampler

__all__ = ["RECORD_RATE", "PlayRecordAgent"]

RECORD_RATE = 8000  # the call is G.711: more would only store resampling artefacts


class PlayRecordAgent(Agent):
    """Plays ``audio`` (int16 at ``sample_rate``), one frame per frame heard, and records.

    Pacing by input (as :class:`~agent.lines.playback.PlaybackAgent` does) keeps the send queue
    at one frame, and makes the recording and the playback share one timeline: sample
    ``n`` of the recording was heard while sample ``n`` of the file was being said.
    The recording is downsampled to 8 kHz as it comes in (bounded work per tick).
    """

    name = "play-record"

    def __init__(self, audio: NDArray[np.int16], sample_rate: int = 24000) -> None:
        a = np.asarray(audio)
        if a.dtype != np.int16 or a.ndim != 1:
            raise ValueError("audio must be a 1-D int16 array")
        self.sample_rate = sample_rate
        self.audio = a
        self.position = 0
        self.heard_samples = 0
        self.events: list[AgentEvent] = []
        self.digits = ""
        self._down = Resampler(sample_rate, RECORD_RATE) if sample_rate != RECORD_RATE else None
        self._recorded: list[NDArray[np.int16]] = []
        self._output: AgentOutput | None = None

    @property
    def finished_playing(self) -> bool:
        return self.position >= self.audio.size

    @property
    def recording(self) -> NDArray[np.int16]:
        """Everything heard so far, 8 kHz mono int16."""
        if not self._recorded:
            return np.zeros(0, np.int16)
        return np.concatenate(self._recorded)

    async def start(self, call: CallInfo, output: AgentOutput) -> None:
        self._output = output

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        a = np.asarray(pcm)
        n = a.size
        self.heard_samples += n
        self._recorded.append(self._down.process(a) if self._down is not None else a.copy())
        if self._output is not None and not self.finished_playing and n:
            chunk = self.audio[self.position : self.position + n]
            self.position += chunk.size
            self._output.write(chunk)

    def on_event(self, event: AgentEvent) -> None:
        self.events.append(event)
        if isinstance(event, DtmfEvent):
            self.digits += event.digit

    async def stop(self) -> None:
        self._output = None

    def save(self, path: str | Path) -> float:
        """Write the recording as a 16-bit mono WAV; returns its length in seconds."""
        pcm = self.recording
        with wave.open(str(path), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(RECORD_RATE)
            w.writeframes(pcm.astype("<i2").tobytes())
        return pcm.size / RECORD_RATE

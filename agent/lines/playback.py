"""An agent that plays a WAV file to the caller: announcements and recorded line checks.

Operators test a trunk by calling in and listening to a known recording (or by recording
what the far end hears). The file is decoded and resampled once, at construction, so a bad
file fails when the profile is loaded rather than mid-call, and the media tick only slices.
"""

from __future__ import annotations

import wave
from math import gcd
from pathlib import Path

import numpy as np
import scipy.signal
from numpy.typing import NDArray

from agent.base import Agent, AgentOutput, CallInfo
from agent.wav_format import unsupported_wav
from resample import SUPPORTED_RATES, Resampler

__all__ = ["PlaybackAgent", "WavFormatError", "load_wav"]


class WavFormatError(ValueError):
    """The file is not a WAV this agent can play (16-bit PCM, mono or stereo)."""


def _read_pcm16(path: Path) -> tuple[NDArray[np.int16], int]:
    """Mono int16 samples and their rate; stereo is downmixed as the mean of the channels."""
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            raw = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as exc:  # "unknown format: 65534": say it in words
        raise WavFormatError(f"{path}: {unsupported_wav(path)}") from exc
    if width != 2:
        raise WavFormatError(f"{path}: {unsupported_wav(path)}")
    if channels not in (1, 2):
        raise WavFormatError(f"{path}: {channels} channels; only mono or stereo is supported")
    if rate <= 0:
        raise WavFormatError(f"{path}: invalid sample rate {rate}")
    usable = len(raw) - len(raw) % (2 * channels)  # a truncated last frame is dropped
    pcm = np.frombuffer(raw[:usable], dtype="<i2").astype(np.int16)
    if pcm.size == 0:
        raise WavFormatError(f"{path}: contains no audio")
    if channels == 2:
        pair = pcm.reshape(-1, 2).astype(np.int32)
        pcm = np.rint((pair[:, 0] + pair[:, 1]) / 2.0).astype(np.int16)
    return pcm, rate


def _resample(pcm: NDArray[np.int16], in_rate: int, out_rate: int) -> NDArray[np.float64]:
    """``pcm`` at ``out_rate``: exactly round(n * out / in) samples, aligned with the input.

    The project's streaming :class:`~resample.Resampler` is used for the rates it supports
    (8/16/22.05/24/48 kHz), its ~2 ms group delay trimmed off to the nearest output sample
    (at most half a sample, 21 us at 24 kHz, remains). Any other rate (44.1 kHz above all)
    goes through ``scipy.signal.resample_poly``: the whole file is in memory, so a one-shot
    zero-phase polyphase filter is fine here, with no streaming to support.
    """
    target = round(pcm.size * out_rate / in_rate)
    if in_rate == out_rate:
        return pcm.astype(np.float64)
    if in_rate in SUPPORTED_RATES and out_rate in SUPPORTED_RATES:
        r = Resampler(in_rate, out_rate)
        skip = round(r.delay_samples_out)
        y = np.concatenate((r.process(pcm), r.flush())).astype(np.float64)
        y = y[skip : skip + target]
    else:
        g = gcd(in_rate, out_rate)
        y = scipy.signal.resample_poly(pcm.astype(np.float64), out_rate // g, in_rate // g)
        y = y[:target]
    if y.size < target:  # not expected; keeps the duration promise regardless
        y = np.concatenate((y, np.zeros(target - y.size)))
    return np.asarray(y, dtype=np.float64)


def load_wav(path: str | Path, sample_rate: int, level_db: float = 0.0) -> NDArray[np.int16]:
    """Read a 16-bit PCM WAV at any rate, mono or stereo, as mono int16 at ``sample_rate``.

    ``level_db`` is a gain applied after resampling; the result is clipped to +-32767.
    Raises :class:`WavFormatError` (a ValueError) naming the file for anything unplayable.
    """
    p = Path(path)
    pcm, rate = _read_pcm16(p)
    y = _resample(pcm, rate, sample_rate) * 10.0 ** (level_db / 20.0)
    out: NDArray[np.int16] = np.clip(np.rint(y), -32767, 32767).astype(np.int16)
    return out


class PlaybackAgent(Agent):
    """Plays a WAV file, one frame of it per frame heard; the caller's audio is ignored.

    Pacing by the caller's frames keeps the output queue at one frame, so a long file never
    floods the bridge and barge-in has nothing stale to flush. At the end of the file it
    either starts over (``loop``) or stops; with ``hangup_at_end`` it then asks the bridge to
    hang up, once, on the tick after the last samples were written so that they are sent
    before the BYE.
    """

    name = "playback"

    def __init__(
        self,
        path: str | Path,
        loop: bool = False,
        hangup_at_end: bool = True,
        level_db: float = 0.0,
        sample_rate: int = 24000,
    ) -> None:
        if sample_rate <= 0:
            raise ValueError("sample_rate must be positive")
        self.path = Path(path)
        self.loop = loop
        self.hangup_at_end = hangup_at_end
        self.level_db = level_db
        self.sample_rate = sample_rate
        self.audio = load_wav(self.path, sample_rate, level_db)
        self.audio.flags.writeable = False
        self._pos = 0
        self.finished = False  # every sample has been written (never, when looping)
        self.hung_up = False
        self.loops_started = 0  # how many times playback wrapped back to the start
        self._output: AgentOutput | None = None
        self.call: CallInfo | None = None

    @property
    def duration_s(self) -> float:
        """Length of one pass of the file at the agent's rate."""
        return self.audio.size / self.sample_rate

    async def start(self, call: CallInfo, output: AgentOutput) -> None:
        self.call = call
        self._output = output

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        out = self._output
        n = int(np.asarray(pcm).size)
        if out is None or n == 0:
            return
        if self.finished:
            if self.hangup_at_end and not self.hung_up:
                self.hung_up = True
                out.hangup("playback finished")
            return
        out.write(self._take(n))

    def _take(self, n: int) -> NDArray[np.int16]:
        """The next ``n`` samples (fewer only at the very end of a non-looping pass)."""
        parts: list[NDArray[np.int16]] = []
        need = n
        while need > 0:
            chunk = self.audio[self._pos : self._pos + need]
            parts.append(chunk)
            need -= chunk.size
            self._pos += chunk.size
            if self._pos >= self.audio.size:
                if not self.loop:
                    self.finished = True
                    break
                self._pos = 0
                self.loops_started += 1
        return np.concatenate(parts) if len(parts) > 1 else parts[0].copy()

    async def stop(self) -> None:
        self._output = None

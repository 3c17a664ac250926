"""The voice agent on its real models, driven tick by tick over a simulated phone line.

What the agent writes is paced out one 20 ms frame per tick (as the bridge does, and
flushed when the agent flushes); the line sends it back as echo (:class:`LineEcho`:
delay, ERL, a hybrid's colouring, G.711), adds line noise and whatever the caller says,
and the agent hears the sum through G.711 on the next tick. Ticks run as fast as the CPU
allows, so a test of minutes of speech takes seconds; the TTS is cached by sentence (the
same text gives the same samples: the voice is deterministic), and the VAD runs inline.

Used by tests/test_barge_in.py and bench/barge_in.py.
"""

from __future__ import annotations

import asyncio
import functools
import wave
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from agent.base import CallInfo, SayText
from agent.dialogue.profile import AgentProfile
from agent.dialogue.profile_loader import load_profile
from agent.voice.voice_agent import VoiceAgent, VoiceSettings
from agent.voice.voice_models import VoiceModels
from agent.voice_settings import ModelSettings
from jitter.playout import PlayoutBuffer
from resample import Resampler
from testkit.agent_capture import Capture
from testkit.line_echo import LineEcho, active_level_dbfs, g711, line_noise

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "config" / "agents" / "demo.toml"
FRAME = 160
TICK_MS = 20

#: What the agent says in the long runs: replies of the demo profile and longer ones.
REPLIES = [
    "We're open Monday to Friday, 8 a.m. to 6 p.m., and Saturday 9 to 1.",
    "Order 1 2 3 4 5 shipped on Monday and should arrive by Thursday.",
    "Sorry, I didn't catch that. You can ask about opening hours, an order, or a person.",
    "What is your order number? You can say it or type it, then press hash.",
    "Sure, I'm putting you through to a colleague. Please hold.",
    "Your parcel left our warehouse this morning. It is with the courier now, and you "
    "will get a text message with a delivery window the evening before it arrives.",
    "To change the address, I need to confirm a few details first. Could you tell me the "
    "postcode of the old address, and then the new one, slowly please?",
]


@functools.cache
def models() -> VoiceModels:
    """The real models, loaded once per process; the VAD inline (no batcher, no loop turn
    between a frame and its verdict) and the TTS cached by sentence. No phrase cache: a
    reply it held would go out without a speak() run, which :data:`SPOKEN` counts."""
    m = VoiceModels(ModelSettings(batch_vad=False, phrase_cache_mb=0))
    m.warm_up()
    synth = functools.lru_cache(maxsize=512)(m.tts.synthesize)
    m.tts.synthesize = synth  # type: ignore[method-assign]
    speak = m.speak

    def counted(*args: Any, **kwargs: Any) -> Iterator[tuple[str, NDArray[np.int16] | None]]:
        try:
            yield from speak(*args, **kwargs)
        finally:
            SPOKEN[0] += 1

    m.speak = counted  # type: ignore[method-assign]
    return m


SPOKEN = [0]  # speak() runs finished (every sentence of a reply synthesised)


def beckett() -> NDArray[np.int16]:
    """A man reading Beckett (a real voice, from the ASR model's wheel), at 8 kHz."""
    from model_runtime.store import default_store

    path = default_store().path("beckett", "beckett.wav")
    with wave.open(str(path)) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    down = Resampler(rate, 8000)
    return np.concatenate([down.process(pcm), down.flush()])


def onset_sample(pcm: NDArray[np.generic], below_db: float = 15.0) -> int:
    """Where speech starts: the first 10 ms within ``below_db`` of the clip's active speech
    level (what a listener hears as "they started talking"; a recording's room noise and
    breaths before it do not count)."""
    x = np.asarray(pcm, dtype=np.float64)
    fr = x[: x.size // 80 * 80].reshape(-1, 80)
    p = np.mean(fr**2, axis=1)
    level = 10 ** (active_level_dbfs(x) / 10) * 32768.0**2
    return int(np.argmax(p >= level * 10 ** (-below_db / 10))) * 80


@dataclass
class Line:
    """The far end: echo of what it hears, noise, and the caller's voice when scheduled."""

    erl_db: float | None = None
    delay_ms: float = 0.0
    colour: bool = True
    noise_dbfs: float = -65.0
    seed: int = 0
    _speech: list[tuple[int, NDArray[np.float64]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        kw = {} if self.colour else {"colour": None}
        self.echo = LineEcho(self.erl_db, self.delay_ms, **kw)  # type: ignore[arg-type]
        self.noise = line_noise(FRAME * 50 * 60, self.noise_dbfs, self.seed)  # a minute, looped

    def say_at(self, tick: int, pcm: NDArray[np.float64]) -> None:
        self._speech.append((tick * FRAME, np.asarray(pcm, np.float64)))

    def frame(self, tick: int, sent: NDArray[np.int16]) -> NDArray[np.int16]:
        """What the agent hears on ``tick`` when ``sent`` went out on it."""
        start = tick * FRAME
        out = self.echo.process(sent.astype(np.float64))
        k = start % self.noise.size
        out = out + self.noise[k : k + FRAME] if k + FRAME <= self.noise.size else out
        for at, pcm in self._speech:
            lo, hi = max(start, at), min(start + FRAME, at + pcm.size)
            if lo < hi:
                out[lo - start : hi - start] += pcm[lo - at : hi - at]
        return g711(out)


class WireOutput(Capture):
    """The bridge's side of the agent's output: writes queue, one frame leaves per tick,
    a flush drops the queue (what was already sent stays sent)."""

    def __init__(self) -> None:
        super().__init__(keep=False)
        self.queue = PlayoutBuffer(8000)
        self.flush_ticks: list[int] = []

    def write(self, pcm: NDArray[np.int16]) -> None:
        super().write(pcm)
        self.queue.write(pcm)

    def flush(self) -> float:
        self.flush_ticks.append(self.tick)
        super().flush()
        return self.queue.flush()

    def send_dtmf(self, digits: str) -> None:
        pass


class Sim:
    """One call: the agent, its wire and the line, ticked by :meth:`run`."""

    def __init__(
        self,
        line: Line,
        *,
        profile: AgentProfile | None = None,
        settings: VoiceSettings | None = None,
    ) -> None:
        self.line = line
        self.out = WireOutput()
        self.agent = VoiceAgent(models(), profile or load_profile(DEMO), settings)
        self.tick = 0
        self.sent_level: list[float] = []  # dBFS of each frame that went out

    async def start(self) -> None:
        done = SPOKEN[0]
        await self.agent.start(CallInfo("sim", caller="sip:sim@127.0.0.1"), self.out)
        await self.synthesised(done)

    async def synthesised(self, done: int) -> None:
        """Until the reply being spoken has been synthesised and written whole (the TTS
        runs in the executor at its own speed; the ticks must not outrun it)."""
        for _ in range(3000):
            if SPOKEN[0] > done:
                break
            await asyncio.sleep(0.005)
        for _ in range(10):  # the last sentence's delivery is a loop callback away
            await asyncio.sleep(0)

    async def say(self, text: str) -> None:
        """An operator's "say this" (SayText): the agent speaks ``text`` now."""
        done = SPOKEN[0]
        self.agent.on_event(SayText(text))
        await self.synthesised(done)

    async def run(
        self, ticks: int, until: Callable[[], bool] | None = None, *, realtime: bool = False
    ) -> None:
        """``realtime``: one tick per 20 ms of the loop's clock, as on a call (the models'
        work then takes the time it takes in ticks too: end of turn, ASR, TTS)."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        for _ in range(ticks):
            if realtime:
                due += TICK_MS / 1000
                await asyncio.sleep(max(0.0, due - loop.time()))
            self.tick += 1
            self.out.tick = self.tick
            sent = self.out.queue.pop()
            self.sent_level.append(_dbfs(sent))
            self.agent.on_audio(self.line.frame(self.tick, sent))
            await asyncio.sleep(0)
            if until is not None and until():
                return

    async def run_until_quiet(self, max_ticks: int = 6000) -> None:
        """Tick until the agent has said everything and listens again."""
        agent = self.agent
        await self.run(max_ticks, lambda: not agent.playout.playing and not agent._busy)

    @property
    def talking(self) -> bool:
        return self.out.queue.queued_samples > 0

    async def stop(self) -> None:
        await self.agent.stop()


def _dbfs(pcm: NDArray[np.int16]) -> float:
    e = float(np.mean(pcm.astype(np.float64) ** 2))
    return float(10 * np.log10(e / 32768**2 + 1e-12))

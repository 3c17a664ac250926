"""One caller of bench/agent_load.py: a demo call script played on a real call, cheaply.

The call is the call-script runner's own (``sip-bridge script``): its SIP leg and its
packet-level RTP leg (:mod:`sip_bridge.script.script_leg`), what the caller heard kept in
a :class:`~sip_bridge.script.heard_audio.HeardAudio`, and the figures measured with that
module's functions (turn latency, barge-in reaction, dead air), on packet energy and arrival
times at the caller's socket.

What differs from the runner is the judging of ``expect`` steps. The runner transcribes
every reply with Moonshine to match the step's pattern: about a tenth of the audio's length
in CPU, on the two cores the bridge under load needs for its own models. Here an ``expect``
is the caller listening to the whole reply: the agent's audio, then ``quiet_ms`` without it
(the runner's own rule for "a reply is over"); its words are not checked. A call whose
agent never answers a step, or never hangs up where the script says it does, still fails.
The caller's speech is rendered once per voice, speed and text before the clock starts
(:class:`Voices`), never during the run: espeak-ng costs ~50 ms of CPU per sentence.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from sip_bridge.script.heard_audio import (
    FRAME_S,
    SPEECH_DBFS,
    HeardAudio,
    Span,
    barge_in_reaction,
    dead_air_gaps,
    frame_dbfs,
    turn_latency,
)
from sip_bridge.script.script_actions import CallerTiming
from sip_bridge.script.script_file import (
    CallerHangup,
    Dtmf,
    Expect,
    ExpectHangup,
    ExpectRefer,
    Script,
    Speak,
    Wait,
    WaitSeconds,
)
from sip_bridge.script.script_leg import FRAME, LineOptions, ScriptLeg, SipLeg, media_config
from sip_bridge.script.script_voice import render_speech
from sip_bridge.sip.uac_events import (
    CallAnswered,
    CallEnded,
    CallFailed,
    MediaChanged,
    ReferReceived,
    UacEvent,
)

__all__ = ["CallFigures", "CallResult", "LoadCall", "Voices", "call_figures"]

_POLL_S = 0.02
#: A gap between two received packets longer than this is a hole in the stream.
RX_GAP_S = 0.06


class Voices:
    """Every utterance of the scripts, rendered once (espeak-ng or a WAV) at the line's
    level, keyed by what makes it sound different: voice, speed, gain and text."""

    def __init__(self, scripts: list[Script], level_dbfs: float) -> None:
        self._audio: dict[tuple[str, int, float, str], NDArray[np.int16]] = {}
        self._loud: dict[tuple[str, int, float, str], int] = {}
        for script in scripts:
            for step in script.steps:
                if not isinstance(step, Speak):
                    continue
                key = self._key(step, script)
                if key not in self._audio:
                    pcm = render_speech(step, script, voice=None, level_dbfs=level_dbfs)
                    self._audio[key] = pcm
                    pad = (-pcm.size) % FRAME
                    frames = np.concatenate([pcm, np.zeros(pad, np.int16)]).reshape(-1, FRAME)
                    self._loud[key] = sum(frame_dbfs(f) > SPEECH_DBFS for f in frames)

    @staticmethod
    def _key(step: Speak, script: Script) -> tuple[str, int, float, str]:
        what = str(step.wav) if step.wav is not None else step.text
        return (step.voice or script.voice, step.rate_wpm or script.rate_wpm, step.gain_db, what)

    def __len__(self) -> int:
        return len(self._audio)

    def audio(self, step: Speak, script: Script) -> NDArray[np.int16]:
        return self._audio[self._key(step, script)]

    def speech_s(self, step: Speak, script: Script) -> float:
        """How long the caller speaks in it (frames with speech energy)."""
        return self._loud[self._key(step, script)] * FRAME_S


@dataclass
class CallFigures:
    """What one call measured, on the caller's clock (seconds)."""

    turns_s: list[float] = field(default_factory=list)  # speech turns
    turn_texts: list[str] = field(default_factory=list)  # what the caller said, per turn
    keypad_turns_s: list[float] = field(default_factory=list)  # last key -> reply
    dead_air_s: list[float] = field(default_factory=list)
    barge_ins_s: list[float | None] = field(default_factory=list)  # None: kept talking
    barge_in_not_talking: int = 0  # the agent was already quiet when the caller began
    talk_s: float = 0.0  # the caller's speech
    listen_s: float = 0.0  # the agent's audio heard
    overlap_s: float = 0.0  # both at once
    call_s: float = 0.0  # answer -> end
    answered_at: float = 0.0  # the answer, on the loop's clock
    rx_frames: int = 0
    rx_expected: int = 0  # 20 ms frames from the first packet to the last
    rx_gaps_s: list[float] = field(default_factory=list)  # holes over RX_GAP_S


@dataclass
class CallResult:
    script: str
    outcome: str  # "completed", "failed" or "refused" (503)
    status: int = 0  # the final SIP status of the INVITE
    reason: str = ""  # why it failed
    figures: CallFigures = field(default_factory=CallFigures)


def call_figures(
    heard: HeardAudio,
    sent: Sequence[tuple[Speak | Dtmf, CallerTiming]],
    spans: Sequence[Span],
    talk_s: float,
    t0: float,
    t_end: float,
) -> CallFigures:
    """The call's figures from what was heard, what the caller sent (in order) and when
    it waited for the agent (the runner's rules: sip_bridge.script.script_steps)."""
    f = CallFigures(talk_s=talk_s, call_s=max(0.0, t_end - t0), answered_at=t0)
    for n, (step, t) in enumerate(sent):
        until = sent[n + 1][1].start if n + 1 < len(sent) else t_end
        if isinstance(step, Dtmf):
            lat = turn_latency(heard, t.done, until)
            if lat is not None:
                f.keypad_turns_s.append(lat)
            continue
        if t.onset is None or t.end is None:
            continue
        lat = turn_latency(heard, t.end, until)
        if lat is not None:
            f.turns_s.append(lat)
            f.turn_texts.append(step.text or step.kind)
        f.overlap_s += len(heard.loud_between(t.onset, t.end)) * FRAME_S
        if step.barge_in:
            r = barge_in_reaction(heard, t.onset, t.end, math.inf)
            if r is None or not r.talking:
                f.barge_in_not_talking += 1
            else:
                f.barge_ins_s.append(r.seconds)
    f.dead_air_s = [g.seconds for g in dead_air_gaps(heard, spans)]
    f.listen_s = len(heard.loud_between(t0, t_end)) * FRAME_S
    times = [t for t in heard.times if t >= t0]
    f.rx_frames = len(times)
    if times:
        f.rx_expected = round((times[-1] - times[0]) / FRAME_S) + 1
        f.rx_gaps_s = [b - a for a, b in itertools.pairwise(times) if b - a > RX_GAP_S]
    return f


class LoadCall:
    """Dial, play ``script`` (``expect`` = listen to the whole reply), hang up, measure."""

    def __init__(
        self,
        script: Script,
        voices: Voices,
        uri: str,
        dest: tuple[str, int],
        *,
        user: str,
        line: LineOptions,
        host: str = "127.0.0.1",
    ) -> None:
        self.script = script
        self.voices = voices
        self.uri = uri
        self.dest = dest
        self.user = user
        self.line = line
        self.host = host
        self.heard = HeardAudio()
        self.answered = asyncio.Event()  # answered or failed
        self._sent: dict[int, asyncio.Future[CallerTiming]] = {}
        self._hung_up_at: float | None = None
        self._refers = 0
        self._sip: SipLeg | None = None
        self._leg: ScriptLeg | None = None
        self._over = False

    @property
    def in_progress(self) -> bool:
        """Answered and not over yet: a call the bridge is carrying."""
        sip = self._sip
        return sip is not None and sip.answered is not None and not self._over

    async def run(self) -> CallResult:
        loop = asyncio.get_running_loop()
        leg = self._leg = ScriptLeg(self.host, self.line, self.heard, self._on_sent)
        await leg.open()
        media = media_config(self.host, leg.port, self.line.codec)
        sip = self._sip = SipLeg(self.uri, self.dest, media, self._on_event, user=self.user,
                                 answer_timeout_s=self.script.answer_timeout_s)  # fmt: skip
        name = self.script.path.stem
        try:
            await sip.start()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.answered.wait(), self.script.answer_timeout_s + 5)
            if sip.answered is None:
                failed = sip.failed
                status = failed.status if failed is not None else 0
                why = f"{failed.status} {failed.reason}" if failed is not None else "no answer"
                return CallResult(name, "refused" if status == 503 else "failed", status, why)
            leg.start(sip.answered.media)
            t0 = loop.time()
            sent, spans, talk_s, why = await self._play(t0)
            if self._hung_up_at is None:
                await sip.hangup()
            t_end = self._hung_up_at or loop.time()
            figures = call_figures(self.heard, sent, spans, talk_s, t0, t_end)
            outcome = "failed" if why else "completed"
            return CallResult(name, outcome, sip.answered.response.status, why, figures)
        finally:
            self._over = True
            if sip.uac is not None and not sip.done.is_set():
                await sip.hangup()
            await sip.close()
            await leg.close()

    # ------------------------------------------------------------------ the steps
    async def _play(
        self, t0: float
    ) -> tuple[list[tuple[Speak | Dtmf, CallerTiming]], list[Span], float, str]:
        """Play the steps: (what was sent, the waits for the agent, the caller's speech
        seconds, why the call failed or "")."""
        loop = asyncio.get_running_loop()
        sent: list[tuple[Speak | Dtmf, CallerTiming]] = []
        spans: list[Span] = []
        talk_s = 0.0
        wait_from = t0  # since when the caller waits for the agent
        deadline = t0 + self.script.timeout_s
        for step in self.script.steps:
            start = loop.time()
            if start > deadline:
                return sent, spans, talk_s, f"the script's {self.script.timeout_s:g} s are up"
            if isinstance(step, Speak | Dtmf):
                if self._hung_up_at is not None:
                    return sent, spans, talk_s, f"step {step.index}: the agent hung up"
                timing = await self._send(step)
                sent.append((step, timing))
                if isinstance(step, Speak):
                    talk_s += self.voices.speech_s(step, self.script)
                end = timing.done if isinstance(step, Dtmf) else timing.end
                if end is not None and step.barge_in is not False:
                    wait_from = end
            elif isinstance(step, WaitSeconds):
                await asyncio.sleep(step.seconds)
            elif isinstance(step, Wait | Expect | ExpectHangup | ExpectRefer):
                end, ok, why = await self._await_agent(step, wait_from, start)
                spans.append(Span(wait_from, max(wait_from, end), not ok))
                wait_from = max(wait_from, end)
                if not ok:
                    return sent, spans, talk_s, f"step {step.index} ({step.kind}): {why}"
            elif isinstance(step, CallerHangup):
                break
        return sent, spans, talk_s, ""

    async def _send(self, step: Speak | Dtmf) -> CallerTiming:
        leg, sip = self._leg, self._sip
        assert leg is not None and sip is not None
        done = self._sent[step.index] = asyncio.get_running_loop().create_future()
        if isinstance(step, Speak):
            leg.say(step.index, self.voices.audio(step, self.script))
        else:
            leg.dtmf(step.index, step.digits, step.method, step.duration_ms, step.gap_ms, sip)
        timing: CallerTiming = await done
        return timing

    async def _await_agent(
        self, step: Wait | Expect | ExpectHangup | ExpectRefer, since: float, start: float
    ) -> tuple[float, bool, str]:
        """Wait for what the step expects of the agent: (until when the caller waited,
        whether it came, why not)."""
        loop = asyncio.get_running_loop()
        heard = self.heard
        until = start + step.timeout_s
        while True:
            now = loop.time()
            if isinstance(step, ExpectHangup):
                if self._hung_up_at is not None:
                    return heard.last_loud_end(self._hung_up_at) or since, True, ""
            elif isinstance(step, ExpectRefer):
                if self._refers:
                    self._refers -= 1
                    return now, True, ""
            elif isinstance(step, Wait) and step.until == "speech":
                t = heard.first_loud(start - 0.1)
                if t is not None:
                    return t, True, ""
            else:  # a reply (expect), or silence: the agent quiet for quiet_ms
                quiet = step.quiet_ms / 1000.0
                last = heard.last_loud_end(now)
                replied = isinstance(step, Wait) or (last is not None and last > since)
                over = now - max(last or start, start) >= quiet or self._hung_up_at is not None
                if replied and over:  # (a goodbye, then the BYE at once: heard whole)
                    return (last or since), True, ""
            if self._hung_up_at is not None and not isinstance(step, ExpectHangup):
                return self._hung_up_at, False, "the agent hung up"
            if now >= until:
                return now, False, f"nothing within {step.timeout_s:g} s"
            await asyncio.sleep(_POLL_S)

    # ------------------------------------------------------------------ events
    def _on_sent(self, step: int, timing: CallerTiming) -> None:
        fut = self._sent.get(step)
        if fut is not None and not fut.done():
            fut.set_result(timing)

    def _on_event(self, ev: UacEvent) -> None:
        now = asyncio.get_running_loop().time()
        if isinstance(ev, CallAnswered | CallFailed):
            self.answered.set()
        elif isinstance(ev, MediaChanged) and self._leg is not None:
            self._leg.update(ev.media)
        elif isinstance(ev, CallEnded):
            if self._hung_up_at is None:
                self._hung_up_at = now
            for fut in self._sent.values():  # audio that will never finish going out
                if not fut.done():
                    fut.set_result(CallerTiming(now, None, None, now))
        elif isinstance(ev, ReferReceived) and self._sip is not None:
            # a phone that does not follow transfers: its user declines (the load bench
            # runs no transfer target); the agent takes the caller back
            self._refers += 1
            self._sip.command("notify", "100", "Trying")
            self._sip.command("notify", "603", "Declined")

"""``sip-bridge script``: place a real call and play a call script on it (asyncio).

The thin I/O layer around :class:`~sip_bridge.script.script_steps.ScriptPlayer`: it renders the
caller's speech (:mod:`sip_bridge.script.script_voice`), dials with a :class:`SipLeg` and a
:class:`ScriptLeg` (:mod:`sip_bridge.script.script_leg`), feeds the player the time, what was
sent and heard, the far end's BYE and REFER, and does what the player asks: send audio
or keys, transcribe (Moonshine, :class:`Transcriber`, in a worker thread so the 20 ms
packet clock never waits for it), hang up.

A REFER is followed the way a phone follows it (RFC 3515): 202, NOTIFY 100, a new call
to the Refer-To target (through ``transfer_proxy`` when given, as a phone's outbound proxy
would), NOTIFY 180 while it rings, then a final NOTIFY with how it ended. The player
learns what became of it (answered, rejected, no_answer).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from resample import Resampler
from sip_bridge.script.caller import local_address_for, resolve_target
from sip_bridge.script.heard_audio import HeardAudio
from sip_bridge.script.script_actions import (
    Action,
    CallerTiming,
    HangUp,
    SendAudio,
    SendDtmf,
    Transcribe,
)
from sip_bridge.script.script_file import Expect, Script, Speak
from sip_bridge.script.script_leg import LineOptions, ScriptLeg, SipLeg, media_config
from sip_bridge.script.script_report import CallReport, format_report, format_step
from sip_bridge.script.script_steps import ScriptPlayer
from sip_bridge.script.script_voice import Renderer, ScriptError, render_speech
from sip_bridge.sip.message import SipUri
from sip_bridge.sip.transport import next_item
from sip_bridge.sip.uac import (
    CallAnswered,
    CallEnded,
    CallFailed,
    CallProgress,
    MediaChanged,
    ReferReceived,
    UacEvent,
)

__all__ = ["RunOptions", "ScriptError", "Transcriber", "run_script"]

log = logging.getLogger(__name__)

#: SIP statuses of a transfer's call that mean nobody answered (rather than a refusal).
_NO_ANSWER = (408, 480, 487)


@dataclass(frozen=True)
class RunOptions:
    uri: str = ""  # "" = the script's own
    voice: str | None = None  # overrides the script's default voice
    line: LineOptions = field(default_factory=LineOptions)
    transfer_proxy: tuple[str, int] | None = None  # where the call to a REFER's target goes
    transfer_ring_s: float = 60.0  # give up ringing a REFER's target after this long
    follow_refer: bool = True  # False: take a REFER, then decline to call (NOTIFY 603)
    keep_going: bool = False  # play the steps after a failure too
    local_host: str | None = None  # default: the address that routes to the target
    caller_user: str = "sip-bridge-script"  # the user part of our From


class Transcriber:
    """Moonshine (the project's ASR) on what the caller heard; loaded on first use, one
    transcription at a time on its own thread."""

    def __init__(self, threads: int = 1, device: str = "auto") -> None:
        self.threads = threads
        self.device = device
        self._asr: Any = None
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="script-asr")

    def load(self) -> None:
        with self._lock:
            if self._asr is None:
                from agent.voice.asr import MoonshineAsr

                self._asr = MoonshineAsr(threads=self.threads, device=self.device)

    def _run(self, pcm8k: NDArray[np.int16]) -> str:
        self.load()
        if pcm8k.size < 800:  # under 0.1 s: nothing Moonshine would take
            return ""
        text: str = self._asr.transcribe(Resampler(8000, 16000).process(pcm8k))
        return text

    async def transcribe(self, pcm8k: NDArray[np.int16]) -> str:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._run, pcm8k)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _render_all(
    script: Script, opts: RunOptions, renderer: Renderer | None
) -> dict[int, NDArray[np.int16]]:
    return {
        step.index: render_speech(
            step, script, voice=opts.voice, level_dbfs=opts.line.level_dbfs, renderer=renderer
        )
        for step in script.steps
        if isinstance(step, Speak)
    }


async def run_script(
    script: Script,
    opts: RunOptions,
    transcriber: Transcriber,
    *,
    renderer: Renderer | None = None,
    on_line: Callable[[str], None] | None = None,
) -> CallReport:
    """Play ``script`` on a real call; never raises for what the call does (that is in the
    report), only :class:`ScriptError` when it cannot be played at all."""
    emit = on_line or (lambda _line: None)
    target = opts.uri or script.uri
    if not target:
        raise ScriptError(f"{script.path}: no target: give --uri or [script] uri")
    try:
        uri = SipUri.parse(target)
    except ValueError as exc:
        raise ScriptError(f"bad target URI {target!r}: {exc}") from None
    audio = await asyncio.to_thread(_render_all, script, opts, renderer)
    if any(isinstance(step, Expect) for step in script.steps):
        await asyncio.to_thread(transcriber.load)  # before dialing: seconds on a cold start
    run = _Run(script, opts, transcriber, audio, emit)
    voice = opts.voice or script.voice
    emit(f"script {script.name} ({script.path}): {target}, voice {voice}, {opts.line.describe()}")
    report = CallReport(script, target, opts.line.describe(), voice, False, 0, "")
    dest = await resolve_target(uri)
    host = opts.local_host or local_address_for(dest)
    try:
        await run.call(target, dest, host, report)
    finally:
        await run.close()
    for line in format_report(report):
        emit(line)
    return report


class _Run:
    """One script's call, from the INVITE to the last BYE."""

    def __init__(
        self,
        script: Script,
        opts: RunOptions,
        transcriber: Transcriber,
        audio: dict[int, NDArray[np.int16]],
        emit: Callable[[str], None],
    ) -> None:
        self.script = script
        self.opts = opts
        self.transcriber = transcriber
        self.audio = audio
        self.emit = emit
        self.heard = HeardAudio()
        self.events: asyncio.Queue[Callable[[float], list[Action]]] = asyncio.Queue()
        self.player: ScriptPlayer | None = None
        self.sip: SipLeg | None = None
        self.leg: ScriptLeg | None = None
        self.transfer: tuple[SipLeg, ScriptLeg] | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.printed: set[int] = set()  # steps whose line is out
        self.we_hung_up = False
        self._answered = asyncio.Event()

    # ------------------------------------------------------------------ the call
    async def call(self, target: str, dest: tuple[str, int], host: str, report: CallReport) -> None:
        loop = asyncio.get_running_loop()
        t_invite = loop.time()
        self.leg = ScriptLeg(host, self.opts.line, self.heard, self._sent)
        await self.leg.open()
        media = media_config(host, self.leg.port, self.opts.line.codec)
        self.sip = SipLeg(target, dest, media, self._on_sip, user=self.opts.caller_user,
                          answer_timeout_s=self.script.answer_timeout_s)  # fmt: skip
        await self.sip.start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._answered.wait(), self.script.answer_timeout_s + 10)
        now = loop.time()
        self.player = player = ScriptPlayer(
            self.script, self.heard, now, keep_going=self.opts.keep_going
        )
        if self.sip.answered is None:
            failed = self.sip.failed
            why = f"{failed.status} {failed.reason}" if failed else "no answer"
            report.status = failed.status if failed else 0
            report.reason = why
            player.abort(f"the call failed: {why}", now)  # no call: nothing to do
            self._print_new()
            report.results = player.results
            report.call_s = now - t_invite
            return
        report.answered = True
        report.status = self.sip.answered.response.status
        report.reason = self.sip.answered.response.reason
        self.emit(f"  answered ({report.status}) after {now - t_invite:.2f} s")
        self.leg.start(self.sip.answered.media)
        self._do(player.start(now))
        deadline = t_invite + self.script.timeout_s
        aborted = False
        while not player.finished:
            fn = await next_item(self.events, 0.02)
            now = loop.time()
            self._do(fn(now) if fn is not None else player.tick(now))
            if not aborted and now > deadline:
                aborted = True
                reason = f"the script's {self.script.timeout_s:g} s are up"
                self._do(player.abort(reason, now))
            if aborted and now > deadline + 15:  # transcripts that never came back
                break
            self._print_new()
        now = loop.time()
        report.summary = player.finish(now)
        report.results = player.results
        self._print_new(final=True)
        report.call_s = now - t_invite
        report.sent_packets = self.leg.sent_packets
        report.lost_packets = self.leg.lost_packets

    def _print_new(self, final: bool = False) -> None:
        """Each step's line once it is judged (expect_no_dead_air: at the end)."""
        assert self.player is not None
        for r in self.player.results:
            if r.step.index in self.printed:
                continue
            if r.step.kind == "expect_no_dead_air" and not final:
                continue
            self.emit(format_step(r))
            self.printed.add(r.step.index)

    def _do(self, actions: list[Action]) -> None:
        assert self.leg is not None and self.sip is not None
        for act in actions:
            if isinstance(act, SendAudio):
                self.leg.say(act.step, self.audio[act.step])
            elif isinstance(act, SendDtmf):
                self.leg.dtmf(act.step, act.digits, act.method, act.duration_ms, act.gap_ms,
                              self.sip)  # fmt: skip
            elif isinstance(act, Transcribe):
                self._spawn(self._transcribe(act))
            elif isinstance(act, HangUp):
                self.we_hung_up = True
                self.sip.command("hangup")

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _transcribe(self, act: Transcribe) -> None:
        pcm = self.heard.audio(act.start, act.end, speech_only=True)  # no ringback
        try:
            text = await self.transcriber.transcribe(pcm)
        except Exception as exc:  # a model failure: the step sees nothing heard, and why
            log.warning("transcription failed: %s", exc)
            text = ""
        player = self.player
        assert player is not None
        self.events.put_nowait(lambda now: player.transcript(act.start, act.end, text, now))

    def _sent(self, step: int, timing: CallerTiming) -> None:
        player = self.player
        if player is not None:
            self.events.put_nowait(lambda now: player.caller_done(step, timing, now))

    def _on_sip(self, ev: UacEvent) -> None:
        if isinstance(ev, CallAnswered | CallFailed):
            self._answered.set()
        elif isinstance(ev, MediaChanged) and self.leg is not None:
            self.leg.update(ev.media)
        elif isinstance(ev, CallEnded) and not self.we_hung_up:
            self._to_player(lambda p, now: p.far_end_hung_up(now))
        elif isinstance(ev, ReferReceived):
            self._to_player(lambda p, now: p.refer(ev.target, now))
            self._spawn(self._follow(ev.target))

    def _to_player(self, fn: Callable[[ScriptPlayer, float], list[Action]]) -> None:
        def call(now: float) -> list[Action]:
            return fn(self.player, now) if self.player is not None else []

        self.events.put_nowait(call)

    # ------------------------------------------------------------------ a transfer
    async def _follow(self, target: str) -> None:
        """Call the REFER's target and tell the transferor (NOTIFY) how it goes."""
        sip = self.sip
        assert sip is not None and self.leg is not None
        sip.command("notify", "100", "Trying")
        if not self.opts.follow_refer:
            sip.command("notify", "603", "Declined")
            self._transfer_result("rejected", 603)
            return
        if not target.lower().startswith("sip"):
            sip.command("notify", "416", "Unsupported URI Scheme")
            self._transfer_result("rejected", 416)
            return
        dest = self.opts.transfer_proxy or await resolve_target(SipUri.parse(target))
        host = self.leg.host
        leg = ScriptLeg(host, LineOptions(codec=self.opts.line.codec), HeardAudio(),
                        lambda *_: None)  # fmt: skip
        ringing = False

        def on_event(ev: UacEvent) -> None:
            nonlocal ringing
            if isinstance(ev, CallProgress) and ev.status in (180, 183) and not ringing:
                ringing = True
                sip.command("notify", "180", "Ringing")
            elif isinstance(ev, CallAnswered):
                leg.start(ev.media)
                sip.command("notify", "200", "OK")
                self._transfer_result("answered", ev.response.status)
            elif isinstance(ev, CallFailed):
                sip.command("notify", str(ev.status), ev.reason or "Failed")
                result = "no_answer" if ev.status in _NO_ANSWER else "rejected"
                self._transfer_result(result, ev.status)

        await leg.open()
        media = media_config(host, leg.port, self.opts.line.codec)
        new = SipLeg(target, dest, media, on_event, answer_timeout_s=self.opts.transfer_ring_s)
        self.transfer = (new, leg)  # closed with the call, whatever happens next
        await new.start()

    def _transfer_result(self, result: str, status: int) -> None:
        self._to_player(lambda p, now: p.transfer_result(result, status, now))

    async def close(self) -> None:
        if self.sip is not None and self.sip.uac is not None:
            self.we_hung_up = True
            await self.sip.hangup()
        if self.transfer is not None:
            new, leg = self.transfer
            if new.uac is not None:
                await new.hangup()
            await new.close()
            await leg.close()
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.leg is not None:
            await self.leg.close()
        if self.sip is not None:
            await self.sip.close()

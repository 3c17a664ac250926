# size: the voice agent's 20 ms loop and the turn state it drives (listening, barge-in, end of turn,
#       speculation, held replies) share one state; splitting it is open work (issue 17)
"""The default voice agent: VAD -> end of turn -> ASR -> dialogue -> TTS, with barge-in.

It runs at 8 kHz, the line's own rate, so the bridge resamples nothing on the way in and
Silero VAD hears the call straight; ASR and the end-of-turn model get a 16 kHz copy. The
media loop only ever does the cheap per-tick work here (VAD windows, resampling, counters);
end-of-turn scoring, ASR and TTS run on the shared executor of :class:`VoiceModels`, and
their results come back to the loop, so 20 ms ticks are never held up by a model.

Time inside the agent is counted in ticks (one ``on_audio`` call = one 20 ms frame on the
wire), which is what lets :class:`ReplyPlayout` know what the caller is hearing right now.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from agent.base import (
    FADE_MS,
    Agent,
    AgentEvent,
    AgentOutput,
    CallInfo,
    DeadAir,
    DtmfEvent,
    HangupEvent,
    ModelFault,
    PauseAgent,
    ResumeAgent,
    SayText,
    TransferRequest,
    TransferResult,
    TurnCompleted,
    fade_out_gain,
)
from agent.dialogue.backchannel import MAX_WORDS, is_backchannel, takes_floor
from agent.dialogue.engine import (
    DialogueEngine,
    Hangup,
    KeyTurn,
    ReplyPart,
    Say,
    SendDtmf,
    Transfer,
)
from agent.dialogue.profile import AgentProfile
from agent.dialogue.sentences import split_sentences
from agent.model_guard import ModelGuard
from agent.redaction import sensitive_text
from agent.ticks import ECHO_S, FRAME, FRAME_MS, RATE, TICK_S
from agent.voice.asr import PREROLL_S
from agent.voice.barge_in import BargeInGate, EchoGate, LoudnessGate
from agent.voice.call_flow import CallFlow
from agent.voice.phrase_bias import PhraseBias, phrase_bias
from agent.voice.reply_playout import ReplyPlayout
from agent.voice.speculation import Speculation
from agent.voice.voice_models import FIRST_WORDS, VoiceModels
from agent.voice_settings import VoiceSettings
from agent.words import normalize
from resample import Resampler

__all__ = ["TurnTiming", "VoiceAgent", "VoiceSettings"]

log = logging.getLogger(__name__)

LIMITS_EVERY = 50  # ticks (1 s) between checks of the profile's call-length limit
SPECULATE_MS = 60  # a pause this long starts preparing the reply (see agent.speculation)
UNDERSTOOD_PAUSE_MS = 400  # a pause this long ends a turn the prepared reply understood
#: how far back from the VAD's onset a run of sound (over our echo) may place the speech's
#: start: about the most a first syllable is heard before the VAD is sure of it
ONSET_MAX_TICKS = 15
MERGE_TICKS = 50  # the caller goes on within 1 s of our reply's start: it was a pause
# Merges in a row (no turn reported between them) before speech over the reply's start is
# held and heard out instead: a reply that starts again after each merge starts a new echo
# each time, and where the line echo was taken for the caller (a canceller relearning the
# echo's delay at each new talkspurt, a loaded node) that looped without end: "Thanks for
# call-" ten times over and no turn recorded (bench/conversations.py, 4 benches on 2 cores)
MAX_MERGES = 2
# A reply to words the dialogue did not understand (a fallback, a slot's retry) waits until
# the caller has been quiet this long: not understood often means not finished ("Hi, I'd
# like to ask about [pause] my order"), and "Sorry, I didn't catch that" in a pause is
# heard even when the merge stops it. 1.2 s: a pause between sentences, and under the
# 1.5 s of dead air a caller who had finished may wait (no filler plays meanwhile).
MISS_HOLD_TICKS = 60
# ... 1.0 s after a number said a digit short (the slot's retry): the caller said what they
# took for all of it, and at 1.2 s that wait was the longest dead air of the conversations
# bench (1.51-1.55 s heard, over the 1.5 s target); a reader going on after 1 s is merged
SHORT_HOLD_TICKS = 50
SOUND_WAIT_TICKS = 2  # ... and the caller is not making a sound (over the line's noise)
# ... counted from the end of their last word: its speech, and the sound it trailed off
# into unbroken, up to this long. Why: Silero's speech over espeak's "thanks" (of "Great,
# thanks.", -25 dBFS, no loss) lasted 0.54 s in some calls and ended 0.22 s early in
# others, its soft end under the threshold; a caller who then paused 1.1 s between
# sentences heard "Sor-" (the reply to words not understood) before the merge stopped
# it: pauses step 13 of bench/conversations.py, 1-2 calls in 24 a cell
TAIL_TICKS = 15
SOUND_GRACE_TICKS = 25  # ... unless the VAD hears no speech in it for this long
BACKCHANNEL_MAX_MS = 1200  # speech over a held reply longer than this is no backchannel
WORD_GAP_TICKS = 15  # a pause up to 300 ms is one between words (a comma), not an end
PREROLL_TICKS = round(PREROLL_S / TICK_S)  # audio kept before the first speech frame
OVER_ECHO_TICKS = 3  # speech ticks above our echo that make words over a reply's end
UNHEARD_CARRY_TICKS = 100  # a turn the ASR made nothing of opens one begun within 2 s
UNHEARD_BACKCHANNEL_MS = 800  # speech since a hold the ASR made nothing of: a hum up to this
# A turn with more speech than this that the ASR made nothing of was words (a quiet caller,
# a burst of loss), not a cough: once the caller has been quiet MISS_HOLD_TICKS they are
# asked again, as for words not understood. Before, such a turn got no reply at all, and
# the caller waited in silence for us (15 s in the matrix's human voice at -35 dBFS).
UNHEARD_WORDS_MS = 800
ECHO_TICKS = round(ECHO_S / TICK_S)  # after we sent sound, as long as it may come back


@dataclass
class TurnTiming:
    """One caller turn, stage by stage (time.monotonic seconds; 0 = did not happen)."""

    speech_end: float = 0.0  # the tick that carried the caller's last speech
    turn_end: float = 0.0  # end of turn decided (model or timeout)
    reason: str = ""
    asr_done: float = 0.0
    text: str = ""
    reply_ready: float = 0.0  # the dialogue engine's first reply part
    tts_first: float = 0.0  # TTS produced the first audio of the reply
    first_write: float = 0.0  # that audio handed to the bridge
    reply: list[str] = field(default_factory=list)
    barged_in: bool = False
    speculative: bool = False  # answered by a reply prepared during the pause: ASR,
    # dialogue and TTS may be done before turn_end
    heard: list[str] = field(default_factory=list)  # what of the reply was played
    reported: bool = False  # a TurnCompleted went out
    keys: str = ""  # a keypad turn: what the caller keyed (turn_end: its last key)
    sensitive: bool = False  # the caller answered a sensitive slot: report no text, no keys
    speech_ms: float = 0.0  # how much of the turn the VAD took for speech

    @property
    def caller_text(self) -> str:
        """What may be kept of what the caller said or keyed (see agent.redaction)."""
        return sensitive_text(self.text) if self.sensitive else self.text

    @property
    def caller_keys(self) -> str:
        """What may be kept of what the caller keyed: a sensitive entry's keys as '*'."""
        return "*" * len(self.keys) if self.sensitive else self.keys

    def stages_ms(self) -> dict[str, float]:
        """The stages that happened, in ms (as bench/turn_latency.py splits a turn); a
        keypad turn's: dialogue, tts_first_audio and total (last key -> first reply audio)."""
        out: dict[str, float] = {}
        if self.keys:
            for name, a, b in (
                ("dialogue", self.turn_end, self.reply_ready),
                ("tts_first_audio", self.reply_ready, self.tts_first),
                ("total", self.turn_end, self.first_write),
            ):
                if a and b:
                    out[name] = round(max(0.0, 1000 * (b - a)), 1)
            return out
        for name, a, b in (
            ("end_of_turn", self.speech_end, self.turn_end),
            ("asr_tail", self.turn_end, self.asr_done),
            ("dialogue", self.asr_done, self.reply_ready),
            ("tts_first_audio", self.reply_ready, self.tts_first),
        ):
            if a and b:
                out[name] = round(max(0.0, 1000 * (b - a)), 1)
        return out


@dataclass
class _Undo:
    """What taking back a turn needs (the caller went on after a pause, see
    :meth:`VoiceAgent._caller_talks_over`)."""

    timing: TurnTiming
    engine: DialogueEngine  # the dialogue before the turn ended
    spec: Speculation  # its words and its reply
    reply_tick: int | None = None  # the tick its first audio reaches the wire


@dataclass
class _Held:
    """A reply waiting while the caller says something that may be a backchannel."""

    timing: TurnTiming | None  # the turn the reply answers (None: the greeting, a command)
    speech: int = 0  # ticks of the caller's speech since
    probe: Future[str] | None = None  # what they said, asked at their latest pause
    audio: list[NDArray[np.int16]] = field(default_factory=list)  # their words (16 kHz)
    since: float = field(default_factory=time.monotonic)  # when the reply was held
    echo_suspect: bool = False  # held after MAX_MERGES merges: it may be our own echo
    asked: float = 0.0  # when the latest probe was queued, and when it ran (monotonic)
    ran: float = 0.0
    unsure: str | None = None  # a probe's words not understood: go on if the pause lasts
    plain: str | None = None  # those words, while a probe leaning toward our phrases runs


class VoiceAgent(Agent):
    name = "voice"
    sample_rate = RATE
    takes_commands = True

    def __init__(
        self,
        models: VoiceModels,
        profile: AgentProfile,
        settings: VoiceSettings | None = None,
        *,
        engine_factory: Callable[[AgentProfile, CallInfo], DialogueEngine] | None = None,
        model_timeout_s: float = 10.0,
        hold_audio: NDArray[np.int16] | None = None,
    ) -> None:
        """``model_timeout_s``: a model run still going after this long is a
        :class:`ModelFault` of the call, as is one that raises (0: no time limit).
        ``hold_audio``: what a caller hears while a transfer rings (8 kHz, looped;
        None: ringback)."""
        self.models = models
        self.profile = profile
        # barge-in is the profile's to shape (a menu may want it off, a chatty agent longer)
        self.settings = replace(
            settings or VoiceSettings(),
            barge_in=profile.barge_in.enabled,
            barge_in_ms=profile.barge_in.min_speech_ms,
        )
        self._engine_factory = engine_factory or (
            lambda p, call: DialogueEngine(p, variables={"caller": call.caller})
        )
        self.engine: DialogueEngine | None = None
        self.turns: list[TurnTiming] = []
        self.paused = False  # an operator paused us (MQTT command): no listening, no turns
        # replies cut short by the caller (speech or a key): when each one stopped
        # (time.monotonic); a held reply's cut counts once it is judged no backchannel,
        # but it stopped when it was held
        self.cut_at: list[float] = []
        self.merges = 0  # turns taken back: the caller went on after a pause
        self._merged = 0  # merges since the last turn reported (MAX_MERGES)
        self.echo_resumes = 0  # held replies that went on: only our own words came back
        self.backchannels = 0  # "uh-huh"s heard over a reply that then went on
        self.events: list[AgentEvent] = []
        self._out: AgentOutput | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._up = Resampler(RATE, 16000)
        # every model run of this call goes through its guard: a raise or a hang is a fault
        self.guard = ModelGuard(models.executor, model_timeout_s)
        self._vad = models.vad_stream(self._on_vad)
        self._vad_errors = 0
        self._stt = models.transcriber(self.guard.executor("asr"))
        self._stt.bias_source = self._phrase_bias
        self._eot = models.end_of_turn(self.settings, self.guard.executor("turn"))
        self.playout = ReplyPlayout()
        # dead air, fillers and transfer ringback: what the caller hears between replies
        self.flow = CallFlow(profile.filler, hold_audio)
        self._tick = 0
        self._user_speaking = False  # VAD's window-by-window decision
        self._confirmed = False  # the segmenter's: speech that lasted (not a click)
        self._key_tick = -1  # the last keypad turn's: speech begun before it is not over it
        self._speech_ticks = 0  # ticks of speech in the current turn
        self._run = 0  # consecutive speech ticks (barge-in)
        self._sound_run = 0  # consecutive ticks that beat our echo and the line's noise
        self._last_speech_t = 0.0
        self._speech_tick = 0  # the tick of the caller's last speech (or its tail: TAIL_TICKS)
        self._said_tick = 0  # the tick of the VAD's last window of speech
        self._ticked = asyncio.Event()  # set by each tick
        self._holding = False  # a reply to words not understood waits (MISS_HOLD_TICKS)
        self._turn: TurnTiming | None = None
        self._busy = False  # a reply is being produced or played
        self._ours_tick = -ECHO_TICKS  # the last tick we sent sound (a reply, a tone, hold audio)
        self._silent_ticks = 0  # the floor is the caller's and they say nothing (no_input_s)
        self.no_input_prompts = 0  # "are you still there?" said, all told
        self._cancel = threading.Event()  # TTS of the current reply stops between sentences
        self._gen = 0  # reply generation: audio from an older one is dropped
        self._tasks: set[asyncio.Task[None]] = set()
        self._drained: asyncio.Event | None = None
        self._closed = False
        # ASR of words the caller went on from (a pause that was not the end of the turn)
        self._carry: list[Future[str]] = []
        self._carry_audio: list[NDArray[np.int16]] = []  # the same words' audio (16 kHz)
        self._carry_until: int | None = None  # words not made out are carried until then
        self._spec: Speculation | None = None  # a reply being prepared during a pause
        self._undo: _Undo | None = None  # the turn being answered, while it can merge
        # while a reply that ends the call (a goodbye, a transfer) is said, and its hang-up
        # or transfer not yet done: the dialogue before it, to go on from if the caller
        # stops it (see _closing_stopped)
        self._before_closing: DialogueEngine | None = None
        self._held: _Held | None = None  # a reply held for a possible backchannel
        self._voice_from: int | None = None  # the tick this reply began to go out
        self._quiet = 0  # ticks since the caller's last speech
        self._sensitive_heard = False  # the caller spoke while a sensitive slot was asked
        # the caller's audio while we talk: replayed into the ASR if they barge in
        preroll = (self.settings.barge_in_ms + 300) // 20
        # what comes back, less our own line echo; and whether it is more than that echo
        run = max(1, -(-self.settings.barge_in_ms // FRAME_MS))
        margin = self.settings.echo_margin_db
        self.gate: BargeInGate = (
            EchoGate(run, margin_db=margin)
            if self.settings.echo_canceller
            else LoudnessGate(run, margin_db=margin)
        )
        # (16 kHz audio, the VAD's speech, that tick beat our echo) per tick while we talk
        self._preroll: deque[tuple[NDArray[np.int16], bool, bool]] = deque(maxlen=preroll)

    # -- Agent interface -------------------------------------------------------------------

    @property
    def sensitive(self) -> bool:
        return self.engine is not None and self.engine.collecting_sensitive

    def _phrase_bias(self) -> PhraseBias | None:
        """What the recogniser leans toward at this point of the dialogue (``[matching]
        phrase_boost``; None when off or before the call starts)."""
        weight = self.profile.matching.phrase_boost
        if self.engine is None or weight <= 0:
            return None
        return phrase_bias(self.engine.listening_for(), weight)

    async def start(self, call: CallInfo, output: AgentOutput) -> None:
        self._out = output
        self._loop = asyncio.get_running_loop()
        self._drained = asyncio.Event()
        self._drained.set()
        self.guard.bind(self._loop, self._on_fault)
        self.engine = self._engine_factory(self.profile, call)
        self.flow.start(time.monotonic())
        output.emit(DeadAir(None))  # measured from the answer: no gap yet reads 0 ms
        self.flow.prepare_phrase(self.models.executor, self.models.synthesize, self.models)
        self._spawn(self._play_parts(_aiter(self.engine.greeting()), None))

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        self._tick += 1
        self._ticked.set()
        if self._user_speaking and not self._sensitive_heard:  # words said while a
            self._sensitive_heard = self.sensitive  # sensitive slot is asked for
        if self._tick % LIMITS_EVERY == 0 and self.engine is not None:
            closing = self.engine.check_limits()  # the call is too long: say so, hang up
            if closing:
                self._interrupt_with(closing)
        now = time.monotonic()
        # the caller's side less the echo of what went out this tick: all we listen to
        self.gate.speech_heard = self._user_speaking
        ours = self.playout.play(pcm.size)
        if ours.any():
            self._ours_tick = self._tick
        pcm = self.gate.process(pcm, ours, learn=not self.playout.last_tone)
        self._sound_run = self._sound_run + 1 if self.gate.caller_now() else 0
        if self._busy and self._voice_from is None and self.playout.last_played:
            self._voice_from = self._tick
        self._flow_tick(now)
        if self._drained is not None and not self.playout.playing:
            self._drained.set()
        if self.paused or self.guard.fault is not None:  # an operator took over, or a
            return  # model failed (the bridge takes the call over)
        pcm16 = self._up.process(pcm)  # (the ASR's and the end of turn's rate)
        # the VAD for the caller's floor once none of our voice can come back (VadGate)
        self._vad.floor = self._tick - self._ours_tick > ECHO_TICKS
        try:
            self._vad.push(pcm, pcm16)
        except Exception as exc:  # the VAD ran inline (no batching) and raised
            self.guard.report(f"{type(exc).__name__}: {exc}", "vad")
            return
        if self._vad.errors != self._vad_errors:  # a batch with our window raised
            self._vad_errors = self._vad.errors
            self.guard.report("VAD run failed (see the batcher's log)", "vad")
            return
        if self._user_speaking:
            self._last_speech_t = now
            self._speech_tick = self._said_tick = self._tick
            self._speech_ticks += 1
        elif (
            self._sound_run
            and self._speech_tick == self._tick - 1
            and self._tick - self._said_tick <= TAIL_TICKS
        ):
            self._speech_tick = self._tick  # a word's soft end, unbroken since its speech
        if self._confirmed:
            self._run += 1
        else:
            self._run = 0
        self._no_input_tick(now)
        if self._busy:
            # the caller's speech beat our echo (for words said over the reply's very end)
            over = self._user_speaking and self.gate.caller_now()
            self._preroll.append((pcm16, self._user_speaking, over))
            if not self._should_barge_in():
                return
            self._caller_talks_over()
            for old, speaking, _ in self._preroll:  # the caller's first words belong to the turn
                self._stt.push(old, speaking)
                self._eot.push(old, speaking)
                if self._held is not None:
                    self._held.audio.append(old)
            self._preroll.clear()
            return
        self._stt.push(pcm16, self._user_speaking)
        self._eot.push(pcm16, self._user_speaking)
        self._quiet = 0 if self._user_speaking else self._quiet + 1
        if self._held is not None:
            self._held.audio.append(pcm16)
            self._listen_held(self._held)
            return  # no turn ends while a reply is held: it resumes, or the turn goes on
        if self._spec is not None and self._user_speaking:
            self._drop_speculation()  # it was a pause, not the end of the turn
        if self._speech_ticks * TICK_S * 1000 >= self.settings.min_speech_ms:
            if self._spec is None and self._quiet * FRAME_MS >= SPECULATE_MS:
                self._speculate()
            decision = self._eot.decide()
            if decision is not None:
                self._end_turn(decision.reason, now)
            elif self._understood_in_pause():
                self._end_turn("understood", now)

    @property
    def barge_ins(self) -> int:
        """Replies cut short by the caller (speech or a key)."""
        return len(self.cut_at)

    @property
    def held_unsure(self) -> str | None:
        """Words over the held reply that were not understood, while the caller's pause
        is still short enough to be one inside their words (the reply goes on once it is
        longer; it stays held if they go on)."""
        return None if self._held is None else self._held.unsure

    def on_event(self, event: AgentEvent) -> None:
        self.events.append(event)
        if self.engine is None:
            return
        if isinstance(event, DtmfEvent):
            if self.paused:  # a person has the call: the key is theirs (the bridge logs it)
                return
            now = time.monotonic()
            self._dead_air(self.flow.caller_acted(now))
            self._key(event.digit, now)
        elif isinstance(event, TransferResult):
            self.flow.transfer_ended()  # the ringback stops
            if event.outcome != "succeeded":
                log.info("transfer to %s failed (%s)", event.target, event.status)
            back = self.engine.on_transfer_result(event.outcome == "succeeded")
            if back:
                self._interrupt_with(back)
        elif isinstance(event, HangupEvent):
            self._dead_air(self.flow.close(time.monotonic()))  # the caller hung up waiting
            self._cancel.set()
        elif isinstance(event, SayText):
            self._drop_speculation()
            self._interrupt_with([Say(event.text)])
        elif isinstance(event, PauseAgent) and not self.paused:
            self.paused = True
            self._commit_hold()
            self._drop_speculation()
            if self._busy:
                self._barge_in()  # stop talking, on the wire too
            self._busy = False
        elif isinstance(event, ResumeAgent) and self.paused:
            self.paused = False
            self._stt.reset()  # what was said meanwhile was not said to us
            self._eot.reset()
            self._speech_ticks = self._quiet = 0

    async def stop(self) -> None:
        self._closed = True
        self.guard.close()
        self._gen += 1  # audio already on its way from the executor is stale now
        self._cancel.set()
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._out = None

    def _on_fault(self, fault: ModelFault) -> None:
        """A model raised or hung: say nothing more (what is on its way is stale) and tell
        the bridge, which stops us and plays the fallback prompt."""
        self._gen += 1
        self._cancel.set()
        self._drop_speculation()
        if self._out is not None:
            self._out.emit(fault)
        self._out = None  # nothing more from us reaches the call: the bridge takes it over

    # -- listening -------------------------------------------------------------------------

    def _on_vad(self, speech: bool, onset_lag: int | None, confirmed: bool | None) -> None:
        self._user_speaking = speech
        if confirmed is True:  # barge-in counts from where the speech began
            # ... which is where its sound began, if that is earlier and unbroken since: the
            # VAD can be unsure of a quiet first syllable for a few hundred ms (a recorded
            # "hours" over the greeting: 0.25-0.42 for 220 ms, at -21 to -24 dBFS)
            # (less this tick, which the run counts below)
            sound = min(self._sound_run - 1, ONSET_MAX_TICKS)
            run = max((onset_lag or 0) // FRAME, sound)
            if self._tick - run <= self._key_tick:
                # begun before a key that made a turn: not the caller talking over its
                # answer. Measured: the greeting cut by key 1, its echo (ERL 12 dB at 60
                # ms, 3 % loss) going on as "speech" for 300 ms, stopped the answer to
                # the key before a word of it played (4 of 6 such cells)
                return
            self._confirmed = True
            self._run = run
        elif confirmed is False:
            self._confirmed = False

    def _no_input_tick(self, now: float) -> None:
        """The floor is the caller's and they say nothing (words lost on the line, a key
        lost in a burst of loss, stepped away): after ``limits.no_input_s`` the engine asks
        again ("Are you still there?"), and in the end says goodbye. Any sound of theirs,
        a reply of ours, a transfer or a keypad entry in progress starts the count afresh."""
        after = self.profile.limits.no_input_s
        engine = self.engine
        idle = (
            after > 0
            and engine is not None
            and not engine.ended
            and not self._busy
            and not self._user_speaking
            and not self.playout.playing
            and self._held is None
            and self._spec is None
            and not self.flow.transfer_pending
            and engine.keypad_deadline() is None
        )
        if not idle:
            self._silent_ticks = 0
            return
        self._silent_ticks += 1
        if engine is not None and self._silent_ticks * TICK_S >= after:
            self._silent_ticks = 0
            self.no_input_prompts += 1
            self.flow.agent_spoke_up(now)
            self._interrupt_with(engine.no_input())

    def _should_barge_in(self) -> bool:
        """Speech (the VAD, on what is left once our echo is taken out) for barge_in_ms,
        and more of it than our echo can explain (:mod:`agent.voice.barge_in`)."""
        s = self.settings
        run = max(1, -(-s.barge_in_ms // FRAME_MS))  # whole ticks, rounded up
        return s.barge_in and self._run >= run and self.gate.caller_louder()

    def _barge_in(self) -> None:
        """The caller talks over us (or presses a key): stop the reply where it is, on the
        wire too; the turn it answered is reported as cut short."""
        self.cut_at.append(time.monotonic())
        self._undo = None
        heard = self._stop_reply()
        if self.engine is not None:
            self.engine.played(heard)
        self._closing_stopped()
        if self._turn is not None:
            self._turn.barged_in = True
            if heard:
                self._turn.heard.append(heard)
            self._report(self._turn)

    def _caller_talks_over(self) -> None:
        """Speech over our reply. Within MERGE_TICKS of the reply's start (or before it
        started), it was a pause, not the end of the turn: the caller went on. Then the
        turn is taken back, as if it had not ended: its reply stops, the dialogue forgets
        it, it is never reported, and its words open the turn that goes on now, which is
        answered once, whole. Otherwise it is a barge-in."""
        undo = self._undo
        onset = self._tick - self._run  # the tick the caller's speech began
        log.debug(
            "speech over the reply: onset tick %d, reply from tick %s, undo %s",
            onset,
            None if undo is None else undo.reply_tick,
            undo is not None,
        )
        if undo is None or (undo.reply_tick is not None and onset - undo.reply_tick > MERGE_TICKS):
            # a backchannel acknowledges what we said: a caller who began before any of
            # the reply was on the wire (who talks first, over the greeting's start) is
            # taking the floor
            heard_us = self._voice_from is not None and onset >= self._voice_from
            if self.profile.barge_in.backchannels and heard_us:
                self._hold()  # perhaps only "uh-huh": known when they pause
            else:
                self._barge_in()
            return
        if self._merged >= MAX_MERGES and undo.reply_tick is not None and onset >= undo.reply_tick:
            # speech came back over the reply's start MAX_MERGES times in a row: heard out
            # before it is taken for the caller going on (our echo? see MAX_MERGES)
            self._hold(echo_suspect=True)
            return
        self._undo = None
        self.merges += 1
        self._merged += 1
        self._stop_reply()
        if undo.timing in self.turns:
            self.turns.remove(undo.timing)
        if self._turn is undo.timing:
            self._turn = None
        self.engine = undo.engine  # as before the turn ended: no reply, no miss counted
        # its words (transcribed or not yet) go first in the turn that goes on (and keep
        # their mark if they answered a sensitive slot)
        self._carry = [*undo.spec.abort(), *self._carry]
        self._carry_audio = [*undo.spec.audio, *self._carry_audio]
        self._carry_until = None
        self._sensitive_heard = self._sensitive_heard or undo.timing.sensitive
        said = sensitive_text(undo.spec.text) if undo.timing.sensitive else undo.spec.text
        log.info("caller went on after a pause: %r opens the turn", said)

    def _stop_reply(self) -> str:
        """Stop what we are saying (fading out on the wire), listen again; returns the part
        of it that was heard."""
        self._held = None
        self._voice_from = None
        self._gen += 1
        self.gate.forget_recent()
        self._cancel.set()
        # the reply fades out over FADE_MS (on the wire and in our model of it), rather than
        # stopping mid-word; nothing after the fade plays
        dropped = self._out.fade_out(FADE_MS) if self._out is not None else 0.0
        heard = self.playout.cut(fade_out_gain(round(RATE * FADE_MS / 1000)))
        self._stt.reset()
        self._eot.reset()
        self._busy = False
        log.debug("reply stopped: %.0f ms of it dropped; heard %r", dropped, heard)
        # the caller's words so far belong to the new turn: keep them
        self._speech_ticks = self._run
        return heard

    # -- backchannels: hold the reply, then go on or give the floor --------------------------

    def _hold(self, *, echo_suspect: bool = False) -> None:
        """Speech over the reply that may be a backchannel: fade out as for a barge-in and
        listen, but keep the reply (and its synthesis going) to go on with."""
        self._held = _Held(self._turn, echo_suspect=echo_suspect)
        self.gate.forget_recent()
        if self._out is not None:
            self._out.fade_out(FADE_MS)
        self.playout.hold(fade_out_gain(round(RATE * FADE_MS / 1000)))
        self._stt.reset()
        self._eot.reset()
        self._busy = False
        self._speech_ticks = self._run

    def _listen_held(self, held: _Held) -> None:
        """The caller's speech over a held reply: long, it is theirs (a barge-in); at their
        first pause, what did they say?"""
        if self._user_speaking:
            held.speech += 1
            # they went on: an earlier pause's words are not all of it
            held.probe = held.unsure = held.plain = None
            if held.speech * FRAME_MS > BACKCHANNEL_MAX_MS:
                self._commit_hold()
        elif held.unsure is not None and self._quiet >= WORD_GAP_TICKS:
            self._resume(held.unsure, "not understood")
        elif held.probe is None and self._quiet * FRAME_MS >= SPECULATE_MS:
            # the words since the hold, as one clip: an utterance this short is heard best
            # whole (the transcriber's segments cut it at the VAD's flickers); not leaning
            # toward our phrases: over a reply, what comes back may be our own words' echo,
            # which holds them
            self._probe(held, np.concatenate(held.audio), None)

    def _probe(self, held: _Held, clip: NDArray[np.int16], bias: PhraseBias | None) -> None:
        """What the caller said over the held reply, asked of the ASR off the loop."""
        held.asked = time.monotonic()

        def transcribe() -> str:
            held.ran = time.monotonic()
            return self.models.asr.transcribe(clip, bias=bias)

        probe = held.probe = self.guard.executor("asr").submit(transcribe)
        loop = self._loop
        assert loop is not None
        probe.add_done_callback(lambda f: loop.call_soon_threadsafe(self._probed, held, f, clip))

    def _probed(self, held: _Held, probe: Future[str], clip: NDArray[np.int16]) -> None:
        if self._held is not held or held.probe is not probe or self._closed:
            return  # settled meanwhile, or the caller went on
        try:
            text = probe.result()
        except Exception:  # the guard reports a failed model; here: not understood
            text = ""
        if held.plain is not None:
            self._probed_leaning(held, text)
            return
        # nothing made out is a hum, if short; a longer utterance the ASR missed was words
        short = held.speech * FRAME_MS <= UNHEARD_BACKCHANNEL_MS
        words = normalize(text)
        now = time.monotonic()
        log.debug(
            "held reply: %d ms of speech; probed %.0f ms after the hold, queued %.0f ms, "
            "ran %.0f ms",
            held.speech * FRAME_MS,
            1000 * (held.asked - held.since),
            1000 * (held.ran - held.asked),
            1000 * (now - held.ran),
        )
        known = self.profile.barge_in.backchannels
        if held.echo_suspect and self._our_own_words(text):
            self.echo_resumes += 1
            self._resume(text, "only our own words: line echo", backchannel=False)
        elif words and is_backchannel(text, known):
            self._resume(text)
        elif (
            known
            and short
            and len(words) <= MAX_WORDS
            and not (words and (takes_floor(text) or self._understood(text)))
        ):
            # a hum the ASR made nothing or words of ("mm-hmm" as "A minimum."): giving
            # the reply up for it would only earn the caller a "sorry, I didn't catch
            # that". More words than a backchannel has are a question heard wrong (a quiet
            # caller over loss): the reply stops for them as for any caller taking the
            # floor. So may these, if the pause was only one inside the words (a quiet
            # caller over loss: "Well," at the first 60 ms pause of "What are your opening
            # hours?"): the reply goes on once the pause is one between sentences.
            # Words first heard once more leaning toward what the dialogue listens for: a
            # question over loss ("Where is my order?" as "Wherein my murder,") is then
            # understood, a hum is not ("M. M. M.", "And they can," stay so)
            bias = self._phrase_bias() if words else None
            if bias is not None:
                held.plain = text
                self._probe(held, clip, bias)
            else:
                self._not_understood(held, text)
        else:
            shown = sensitive_text(text) if self.sensitive else text  # a PIN said over the
            log.debug("over a held reply: %r, not a backchannel", shown)  # prompt for it
            self._commit_hold()

    def _probed_leaning(self, held: _Held, text: str) -> None:
        """The words over the held reply heard again, leaning toward our phrases: taken as
        the caller's when the dialogue understands them and they are not only words of this
        reply (its echo, leaned toward the phrases it holds)."""
        plain, held.plain = held.plain, None
        assert plain is not None
        ours = self._reply_words()
        if self._understood(text) and not all(w in ours for w in normalize(text)):
            shown = sensitive_text(text) if self.sensitive else text
            log.debug("over a held reply: %r leaning to our phrases, not a backchannel", shown)
            self._commit_hold()
        else:
            self._not_understood(held, plain)

    def _not_understood(self, held: _Held, text: str) -> None:
        """A few words over the held reply that are no turn: it goes on once the caller's
        pause is one between sentences."""
        if self._quiet >= WORD_GAP_TICKS:
            self._resume(text, "not understood")
        else:
            held.unsure = text

    def _our_own_words(self, text: str) -> bool:
        """Every word of ``text`` is in what this reply has played or queued (fillers
        included; the last may be cut short), and it is more than one word asking for the
        floor ("No." over "...yes or no?" is the caller's). Asked only after MAX_MERGES
        merges in a row: a caller who answers a menu with its own words ("opening hours")
        is otherwise heard as usual."""
        ours = self._reply_words()
        words = normalize(text)
        if not words or not all(w in ours for w in words[:-1]):
            return False
        last = words[-1]  # the echo ends where we faded: "Thanks for call-"
        cut = len(last) >= 2 and any(w.startswith(last) for w in ours)
        return (last in ours or cut) and (len(words) > 1 or not takes_floor(text))

    def _reply_words(self) -> set[str]:
        """The words of what this reply has played or queued, fillers included."""
        return {w for t in self.playout.texts() for w in normalize(t)}

    def _understood(self, text: str) -> bool:
        return self.engine is None or self.engine.understands(text)

    def _resume(self, text: str, why: str = "a backchannel", *, backchannel: bool = True) -> None:
        """A backchannel (or our own echo, ``backchannel`` False): no turn; the reply goes
        on from the word it stopped in."""
        self._held = None
        self.backchannels += int(backchannel)
        audio = self.playout.resume()
        if audio.size and self._out is not None:
            self._out.write(audio)
        self._busy = True
        self._stt.reset()
        self._eot.reset()
        self._speech_ticks = self._quiet = 0
        shown = sensitive_text(text) if self.sensitive else text
        log.info("%r over the reply (%s): it goes on", shown, why)

    def _commit_hold(self) -> None:
        """Not a backchannel: the held reply is dropped (a barge-in, reported as one), and
        the caller's words, still being heard, make the turn they are taking."""
        held, self._held = self._held, None
        if held is None:
            return
        self.cut_at.append(held.since)
        self._undo = None
        self._voice_from = None
        self._gen += 1  # the held reply's task and synthesis stop
        self._cancel.set()
        heard = self.playout.cut()
        if self.engine is not None:
            self.engine.played(heard)
        self._closing_stopped()
        if held.timing is not None:
            held.timing.barged_in = True
            if heard:
                held.timing.heard.append(heard)
            self._report(held.timing)

    def _interrupt_with(self, parts: list[ReplyPart]) -> None:
        """Say something now, whatever was going on (limits, a failed transfer)."""
        if self._busy:
            self._barge_in()
        self._busy = True
        self._spawn(self._play_parts(_aiter(parts), None))

    def _speculate(self) -> None:
        """A short pause: start answering now, adopt it if the turn really ended."""
        if self.settings.speculate and self.engine is not None:
            # the utterance goes on meanwhile
            self._spec = self._prepare(self._stt.snapshot(), self._stt.utterance_audio())

    def _prepare(self, text: Future[str], audio: NDArray[np.int16]) -> Speculation:
        """Answer the turn whose last words ``text`` (heard in ``audio``) will give, after
        any carried ones, on a fork of the engine. Words carried from a pause that was not
        the end are heard again with these, as one clip: halves transcribed apart lose
        words ("Yes," + "go ahead" heard as "Yeah." + "Left hand.")."""
        assert self.engine is not None  # start() made it
        if self._carry_until is not None and self._tick > self._carry_until:
            self._carry_audio = []  # a sound long before, not the start of these words
        self._carry_until = None
        texts, self._carry = [*self._carry, text], []
        clips, self._carry_audio = [*self._carry_audio, audio], []
        if len(clips) > 1 and all(c.size for c in clips):
            whole = np.concatenate(clips)
            texts = [
                self.guard.executor("asr").submit(
                    self.models.asr.transcribe,
                    whole,
                    words_expected=True,
                    bias=self._phrase_bias(),
                )
            ]
        tts = self.guard.executor("tts")
        return Speculation(
            texts, self.engine.fork(), self.models, tts, first_words=FIRST_WORDS, audio=clips
        )

    def _understood_in_pause(self) -> bool:
        """The caller has paused UNDERSTOOD_PAUSE_MS, smart-turn is not sure they finished,
        and a rule understood the reply prepared in the pause (an intent, a whole slot
        value; an LLM would answer any words): their words already say what they want, so
        the turn ends here rather than at max_silence_ms. Why: smart-turn scores many
        finished sentences as unfinished ("No thanks, goodbye." 0.02-0.16, a slowly read
        order number), and those turns waited the whole 900 ms. Words the dialogue cannot
        use yet ("Hi, I would like to ask about", three digits of five) keep the wait; a
        whole value refused ("I can't find order 12346") does not: it is all they meant
        to say (at 24 callers those turns waited 900 ms and were the turn p95); a
        caller who goes on within a second of the reply is merged as after any pause. A
        goodbye too: callers often say more ("That's all. [pause] Goodbye."), and words
        over our closing stop it before its hang-up and are answered (_closing_stopped).
        It once waited for smart-turn or max_silence_ms, when the ended dialogue answered
        nothing (tests/test_turn_merge.py lost that goodbye in a full run); then 43 of 188
        turns at 24 callers did (espeak's "No thanks, goodbye." scores 0.02-0.16)."""
        spec = self._spec
        return (
            spec is not None
            and self._quiet * FRAME_MS >= UNDERSTOOD_PAUSE_MS
            and spec.reply_ready > 0.0
            and bool(spec.text)
            and spec.engine.last_by_rules
            and (not spec.engine.last_missed or spec.engine.last_refused)
        )

    def _drop_speculation(self) -> None:
        """The caller went on: the utterance, still open in the transcriber, goes on too
        (what the speculation carried from an earlier turn goes back to wait)."""
        if self._spec is not None:
            self._carry = [*self._spec.abort()[:-1], *self._carry]
            self._carry_audio = [*self._spec.audio[:-1], *self._carry_audio]
            self._spec = None

    def _end_turn(self, reason: str, now: float) -> None:
        # sensitive if the caller spoke while a sensitive slot was asked for, since the last
        # turn: those words may end up in this one (a pause that was not the end of a turn)
        timing = TurnTiming(speech_end=self._last_speech_t, turn_end=now, reason=reason,
                            sensitive=self._sensitive_heard or self.sensitive,
                            speech_ms=self._speech_ticks * FRAME_MS)  # fmt: skip
        self._sensitive_heard = False
        self.turns.append(timing)
        self._turn = timing
        assert self.engine is not None  # start() made it
        self._busy = True
        self._speech_ticks = 0
        self._eot.reset()
        spec, self._spec = self._spec, None
        if spec is None:
            audio = self._stt.utterance_audio()
            spec = self._prepare(self._stt.finish(), audio)
        else:
            timing.speculative = True
            self._stt.forget()  # its snapshot has the whole utterance
        self._undo = _Undo(timing, self.engine, spec)
        self._spawn(self._answer(spec, timing, self._gen))

    async def _answer(self, spec: Speculation, timing: TurnTiming, gen: int) -> None:
        """Adopt the prepared reply (or wait for it) and play it."""
        try:
            if not spec.task.done() and not spec.heard.is_set():
                heard = asyncio.ensure_future(spec.heard.wait())
                await asyncio.wait({spec.task, heard}, return_when=asyncio.FIRST_COMPLETED)
                heard.cancel()
            timing.asr_done, timing.text = spec.asr_done, spec.text
            if gen != self._gen:  # the caller went on talking before we answered
                self._went_on(spec, timing)
                return
            if spec.heard.is_set() and not spec.text and timing.speech_ms > UNHEARD_WORDS_MS:
                await asyncio.shield(spec.task)  # words we missed: asked again (below) once
                spec.head = spec.engine.unheard()  # the caller is quiet, unless they go on
                spec.reply_ready = time.monotonic()
            elif not spec.heard.is_set() or not spec.text:
                self._busy = False
                if spec.heard.is_set():  # nothing made out ("Yes," alone, too short for the
                    # ASR): it may open what they go on to say, heard whole with it
                    self._carry_audio = list(spec.audio)
                    self._carry_until = self._tick + UNHEARD_CARRY_TICKS
                return
            if not spec.task.done():  # a prepared reply goes out without a loop turn
                await asyncio.shield(spec.task)
            if spec.engine.last_missed and not spec.engine.last_refused:  # not understood:
                # perhaps not finished either (a whole value refused is finished)
                hold = SHORT_HOLD_TICKS if spec.engine.last_short else MISS_HOLD_TICKS
                await self._caller_quiet(gen, hold)
            if gen != self._gen:  # the caller went on meanwhile (the engine is still the
                self._went_on(spec, timing)  # one from before the turn)
                return
        except asyncio.CancelledError:
            spec.task.cancel()
            raise
        self._before_closing = self.engine if spec.engine.ended else None
        self.engine = spec.engine
        timing.reply_ready, timing.tts_first = spec.reply_ready, spec.tts_first
        log.info("caller: %s", timing.caller_text)
        parts = _chain(spec.head, spec.rest)
        await self._play_parts(parts, timing, first=spec.first_audio)

    def _went_on(self, spec: Speculation, timing: TurnTiming) -> None:
        """The caller went on before we answered: it was a pause; these words open the next
        turn (unless the merge that stopped us carried them), and so does their mark."""
        if not spec.aborted:
            self._carry = spec.abort()
            self._carry_audio = list(spec.audio)
            self._carry_until = None
        self._sensitive_heard = self._sensitive_heard or timing.sensitive

    async def _caller_quiet(self, gen: int, ticks: int) -> None:
        """Until the caller has been quiet for ``ticks`` (speech, and the sound a word trails
        off into, start the count afresh: TAIL_TICKS), or reply ``gen`` was stopped."""
        self._holding = True
        try:
            while gen == self._gen and not self._closed:
                quiet = self._tick - self._speech_tick
                if quiet >= ticks and not (
                    # a sound begins that the VAD has not judged yet: "Great, thanks.
                    # [pause] That's all." went on 1.1-1.2 s after the last word, and the
                    # apology's first syllable was heard before the merge stopped it
                    self._sound_run >= SOUND_WAIT_TICKS and quiet < ticks + SOUND_GRACE_TICKS
                ):
                    break
                self._ticked.clear()
                await self._ticked.wait()
        finally:
            self._holding = False

    # -- speaking --------------------------------------------------------------------------

    async def _play_parts(
        self,
        parts: AsyncIterator[ReplyPart],
        timing: TurnTiming | None,
        *,
        first: tuple[str, NDArray[np.int16]] | None = None,
    ) -> None:
        """Say and do a reply's parts in order; ``first``: its first piece, already spoken
        by the TTS (a speculation's)."""
        self._commit_hold()  # a key, a command: the held reply is not going on
        self._busy = True
        self._voice_from = None
        self._cancel = threading.Event()
        gen = self._gen
        try:
            async for part in parts:
                if gen != self._gen or self._closed:
                    return  # barged in: the rest of this reply is stale
                if timing is not None and not timing.reply_ready:
                    timing.reply_ready = time.monotonic()
                if isinstance(part, Say):
                    if timing is not None:
                        timing.reply.append(part.text)
                    await self._say(part.text, gen, timing, first)
                    first = None
                else:
                    await self._wait_drained(gen)
                    if gen == self._gen:
                        self._act(part)
            await self._wait_drained(gen)
        finally:
            if gen == self._gen:
                if self.engine is not None:
                    heard = self.playout.take_heard()
                    if heard:
                        self.engine.played(heard)
                        if timing is not None:
                            timing.heard.append(heard)
                if timing is not None:
                    self._report(timing)
                    if self._undo is not None and self._undo.timing is timing:
                        self._undo = None  # answered in full: a turn of its own
                self._busy = False
                self._voice_from = None
                self._speech_ticks = self._run  # our own echo is not the caller's turn
                self._keep_words_over_the_end()

    def _keep_words_over_the_end(self) -> None:
        """The reply ended as the caller began ("Yes, go ahead" over "... say yes or no"):
        too soon for a barge-in, their first words were heard only into the preroll. If
        they are still talking, or paused as between words, those words open the turn, as
        after a barge-in; otherwise (a cough over our last word) they are dropped."""
        frames = list(self._preroll)
        self._preroll.clear()
        over = sum(o for _, _, o in frames) >= OVER_ECHO_TICKS
        spoken = [i for i, (_, speaking, _) in enumerate(frames) if speaking]
        if spoken and not over and self._user_speaking:
            # speech that goes on past our last word, too short over it to be told from
            # our echo: its onset is kept as the lead-in the transcriber keeps before any
            # speech (not counted as speech), or the turn would start without its first
            # syllable ("Yes please." heard as "...lean")
            log.debug("speech over the reply's end (%d ticks): kept as lead-in", len(spoken))
            for pcm16, _, _ in frames[-PREROLL_TICKS:]:
                self._stt.push(pcm16, False)
                self._eot.push(pcm16, False)
            return
        if not spoken or not over:  # nothing, or only what our own echo explains
            return
        pause = len(frames) - 1 - spoken[-1]
        if not self._user_speaking and pause > WORD_GAP_TICKS:
            return
        for pcm16, speaking, _ in frames[max(0, spoken[0] - PREROLL_TICKS) :]:
            self._stt.push(pcm16, speaking)
            self._eot.push(pcm16, speaking)
        self._speech_ticks = max(self._speech_ticks, len(spoken))
        self._quiet = 0 if self._user_speaking else pause

    async def _say(
        self,
        text: str,
        gen: int,
        timing: TurnTiming | None,
        first: tuple[str, NDArray[np.int16]] | None = None,
    ) -> None:
        """Synthesise in the executor; each sentence's audio goes out as soon as it exists
        (``first``, the first piece's, at once)."""
        loop = self._loop
        assert loop is not None
        cancel = self._cancel
        done: asyncio.Future[None] = loop.create_future()

        def deliver(sentence: str, pcm: NDArray[np.int16] | None) -> None:
            if gen != self._gen or self._out is None:
                return
            if pcm is None:  # a new sentence starts
                self.playout.begin_sentence(sentence)
                return
            audio = pcm  # 8 kHz already: resampled in the executor
            if timing is not None and not timing.first_write:
                timing.first_write = time.monotonic()
                undo = self._undo
                if undo is not None and undo.timing is timing and undo.reply_tick is None:
                    undo.reply_tick = self._tick + self.playout.queued // FRAME
            self.playout.write(audio)
            if self._drained is not None:
                self._drained.clear()
            if self._held is None:  # held: it waits here, to go on or to be dropped
                self._out.write(audio)

        if first is not None:
            deliver(first[0], None)
            deliver(*first)
        # pieces already rendered (the phrase cache) go out from here, at once: a reply
        # every call says never waits behind other calls' model jobs for a worker
        skip = int(first is not None)
        pieces = split_sentences(text, first_max_words=FIRST_WORDS)
        while skip < len(pieces) and (pcm := self.models.cached(pieces[skip])) is not None:
            if timing is not None and not timing.tts_first:
                timing.tts_first = time.monotonic()
            deliver(pieces[skip], None)
            deliver(pieces[skip], pcm)
            skip += 1
        if skip == len(pieces):
            return

        def work() -> None:
            pieces = self.models.speak(text, cancel, skip=skip)
            try:
                while True:
                    with self.guard.watch("tts"):  # one sentence's synthesis: one model run
                        item = next(pieces, None)
                    if item is None:
                        break
                    sentence, pcm = item
                    if timing is not None and not timing.tts_first and pcm is not None:
                        timing.tts_first = time.monotonic()
                    loop.call_soon_threadsafe(deliver, sentence, pcm)
            finally:
                loop.call_soon_threadsafe(_resolve, done)

        self.models.executor.submit(work)
        await done

    async def _wait_drained(self, gen: int) -> None:
        while gen == self._gen and self.playout.playing and self._drained is not None:
            self._drained.clear()
            await self._drained.wait()

    def _report(self, timing: TurnTiming) -> None:
        """Tell the bridge (records, metrics, events) how the turn went, once."""
        if timing.reported or self._out is None:
            return
        timing.reported = True
        self._merged = 0
        self._out.emit(
            TurnCompleted(
                timing.caller_text, " ".join(timing.heard), timing.stages_ms(), timing.barged_in,
                input="keypad" if timing.keys else "speech", keys=timing.caller_keys,
            )
        )  # fmt: skip

    # -- keys, fillers, ringback, dead air -------------------------------------------------

    def _key(self, digit: str, now: float) -> None:
        """A key that makes a turn (a menu key, the end of an entry) stops the reply, like
        speech; a digit typed into an entry and a key the engine ignores do not. (Asked of a
        fork first, so that what was heard of the reply is recorded before the key.)"""
        assert self.engine is not None
        if self._busy and self.engine.fork().press(digit, now) is not None:
            self._drop_speculation()
            self._barge_in()
        turn = self.engine.press(digit, now)
        if turn is not None:
            self._key_turn(turn, now)

    def _key_turn(self, turn: KeyTurn, now: float) -> None:
        """A keypad turn (a menu key, a finished entry): answered like a spoken one (a
        sensitive entry's keys reach the engine only: the turn reports them masked)."""
        self._drop_speculation()
        if self._busy:
            self._barge_in()
        # the key is the caller's turn: speech under way (our echo, as the key cut us) is
        # no barge-in on its answer; speech that starts after it is
        self._key_tick, self._confirmed, self._run = self._tick, False, 0
        timing = TurnTiming(speech_end=now, turn_end=now, reason=f"keypad {turn.ended_by}",
                            sensitive=turn.sensitive)  # fmt: skip
        timing.text, timing.keys = f"(keypad {turn.keys})", turn.keys
        self.turns.append(timing)
        self._turn = timing
        self._busy = True
        self._spawn(self._play_parts(_aiter(turn.parts), timing))

    def _flow_tick(self, now: float) -> None:
        """Once per tick: dead air, a filler or ringback to play, a keypad entry's timeout."""
        if self.paused or self.guard.fault is not None or self._out is None:
            return
        audio, gap = self.flow.tick(
            now, played=self.playout.last_played > 0, replying=self._busy,
            queued=self.playout.playing, caller=self._user_speaking, holding=self._holding,
        )  # fmt: skip
        self._dead_air(gap)
        if audio is not None:
            if not audio.background:  # a filler: heard like the reply (and cut with it)
                self.playout.write_aside(audio.pcm, audio.text)
                if self._drained is not None:
                    self._drained.clear()
            else:  # ringback: not the reply, but our voice on the line all the same
                self.playout.write_background(audio.pcm)
            self._out.write(audio.pcm)
        if self.engine is not None and (turn := self.engine.keypad_timeout(now)) is not None:
            self._dead_air(self.flow.caller_acted(now))  # the entry ended now, not at its last key
            self._key_turn(turn, now)

    def _dead_air(self, gap: float | None) -> None:
        if gap is not None and self._out is not None:
            self._out.emit(DeadAir(round(1000 * gap, 1)))

    def _closing_stopped(self) -> None:
        """The caller stopped a reply that ends the call before its hang-up or transfer:
        they have more to say ("No, wait", or a goodbye of their own over ours), so the
        dialogue goes on from before that reply, and their words get an answer. Why: the
        ended dialogue answered nothing, and the call stayed silent until the caller hung
        up (the demo's pauses script under load: "That's all." ended the turn at
        max_silence_ms, the caller's "No thanks, goodbye." cut the goodbye)."""
        before, self._before_closing = self._before_closing, None
        if before is not None and self.engine is not None and self.engine.ended:
            self.engine = before
            log.info("the caller spoke over our closing: the call goes on")

    def _act(self, part: ReplyPart) -> None:
        out = self._out
        self._before_closing = None  # done: a hang-up or a transfer is not taken back
        self._undo = None  # a transfer, a hang-up, keys sent: that turn cannot be taken back
        if out is None:
            return
        if isinstance(part, Transfer):
            self.flow.transfer_started()  # ringback from the next tick, until the outcome
            out.emit(TransferRequest(part.target))
        elif isinstance(part, Hangup):
            out.hangup(part.reason or "agent said goodbye")
        elif isinstance(part, SendDtmf):
            out.send_dtmf(part.digits)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("voice agent task failed", exc_info=task.exception())
            self._busy = False


async def _aiter(parts: list[ReplyPart]) -> AsyncIterator[ReplyPart]:
    for p in parts:
        yield p


async def _chain(
    head: list[ReplyPart], rest: AsyncIterator[ReplyPart] | None
) -> AsyncIterator[ReplyPart]:
    for p in head:
        yield p
    if rest is not None:
        async for p in rest:
            yield p


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)

"""The one interface a speech agent plugs into, so that it never sees SIP or RTP.

The bridge owns the call: it de-jitters and decodes the caller's audio, resamples it to
:attr:`Agent.sample_rate` and calls :meth:`Agent.on_audio` once per 20 ms tick, always
(silence when the caller sends nothing), so an agent can count time in samples. What the
agent says goes the other way through :class:`AgentOutput`, which queues, resamples and
paces it onto the call. Events (DTMF, hang-up) are small frozen dataclasses, in the style
of pipecat frames.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "Agent",
    "AgentEvent",
    "AgentOutput",
    "CallInfo",
    "DeadAir",
    "DtmfEvent",
    "HangupEvent",
    "ModelFault",
    "PauseAgent",
    "ResumeAgent",
    "SayText",
    "TransferRequest",
    "TransferResult",
    "TurnCompleted",
    "fade_out_gain",
]

#: What agents hear and speak unless they say otherwise: the speech model's native rate.
DEFAULT_SAMPLE_RATE = 24000
#: How long an interrupted reply takes to fade out: a hard cut mid-word is the most robotic
#: sound on a call; 100 ms is gone before the caller's next syllable.
FADE_MS = 100.0


def fade_out_gain(samples: int) -> NDArray[np.float64]:
    """The gain of a fade-out over ``samples``: (1 - t/T)^2, from 1 to 0. Quadratic, not
    linear: -6 dB after 30 % of it, -20 dB after 70 %, so the caller hears us stop at once
    but never a click. One definition for the bridge that plays the fade and the agent
    that models what the caller hears (its echo canceller's reference)."""
    t = np.arange(samples, dtype=np.float64) / max(1, samples)
    out: NDArray[np.float64] = (1.0 - t) ** 2
    return out


@dataclass(frozen=True, slots=True)
class CallInfo:
    """Who is calling whom; the agent's only view of the SIP side."""

    call_id: str
    caller: str = ""  # From URI (or user part)
    callee: str = ""  # To / request URI: picks the agent profile
    codec: str = "PCMU"
    extra: dict[str, str] = field(default_factory=dict)  # e.g. custom X- headers


@dataclass(frozen=True, slots=True)
class DtmfEvent:
    """The caller pressed a key (RFC 4733, reported once per press)."""

    digit: str
    duration_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class HangupEvent:
    """The call is over. To the agent: the caller hung up; from the agent: please hang up."""

    reason: str = ""


@dataclass(frozen=True, slots=True)
class TransferRequest:
    """From the agent: transfer the caller (REFER) to ``target`` (a SIP URI or number)."""

    target: str


# A string: TransferResult is defined at the end of the module.
AgentEvent: TypeAlias = (
    "DtmfEvent | HangupEvent | TransferRequest | TransferResult | TurnCompleted | SayText"
    " | PauseAgent | ResumeAgent | ModelFault | DeadAir"
)


class AgentOutput(abc.ABC):
    """The agent's way back onto the call. Implemented by the bridge (and by tests)."""

    @abc.abstractmethod
    def write(self, pcm: NDArray[np.int16]) -> None:
        """Queue mono int16 audio at the agent's rate; bursts of any size are paced out."""

    @abc.abstractmethod
    def flush(self) -> float:
        """Barge-in: drop everything queued but not yet sent; returns the ms dropped."""

    def fade_out(self, ms: float = FADE_MS) -> float:
        """Barge-in, gently: the next ``ms`` of what is queued plays, fading to silence
        (:func:`fade_out_gain`), and everything after it is dropped, so nothing stale
        reaches the caller; returns the ms dropped. Concrete so that outputs which cannot
        fade (test captures) need not implement it: they cut (:meth:`flush`)."""
        return self.flush()

    def queued_ms(self) -> float:
        """Audio written but not yet sent. Concrete so that outputs which send at once (test
        captures) need not implement it: they have nothing queued."""
        return 0.0

    @abc.abstractmethod
    def hangup(self, reason: str = "") -> None:
        """Ask the bridge to end the call (it sends the BYE; what is still queued is cut)."""

    @abc.abstractmethod
    def emit(self, event: AgentEvent) -> None:
        """Send any other event to the bridge (e.g. a :class:`TransferRequest`)."""

    def send_dtmf(self, digits: str) -> None:
        """Press keys towards the caller (RFC 4733 events on the call's RTP stream, queued
        behind each other; audio waits while one plays). Concrete so that outputs which
        cannot send DTMF (test captures) need not implement it: they raise."""
        raise NotImplementedError(f"{type(self).__name__} cannot send DTMF")


class Agent(abc.ABC):
    """Base class of all agents.

    Lifecycle: ``await start(call, output)``, then any number of :meth:`on_audio` /
    :meth:`on_event` calls from the bridge's event loop, then ``await stop()``. The two
    ``on_`` methods are called from the media loop's tick: they must return quickly and
    hand heavy work (ASR, TTS) to a task or an executor.
    """

    #: Short name shown in the media chain description, e.g. ``Agent(echo)``.
    name: str = "agent"
    #: Rate of the PCM the agent receives and writes.
    sample_rate: int = DEFAULT_SAMPLE_RATE
    #: Whether it acts on an operator's :class:`SayText`, :class:`PauseAgent` and
    #: :class:`ResumeAgent` (the bridge answers other agents' commands with an error).
    takes_commands: bool = False

    @property
    def sensitive(self) -> bool:
        """True while the caller gives input that must leave no trace (a ``sensitive``
        slot: a PIN, a card number): the bridge then masks keys in records and events, and
        records silence. Read on the media loop's tick: keep it cheap."""
        return False

    @abc.abstractmethod
    async def start(self, call: CallInfo, output: AgentOutput) -> None:
        """The call is answered; keep ``output`` to speak."""

    @abc.abstractmethod
    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        """One frame of the caller's audio (20 ms at :attr:`sample_rate`, int16)."""

    def on_event(self, event: AgentEvent) -> None:  # noqa: B027 (optional hook)
        """A DTMF key or the caller's hang-up; ignored unless overridden."""

    async def stop(self) -> None:  # noqa: B027 (optional hook)
        """The call is gone; release resources. Nothing is sent after this."""


@dataclass(frozen=True, slots=True)
class TurnCompleted:
    """From the agent: one caller turn answered, or cut short by the caller (barge-in), for
    call records, metrics and events. ``agent_text`` is what was played, not what was
    planned; ``stages_ms``: end_of_turn, asr_tail, dialogue, tts_first_audio (those that
    happened). A keypad turn (``input`` "keypad") has ``keys``, what the caller keyed (a
    slot entry's digits or a menu key), and ``stages_ms``: dialogue, tts_first_audio and
    total (the turn's last key -> its first reply audio). A sensitive slot's entry comes
    masked: ``caller_text`` ``[redacted N digits]``, ``keys`` one ``*`` per key."""

    caller_text: str
    agent_text: str
    stages_ms: dict[str, float]
    barged_in: bool = False
    input: Literal["speech", "keypad"] = "speech"
    keys: str = ""


@dataclass(frozen=True, slots=True)
class DeadAir:
    """From the agent: the caller waited ``gap_ms`` in silence for us (one gap of dead
    air, as :mod:`agent.voice.dead_air` defines it), for records, metrics and the console.
    ``None``: the agent measures this call's dead air and has seen no gap yet (sent when it
    starts), so a call whose every wait was answered at once reads 0 ms, not "not measured"."""

    gap_ms: float | None


@dataclass(frozen=True, slots=True)
class SayText:
    """To the agent, from an operator (an MQTT command): say this now, cutting short what
    it is saying. Agents that do not speak ignore it (:attr:`Agent.takes_commands`)."""

    text: str


@dataclass(frozen=True, slots=True)
class PauseAgent:
    """To the agent, from an operator: stop listening and answering (a person takes over)
    until :class:`ResumeAgent`; what it is saying stops."""


@dataclass(frozen=True, slots=True)
class ResumeAgent:
    """To the agent, from an operator: listen and answer again."""


@dataclass(frozen=True, slots=True)
class TransferResult:
    """To the agent: how its :class:`TransferRequest` ended (once per request).

    ``outcome`` is "succeeded" (the target answered; the bridge hangs up soon) or
    "failed"; ``status`` is the SIP status behind it (0 when unknown), ``target`` the URI
    the REFER named.
    """

    target: str
    outcome: Literal["succeeded", "failed"]
    status: int = 0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ModelFault:
    """From the agent: a model it depends on raised, or gave no result within
    ``[agent] model_timeout_s``; the call cannot go on with this agent. ``stage`` names the
    model's job (vad, turn, asr, tts, speech_model...), ``reason`` what happened. The
    bridge stops the agent, plays the fallback prompt itself, then hangs up or transfers
    (``[agent] on_model_fault``); the agent reports at most one per call."""

    reason: str
    stage: str

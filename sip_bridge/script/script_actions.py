"""What the call-script player and its runner hand each other (no I/O): the actions the
player asks for, what the caller's audio or keys did on the wire, each step's result and
the call's figures. The player: :mod:`sip_bridge.script.script_steps`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sip_bridge.script.heard_audio import Gap, Reaction
from sip_bridge.script.script_file import Dtmf, Speak, Step

__all__ = [
    "Action",
    "CallerTiming",
    "HangUp",
    "SendAudio",
    "SendDtmf",
    "StepResult",
    "Summary",
    "TalkOver",
    "Transcribe",
    "normalize_transcript",
    "send_action",
    "transcript_key",
]


@dataclass(frozen=True, slots=True)
class SendAudio:
    """Say / play this step's audio now (the runner rendered it beforehand)."""

    step: int


@dataclass(frozen=True, slots=True)
class SendDtmf:
    step: int
    digits: str
    method: str
    duration_ms: int
    gap_ms: int


@dataclass(frozen=True, slots=True)
class Transcribe:
    """Transcribe what was heard from ``start`` to ``end``; answer with :meth:`transcript`."""

    start: float
    end: float

    @property
    def key(self) -> tuple[int, int]:
        return transcript_key(self.start, self.end)


@dataclass(frozen=True, slots=True)
class HangUp:
    pass


Action = SendAudio | SendDtmf | Transcribe | HangUp


def send_action(step: Speak | Dtmf) -> SendAudio | SendDtmf:
    """What sends this caller step out: its audio, or its keys."""
    if isinstance(step, Speak):
        return SendAudio(step.index)
    return SendDtmf(step.index, step.digits, step.method, step.duration_ms, step.gap_ms)


@dataclass(frozen=True, slots=True)
class CallerTiming:
    """When a step's audio or keys went out: the first packet, the first and last with
    speech energy (None for silent audio), and the last packet."""

    start: float
    onset: float | None
    end: float | None
    done: float


@dataclass
class StepResult:
    step: Step
    passed: bool | None  # None: skipped
    start: float  # seconds after the answer
    end: float
    detail: str = ""
    repeats: int = 0  # an expect: times the caller said their answer again (``repeat_on``)

    @property
    def status(self) -> str:
        return "SKIP" if self.passed is None else "PASS" if self.passed else "FAIL"


@dataclass(frozen=True, slots=True)
class TalkOver:
    """The caller spoke (or pressed a key) while the agent was talking, at step ``step``;
    ``barge_in`` is that step's own (None: the script did not say what should happen)."""

    step: int
    key: bool
    barge_in: bool | None
    reaction: Reaction


@dataclass
class Summary:
    """The call's conversation figures, measured on what the caller sent and heard."""

    turn_latencies_s: list[float] = field(default_factory=list)
    talk_overs: list[TalkOver] = field(default_factory=list)
    dead_air: list[Gap] = field(default_factory=list)
    sent: list[tuple[Speak | Dtmf, CallerTiming]] = field(default_factory=list)  # in order
    transfer_at: float | None = None  # when the REFER's call had its outcome

    @property
    def reactions(self) -> list[Reaction]:
        """How the agent reacted to the caller talking over it (keys are not measured: a
        key's answer follows the cut at once)."""
        return [o.reaction for o in self.talk_overs if not o.key]

    @property
    def longest_dead_air_s(self) -> float:
        return max((g.seconds for g in self.dead_air), default=0.0)

    @property
    def total_dead_air_s(self) -> float:
        return sum(g.seconds for g in self.dead_air)


def normalize_transcript(text: str) -> str:
    """Lower case, punctuation gone ("8 a.m." -> "8 a m"), single spaces: what ``expect``
    patterns are matched against."""
    text = re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("’", "'"))
    return " ".join(text.split())


def transcript_key(start: float, end: float) -> tuple[int, int]:
    """A stretch of heard audio, to the millisecond: what transcripts are filed under."""
    return round(start * 1000), round(end * 1000)

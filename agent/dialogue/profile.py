"""Agent profiles: the TOML file a call-center operator writes to script the voice agent.

Every mistake is caught at load time and reported as ``file:line: key: message`` (unknown
keys, wrong types, bad regular expressions, and template placeholders that name no slot or
variable), so a typo never turns into a broken sentence in the middle of a call. The schema
is documented in ``config/agents/README.md``. The error style is that of
``sip_bridge.config.loader.ConfigError``; ``agent/`` must not import the SIP package, so the small
line finder is written again in :mod:`agent.dialogue.profile_loader`, with the schema and builders.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from agent.dialogue.backchannel import DEFAULT_BACKCHANNELS, phrases
from agent.dialogue.business_hours import BusinessHours
from agent.dialogue.formatters import apply as apply_format

__all__ = [
    "Actions",
    "AgentProfile",
    "BargeIn",
    "Fallback",
    "Filler",
    "Intent",
    "Limits",
    "LlmSettings",
    "Lookup",
    "Matching",
    "ProfileError",
    "SlotSpec",
    "Template",
    "TransferSettings",
    "Voice",
    "parse_template",
]

#: Placeholders every template may use; the engine fills them from the call.
BUILTINS = ("caller", "callee")
DTMF_KEYS = "0123456789*#ABCD"


class ProfileError(ValueError):
    """A profile mistake, located: `file:line: key: message`."""

    def __init__(self, path: str, line: int | None, key: str, message: str) -> None:
        self.path, self.line, self.key = path, line, key
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {key}: {message}")


@dataclass(frozen=True)
class Template:
    """A reply with ``{name}``, ``{table.field}`` or ``{name:spell}`` placeholders, parsed
    once so that rendering during a call cannot fail."""

    source: str
    parts: tuple[str | tuple[str, str], ...]  # literal text or (name, format)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(p[0] for p in self.parts if isinstance(p, tuple))

    def render(self, values: Mapping[str, str]) -> str:
        out: list[str] = []
        for p in self.parts:
            if isinstance(p, str):
                out.append(p)
                continue
            out.append(apply_format(p[1], values.get(p[0], "")))  # {x:spell}, {x:ordinal}...
        return " ".join("".join(out).split())


_TOKEN = re.compile(r"\{\{|\}\}|\{[^{}]*\}|[{}]")
_FIELD = re.compile(r"([A-Za-z_]\w*(?:\.\w+)?)(?::(spell|ordinal|date:spoken|time:spoken))?")


def parse_template(source: str) -> Template:
    """Split ``source`` into literals and fields; ValueError on a malformed placeholder."""
    parts: list[str | tuple[str, str]] = []
    pos = 0
    for m in _TOKEN.finditer(source):
        parts.append(source[pos : m.start()])
        tok = m.group()
        if tok in ("{{", "}}"):
            parts.append(tok[0])
        elif tok in ("{", "}"):
            raise ValueError(f"unbalanced {tok!r} at column {m.start() + 1} (write {tok * 2})")
        else:
            f = _FIELD.fullmatch(tok[1:-1].strip())
            if f is None:
                raise ValueError(
                    f"malformed placeholder {tok}: use {{name}} or {{name:FORMAT}}, FORMAT one"
                    " of spell, ordinal, date:spoken, time:spoken"
                )
            parts.append((f.group(1), f.group(2) or ""))
        pos = m.end()
    parts.append(source[pos:])
    return Template(source, tuple(p for p in parts if p != ""))


@dataclass(frozen=True)
class SlotSpec:
    """A value the dialogue collects: ``digits`` (spoken or keyed), ``yes_no``, ``date``,
    ``time``, ``number``, ``choice`` or ``text`` (rules: :mod:`agent.dialogue.slot_rules`).
    While a ``sensitive`` slot is asked for, the bridge keeps no trace of the caller's
    input (records, events, logs, recording); the engine still gets the value."""

    name: str
    kind: Literal["digits", "yes_no", "date", "time", "number", "choice", "text"]
    prompt: Template
    retry: Template
    min_length: int = 1
    max_length: int = 20
    # keypad entry: no key for this long ends the entry (as '#' does)
    digit_timeout_s: float = 3.0
    # choice: (name, its phrases as normalized words), the name itself among them
    options: tuple[tuple[str, tuple[tuple[str, ...], ...]], ...] = ()
    minimum: float | None = None  # number
    maximum: float | None = None
    not_past: bool = True  # date: not before today
    max_days_ahead: int = 365
    weekdays: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6)  # date: the days allowed, Monday = 0
    earliest: str = "00:00"  # time: HH:MM, both included
    latest: str = "23:59"
    confirm: Literal["auto", "always", "never"] = "auto"  # auto: when the value is unsure
    # auto also asks back a value from words the ASR was less sure of than this (0..1: its
    # least certain token's probability; 0: the words alone decide)
    confirm_below: float = 0.0
    # date/time: refused outside the profile's [hours] (closed days, holidays, a time when
    # the office is shut that day); only where the profile has [hours]
    within_hours: bool = True
    confirm_prompt: Template | None = None  # default: "{slot}, is that right?"
    invalid: Template | None = None  # said when a value is understood but not allowed
    # a PIN or a card number: never stored, sent or spoken back (see agent.redaction)
    sensitive: bool = False


@dataclass(frozen=True)
class Actions:
    """What happens after the reply is spoken, in this order: DTMF, transfer, hang-up."""

    reply: Template
    set: tuple[tuple[str, Template], ...] = ()
    send_dtmf: str = ""
    transfer: str = ""
    hangup: bool = False


@dataclass(frozen=True)
class Lookup:
    """Find the row of ``data.<table>`` whose key is the value of slot ``key``."""

    table: str
    key: str
    alias: str
    not_found: Template


@dataclass(frozen=True)
class Intent:
    name: str
    keywords: tuple[tuple[str, ...], ...]  # normalised phrases
    patterns: tuple[re.Pattern[str], ...]
    examples: tuple[tuple[str, ...], ...]
    dtmf: str
    slots: tuple[str, ...]
    then: Actions
    on_no: Actions | None = None  # used when a yes_no slot of the intent is "no"
    lookup: Lookup | None = None
    override_llm: bool = False
    # normalised phrases: a plain no to a reply that asked one of them starts this intent
    # ("... Anything else?" "No, I'm good.")
    no_to: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class Fallback:
    replies: tuple[Template, ...]
    escalate_after: int = 0  # misses in a row; 0 = never
    escalate_reply: Template | None = None
    escalate_transfer: str = ""  # empty: hang up instead
    transfer_failed: Template | None = None


@dataclass(frozen=True)
class Limits:
    max_turns: int = 0  # 0 = no limit
    max_call_s: float = 0.0
    closing: Template = field(default_factory=lambda: parse_template("Thank you for calling."))
    # The floor is the caller's and they say nothing (their words lost on the line, a key
    # in a burst of loss, stepped away): after this long the agent asks again, up to
    # no_input_prompts times, then says no_input_goodbye and hangs up. 0 = never.
    no_input_s: float = 0.0
    no_input_prompts: int = 2
    no_input_reply: Template = field(default_factory=lambda: parse_template("Are you still there?"))
    no_input_goodbye: Template = field(
        default_factory=lambda: parse_template(
            "I can't hear anything, so I'll hang up now. Goodbye."
        )
    )


@dataclass(frozen=True)
class LlmSettings:
    mode: Literal["fallback", "primary"]
    base_url: str
    model: str
    api_key_env: str = ""
    system_prompt: Template = field(default_factory=lambda: parse_template(""))
    temperature: float = 0.3
    max_tokens: int = 150
    timeout_s: float = 10.0


@dataclass(frozen=True)
class BargeIn:
    enabled: bool = True
    min_speech_ms: int = 200
    # normalised phrases that, said alone while the agent talks, are no turn and do not
    # stop it for good (agent.backchannel); empty: every barge-in is a turn
    backchannels: tuple[tuple[str, ...], ...] = field(default_factory=lambda: _defaults())


def _defaults() -> tuple[tuple[str, ...], ...]:
    return phrases(DEFAULT_BACKCHANNELS)


@dataclass(frozen=True)
class Voice:
    length_scale: float = 1.0


@dataclass(frozen=True)
class Filler:
    """What fills a wait while the agent works ([agent] filler*), so that the caller never
    sits in more than ~1.5 s of silence: after ``after_ms`` of it, ``text`` is said (once
    per wait), and a short tone at ``tone_hz`` if the wait goes on (0: no tone; with
    ``text`` empty the tone is all). See agent.dead_air for what counts as a wait."""

    text: str = "One moment."
    tone_hz: float = 440.0
    after_ms: int = 1000

    @property
    def enabled(self) -> bool:
        return bool(self.text) or self.tone_hz > 0


@dataclass(frozen=True)
class TransferSettings:
    """[transfer] of a profile: what the caller hears while a transfer rings."""

    hold_audio: str = ""  # a WAV looped until the target answers; "": the bridge's, else ringback


@dataclass(frozen=True)
class Matching:
    fuzzy_threshold: float = 0.82  # difflib ratio for one keyword word vs one heard word
    example_threshold: float = 0.75  # difflib ratio for a whole example sentence
    # the recogniser leans toward the profile's phrases (agent.dialogue.vocabulary) by this
    # many nats per character (agent.voice.phrase_bias); 0 = off (docs/voice-agent.md)
    phrase_boost: float = 0.5
    phrases: tuple[str, ...] = ()  # more to lean toward, normalised (names, products)


@dataclass(frozen=True)
class AgentProfile:
    name: str
    greeting: Template
    intents: tuple[Intent, ...]
    slots: Mapping[str, SlotSpec]
    fallback: Fallback
    limits: Limits
    llm: LlmSettings | None
    variables: Mapping[str, str]
    data: Mapping[str, Mapping[str, Mapping[str, str]]]
    barge_in: BargeIn = field(default_factory=BargeIn)
    voice: Voice = field(default_factory=Voice)
    filler: Filler = field(default_factory=Filler)
    transfer: TransferSettings = field(default_factory=TransferSettings)
    matching: Matching = field(default_factory=Matching)
    hours: BusinessHours | None = None  # outside them, calls get hours.after_hours_profile
    language: str = "en"  # what callers speak and hear (the speech models must match)
    path: str = ""

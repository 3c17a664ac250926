"""Call scripts (``sip-bridge script FILE.toml``): the file format, parsed and checked.

A script is what an operator writes to prove a profile works before callers reach it: a
``[script]`` table (name, default voice, limits) and ``[[step]]`` tables played in order,
each with exactly one action key (``say``, ``play``, ``dtmf``, ``wait``, ``wait_s``,
``expect``, ``expect_hangup``, ``expect_refer``, ``expect_no_dead_air``, ``hangup``).
The format is documented in config/scripts/README.md.

Like the bridge's own config, a mistake is reported with the file, the line and the key
(:class:`~sip_bridge.config.config_types.ConfigError`); unknown keys are errors, regular
expressions are compiled and files looked for here, so a broken script fails before it
dials anyone.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agent.dialogue.toml_source import as_written
from sip_bridge.config.config_types import ConfigError, _line_of, is_file
from sip_bridge.config.trunks import entry_key_line
from sip_bridge.media.dtmf import DtmfOutbox

__all__ = [
    "ACTIONS",
    "DTMF_METHODS",
    "TRANSFER_RESULTS",
    "CallerHangup",
    "Dtmf",
    "Expect",
    "ExpectHangup",
    "ExpectRefer",
    "NoDeadAir",
    "Script",
    "Speak",
    "Step",
    "Wait",
    "WaitSeconds",
    "load_script",
    "parse_script_text",
]

#: The action keys; a step has exactly one of them.
ACTIONS = (
    "say",
    "play",
    "dtmf",
    "wait",
    "wait_s",
    "expect",
    "expect_hangup",
    "expect_refer",
    "expect_no_dead_air",
    "hangup",
)
DTMF_METHODS = ("rfc4733", "info")
#: What became of the call the runner placed to a REFER's target.
TRANSFER_RESULTS = ("answered", "rejected", "no_answer")
WAIT_FOR = ("silence", "speech")

_NUM = (int, float)
# key -> accepted types, per action (plus the keys every step may have)
_COMMON: dict[str, tuple[type, ...]] = {"note": (str,)}
_SPEAK = {"voice": (str,), "rate_wpm": (int,), "gain_db": _NUM, "barge_in": (bool,),
          "within_ms": (int,)}  # fmt: skip
_STEP_KEYS: dict[str, dict[str, tuple[type, ...]]] = {
    "say": {"say": (str,), **_SPEAK},
    "play": {"play": (str,), **_SPEAK},
    "dtmf": {
        "dtmf": (str,),
        "method": (str,),
        "duration_ms": (int,),
        "gap_ms": (int,),
        "barge_in": (bool,),
        "within_ms": (int,),
    },
    "wait": {"wait": (str,), "quiet_ms": (int,), "timeout_s": _NUM},
    "wait_s": {"wait_s": _NUM},
    "expect": {
        "expect": (str,),
        "not": (str,),
        "timeout_s": _NUM,
        "quiet_ms": (int,),
        "repeat_on": (str,),
    },
    "expect_hangup": {"expect_hangup": (bool,), "timeout_s": _NUM},
    "expect_refer": {"expect_refer": (str,), "result": (str,), "timeout_s": _NUM},
    "expect_no_dead_air": {"expect_no_dead_air": _NUM},
    "hangup": {"hangup": (bool,)},
}
_SCRIPT_KEYS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "description": (str,),
    "uri": (str,),
    "voice": (str,),
    "rate_wpm": (int,),
    "timeout_s": _NUM,
    "answer_timeout_s": _NUM,
    "dtmf": (str,),
    "quiet_ms": (int,),
    "within_ms": (int,),
    "repeat_on": (str,),
}


@dataclass(frozen=True)
class Script:
    """One call: where to dial, how to speak, and the steps in order."""

    path: Path
    name: str
    description: str
    steps: tuple[Step, ...]
    uri: str = ""  # the default target; `--uri` overrides
    voice: str = "en-us"  # espeak-ng voice of `say` steps
    rate_wpm: int = 165
    timeout_s: float = 120.0  # the whole call, from the INVITE
    answer_timeout_s: float = 20.0
    dtmf: str = "rfc4733"  # the default method of `dtmf` steps
    quiet_ms: int = 1000  # the default of `wait`/`expect`: the agent's pause that ends a reply
    within_ms: int = 400  # the default barge-in bound: min_speech_ms 250 + 150
    repeat_on: str = ""  # the default of `expect`: a reply asking the caller to say it again


def _barge_text(barge_in: bool | None, within_ms: int) -> str:
    if barge_in is None:
        return ""
    return f" (barge in, stop within {within_ms} ms)" if barge_in else " (must not stop the agent)"


@dataclass(frozen=True)
class _StepBase:
    index: int  # 1-based, as printed
    line: int | None
    note: str


@dataclass(frozen=True)
class Speak(_StepBase):
    """``say`` TEXT (espeak-ng) or ``play`` a WAV file.

    ``barge_in``: None says nothing about the agent; True: the agent must be talking when
    the caller starts and stop within ``within_ms``; False: it must keep talking (a
    backchannel, a cough)."""

    text: str = ""
    wav: Path | None = None
    voice: str | None = None
    rate_wpm: int | None = None
    gain_db: float = 0.0
    barge_in: bool | None = None
    within_ms: int = 400

    @property
    def kind(self) -> str:
        return "play" if self.wav is not None else "say"

    def describe(self) -> str:
        what = f'say "{self.text}"' if self.wav is None else f"play {self.wav.name}"
        return what + _barge_text(self.barge_in, self.within_ms)


@dataclass(frozen=True)
class Dtmf(_StepBase):
    """Keys; ``barge_in`` as for :class:`Speak` (a menu key over a prompt; a key the agent
    ignores must not stop it)."""

    digits: str = ""
    method: str = "rfc4733"
    duration_ms: int = 100
    gap_ms: int = 200
    barge_in: bool | None = None
    within_ms: int = 400

    kind = "dtmf"

    def describe(self) -> str:
        return f"press {self.digits} ({self.method})" + _barge_text(self.barge_in, self.within_ms)


@dataclass(frozen=True)
class Wait(_StepBase):
    """Until the agent has been quiet for ``quiet_ms`` (``silence``) or speaks (``speech``)."""

    until: str = "silence"
    quiet_ms: int = 1000
    timeout_s: float = 30.0

    kind = "wait"

    def describe(self) -> str:
        return f"wait for {self.until}"


@dataclass(frozen=True)
class WaitSeconds(_StepBase):
    seconds: float = 0.0

    kind = "wait_s"

    def describe(self) -> str:
        return f"wait {self.seconds:g} s"


@dataclass(frozen=True)
class Expect(_StepBase):
    """What the agent says (transcribed) matches ``pattern`` (and not ``forbid``). A whole
    reply matching ``repeat_on`` instead (the agent asked again: "Sorry, I need the five
    digit order number") has the caller say their answer again, once, as callers do."""

    pattern: str = ""
    forbid: str = ""
    timeout_s: float = 15.0
    quiet_ms: int = 1000
    repeat_on: str = ""

    kind = "expect"

    def describe(self) -> str:
        return f"expect /{self.pattern}/" + (f" not /{self.forbid}/" if self.forbid else "")


@dataclass(frozen=True)
class ExpectHangup(_StepBase):
    timeout_s: float = 10.0

    kind = "expect_hangup"

    def describe(self) -> str:
        return "expect hang-up"


@dataclass(frozen=True)
class ExpectRefer(_StepBase):
    """A REFER to ``target`` ("" = any); with ``result``, also what became of the call the
    runner placed to it (answered, rejected, no_answer)."""

    target: str = ""
    result: str = ""
    timeout_s: float = 15.0

    kind = "expect_refer"

    def describe(self) -> str:
        what = f"expect REFER to {self.target or 'anyone'}"
        return what + (f", {self.result}" if self.result else "")


@dataclass(frozen=True)
class NoDeadAir(_StepBase):
    """From here to the end of the call no wait for the agent is silent longer than this."""

    max_s: float = 1.5

    kind = "expect_no_dead_air"

    def describe(self) -> str:
        return f"expect no dead air over {self.max_s:g} s"


@dataclass(frozen=True)
class CallerHangup(_StepBase):
    kind = "hangup"

    def describe(self) -> str:
        return "hang up"


Step = (
    Speak
    | Dtmf
    | Wait
    | WaitSeconds
    | Expect
    | ExpectHangup
    | ExpectRefer
    | NoDeadAir
    | CallerHangup
)


def load_script(path: str | Path) -> Script:
    """Read and check a script file; ConfigError (file, line, key) for any mistake."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(p), None, "script", f"cannot read: {exc}") from None
    return parse_script_text(text, p)


def parse_script_text(text: str, path: Path) -> Script:
    p = str(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise ConfigError(p, int(m.group(1)) if m else None, "toml", str(exc)) from None
    for key in data:
        if key not in ("script", "step"):
            line = _line_of(text, key, None) or entry_key_line(text, key, 0, None)
            raise ConfigError(p, line, key, "unknown table; a script has [script] and [[step]]")
    head = data.get("script", {})
    if not isinstance(head, dict):
        raise ConfigError(p, None, "script", "must be a table: [script]")
    for key, value in head.items():
        _check_type(value, _SCRIPT_KEYS.get(key), p, _line_of(text, "script", key),
                    f"script.{key}", sorted(_SCRIPT_KEYS))  # fmt: skip
    defaults = Script(path, path.stem, "", ())
    script = Script(
        path=path,
        name=head.get("name", path.stem),
        description=head.get("description", ""),
        steps=(),
        uri=head.get("uri", ""),
        voice=head.get("voice", defaults.voice),
        rate_wpm=head.get("rate_wpm", defaults.rate_wpm),
        timeout_s=float(head.get("timeout_s", defaults.timeout_s)),
        answer_timeout_s=float(head.get("answer_timeout_s", defaults.answer_timeout_s)),
        dtmf=head.get("dtmf", defaults.dtmf),
        quiet_ms=head.get("quiet_ms", defaults.quiet_ms),
        within_ms=head.get("within_ms", defaults.within_ms),
        repeat_on=head.get("repeat_on", ""),
    )
    _check_head(script, text, p)
    raw = data.get("step", [])
    if not isinstance(raw, list) or not all(isinstance(s, dict) for s in raw):
        raise ConfigError(p, _line_of(text, "step", None), "step", "must be [[step]] tables")
    if not raw:
        raise ConfigError(p, None, "step", "a script needs at least one [[step]]")
    steps = tuple(_step(s, i, script, text, p) for i, s in enumerate(raw))
    return replace(script, steps=steps)


def _check_type(
    value: Any, types: tuple[type, ...] | None, p: str, line: int | None, key: str,
    allowed: list[str],
) -> None:  # fmt: skip
    if types is None:
        raise ConfigError(p, line, key, f"unknown key; allowed: {', '.join(allowed)}")
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        want = " or ".join(t.__name__ for t in types)
        raise ConfigError(p, line, key, f"expected {want}, got {value!r}")


def _check_head(s: Script, text: str, p: str) -> None:
    def fail(key: str, message: str) -> ConfigError:
        return ConfigError(p, _line_of(text, "script", key), f"script.{key}", message)

    if s.dtmf not in DTMF_METHODS:
        raise fail("dtmf", f"{s.dtmf!r} is not one of {', '.join(DTMF_METHODS)}")
    if s.uri and not re.match(r"(sips?):[^@\s]+@\S+$|(sips?):\S+$", s.uri):
        raise fail("uri", f"not a sip: URI: {s.uri!r}")
    lows = (("timeout_s", s.timeout_s, 1.0), ("answer_timeout_s", s.answer_timeout_s, 1.0),
            ("rate_wpm", s.rate_wpm, 80), ("quiet_ms", s.quiet_ms, 100),
            ("within_ms", s.within_ms, 20))  # fmt: skip
    for key, value, low in lows:
        if value < low:
            raise fail(key, f"must be at least {low:g}")
    if s.rate_wpm > 450:
        raise fail("rate_wpm", "must be at most 450 (espeak-ng's range)")
    _check_voice(s.voice, fail, "voice")
    _regex(s.repeat_on, fail, "repeat_on", text)


def _check_voice(voice: str, fail: Any, key: str) -> None:
    # espeak-ng voice names: "en-us", "en-gb-x-rp", "en-us+f3", "mb-us1"
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,40}(\+[A-Za-z0-9_ ]{1,40})?", voice):
        raise fail(key, f"not an espeak-ng voice name: {voice!r}")


def _regex(pattern: str, fail: Any, key: str, text: str) -> None:
    try:
        re.compile(pattern, re.IGNORECASE)
    except re.error as exc:  # the pattern as the file has it, not Python's escaping
        raise fail(key, f"{as_written(text, pattern)} is not a regular expression: {exc}") from None


def _step(entry: dict[str, Any], i: int, s: Script, text: str, p: str) -> Step:
    def fail(key: str | None, message: str) -> ConfigError:
        where = f"step[{i + 1}]" + (f".{key}" if key else "")
        return ConfigError(p, entry_key_line(text, "step", i, key), where, message)

    actions = [k for k in entry if k in ACTIONS]
    if len(actions) != 1:
        got = ", ".join(actions) or "none"
        raise fail(None, f"needs exactly one of {', '.join(ACTIONS)} (got {got})")
    kind = actions[0]
    allowed = {**_STEP_KEYS[kind], **_COMMON}
    for key, value in entry.items():
        types = allowed.get(key)
        if types is None:
            raise fail(key, f"unknown key for a {kind} step; allowed: {', '.join(sorted(allowed))}")
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            want = " or ".join(t.__name__ for t in types)
            raise fail(key, f"expected {want}, got {value!r}")
    base = {"index": i + 1, "line": entry_key_line(text, "step", i, None),
            "note": entry.get("note", "")}  # fmt: skip
    value = entry[kind]
    timeout = entry.get("timeout_s")
    if timeout is not None and timeout <= 0:
        raise fail("timeout_s", "must be above 0")
    if kind in ("say", "play"):
        return _speak(entry, kind, s, base, fail)
    if kind == "dtmf":
        method = entry.get("method", s.dtmf)
        if method not in DTMF_METHODS:
            raise fail("method", f"{method!r} is not one of {', '.join(DTMF_METHODS)}")
        try:
            DtmfOutbox.check(value)
        except ValueError:
            raise fail("dtmf", f"{value!r}: keys are 0-9, *, #, A-D") from None
        if not value:
            raise fail("dtmf", "no keys to press")
        duration, gap = entry.get("duration_ms", 100), entry.get("gap_ms", 200)
        if not 40 <= duration <= 2000 or not 0 <= gap <= 10000:
            raise fail("duration_ms" if not 40 <= duration <= 2000 else "gap_ms",
                       "duration_ms is 40-2000, gap_ms 0-10000")  # fmt: skip
        if entry.get("barge_in") is True:
            # the reply to a key follows the cut at once: on the wire a stop cannot be told
            # from a pause; expect the reply (and `not` the rest of the prompt) instead
            raise fail("barge_in", "only barge_in = false (the key must not stop the agent) "
                       "is checked for keys")  # fmt: skip
        return Dtmf(**base, digits=value.upper(), method=method, duration_ms=duration, gap_ms=gap,
                    **_barge(entry, s, fail))  # fmt: skip
    if kind == "wait":
        if value not in WAIT_FOR:
            raise fail("wait", f"{value!r} is not one of {', '.join(WAIT_FOR)} (wait_s = N: sleep)")
        quiet = entry.get("quiet_ms", s.quiet_ms)
        if quiet < 100:
            raise fail("quiet_ms", "must be at least 100")
        return Wait(**base, until=value, quiet_ms=quiet, timeout_s=float(timeout or 30.0))
    if kind == "wait_s":
        if not 0 < value <= 600:
            raise fail("wait_s", "seconds, above 0 and at most 600")
        return WaitSeconds(**base, seconds=float(value))
    if kind == "expect":
        _regex(value, fail, "expect", text)
        _regex(entry.get("not", ""), fail, "not", text)
        repeat_on = entry.get("repeat_on", s.repeat_on)
        _regex(repeat_on, fail, "repeat_on", text)
        quiet = entry.get("quiet_ms", s.quiet_ms)
        if quiet < 100:
            raise fail("quiet_ms", "must be at least 100")
        return Expect(**base, pattern=value, forbid=entry.get("not", ""), repeat_on=repeat_on,
                      timeout_s=float(timeout or 15.0), quiet_ms=quiet)  # fmt: skip
    if kind == "expect_hangup":
        if value is not True:
            raise fail("expect_hangup", "write expect_hangup = true")
        return ExpectHangup(**base, timeout_s=float(timeout or 10.0))
    if kind == "expect_refer":
        result = entry.get("result", "")
        if result and result not in TRANSFER_RESULTS:
            raise fail("result", f"{result!r} is not one of {', '.join(TRANSFER_RESULTS)}")
        if value and not re.match(r"(sips?|tel):\S+$", value):
            raise fail("expect_refer", f"not a sip:, sips: or tel: URI: {value!r} ('' = any)")
        return ExpectRefer(**base, target=value, result=result, timeout_s=float(timeout or 15.0))
    if kind == "expect_no_dead_air":
        if not 0 < value <= 60:
            raise fail("expect_no_dead_air", "seconds, above 0 and at most 60")
        return NoDeadAir(**base, max_s=float(value))
    if value is not True:
        raise fail("hangup", "write hangup = true")
    return CallerHangup(**base)


def _barge(entry: dict[str, Any], s: Script, fail: Any) -> dict[str, Any]:
    within = entry.get("within_ms", s.within_ms)
    if within < 20:
        raise fail("within_ms", "must be at least 20")
    if "within_ms" in entry and entry.get("barge_in") is not True:
        raise fail("within_ms", "applies to barge_in = true only")
    return {"barge_in": entry.get("barge_in"), "within_ms": within}


def _speak(entry: dict[str, Any], kind: str, s: Script, base: dict[str, Any], fail: Any) -> Speak:
    value: str = entry[kind]
    voice = entry.get("voice")
    if voice is not None:
        _check_voice(voice, fail, "voice")
    rate = entry.get("rate_wpm")
    if rate is not None and not 80 <= rate <= 450:
        raise fail("rate_wpm", "must be 80-450")
    gain = float(entry.get("gain_db", 0.0))
    if not -40 <= gain <= 20:
        raise fail("gain_db", "must be -40 to 20 dB")
    common = {"voice": voice, "rate_wpm": rate, "gain_db": gain, **_barge(entry, s, fail)}
    if kind == "say":
        if not value.strip():
            raise fail("say", "nothing to say")
        return Speak(**base, text=value.strip(), **common)
    wav = Path(value) if Path(value).is_absolute() else s.path.parent / value
    if not is_file(wav):
        raise fail("play", f"no such file: {wav}")
    return Speak(**base, wav=wav, **common)

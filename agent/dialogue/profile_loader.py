# size: the whole agent-profile schema, one builder per table, so every key's check (file:line: key)
#       is in one file
"""Reading an agent profile: the schema, the line finder for messages, and the builders
that turn TOML tables into :mod:`agent.dialogue.profile`'s frozen dataclasses (kept apart from them
so each file stays readable). Entry point: :func:`agent.dialogue.profile.load_profile`."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn
from urllib.parse import urlsplit

from agent.dialogue.backchannel import MAX_WORDS
from agent.dialogue.business_hours import BusinessHours, parse_hours
from agent.dialogue.profile import (
    BUILTINS,
    DTMF_KEYS,
    Actions,
    AgentProfile,
    BargeIn,
    Fallback,
    Filler,
    Intent,
    Limits,
    LlmSettings,
    Lookup,
    Matching,
    ProfileError,
    SlotSpec,
    Template,
    TransferSettings,
    Voice,
    parse_template,
)
from agent.dialogue.slot_loader import SLOT_TYPES, build_slot_rules
from agent.dialogue.slot_rules import KEYED
from agent.dialogue.toml_source import as_written
from agent.dialogue.transfer_target import target_problem
from agent.voice_settings import SPEECH_LANGUAGES
from agent.words import normalize

__all__ = ["load_profile"]

_NUM, _INT, _STR, _BOOL, _LIST, _TABLE = (int, float), (int,), (str,), (bool,), (list,), (dict,)


def _keys(types: tuple[type, ...], names: str) -> dict[str, tuple[type, ...]]:
    return dict.fromkeys(names.split(), types)


_ACTIONS = _keys(_STR, "reply send_dtmf transfer") | {"set": _TABLE, "hangup": _BOOL}
_SCHEMA: dict[str, dict[str, tuple[type, ...]]] = {
    "agent": _keys(_STR, "name greeting language filler")
    | {"filler_tone_hz": _NUM, "filler_after_ms": _INT},
    "variables": {},
    "matching": _keys(_NUM, "fuzzy_threshold example_threshold phrase_boost") | {"phrases": _LIST},
    "limits": {"max_turns": _INT, "max_call_s": _NUM, "no_input_s": _NUM, "no_input_prompts": _INT}
    | _keys(_STR, "closing no_input_reply no_input_goodbye"),
    "fallback": _keys(_STR, "escalate_reply escalate_transfer transfer_failed")
    | {"replies": _LIST, "escalate_after": _INT},
    "barge_in": {"enabled": _BOOL, "min_speech_ms": _INT, "backchannels": _LIST},
    "voice": {"length_scale": _NUM},
    "transfer": {"hold_audio": _STR},
    "hours": _keys(_STR, "timezone after_hours_profile mon tue wed thu fri sat sun")
    | {"holidays": _LIST},
    "llm": _keys(_STR, "mode base_url model api_key_env system_prompt")
    | _keys(_NUM, "temperature timeout_s")
    | {"max_tokens": _INT},
    "slots.*": _keys(_STR, "type prompt retry earliest latest confirm confirm_prompt invalid")
    | _keys(_INT, "min_length max_length max_days_ahead")
    | _keys(_NUM, "digit_timeout_s min max confirm_below")
    | {"options": _TABLE, "not_past": _BOOL, "sensitive": _BOOL, "weekdays": _LIST}
    | {"within_hours": _BOOL},
    "intents.*": _ACTIONS
    | _keys(_LIST, "keywords patterns examples slots no_to")
    | _keys(_STR, "dtmf not_found")
    | _keys(_TABLE, "lookup no")
    | {"override_llm": _BOOL},
    "intents.*.no": dict(_ACTIONS),
    "lookup": _keys(_STR, "table key as"),
}
_NAME = re.compile(r"[A-Za-z_][\w-]*")


def _line_of(text: str, section: str, key: str | None) -> int | None:
    """Line of `key` inside `[section]` (or of the section header), for messages."""
    current, section_line = "", None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        header = re.fullmatch(r"\[\s*([^\]]+?)\s*\]", line)
        if header:
            current = re.sub(r"[\s\"']", "", header.group(1))
            section_line = n if current == section else section_line
            continue
        if (
            key is not None
            and current == section
            and re.match(rf"\"?{re.escape(key)}\"?\s*=", line)
        ):
            return n
    if section_line is None and "." in section:  # an inline table: the parent's key line
        parent, _, last = section.rpartition(".")
        return _line_of(text, parent, last)
    return section_line


class _Loader:
    """Validates one file; every check raises ProfileError with the line it is about."""

    def __init__(self, path: str, text: str) -> None:
        self.path, self.text = path, text
        self.variables: dict[str, str] = {}  # [variables]: known before any call
        self.sensitive: set[str] = set()  # slots no template may speak back

    def transfer(self, section: str, key: str, source: str, known: set[str]) -> str:
        """A transfer target: literal, or a template of known names. One that the file
        alone decides ([variables] only) is checked now; one with a slot or a caller's
        value is checked by the bridge when the call reaches it."""
        t = self.template(section, key, source.strip(), known)
        if t.names <= set(self.variables):
            value = t.render(self.variables)
            why = target_problem(value)
            if why:
                said = f"{source.strip()!r} gives {value!r}: " if t.names else ""
                self.fail(section, key, said + why)
        return source.strip()

    def fail(self, section: str, key: str | None, message: str) -> NoReturn:
        dotted = f"{section}.{key}" if key else section
        raise ProfileError(self.path, _line_of(self.text, section, key), dotted, message)

    def table(self, section: str, value: Any, schema_name: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(section, None, "must be a [table]")
        schema = _SCHEMA[schema_name]
        for key, v in value.items():
            if schema_name == "variables":
                if not isinstance(v, str | int | float) or isinstance(v, bool):
                    self.fail(section, key, f"expected a string or number, got {v!r}")
                continue
            if key not in schema:
                self.fail(section, key, f"unknown key; allowed: {', '.join(sorted(schema))}")
            types = schema[key]
            if (isinstance(v, bool) and bool not in types) or not isinstance(v, types):
                want = " or ".join("table" if t is dict else t.__name__ for t in types)
                self.fail(section, key, f"expected {want}, got {v!r}")
            if isinstance(v, list) and not all(isinstance(x, str) for x in v):
                self.fail(section, key, "expected a list of strings")
        return value

    def template(self, section: str, key: str, source: str, known: set[str]) -> Template:
        try:
            t = parse_template(source)
        except ValueError as exc:
            self.fail(section, key, str(exc))
        for name in sorted(t.names & self.sensitive):
            self.fail(section, key, f"slot {name!r} is sensitive: a reply may not repeat it "
                      "(what the agent says is recorded and stored)")  # fmt: skip
        for name in sorted(t.names - known):
            self.fail(section, key, f"unknown placeholder {{{name}}}; known: {sorted(known)}")
        return t

    def number(self, section: str, key: str, value: float, low: float, high: float) -> None:
        if not low <= value <= high:
            self.fail(section, key, f"must be {low:g}..{high:g}, got {value!r}")


def load_profile(path: Path) -> AgentProfile:
    """Read and validate one agent profile (``file:line: key: message`` on any mistake)."""
    p = str(path)
    try:
        text = Path(p).read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(p, None, "file", f"cannot read: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise ProfileError(p, int(m.group(1)) if m else None, "syntax", str(exc)) from None
    return _build(_Loader(p, text), data)


def _build(ld: _Loader, data: dict[str, Any]) -> AgentProfile:
    top = {k for k in _SCHEMA if "." not in k and k != "lookup"} | {"slots", "intents", "data"}
    for name in data:
        if name not in top:
            ld.fail(name, None, f"unknown section; known: {', '.join(sorted(top))}")
    agent = ld.table("agent", data.get("agent", {}), "agent")
    if "greeting" not in agent:
        ld.fail("agent", "greeting", "is required")
    language = agent.get("language", "en")
    if language not in SPEECH_LANGUAGES:
        have = ", ".join(SPEECH_LANGUAGES)
        ld.fail("agent", "language", f"no speech models for {language!r} (the models speak {have})")
    variables = {
        k: str(v) for k, v in ld.table("variables", data.get("variables", {}), "variables").items()
    }
    ld.variables = variables
    tables = _build_data(ld, data.get("data", {}))
    raw_intents = data.get("intents", {})
    if not isinstance(raw_intents, dict) or not raw_intents:
        ld.fail("intents", None, "need at least one [intents.NAME] table")
    set_names = set()
    for iname, raw in raw_intents.items():
        raw = ld.table(f"intents.{iname}", raw, "intents.*")
        for part in (raw, raw.get("no", {})):
            set_names |= set(part.get("set", {}))
    known = set(BUILTINS) | set(variables) | set_names
    raw_slots = data.get("slots", {})
    if isinstance(raw_slots, dict):
        secret = (n for n, s in raw_slots.items() if isinstance(s, dict) and s.get("sensitive"))
        ld.sensitive = set(secret)
    slots = _build_slots(ld, raw_slots, known)
    intents = tuple(
        _build_intent(ld, name, raw, known, slots, tables) for name, raw in raw_intents.items()
    )
    seen: dict[str, str] = {}
    for it in intents:
        if it.dtmf and it.dtmf in seen:
            ld.fail(f"intents.{it.name}", "dtmf", f"key {it.dtmf!r} is also {seen[it.dtmf]}")
        seen[it.dtmf] = it.name
    fb = ld.table("fallback", data.get("fallback", {}), "fallback")
    replies = tuple(
        ld.template("fallback", "replies", r, known)
        for r in fb.get("replies", ["Sorry, I didn't catch that. Could you say it again?"])
    )
    if not replies:
        ld.fail("fallback", "replies", "need at least one reply")
    esc = fb.get("escalate_after", 0)
    ld.number("fallback", "escalate_after", esc, 0, 100)
    fallback = Fallback(
        replies=replies,
        escalate_after=esc,
        escalate_reply=_opt(ld, "fallback", "escalate_reply", fb, known),
        escalate_transfer=ld.transfer(
            "fallback", "escalate_transfer", fb["escalate_transfer"], known
        )
        if fb.get("escalate_transfer")
        else "",
        transfer_failed=_opt(ld, "fallback", "transfer_failed", fb, known),
    )
    lim = ld.table("limits", data.get("limits", {}), "limits")
    limits = Limits(
        max_turns=lim.get("max_turns", 0),
        max_call_s=float(lim.get("max_call_s", 0)),
        no_input_s=float(lim.get("no_input_s", 0)),
        no_input_prompts=lim.get("no_input_prompts", 2),
    )
    ld.number("limits", "max_turns", limits.max_turns, 0, 10_000)
    ld.number("limits", "max_call_s", limits.max_call_s, 0, 86_400)
    if limits.no_input_s:  # shorter than a caller takes to think is no silence
        ld.number("limits", "no_input_s", limits.no_input_s, 3, 600)
    ld.number("limits", "no_input_prompts", limits.no_input_prompts, 0, 10)
    limits = replace(
        limits,
        closing=_opt(ld, "limits", "closing", lim, known) or limits.closing,
        no_input_reply=_opt(ld, "limits", "no_input_reply", lim, known) or limits.no_input_reply,
        no_input_goodbye=_opt(ld, "limits", "no_input_goodbye", lim, known)
        or limits.no_input_goodbye,
    )
    bi = ld.table("barge_in", data.get("barge_in", {}), "barge_in")
    barge_in = BargeIn(**{k: v for k, v in bi.items() if k != "backchannels"})
    ld.number("barge_in", "min_speech_ms", barge_in.min_speech_ms, 0, 5000)
    if "backchannels" in bi:
        barge_in = replace(barge_in, backchannels=_build_backchannels(ld, bi["backchannels"]))
    vo = ld.table("voice", data.get("voice", {}), "voice")
    voice = Voice(float(vo.get("length_scale", 1.0)))
    ld.number("voice", "length_scale", voice.length_scale, 0.5, 2.0)
    ma = ld.table("matching", data.get("matching", {}), "matching")
    matching = Matching(
        **{k: float(v) for k, v in ma.items() if k != "phrases"},
        phrases=_phrases(ld, ma.get("phrases", [])),
    )
    for k in ("fuzzy_threshold", "example_threshold"):
        ld.number("matching", k, getattr(matching, k), 0.5, 1.0)
    ld.number("matching", "phrase_boost", matching.phrase_boost, 0.0, 2.0)
    return AgentProfile(
        hours=_build_hours(ld, data.get("hours")),
        name=agent.get("name", Path(ld.path).stem),
        language=language,
        greeting=ld.template("agent", "greeting", agent["greeting"], known),
        intents=intents,
        slots=MappingProxyType(slots),
        fallback=fallback,
        limits=limits,
        llm=_build_llm(ld, data.get("llm"), known),
        variables=MappingProxyType(variables),
        data=MappingProxyType(tables),
        barge_in=barge_in,
        voice=voice,
        matching=matching,
        filler=_build_filler(ld, agent),
        transfer=_build_transfer(ld, data.get("transfer", {})),
        path=ld.path,
    )


def _build_filler(ld: _Loader, agent: dict[str, Any]) -> Filler:
    f = Filler(
        text=" ".join(agent.get("filler", Filler.text).split()),
        tone_hz=float(agent.get("filler_tone_hz", Filler.tone_hz)),
        after_ms=agent.get("filler_after_ms", Filler.after_ms),
    )
    if f.tone_hz and not 100 <= f.tone_hz <= 3400:
        why = f"must be 0 (no tone) or 100..3400 Hz, got {f.tone_hz:g}"
        ld.fail("agent", "filler_tone_hz", why)
    # the filler must start before the caller has waited 1.5 s (a tick and pacing later)
    ld.number("agent", "filler_after_ms", f.after_ms, 200, 1300)
    if len(f.text) > 80:
        ld.fail("agent", "filler", "keep it short (at most 80 characters): it fills a wait")
    return f


def _build_transfer(ld: _Loader, raw: Any) -> TransferSettings:
    tr = ld.table("transfer", raw, "transfer")
    if not tr.get("hold_audio"):
        return TransferSettings()
    f = Path(tr["hold_audio"])
    f = f if f.is_absolute() else Path(ld.path).resolve().parent / f  # relative to the profile
    try:
        found = f.is_file()
    except (OSError, ValueError):
        found = False
    if not found:
        ld.fail("transfer", "hold_audio", f"no such file: {f}")
    from agent.lines.playback import load_wav  # scipy: only for profiles that have hold audio

    try:
        load_wav(f, 8000)
    except ValueError as exc:
        ld.fail("transfer", "hold_audio", str(exc))
    return TransferSettings(hold_audio=str(f))


def _build_backchannels(ld: _Loader, raw: list[str]) -> tuple[tuple[str, ...], ...]:
    out = []
    for text in raw:
        words = normalize(text)
        if not words:
            ld.fail("barge_in", "backchannels", f"{text!r} has no words")
        if len(words) > MAX_WORDS:
            ld.fail("barge_in", "backchannels", f"{text!r}: a backchannel is 1-{MAX_WORDS} words")
        out.append(words)
    return tuple(out)


def _phrases(ld: _Loader, raw: list[Any]) -> tuple[str, ...]:
    out = []
    for text in raw:
        words = normalize(text)  # a list of strings: checked with the table
        if not words:
            ld.fail("matching", "phrases", f"{text!r} has no words")
        out.append(" ".join(words))
    return tuple(out)


def _build_hours(ld: _Loader, raw: Any) -> BusinessHours | None:
    if raw is None:
        return None
    hours = ld.table("hours", raw, "hours")
    for key in ("timezone", "after_hours_profile"):
        if key not in hours:
            ld.fail("hours", key, "is required")
    f = Path(hours["after_hours_profile"])
    f = f if f.is_absolute() else Path(ld.path).resolve().parent / f  # relative to the profile
    try:
        found = f.is_file()
    except (OSError, ValueError):  # a name the OS refuses (too long, NUL)
        found = False
    if not found:
        ld.fail("hours", "after_hours_profile", f"no such file: {f}")
    try:
        return parse_hours(hours, str(f))
    except ValueError as exc:
        key, _, message = str(exc).partition(": ")
        ld.fail("hours", key, message)


def _opt(
    ld: _Loader, section: str, key: str, raw: dict[str, Any], known: set[str]
) -> Template | None:
    return ld.template(section, key, raw[key], known) if key in raw else None


def _build_data(ld: _Loader, raw: Any) -> dict[str, Mapping[str, Mapping[str, str]]]:
    if not isinstance(raw, dict):
        ld.fail("data", None, "must be a [table]")
    out: dict[str, Mapping[str, Mapping[str, str]]] = {}
    for tname, rows in raw.items():
        if not isinstance(rows, dict):
            ld.fail("data", tname, "must be a table of rows: [data.TABLE.KEY]")
        table: dict[str, Mapping[str, str]] = {}
        for key, row in rows.items():
            if not isinstance(row, dict):
                ld.fail(f"data.{tname}", key, "must be a row table: [data.TABLE.KEY] field = ...")
            for f, v in row.items():
                if isinstance(v, dict | list | bool):
                    ld.fail(f"data.{tname}.{key}", f, f"expected a string or number, got {v!r}")
            table[str(key)] = MappingProxyType({f: str(v) for f, v in row.items()})
        out[tname] = MappingProxyType(table)
    return out


def _build_slots(ld: _Loader, raw: Any, known: set[str]) -> dict[str, SlotSpec]:
    if not isinstance(raw, dict):
        ld.fail("slots", None, "must be a [table]")
    out = {}
    for name, spec in raw.items():
        sec = f"slots.{name}"
        spec = ld.table(sec, spec, "slots.*")
        kind = spec.get("type", "")
        if kind not in SLOT_TYPES:
            ld.fail(sec, "type", f"{kind!r} is not one of {', '.join(SLOT_TYPES)}")
        if "prompt" not in spec:
            ld.fail(sec, "prompt", "is required (the question that asks for the slot)")
        mine = known | set(raw)  # a prompt may repeat a slot filled earlier
        prompt = ld.template(sec, "prompt", spec["prompt"], mine)
        lo, hi = spec.get("min_length", 1), spec.get("max_length", 20)
        ld.number(sec, "min_length", lo, 1, 64)
        ld.number(sec, "max_length", hi, lo, 64)
        retry = _opt(ld, sec, "retry", spec, mine) or prompt
        timeout = float(spec.get("digit_timeout_s", SlotSpec.digit_timeout_s))
        if "digit_timeout_s" in spec and kind not in KEYED:
            ld.fail(sec, "digit_timeout_s", f"only {', '.join(KEYED)} slots have keypad entry")
        ld.number(sec, "digit_timeout_s", timeout, 1, 30)
        sensitive = spec.get("sensitive", False)
        slot = SlotSpec(name, kind, prompt, retry, lo, hi, timeout, sensitive=sensitive)
        out[name] = build_slot_rules(ld, sec, slot, spec, mine)
    return out


def _build_actions(ld: _Loader, sec: str, raw: dict[str, Any], known: set[str]) -> Actions:
    if "reply" not in raw:
        ld.fail(sec, "reply", "is required")
    sets = []
    for var, src in raw.get("set", {}).items():
        if not isinstance(src, str):
            ld.fail(f"{sec}.set", var, f"expected str, got {src!r}")
        sets.append((var, ld.template(f"{sec}.set", var, src, known)))
    dtmf = raw.get("send_dtmf", "")
    if any(c not in DTMF_KEYS for c in dtmf):
        ld.fail(sec, "send_dtmf", f"only {DTMF_KEYS} allowed, got {dtmf!r}")
    if "transfer" in raw and not raw["transfer"].strip():
        ld.fail(sec, "transfer", "must name a target (SIP URI or number)")
    return Actions(
        reply=ld.template(sec, "reply", raw["reply"], known),
        set=tuple(sets),
        send_dtmf=dtmf,
        transfer=ld.transfer(sec, "transfer", raw["transfer"], known) if "transfer" in raw else "",
        hangup=raw.get("hangup", False),
    )


def _build_intent(
    ld: _Loader,
    name: str,
    raw: dict[str, Any],
    known: set[str],
    slots: Mapping[str, SlotSpec],
    tables: Mapping[str, Mapping[str, Mapping[str, str]]],
) -> Intent:
    sec = f"intents.{name}"
    if not _NAME.fullmatch(name):
        ld.fail(sec, None, "intent names are letters, digits, '_' and '-'")
    for s in raw.get("slots", []):
        if s not in slots:
            ld.fail(sec, "slots", f"unknown slot {s!r}; defined: {sorted(slots)}")
    mine = known | set(raw.get("slots", []))
    lookup = None
    if "lookup" in raw:
        lk = ld.table(f"{sec}.lookup", raw["lookup"], "lookup")
        table, key, alias = lk.get("table", ""), lk.get("key", ""), lk.get("as", "")
        if table not in tables:
            ld.fail(sec, "lookup", f"no table data.{table!r}; defined: {sorted(tables)}")
        if key not in raw.get("slots", []):
            ld.fail(sec, "lookup", f"key {key!r} must be one of this intent's slots")
        if not _NAME.fullmatch(alias or "?"):
            ld.fail(sec, "lookup", "needs as = NAME (templates then use {NAME.field})")
        if "not_found" not in raw:
            ld.fail(sec, "not_found", "is required with lookup (said when no row matches)")
        lookup = Lookup(table, key, alias, ld.template(sec, "not_found", raw["not_found"], mine))
        fields = [set(r) for r in tables[table].values()]  # in every row: safe to render
        mine = mine | {f"{alias}.{f}" for f in (set.intersection(*fields) if fields else ())}
    patterns = []
    for src in raw.get("patterns", []):
        try:
            patterns.append(re.compile(src, re.IGNORECASE))
        except re.error as exc:  # the pattern as the file has it, not Python's escaping
            ld.fail(sec, "patterns", f"bad regular expression {as_written(ld.text, src)}: {exc}")
    dtmf = raw.get("dtmf", "")
    if dtmf and (len(dtmf) != 1 or dtmf not in DTMF_KEYS.replace("#", "")):
        ld.fail(sec, "dtmf", f"one key of 0-9 * A-D, got {dtmf!r} ('#' ends digit entry)")
    keywords = tuple(k for k in (normalize(w) for w in raw.get("keywords", [])) if k)
    examples = tuple(k for k in (normalize(w) for w in raw.get("examples", [])) if k)
    no_to = tuple(normalize(q) for q in raw.get("no_to", []))
    if not all(no_to):
        ld.fail(sec, "no_to", "each entry must be words of a question the agent asks")
    if not (keywords or patterns or examples or dtmf or no_to):
        ld.fail(sec, None, "can never match: give keywords, patterns, examples, dtmf or no_to")
    on_no = None
    if "no" in raw:
        if not any(slots[s].kind == "yes_no" for s in raw.get("slots", [])):
            ld.fail(sec, "no", "needs a yes_no slot in this intent's slots")
        on_no = _build_actions(
            ld, f"{sec}.no", ld.table(f"{sec}.no", raw["no"], "intents.*.no"), mine
        )
    return Intent(
        name=name,
        keywords=keywords,
        patterns=tuple(patterns),
        examples=examples,
        dtmf=dtmf,
        slots=tuple(raw.get("slots", [])),
        then=_build_actions(ld, sec, raw, mine),
        on_no=on_no,
        lookup=lookup,
        override_llm=raw.get("override_llm", False),
        no_to=no_to,
    )


def _build_llm(ld: _Loader, raw: Any, known: set[str]) -> LlmSettings | None:
    if raw is None:
        return None
    raw = ld.table("llm", raw, "llm")
    mode = raw.get("mode", "fallback")
    if mode not in ("off", "fallback", "primary"):
        ld.fail("llm", "mode", f"{mode!r} is not one of off, fallback, primary")
    for key in ("base_url", "model"):
        if not raw.get(key):
            ld.fail("llm", key, "is required")
    url = urlsplit(raw["base_url"])
    if url.scheme != "http" or not url.hostname:
        ld.fail("llm", "base_url", f"need http://HOST[:PORT][/v1], got {raw['base_url']!r}")
    s = LlmSettings(
        mode="primary" if mode == "primary" else "fallback",
        base_url=raw["base_url"],
        model=raw["model"],
        api_key_env=raw.get("api_key_env", ""),
        system_prompt=ld.template("llm", "system_prompt", raw.get("system_prompt", ""), known),
        temperature=float(raw.get("temperature", 0.3)),
        max_tokens=raw.get("max_tokens", 150),
        timeout_s=float(raw.get("timeout_s", 10.0)),
    )
    ld.number("llm", "temperature", s.temperature, 0, 2)
    ld.number("llm", "max_tokens", s.max_tokens, 1, 4096)
    ld.number("llm", "timeout_s", s.timeout_s, 0.1, 120)
    return None if mode == "off" else s

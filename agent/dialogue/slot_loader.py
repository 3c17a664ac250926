"""A profile's ``[slots.NAME]`` rules per slot type, checked when the profile loads (the rest
of the profile: :mod:`agent.dialogue.profile_loader`). Each type takes only its own keys, so a
``min`` on a date slot is a mistake with its line, not a rule silently ignored."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, NoReturn, Protocol

from agent.dialogue.business_hours import DAYS
from agent.dialogue.profile import SlotSpec, Template, parse_template
from agent.dialogue.slot_rules import KEYED, confirm_format
from agent.words import normalize

__all__ = ["SLOT_TYPES", "build_slot_rules"]

SLOT_TYPES = ("digits", "yes_no", "date", "time", "number", "choice", "text")
_COMMON = {
    "type", "prompt", "retry", "confirm", "confirm_prompt", "confirm_below", "invalid", "sensitive"
}  # fmt: skip
_OWN = {
    "digits": {"min_length", "max_length", "digit_timeout_s"},
    "yes_no": set(),
    "date": {"not_past", "max_days_ahead", "weekdays", "within_hours", "digit_timeout_s"},
    "time": {"earliest", "latest", "within_hours", "digit_timeout_s"},
    "number": {"min", "max", "digit_timeout_s"},
    "choice": {"options"},
    "text": set(),
}
_HHMM = re.compile(r"([01]\d|2[0-3]):[0-5]\d")


class _Checks(Protocol):
    def fail(self, section: str, key: str | None, message: str) -> NoReturn: ...
    def template(self, section: str, key: str, source: str, known: set[str]) -> Template: ...
    def number(self, section: str, key: str, value: float, low: float, high: float) -> None: ...


def build_slot_rules(
    ld: _Checks, sec: str, slot: SlotSpec, spec: dict[str, Any], known: set[str]
) -> SlotSpec:
    """``slot`` with the rules of its type from ``spec`` (keys and values checked)."""
    kind = slot.kind
    for key in spec:
        if key not in _COMMON | _OWN[kind]:
            owners = [t for t, keys in _OWN.items() if key in keys]
            ld.fail(sec, key, f"only a {' or '.join(owners)} slot takes {key} (this is {kind})")
    confirm = spec.get("confirm", "auto")
    if confirm not in ("auto", "always", "never"):
        ld.fail(sec, "confirm", f"{confirm!r} is not one of auto, always, never")
    if slot.sensitive and kind not in KEYED:
        kinds = f"{', '.join(KEYED[:-1])} or {KEYED[-1]}"
        ld.fail(sec, "sensitive", f"only a {kinds} slot can be sensitive "
                "(a PIN, a card number)")  # fmt: skip
    default = f"{{{slot.name}{confirm_format(slot)}}}, is that right?"
    asked = spec.get("confirm_prompt")
    if slot.sensitive and not asked and confirm == "always":  # the default repeats the value
        ld.fail(sec, "confirm", "a sensitive slot's value is never spoken back: give a "
                "confirm_prompt that does not repeat it, or confirm = \"never\"")  # fmt: skip
    # a sensitive slot is confirmed only with its own prompt (which may not name it)
    confirm_prompt = (
        ld.template(sec, "confirm_prompt", asked, known)
        if asked
        else None
        if slot.sensitive
        else parse_template(default)
    )
    invalid = ld.template(sec, "invalid", spec["invalid"], known) if "invalid" in spec else None
    below = spec.get("confirm_below", 0.0)  # types: the profile loader's schema
    ld.number(sec, "confirm_below", below, 0.0, 1.0)
    within = spec.get("within_hours", True)
    slot = replace(slot, confirm=confirm, confirm_prompt=confirm_prompt, invalid=invalid,
                   confirm_below=float(below), within_hours=within)  # fmt: skip
    if kind == "date":
        ahead = spec.get("max_days_ahead", slot.max_days_ahead)
        ld.number(sec, "max_days_ahead", ahead, 0, 3660)
        days = spec.get("weekdays", list(DAYS))
        if not days or any(d not in DAYS for d in days):
            ld.fail(sec, "weekdays", f"a list of {', '.join(DAYS)}, got {days!r}")
        weekdays = tuple(sorted({DAYS.index(d) for d in days}))
        not_past = spec.get("not_past", True)
        return replace(slot, min_length=4, max_length=4, max_days_ahead=ahead,
                       weekdays=weekdays, not_past=not_past)  # fmt: skip
    if kind == "time":
        earliest, latest = spec.get("earliest", "00:00"), spec.get("latest", "23:59")
        for key, v in (("earliest", earliest), ("latest", latest)):
            if not _HHMM.fullmatch(v):
                ld.fail(sec, key, f'{v!r} is not a time of day "HH:MM" (24-hour)')
        if latest < earliest:
            ld.fail(sec, "latest", f"{latest} is before earliest ({earliest})")
        return replace(slot, min_length=4, max_length=4, earliest=earliest, latest=latest)
    if kind == "number":
        low, high = spec.get("min"), spec.get("max")
        if low is not None and high is not None and high < low:
            ld.fail(sec, "max", f"{high} is below min ({low})")
        width = len(str(int(abs(high)))) if high is not None else 9
        return replace(slot, minimum=low, maximum=high, min_length=1, max_length=width)
    if kind == "choice":
        return replace(slot, options=_options(ld, sec, spec.get("options")))
    return slot


def _options(
    ld: _Checks, sec: str, raw: Any
) -> tuple[tuple[str, tuple[tuple[str, ...], ...]], ...]:
    """``[slots.X.options] cleaning = ["hygiene", "scale and polish"]``: each option's name
    and its synonyms as normalized phrases; a phrase may belong to one option only."""
    if not isinstance(raw, dict) or not raw:
        ld.fail(sec, "options", 'need a table of options: name = ["synonym", ...]')
    owner: dict[tuple[str, ...], str] = {}
    out = []
    for name, synonyms in raw.items():
        if not isinstance(synonyms, list) or not all(isinstance(x, str) for x in synonyms):
            ld.fail(f"{sec}.options", name, "expected a list of synonyms (strings)")
        phrases = []
        for said in (name.replace("_", " "), *synonyms):
            words = normalize(said)
            if not words:
                continue
            if owner.setdefault(words, name) != name:
                ld.fail(f"{sec}.options", name, f"{said!r} is also {owner[words]}")
            phrases.append(words)
        out.append((name, tuple(phrases)))
    return tuple(out)

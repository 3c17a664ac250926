"""What a slot of each type accepts: reading it from words or keys, checking it against the
slot's rules, and whether to ask the caller to confirm it. Pure; the dialogue engine
(:mod:`agent.dialogue.engine`) asks, the profile (:class:`agent.dialogue.profile.SlotSpec`)
decides."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from agent.dialogue.business_hours import BusinessHours
from agent.dialogue.formatters import time_spoken
from agent.dialogue.profile import SlotSpec
from agent.dialogue.slot_values import (
    WEEKDAYS,
    Heard,
    date_from_keys,
    read_choice,
    read_date,
    read_number,
    read_time,
    time_from_keys,
)
from agent.dialogue.spoken_numbers import digit_runs, yes_no
from agent.words import normalize

__all__ = [
    "HESITATIONS",
    "KEYED",
    "PREFILLED",
    "confirm_format",
    "from_keys",
    "hear",
    "needs_confirmation",
    "problem",
    "settle",
]

#: Sounds a caller makes while thinking, as the ASR spells them: no part of a free-text
#: answer ("Um, Bob Jones." is "Bob Jones"; "Um," alone is no name yet: the caller is still
#: thinking, and the agent's retry waits for them to go on).
HESITATIONS = frozenset(("um", "umm", "uh", "uhm", "er", "erm", "ah", "eh", "hmm", "mm"))

#: Slot types typed on the keypad as an entry (ended by '#', its length or a pause).
KEYED = ("digits", "date", "time", "number")
#: Slot types filled from the words that started an intent ("book a cleaning tomorrow").
PREFILLED = ("digits", "date", "time", "choice")


def hear(slot: SlotSpec, words: Sequence[str], text: str, today: dt.date) -> Heard | None:
    """The slot's value in what the caller said; None when it is not there."""
    if slot.kind == "yes_no":
        answer = yes_no(words)
        return Heard(answer) if answer else None
    if slot.kind == "digits":
        run = next(
            (r for r in digit_runs(words) if slot.min_length <= len(r) <= slot.max_length), None
        )
        return Heard(run) if run else None
    if slot.kind == "date":
        return read_date(words, today)
    if slot.kind == "time":
        return settle(slot, read_time(words))
    if slot.kind == "number":
        return read_number(words)
    if slot.kind == "choice":
        return read_choice(words, dict(slot.options))
    return _free_text(text)


def _free_text(text: str) -> Heard | None:
    """The words as heard, without hesitations at either end (the template ends them)."""
    tokens = text.split()
    while tokens and all(w in HESITATIONS for w in normalize(tokens[0])):
        tokens.pop(0)
    while tokens and all(w in HESITATIONS for w in normalize(tokens[-1])):
        tokens.pop()
    said = " ".join(tokens).rstrip(".!?,;: ")
    return Heard(said) if said else None


def from_keys(slot: SlotSpec, keys: str, today: dt.date) -> Heard | None:
    """A keypad entry as the slot's value: DDMM, HHMM, a number, digits."""
    if slot.kind == "date":
        return date_from_keys(keys, today)
    if slot.kind == "time":
        return time_from_keys(keys)
    if slot.kind == "number":
        return Heard(str(int(keys))) if keys.isdigit() else None
    return Heard(keys) if slot.min_length <= len(keys) <= slot.max_length else None


def settle(slot: SlotSpec, heard: Heard | None) -> Heard | None:
    """A time said without am/pm is sure when only one reading fits the slot's hours
    ("half past two" for an office open 08:00-18:00 is 14:30)."""
    if heard is None or heard.sure or slot.kind != "time":
        return heard
    h, m = (int(x) for x in heard.value.split(":"))
    other = f"{(h + 12) % 24:02d}:{m:02d}"
    fits = [v for v in (heard.value, other) if slot.earliest <= v <= slot.latest]
    return Heard(fits[0]) if len(fits) == 1 else heard


def problem(
    slot: SlotSpec,
    value: str,
    today: dt.date,
    hours: BusinessHours | None = None,
    day: dt.date | None = None,
) -> str | None:
    """Why a value the caller gave is not allowed, as a sentence to say; None when it is.
    ``hours``: the profile's business hours (a slot ``within_hours`` keeps to them);
    ``day``: the date already chosen, for a time."""
    shop = hours if slot.within_hours else None
    if slot.kind == "date":
        day = dt.date.fromisoformat(value)
        if slot.not_past and day < today:
            return "That day has already passed."
        if (day - today).days > slot.max_days_ahead:
            return f"I can only book up to {slot.max_days_ahead} days ahead."
        if day.weekday() not in slot.weekdays or (
            shop is not None and not shop.week[day.weekday()]
        ):
            return f"We're closed on {WEEKDAYS[day.weekday()].capitalize()}s."
        if shop is not None and not shop.ranges_on(day):
            return "We're closed that day."
    elif slot.kind == "time":
        if not slot.earliest <= value <= slot.latest:
            open_ = f"{time_spoken(slot.earliest)} to {time_spoken(slot.latest)}"
            return f"That's outside our hours, {open_}."
        h, m = (int(x) for x in value.split(":"))
        if shop is not None and not shop.opens_at(h * 60 + m, day):
            return _not_open(shop, day)
    elif slot.kind == "number":
        n = float(value)
        low, high = slot.minimum, slot.maximum
        if (low is not None and n < low) or (high is not None and n > high):
            lo = "" if low is None else f"at least {low:g}"
            hi = "" if high is None else f"at most {high:g}"
            return f"It has to be {' and '.join(x for x in (lo, hi) if x)}."
    return None


def confirm_format(slot: SlotSpec) -> str:
    """How the default confirmation says the value."""
    return {"date": ":date:spoken", "time": ":time:spoken"}.get(slot.kind, "")


def needs_confirmation(slot: SlotSpec, heard: Heard, confidence: float = 1.0) -> bool:
    """Ask the caller back: always, or (auto) when the words left a doubt ("one": the
    first?) or the ASR was less sure of them than the slot's ``confirm_below``."""
    unsure = not heard.sure or confidence < slot.confirm_below
    return slot.confirm == "always" or (slot.confirm == "auto" and unsure)


def _not_open(hours: BusinessHours, day: dt.date | None) -> str:
    """A time outside the hours, said with the hours that apply: the chosen day's, or the
    week's when every open day keeps the same ones."""
    if day is not None:
        return f"We're not open then. That day we're open {_spoken(hours.ranges_on(day))}."
    kept = {r for r in hours.week if r}
    if len(kept) == 1:
        return f"We're not open then. We're open {_spoken(kept.pop())}."
    return "We're not open at that time on any day."


def _spoken(ranges: tuple[tuple[int, int], ...]) -> str:
    """``((540, 780),)`` -> "9 am to 1 pm"."""
    return " and ".join(f"{time_spoken(_hhmm(a))} to {time_spoken(_hhmm(b))}" for a, b in ranges)


def _hhmm(minute: int) -> str:
    minute %= 24 * 60  # 24:00, the end of a day open till midnight, is said "midnight"
    return f"{minute // 60:02d}:{minute % 60:02d}"

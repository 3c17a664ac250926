"""Dates, times, numbers and choices as callers say or key them, read from ASR words.

Pure (no I/O, no clock: ``today`` is passed in). Each reader gives a :class:`Heard`: the
value in a canonical form (``2026-12-15``, ``14:30``, ``3``, the choice's name) and whether
it is *sure*. A value read from little evidence is not: a bare number for a date ("one
time" heard for "one thirty" fills the day with 1), a bare hour without am/pm outside
working hours. A slot with ``confirm = "auto"`` asks the caller before it uses an unsure
value. Keypad entries are sure: DDMM for a date, HHMM for a time.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent.dialogue.spoken_numbers import digit_runs
from agent.words import has_phrase

__all__ = [
    "MONTHS",
    "WEEKDAYS",
    "Heard",
    "date_from_keys",
    "read_choice",
    "read_date",
    "read_number",
    "read_time",
    "time_from_keys",
]

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
          "september", "october", "november", "december")  # fmt: skip
_MONTH_SHORT = {m[:3]: i + 1 for i, m in enumerate(MONTHS)} | {"sept": 9}
_ORDINALS = {
    "first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7,
    "eighth": 8, "ninth": 9, "tenth": 10, "eleventh": 11, "twelfth": 12, "thirteenth": 13,
    "fourteenth": 14, "fifteenth": 15, "sixteenth": 16, "seventeenth": 17, "eighteenth": 18,
    "nineteenth": 19, "twentieth": 20, "thirtieth": 30,
}  # fmt: skip
_TENS_ORD = {"twenty": 20, "thirty": 30}
_TEENS = {"thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17,
          "eighteen": 18, "nineteen": 19}  # fmt: skip
_HOURS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
          "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}  # fmt: skip


@dataclass(frozen=True)
class Heard:
    value: str
    sure: bool = True


# -- dates ---------------------------------------------------------------------------------


def _ordinal_at(words: Sequence[str], i: int) -> tuple[int | None, int]:
    """A day of the month said as an ordinal at ``words[i]``: "fifteenth", "twenty first",
    "15th", "3rd"; (None, 0) if there is none."""
    w = words[i]
    nxt = words[i + 1] if i + 1 < len(words) else ""
    if w in _TENS_ORD and nxt in _ORDINALS and _ORDINALS[nxt] < 10:
        return _TENS_ORD[w] + _ORDINALS[nxt], 2
    if w in _ORDINALS:
        return _ORDINALS[w], 1
    digits = w[:-2]
    if w[-2:] in ("st", "nd", "rd", "th") and digits.isdigit():
        return int(digits), 1
    return None, 0


def _month_at(words: Sequence[str], i: int) -> int | None:
    w = words[i] if 0 <= i < len(words) else ""
    return MONTHS.index(w) + 1 if w in MONTHS else _MONTH_SHORT.get(w)


def _next(today: dt.date, month: int | None, day: int) -> dt.date | None:
    """The next date (today included) with this day (and month); None if there is none."""
    for offset in range(0, 13):
        y, m = divmod(today.month - 1 + offset, 12)
        year, mon = today.year + y, m + 1
        if month is not None and mon != month:
            continue
        try:
            d = dt.date(year, mon, day)
        except ValueError:
            continue
        if d >= today:
            return d
    return None


def read_date(words: Sequence[str], today: dt.date) -> Heard | None:
    """ "today", "tomorrow", "yesterday", "the day after tomorrow", "monday", "next tuesday", "the
    fifteenth", "march 3rd", "the 3rd of march", "on the 15", "15 march" -> the date."""
    joined = " ".join(words)
    if "day after tomorrow" in joined:
        return Heard((today + dt.timedelta(days=2)).isoformat())
    if "tomorrow" in words:
        return Heard((today + dt.timedelta(days=1)).isoformat())
    if "today" in words:
        return Heard(today.isoformat())
    if "yesterday" in words:  # said, and refused by a slot that is not_past
        return Heard((today - dt.timedelta(days=1)).isoformat())
    for w in words:
        if w in WEEKDAYS:
            ahead = (WEEKDAYS.index(w) - today.weekday()) % 7 or 7  # on a Monday: the next
            return Heard((today + dt.timedelta(days=ahead)).isoformat())
    for i in range(len(words)):
        day, used = _ordinal_at(words, i)
        number = False
        if day is None and words[i].isdigit() and len(words[i]) <= 2:
            day, used, number = int(words[i]), 1, True
        if day is None:
            continue
        month = _month_at(words, i + used) or _month_at(words, i + used + 1)  # "of march"
        month = month or _month_at(words, i - 1)  # "march 3rd"
        d = _next(today, month, day) if 1 <= day <= 31 else None
        if d is not None:
            # a bare number with no month or "the" before it may be anything ("one time")
            sure = not number or month is not None or (i > 0 and words[i - 1] in ("the", "on"))
            return Heard(d.isoformat(), sure)
    for run in digit_runs(words):  # "one" -> 1: a day, but from very little evidence
        if len(run) <= 2 and 1 <= int(run) <= 31 and (d := _next(today, None, int(run))):
            return Heard(d.isoformat(), sure=False)
    return None


def date_from_keys(keys: str, today: dt.date) -> Heard | None:
    """DDMM on the keypad ("1503": the 15th of March, the next one); None if no such day."""
    if len(keys) != 4 or not keys.isdigit():
        return None
    day, month = int(keys[:2]), int(keys[2:])
    d = _next(today, month, day) if 1 <= month <= 12 and 1 <= day <= 31 else None
    return Heard(d.isoformat()) if d is not None else None


# -- times ---------------------------------------------------------------------------------


def _clock(hour: int, minute: int, half: str | None) -> tuple[int, int] | None:
    """24-hour time from an hour, minutes and "am"/"pm" (None: not said)."""
    if not 0 <= minute <= 59:
        return None
    if half is not None:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if half == "pm" else 0)
    return (hour, minute) if 0 <= hour <= 23 else None


def _half_of_day(words: Sequence[str], i: int) -> str | None:
    """ "pm", "p m", "in the afternoon", "in the evening" -> "pm"; "am" ... -> "am"."""
    rest = " ".join(words[i : i + 4])
    if rest.startswith(("pm", "p m", "in the afternoon", "in the evening", "at night")):
        return "pm"
    if rest.startswith(("am", "a m", "in the morning")):
        return "am"
    return None


def _word_hour(w: str) -> int | None:
    return _HOURS.get(w) or (int(w) if w.isdigit() and 1 <= int(w) <= 24 else None)


def read_time(words: Sequence[str]) -> Heard | None:
    """ "half past two", "quarter to three", "2:30 pm", "two thirty", "fourteen hundred",
    "noon", "3 o'clock" -> "HH:MM". A bare hour with no am/pm is read as working hours
    (1-7 as pm), and is not sure."""
    if "noon" in words or "midday" in words:
        return Heard("12:00")
    for i, w in enumerate(words):
        nxt = words[i + 1] if i + 1 < len(words) else ""
        # "half past two", "quarter past ten", "ten past three", "quarter to three"
        nxt = "past" if nxt == "passed" else nxt  # what ASR often writes for "past"
        if w in ("half", "quarter") or (w in ("five", "ten", "twenty") and nxt in ("past", "to")):
            mins = {"half": 30, "quarter": 15, "five": 5, "ten": 10, "twenty": 20}[w]
            if nxt in ("past", "to", "after") and i + 2 < len(words):
                hour = _word_hour(words[i + 2])
                if hour is not None:
                    if nxt == "to":
                        hour, mins = hour - 1, 60 - mins
                    return _heard_clock(hour, mins, _half_of_day(words, i + 3))
    runs = _time_numbers(words)
    for i, (hour, minute, used) in runs:
        half = _half_of_day(words, i + used)
        if used and words[i + used - 1] == "hundred" and minute == 0:  # "fourteen hundred"
            half = half or ("pm" if hour == 12 else None)
        return _heard_clock(hour, minute, half)
    return None


def _time_numbers(words: Sequence[str]) -> list[tuple[int, tuple[int, int, int]]]:
    """(index, (hour, minute, words used)) of each clock-like number: "2 30", "two thirty",
    "fourteen hundred", "1430", "three o clock", "3"."""
    out: list[tuple[int, tuple[int, int, int]]] = []
    i = 0
    while i < len(words):
        w = words[i]
        nxt = words[i + 1] if i + 1 < len(words) else ""
        hour = _word_hour(w)
        if w in _TEENS and nxt == "hundred":
            out.append((i, (_TEENS[w], 0, 2)))
        elif w.isdigit() and len(w) in (3, 4):  # "1430", "930"
            out.append((i, (int(w[:-2]), int(w[-2:]), 1)))
        elif hour is not None and nxt == "hundred":
            out.append((i, (hour, 0, 2)))
        elif (
            hour is not None
            and nxt in ("o", "oclock")
            and (nxt != "o" or _at(words, i + 2) == "clock")
        ):
            out.append((i, (hour, 0, 3 if nxt == "o" else 2)))
        elif hour is not None:
            minute, used = _minutes_at(words, i + 1)
            out.append((i, (hour, minute, 1 + used)))
        i += 1
        if out:
            break
    return out


def _at(words: Sequence[str], i: int) -> str:
    return words[i] if 0 <= i < len(words) else ""


def _minutes_at(words: Sequence[str], i: int) -> tuple[int, int]:
    """Minutes said after an hour: "30", "thirty", "fifteen", "oh five", "forty five"."""
    w, nxt = _at(words, i), _at(words, i + 1)
    if w.isdigit() and len(w) == 2:
        return int(w), 1
    tens = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50}
    teens = _TEENS | {"ten": 10, "eleven": 11, "twelve": 12}
    units = {k: v for k, v in _HOURS.items() if v < 10}
    if w in tens:
        return (tens[w] + units[nxt], 2) if nxt in units else (tens[w], 1)
    if w in teens:
        return teens[w], 1
    if w in ("oh", "o") and nxt in units:
        return units[nxt], 2
    return 0, 0


def _heard_clock(hour: int, minute: int, half: str | None) -> Heard | None:
    if half is None and 1 <= hour <= 7:
        hour += 12  # "at two": in the afternoon, for an office; ask to be sure
        t = _clock(hour, minute, None)
        return Heard(f"{t[0]:02d}:{t[1]:02d}", sure=False) if t else None
    t = _clock(hour, minute, half)
    return Heard(f"{t[0]:02d}:{t[1]:02d}") if t is not None else None


def time_from_keys(keys: str) -> Heard | None:
    """HHMM on the keypad ("1430"); None if it is no time of day."""
    if len(keys) != 4 or not keys.isdigit():
        return None
    t = _clock(int(keys[:2]), int(keys[2:]), None)
    return Heard(f"{t[0]:02d}:{t[1]:02d}") if t is not None else None


# -- numbers and choices -------------------------------------------------------------------


def read_number(words: Sequence[str]) -> Heard | None:
    """The first number said ("three", "twenty five", "2"); a second one makes it unsure."""
    runs = digit_runs(words)
    if not runs:
        return None
    return Heard(str(int(runs[0])), sure=len(runs) == 1)


def read_choice(
    words: Sequence[str], options: Mapping[str, Sequence[Sequence[str]]]
) -> Heard | None:
    """The option whose name or a synonym (normalized phrases) the caller said; None when
    none or more than one option was named."""
    said = {name for name, phrases in options.items() if any(has_phrase(words, p) for p in phrases)}
    return Heard(said.pop()) if len(said) == 1 else None

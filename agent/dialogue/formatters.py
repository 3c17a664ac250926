"""Template formatters: how a slot's value is said (``{day:ordinal}``, ``{when:date:spoken}``,
``{at:time:spoken}``, ``{number:spell}``). Pure; a value a formatter cannot read is said as
it is (rendering during a call never fails)."""

from __future__ import annotations

import datetime as dt

__all__ = ["FORMATS", "apply"]

FORMATS = ("spell", "ordinal", "date:spoken", "time:spoken")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")  # fmt: skip
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def ordinal(value: str) -> str:
    """ "1" -> "1st", "2" -> "2nd", "11" -> "11th", "23" -> "23rd" (TTS says "first")."""
    if not value.strip().isdigit():
        return value
    n = int(value)
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def date_spoken(value: str) -> str:
    """ "2026-12-15" -> "Tuesday the 15th of December"."""
    try:
        d = dt.date.fromisoformat(value)
    except ValueError:
        return value
    return f"{_DAYS[d.weekday()]} the {ordinal(str(d.day))} of {_MONTHS[d.month - 1]}"


def time_spoken(value: str) -> str:
    """ "14:30" -> "2:30 pm", "09:00" -> "9 am", "12:00" -> "12 noon", "00:00" -> "midnight"."""
    try:
        t = dt.time.fromisoformat(value)
    except ValueError:
        return value
    if (t.hour, t.minute) == (12, 0):
        return "12 noon"
    if (t.hour, t.minute) == (0, 0):
        return "midnight"
    hour = t.hour % 12 or 12
    clock = f"{hour}:{t.minute:02d}" if t.minute else str(hour)
    return f"{clock} {'pm' if t.hour >= 12 else 'am'}"


def apply(fmt: str, value: str) -> str:
    """``value`` as format ``fmt`` says ("" or unknown: as it is)."""
    if fmt == "spell":  # "12345" -> "1 2 3 4 5": TTS reads digits one by one
        return " ".join(c for c in value if not c.isspace())
    if fmt == "ordinal":
        return ordinal(value)
    if fmt == "date:spoken":
        return date_spoken(value)
    if fmt == "time:spoken":
        return time_spoken(value)
    return value

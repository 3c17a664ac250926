"""Business hours of an agent profile: outside them, calls get its after-hours profile.

A profile's ``[hours]`` table gives a time zone (IANA name: the call center's, not the
server's), opening ranges per weekday, holidays, and the profile that answers when
closed::

    [hours]
    timezone = "Europe/London"
    mon = "08:00-18:00"              # several ranges: "08:00-12:00, 13:00-17:00"
    sat = "09:00-13:00"              # a day left out is closed
    holidays = ["2026-12-25", "2026-12-26"]
    after_hours_profile = "after_hours.toml"

Pure: the bridge asks :meth:`BusinessHours.is_open` with the time a call arrives.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["DAYS", "BusinessHours", "parse_hours"]

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_RANGE = re.compile(r"(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})")

Minutes = tuple[tuple[int, int], ...]  # [start, end) minutes after midnight


@dataclass(frozen=True)
class BusinessHours:
    timezone: str
    week: tuple[Minutes, ...]  # Monday first
    holidays: frozenset[dt.date]
    after_hours_profile: str  # absolute path

    def is_open(self, when: dt.datetime) -> bool:
        """Whether ``when`` (aware, any zone) lies inside the hours, in their time zone."""
        local = when.astimezone(ZoneInfo(self.timezone))
        if local.date() in self.holidays:
            return False
        minute = local.hour * 60 + local.minute
        return any(a <= minute < b for a, b in self.week[local.weekday()])

    def ranges_on(self, day: dt.date) -> Minutes:
        """The opening ranges of ``day`` (none on a holiday or a closed weekday)."""
        return () if day in self.holidays else self.week[day.weekday()]

    def opens_at(self, minute: int, day: dt.date | None = None) -> bool:
        """Whether the office is open at ``minute`` after midnight: on ``day``, or on
        some day of the week when no day is given (a time asked before a date)."""
        days = [self.ranges_on(day)] if day is not None else list(self.week)
        return any(a <= minute < b for ranges in days for a, b in ranges)


def _ranges(value: str) -> Minutes:
    """``"08:00-12:00, 13:00-17:30"`` -> minutes; ValueError says what is wrong."""
    if value.strip().lower() == "closed":
        return ()
    out: list[tuple[int, int]] = []
    for part in value.split(","):
        m = _RANGE.fullmatch(part.strip())
        if m is None:
            raise ValueError(f'{part.strip()!r} is not "HH:MM-HH:MM"')
        h1, m1, h2, m2 = (int(g) for g in m.groups())
        if h1 > 23 or h2 > 24 or m1 > 59 or m2 > 59 or (h2 == 24 and m2):
            raise ValueError(f"{part.strip()!r} is not a time of day")
        a, b = h1 * 60 + m1, h2 * 60 + m2
        if b <= a:
            raise ValueError(f"{part.strip()!r} ends before it starts (split at midnight)")
        out.append((a, b))
    return tuple(sorted(out))


def parse_hours(raw: Mapping[str, object], after_hours_path: str) -> BusinessHours:
    """The ``[hours]`` table (keys already type-checked); ValueError names the bad key as
    ``key: message``."""
    tz = str(raw.get("timezone", ""))
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f'timezone: {tz!r} is not an IANA time zone ("Europe/London")') from None
    week: list[Minutes] = []
    for day in DAYS:
        try:
            week.append(_ranges(str(raw.get(day, "closed"))))
        except ValueError as exc:
            raise ValueError(f"{day}: {exc}") from None
    holidays: set[dt.date] = set()
    for h in raw.get("holidays", []):  # type: ignore[attr-defined]
        try:
            holidays.add(dt.date.fromisoformat(str(h)))
        except ValueError:
            raise ValueError(f"holidays: {h!r} is not a date (YYYY-MM-DD)") from None
    if not any(week):
        raise ValueError("mon: no day has opening hours (leave [hours] out to be always open)")
    return BusinessHours(tz, tuple(week), frozenset(holidays), after_hours_path)

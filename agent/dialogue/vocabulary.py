"""The phrases a caller is likely to say at a point of the dialogue: what the recogniser
leans toward (:mod:`agent.voice.phrase_bias`). No I/O, no state.

Always the intents' keywords and the profile's ``[matching] phrases``; while a slot is
asked for (or its value confirmed), the words its kind is answered with: digits for digit
and number slots, the options of a choice, days and months for a date, times of day for a
time, yes and no for a yes/no question or a confirmation. Not the intents' example
sentences: their everyday words ("when", "are", "you") would lean every turn.
"""

from __future__ import annotations

from agent.dialogue.profile import AgentProfile, SlotSpec
from agent.dialogue.slot_values import MONTHS, WEEKDAYS

__all__ = ["listening_phrases"]

_DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_YES_NO = ("yes", "yes please", "yeah", "no", "nope", "no thanks", "no thank you", "correct",
           "thats right", "that is right", "thats correct", "thats wrong")  # fmt: skip
_DAYS = (*WEEKDAYS, *MONTHS, "today", "tomorrow", "next week", "day after tomorrow")
_TIMES = ("oclock", "morning", "afternoon", "evening", "noon", "midday", "half past",
          "quarter past", "quarter to", "ten", "eleven", "twelve", *_DIGITS)  # fmt: skip


def listening_phrases(
    profile: AgentProfile, slot: SlotSpec | None = None, *, confirming: bool = False
) -> tuple[str, ...]:
    """What to listen for now: ``slot`` is the one asked for, if any; ``confirming``: a
    value is being confirmed ("is that right?")."""
    phrases: set[str] = set(profile.matching.phrases)
    for intent in profile.intents:
        phrases.update(" ".join(k) for k in intent.keywords)
    if confirming:
        phrases.update(_YES_NO)
    if slot is not None:
        phrases.update(_slot_words(slot))
    return tuple(sorted(p for p in phrases if p))


def _slot_words(slot: SlotSpec) -> tuple[str, ...]:
    if slot.kind in ("digits", "number"):
        return _DIGITS
    if slot.kind == "yes_no":
        return _YES_NO
    if slot.kind == "date":
        return _DAYS
    if slot.kind == "time":
        return _TIMES
    if slot.kind == "choice":
        return tuple(" ".join(words) for _, synonyms in slot.options for words in synonyms)
    return ()

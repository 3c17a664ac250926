"""Numbers and yes/no as callers say them, read from ASR words (no I/O, no state).

"one two three" and "1 2 3" -> "123", "twelve thirty four" -> "1234", "double five" ->
"55", "one hundred twenty three" -> "123"; "oh" is a zero only after another number, and
words ASR hears for digits ("to", "for", "won", "ate") count only between two numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["digit_runs", "yes_no"]

_UNITS = {"zero": 0, "oh": 0, "o": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5}
_UNITS |= {"six": 6, "seven": 7, "eight": 8, "nine": 9}
_TEENS = {"ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15}
_TEENS |= {"sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19}
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70}
_TENS |= {"eighty": 80, "ninety": 90}
# ASR homophones, read as digits only between two number words ("one to three" -> 123).
_SOUNDALIKE = {"to": "2", "too": "2", "for": "4", "won": "1", "ate": "8"}
_YES = {"yes", "yeah", "yep", "yup", "sure", "correct", "right", "ok", "okay", "affirmative"}
_YES |= {"absolutely", "definitely", "certainly", "indeed"}
_NO = {"no", "nope", "nah", "negative"}
_NEGATORS = {"not", "dont", "never"}
_PLAIN_YES, _PLAIN_NO = {"yes", "yep", "yup"}, {"no", "nope", "nah"}
_FILLERS = {"uh", "um", "er", "erm", "ah", "oh", "well", "hmm"}


def _number_at(words: Sequence[str], i: int) -> tuple[str | None, int]:
    """The digits spoken at ``words[i]`` and how many words they took."""
    w, nxt = words[i], (words[i + 1] if i + 1 < len(words) else "")
    if w.isdigit():
        return w, 1
    if w in ("double", "triple") and (nxt in _UNITS or (nxt.isdigit() and len(nxt) == 1)):
        d = nxt if nxt.isdigit() else str(_UNITS[nxt])
        return d * (2 if w == "double" else 3), 2
    if w in _UNITS and nxt == "hundred":
        value, j = _UNITS[w] * 100, i + 2
        j += j < len(words) and words[j] == "and"
        rest, used = _number_at(words, j) if j < len(words) else (None, 0)
        if rest is not None and len(rest) <= 2 and words[j] not in ("oh", "o"):
            return str(value + int(rest)), j - i + used
        return str(value), 2
    if w in _UNITS and w not in ("oh", "o"):
        return str(_UNITS[w]), 1
    if w in _TEENS:
        return str(_TEENS[w]), 1
    if w in _TENS:
        if nxt in _UNITS and _UNITS[nxt] > 0:
            return str(_TENS[w] + _UNITS[nxt]), 2
        return str(_TENS[w]), 1
    return None, 0


def digit_runs(words: Sequence[str]) -> list[str]:
    """Runs of spoken digits: "one two three" and "1 2 3" -> "123", "twelve thirty four" ->
    "1234", "double five" -> "55"; "oh" is a zero only after another number."""
    runs: list[str] = []
    cur: list[str] = []
    i = 0
    while i < len(words):
        piece, used = _number_at(words, i)
        w = words[i]
        between = cur and i + 1 < len(words) and _number_at(words, i + 1)[0] is not None
        if piece is None and cur and w in ("oh", "o"):
            piece, used = "0", 1
        elif piece is None and between and w in _SOUNDALIKE:
            piece, used = _SOUNDALIKE[w], 1
        if piece is None:
            if cur:
                runs.append("".join(cur))
                cur = []
            i += 1
            continue
        cur.append(piece)
        i += used
    if cur:
        runs.append("".join(cur))
    return runs


def _answers(words: Sequence[str]) -> list[tuple[str, bool]]:
    """Each answer said, in order: "yes", "no" or "unsure", and whether it was a negation.

    A negator turns a yes word up to two words after it around: "that's not right" is one
    no, not a yes and a no; "not sure" is neither."""
    out: list[tuple[str, bool]] = []
    i = 0
    while i < len(words):
        w = words[i]
        if w in _NEGATORS:
            after = words[i + 1 : i + 3]
            turned = next((k for k, x in enumerate(after) if x in _YES), None)
            if turned is None:
                out.append(("no", True))
            else:
                out.append(("unsure" if after[turned] == "sure" else "no", True))
                i += turned + 1
        elif w in _YES:
            out.append(("yes", False))
        elif w in _NO:
            out.append(("no", False))
        i += 1
    return out


def yes_no(words: Sequence[str]) -> str | None:
    """ "yes", "no", or None when the answer is neither, unsure or both.

    When both are heard, a plain yes or no that opens the answer decides over a negation
    later ("yes, not been right" is how the recogniser may hear "yes, that is right" on a
    lossy line); a second plain answer word ("yes, no, ...", "no, that's right") leaves it
    undecided."""
    answers = _answers(words)
    kinds = {kind for kind, _ in answers}
    if "unsure" in kinds or not kinds:
        return None
    if len(kinds) == 1:
        return kinds.pop()
    opening = next((w for w in words if w not in _FILLERS), "")
    lead = "yes" if opening in _PLAIN_YES else "no" if opening in _PLAIN_NO else None
    if lead is not None and all(kind == lead or negation for kind, negation in answers):
        return lead
    return None

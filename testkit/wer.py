"""Word error rate: a reference and a transcript as words, and the edits between them.

Both sides go through :func:`wer_words`, so a transcript is not charged for writing "1"
where the reference says "one", "#" for "pound" or "fifteenth" for "15th": the agent's own
word rule (:func:`agent.words.normalize`: lower case, no punctuation), then every run of
spoken or written numbers as its digits (:func:`agent.dialogue.spoken_numbers.digit_runs`:
"one two three", "1 2 3" and "123" are all "123"; "twenty eight" is "28"), ordinals as
digits with their suffix ("fifteenth", "15th"), hyphenated words as one ("Good-bye" is
"goodbye"), the keypad's symbols as the words a prompt says for them, and notes in
brackets (``[beep]``, ``(10 seconds of silence)``, ``<beep>``) as no words at all.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from agent.dialogue.spoken_numbers import digit_runs
from agent.words import normalize

__all__ = ["WordErrors", "wer_words", "word_errors"]

_SYMBOLS = {"*": " star ", "#": " pound ", "%": " percent ", "&": " and ", "+": " plus "}
_DECIMAL = re.compile(r"(\d)\.(\d)")  # "28.8" is said "twenty eight point eight"
# "[ascending tones]", "(10 seconds of silence)", "<beep ascending>": notes, not words
_NOTES = re.compile(r"\[[^\]]*\]|\([^)]*\)|<[^>]*>")
_HYPHENATED = re.compile(r"\b[A-Za-z]+(?:-[A-Za-z]+)+\b")
_ORDINAL_DIGITS = re.compile(r"^(\d+)(st|nd|rd|th)$")
_ORDINALS = {"first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6}
_ORDINALS |= {"seventh": 7, "eighth": 8, "ninth": 9, "tenth": 10, "eleventh": 11}
_ORDINALS |= {"twelfth": 12, "thirteenth": 13, "fourteenth": 14, "fifteenth": 15}
_ORDINALS |= {"sixteenth": 16, "seventeenth": 17, "eighteenth": 18, "nineteenth": 19}
_ORDINALS |= {"twentieth": 20, "thirtieth": 30, "fortieth": 40, "fiftieth": 50}
_ORDINALS |= {"sixtieth": 60, "seventieth": 70, "eightieth": 80, "ninetieth": 90}
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60}
_TENS |= {"seventy": 70, "eighty": 80, "ninety": 90}


def _suffix(n: int) -> str:
    if n % 100 in (11, 12, 13):
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


def _is_number(words: Sequence[str], i: int) -> bool:
    """``words[i]`` belongs to a spoken or written number ("hundred" only after one)."""
    w = words[i]
    if w == "hundred":
        return i > 0 and _is_number(words, i - 1)
    return w.isdigit() or (w not in ("oh", "o") and bool(digit_runs([w])))


def _compound(m: re.Match[str]) -> str:
    """ "Good-bye" is "goodbye", "X-ray" "xray"; "twenty-one" stays two number words."""
    parts = m.group(0).split("-")
    return " ".join(parts) if any(digit_runs([p.lower()]) for p in parts) else "".join(parts)


def wer_words(text: str) -> tuple[str, ...]:
    """The words of ``text`` as the word error rate compares them (see the module)."""
    text = _NOTES.sub(" ", text)
    text = _HYPHENATED.sub(_compound, text)
    text = _DECIMAL.sub(r"\1 point \2", text)
    for symbol, word in _SYMBOLS.items():
        text = text.replace(symbol, word)
    words = list(normalize(text))
    out: list[str] = []
    i = 0
    while i < len(words):
        w, nxt = words[i], words[i + 1] if i + 1 < len(words) else ""
        if w in _TENS and nxt in _ORDINALS and _ORDINALS[nxt] < 10:  # "twenty first"
            n = _TENS[w] + _ORDINALS[nxt]
            out.append(f"{n}{_suffix(n)}")
            i += 2
        elif w in _ORDINALS:
            out.append(f"{_ORDINALS[w]}{_suffix(_ORDINALS[w])}")
            i += 1
        elif m := _ORDINAL_DIGITS.match(w):
            n = int(m.group(1))
            out.append(f"{n}{_suffix(n)}")
            i += 1
        elif _is_number(words, i):
            j = i
            while j < len(words) and _is_number(words, j):
                j += 1
            out.extend(digit_runs(words[i:j]))
            i = j
        else:
            out.append(w)
            i += 1
    return tuple(out)


@dataclass(frozen=True)
class WordErrors:
    """The fewest substitutions, deletions and insertions that turn the reference's words
    into the transcript's, and the reference's length."""

    substitutions: int
    deletions: int
    insertions: int
    words: int

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    def __add__(self, other: WordErrors) -> WordErrors:
        return WordErrors(
            self.substitutions + other.substitutions,
            self.deletions + other.deletions,
            self.insertions + other.insertions,
            self.words + other.words,
        )

    @property
    def wer_pct(self) -> float:
        """Errors per 100 reference words (0 for an empty reference with no insertion)."""
        return 100.0 * self.errors / self.words if self.words else 100.0 * bool(self.errors)


def word_errors(reference: Sequence[str], hypothesis: Sequence[str]) -> WordErrors:
    """Levenshtein alignment over words, with the counts of each kind of edit. Of the
    alignments with the fewest edits, the walk back prefers a match or substitution, then a
    deletion: each count is exact for any alignment it picks."""
    r, h = list(reference), list(hypothesis)
    rows, cols = len(r) + 1, len(h) + 1
    cost = [[0] * cols for _ in range(rows)]
    for i in range(rows):
        cost[i][0] = i
    for j in range(cols):
        cost[0][j] = j
    for i in range(1, rows):
        for j in range(1, cols):
            cost[i][j] = min(
                cost[i - 1][j - 1] + (r[i - 1] != h[j - 1]),
                cost[i - 1][j] + 1,
                cost[i][j - 1] + 1,
            )
    sub = dele = ins = 0
    i, j = len(r), len(h)
    while i or j:
        if i and j and cost[i][j] == cost[i - 1][j - 1] + (r[i - 1] != h[j - 1]):
            sub += r[i - 1] != h[j - 1]
            i, j = i - 1, j - 1
        elif i and cost[i][j] == cost[i - 1][j] + 1:
            dele += 1
            i -= 1
        else:
            ins += 1
            j -= 1
    return WordErrors(sub, dele, ins, len(r))

"""Keeping card numbers and sensitive input out of what a call leaves behind (no I/O).

Two rules, applied where text or keys leave a call (records, MQTT events, logs):

- A *sensitive* slot's input (a PIN, a card number keyed for a payment) is never kept at
  all: :func:`sensitive_text` gives ``[redacted N digits]`` in place of what was said.
- Card numbers anywhere: a run of digits that holds a stretch of 13 to 19 digits passing
  the Luhn check is masked (:func:`redact_card_numbers`), whether it was written ("4111
  1111 1111 1111") or spoken ("four one one one ..."), and keys pressed one by one are held
  back by :class:`KeypadRun` until it is known whether they make one.

Why stretches and not whole runs: a caller who presses a menu key and then the card number
makes one run of 17 keys, which is not Luhn-valid as a whole. Masking every stretch masks
some numbers that are not cards (about one in ten 13-digit numbers passes the check); for
data of this kind that is the safe mistake.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

__all__ = [
    "MAX_CARD",
    "MIN_CARD",
    "HeldKey",
    "KeypadRun",
    "KeypadTurns",
    "card_mask",
    "count_digits",
    "luhn_valid",
    "mask_card_keys",
    "redact_card_numbers",
    "redacted",
    "sensitive_text",
]

MIN_CARD, MAX_CARD = 13, 19  # the lengths of payment card numbers (ISO/IEC 7812)
_LONG_RUN = 64  # a run longer than this is masked whole (no one keys that many digits)


def luhn_valid(digits: str) -> bool:
    """The Luhn (mod 10) check every payment card number passes."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def card_mask(digits: str) -> list[bool]:
    """Per digit of a run: whether it lies in a Luhn-valid stretch of 13-19 digits."""
    n = len(digits)
    if n > _LONG_RUN:
        return [True] * n
    mask = [False] * n
    for length in range(MIN_CARD, min(MAX_CARD, n) + 1):
        for start in range(n - length + 1):
            if luhn_valid(digits[start : start + length]):
                mask[start : start + length] = [True] * length
    return mask


def redacted(n: int) -> str:
    """What stands in for ``n`` digits that must not be kept."""
    return f"[redacted {n} digit{'s' if n != 1 else ''}]"


# -- digits in text, written or spoken --------------------------------------------------------

_UNITS = {"zero": 0, "oh": 0, "o": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5}
_UNITS |= {"six": 6, "seven": 7, "eight": 8, "nine": 9}
_TEENS = {"ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15}
_TEENS |= {"sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19}
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fourty": 40, "fifty": 50, "sixty": 60}
_TENS |= {"seventy": 70, "eighty": 80, "ninety": 90}
_REPEAT = {"double": 2, "triple": 3}
# what an ASR writes for a digit it heard; read as one only next to other digits
_SOUNDALIKE = {"to": "2", "too": "2", "for": "4", "won": "1", "ate": "8"}
_TOKEN = re.compile(r"\d+|[A-Za-z]+|\S")
# what may stand between the pieces of one number ("4111-1111", "four, one"; a full stop
# when a space follows: ASR ends a group with one, and "1764111111.25" stays a decimal)
_GLUE = frozenset("-,")


class _Word(NamedTuple):
    text: str  # lower case
    start: int
    end: int


@dataclass
class _Piece:
    """Consecutive words of one run that say these digits."""

    digits: str
    start: int  # character span in the text
    end: int
    weak: bool = False  # a soundalike: a digit only between two others


def _words(text: str) -> list[_Word]:
    return [_Word(m.group().lower(), m.start(), m.end()) for m in _TOKEN.finditer(text)]


def _glue(text: str, w: _Word) -> bool:
    return w.text in _GLUE or (w.text == "." and text[w.end : w.end + 1].isspace())


def _piece(words: list[_Word], i: int) -> tuple[_Piece | None, int]:
    """The digits said at ``words[i]`` and how many words they take."""
    w = words[i].text
    nxt = words[i + 1].text if i + 1 < len(words) else ""
    s = words[i].start
    if w.isdigit():
        return _Piece(w, s, words[i].end), 1
    if w in _REPEAT and nxt in _UNITS:
        return _Piece(str(_UNITS[nxt]) * _REPEAT[w], s, words[i + 1].end), 2
    if w in _UNITS and nxt == "hundred" and w not in ("o", "oh"):
        j = i + 2
        if j < len(words) and words[j].text == "and":
            j += 1
        rest, used = _piece(words, j) if j < len(words) else (None, 0)
        if rest is not None and not rest.weak and len(rest.digits) <= 2:  # "four hundred eleven"
            return _Piece(f"{_UNITS[w] * 100 + int(rest.digits)}", s, rest.end), j - i + used
        return _Piece(f"{_UNITS[w]}00", s, words[i + 1].end), 2
    if w in _UNITS:
        return _Piece(str(_UNITS[w]), s, words[i].end, weak=w in ("o", "oh")), 1
    if w in _TEENS:
        return _Piece(str(_TEENS[w]), s, words[i].end), 1
    if w in _TENS:
        # "forty one", "forty-one": one number
        j = i + 1 + (nxt == "-")
        after = words[j].text if j < len(words) else ""
        if after in _UNITS and _UNITS[after] > 0 and after not in ("o", "oh"):
            return _Piece(str(_TENS[w] + _UNITS[after]), s, words[j].end), j - i + 1
        return _Piece(str(_TENS[w]), s, words[i].end), 1
    if w in _SOUNDALIKE:
        return _Piece(_SOUNDALIKE[w], s, words[i].end, weak=True), 1
    return None, 1


def _runs(text: str) -> Iterator[list[_Piece]]:
    """The numbers in ``text``: runs of pieces with only spaces, '-', ',' or '. ' between."""
    words = _words(text)
    run: list[_Piece] = []
    i = 0
    while i < len(words):
        piece, used = _piece(words, i)
        if piece is None:
            if run and _glue(text, words[i]):
                i += 1
                continue
            yield from _settled(run)
            run = []
            i += used
            continue
        run.append(piece)
        i += used
    yield from _settled(run)


def _settled(run: list[_Piece]) -> Iterator[list[_Piece]]:
    """A run without weak pieces at its ends ("for", "oh" count only between digits)."""
    lo, hi = 0, len(run)
    while lo < hi and run[lo].weak:
        lo += 1
    while hi > lo and run[hi - 1].weak:
        hi -= 1
    if lo < hi:
        yield run[lo:hi]


def count_digits(text: str) -> int:
    """How many digits ``text`` says, written or spoken ("four one" and "41": 2)."""
    return sum(len(p.digits) for run in _runs(text) for p in run)


def redact_card_numbers(text: str) -> tuple[str, int]:
    """``text`` with every card number in it (written or spoken) replaced by
    ``[redacted N digits]``; and how many were replaced."""
    cuts: list[tuple[int, int, int]] = []  # (start, end, digits) spans to replace
    for run in _runs(text):
        digits = "".join(p.digits for p in run)
        if len(digits) < MIN_CARD:
            continue
        mask = card_mask(digits)
        pos = 0
        span: list[_Piece] = []
        for p in run:
            hit = any(mask[pos : pos + len(p.digits)])
            pos += len(p.digits)
            if hit:
                span.append(p)
                continue
            if span:
                cuts.append((span[0].start, span[-1].end, sum(len(x.digits) for x in span)))
                span = []
        if span:
            cuts.append((span[0].start, span[-1].end, sum(len(x.digits) for x in span)))
    if not cuts:
        return text, 0
    out: list[str] = []
    pos = 0
    for start, end, n in cuts:
        out += [text[pos:start], redacted(n)]
        pos = end
    out.append(text[pos:])
    return "".join(out), len(cuts)


_DIGIT_RUN = re.compile(r"\d+")


def mask_card_keys(keys: str) -> tuple[str, int]:
    """Keys typed in one go (a keypad turn's ``54321``) with every digit of a card number
    in them shown as ``*``; and how many digits were masked."""
    out, masked = list(keys), 0
    for m in _DIGIT_RUN.finditer(keys):
        for i, hit in enumerate(card_mask(m.group())):
            if hit:
                out[m.start() + i] = "*"
                masked += 1
    return ("".join(out), masked) if masked else (keys, 0)


def sensitive_text(text: str) -> str:
    """What is kept of a sensitive slot's input: how many digits it had, never which."""
    return redacted(count_digits(text))


# -- keys pressed one at a time -----------------------------------------------------------------


class HeldKey(NamedTuple):
    """One key press on its way to the records: the key, when, and how it came (``seq``:
    its number among the call's digits, see :class:`KeypadTurns`)."""

    digit: str
    at: float
    method: str = "rfc4733"
    seq: int = -1


class KeypadRun:
    """One call's key presses, held back while they could still be part of a card number.

    A key leaves (:meth:`push`, :meth:`due`, :meth:`flush` return ``(key, masked)``) once
    every stretch of 13-19 digits it could belong to is known: 18 more digits came after
    it, or the run ended (a key other than 0-9, another event of the call, ``gap_s``
    without a key, the end of the call). Masked keys are those of a Luhn-valid stretch.
    """

    def __init__(self, gap_s: float = 4.0) -> None:
        self.gap_s = gap_s
        self._digits = ""  # the run so far: released context, then held keys
        self._held: list[HeldKey] = []  # the run's last len(self._held) digits
        self.last_at = 0.0

    @property
    def holding(self) -> bool:
        return bool(self._held)

    @property
    def deadline(self) -> float | None:
        """When the held keys go out if no other key comes (None: none held)."""
        return self.last_at + self.gap_s if self._held else None

    def push(self, key: HeldKey) -> list[tuple[HeldKey, bool]]:
        """A key pressed; the keys that may leave now, in order."""
        if not ("0" <= key.digit <= "9" and len(key.digit) == 1):
            return [*self.flush(), (key, False)]  # '*', '#', A-D end a run
        self.last_at = key.at
        self._digits += key.digit
        self._held.append(key)
        if len(self._digits) > _LONG_RUN:
            return self.flush()
        ready = len(self._held) - (MAX_CARD - 1)
        return self._release(ready) if ready > 0 else []

    def due(self, now: float) -> list[tuple[HeldKey, bool]]:
        """The held keys, if ``gap_s`` has passed since the last one."""
        deadline = self.deadline
        return self.flush() if deadline is not None and now >= deadline else []

    def flush(self) -> list[tuple[HeldKey, bool]]:
        """The run is over: every held key leaves."""
        out = self._release(len(self._held))
        self._digits = ""
        return out

    def _release(self, count: int) -> list[tuple[HeldKey, bool]]:
        mask = card_mask(self._digits)
        first = len(self._digits) - len(self._held)
        out = [(k, mask[first + i]) for i, k in enumerate(self._held[:count])]
        del self._held[:count]
        keep = len(self._held) + MAX_CARD - 1  # released digits later stretches may include
        self._digits = self._digits[-keep:] if keep < len(self._digits) else self._digits
        return out


T = TypeVar("T")


class KeypadTurns(Generic[T]):
    """One call's keypad turns, each held until the keys in it have left :class:`KeypadRun`.

    A card number keyed at a menu, one key at a time, makes one keypad turn per key: each
    turn's key must be masked as its ``dtmf`` event is, or the turns spell the number.
    Digits are numbered as they are pressed (:meth:`pressed`) and get their verdict as the
    run releases them (:meth:`released`). A turn (:meth:`add`) claims the first unclaimed
    digits that spell its keys (turns come in the order of their keys; digits no turn
    claims, such as an entry cleared with '*', are passed over). Turns leave in order, each
    once all its digits have a verdict, with them: ``(turn, masked per digit)``; a turn
    whose keys hold no pressed digits (a sensitive slot's, already masked) leaves as is.
    """

    def __init__(self, keep: int = 4 * MAX_CARD) -> None:
        self._next = 0
        self._keep = keep
        self._free: deque[tuple[int, str]] = deque()  # pressed digits no turn has claimed
        self._verdict: dict[int, bool] = {}  # released digits, free or claimed
        self._queue: deque[tuple[T, list[int]]] = deque()

    @property
    def waiting(self) -> bool:
        return bool(self._queue)

    def pressed(self, digit: str) -> int:
        """A digit into the run: its number (for its :class:`HeldKey`)."""
        seq, self._next = self._next, self._next + 1
        self._free.append((seq, digit))
        if len(self._free) > self._keep:  # never claimed: no turn comes for it any more
            old, _ = self._free.popleft()
            self._verdict.pop(old, None)
        return seq

    def released(self, seq: int, masked: bool) -> list[tuple[T, list[bool]]]:
        """A digit's verdict (``seq`` from :meth:`pressed`); the turns that may leave now."""
        if seq >= 0:
            self._verdict[seq] = masked
        return self._ready()

    def add(self, keys: str, turn: T) -> list[tuple[T, list[bool]]]:
        """A keypad turn that keyed ``keys``; the turns that may leave now, in order."""
        self._queue.append((turn, self._claim(keys)))
        return self._ready()

    def drain(self) -> list[tuple[T, list[bool]]]:
        """The call is over: every turn leaves (a digit without a verdict counts as masked)."""
        out = [(t, [self._verdict.get(s, True) for s in seqs]) for t, seqs in self._queue]
        self._queue.clear()
        self._free.clear()
        self._verdict.clear()
        return out

    def _claim(self, keys: str) -> list[int]:
        digits = "".join(ch for ch in keys if "0" <= ch <= "9")
        free = list(self._free)
        at = "".join(d for _, d in free).find(digits) if digits else -1
        if at < 0:
            return []
        for seq, _ in free[:at]:  # passed over: no later turn claims them
            self._verdict.pop(seq, None)
        self._free = deque(free[at + len(digits) :])
        return [seq for seq, _ in free[at : at + len(digits)]]

    def _ready(self) -> list[tuple[T, list[bool]]]:
        out: list[tuple[T, list[bool]]] = []
        while self._queue and all(s in self._verdict for s in self._queue[0][1]):
            turn, seqs = self._queue.popleft()
            out.append((turn, [self._verdict.pop(s) for s in seqs]))
        return out

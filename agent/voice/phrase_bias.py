"""Leaning the recogniser toward the words a profile listens for (contextual biasing).

Why: Moonshine's greedy decoder, on quiet, lossy or synthetic speech, often ranks the word
the caller said a close second: "No thanks, nor lie." for "No thanks, goodbye." (" nor"
-0.77 against " good" -0.91 in log probability), "cancel an augur", "Brave angst" for
"Great, thanks". A call center's turns are mostly its own vocabulary (the intents'
keywords, yes and no, digits), so at each step the decoder's few best candidates get a
bonus for the characters by which they carry on one of those phrases; the best of them
after the bonus is chosen. The model's own probabilities are untouched (the transcript's
confidence stays the model's), and what it is sure of is never overruled: a bonus of
``weight`` nats per character moves only candidates within a few nats of the best.

A word earns its bonus once it has ``min_prefix`` letters of a phrase word, or is one
whole and the phrase so far that long: a prefix of one to three letters ("a", "can") would
otherwise lean every word that starts like a keyword ("Could" heard as "Can", for
"cancel"), and a short word alone its homophones ("by" as "bye"). Its earlier letters are
paid then, so "goodbye" earns the same through " good" + "bye" as through " goodbye".

A lean is a guess, so it is checked once the transcript is whole. Where it first
overruled the model, the model's own words are decoded on from there too; a phrase counts
only where a transcript holds it whole (:meth:`PhraseBias.whole`), and the transcript
worth more (the model's log probability plus that bonus) is kept. A phrase begun but not
finished ("talk to Hansel and Norrider" for "cancel an order", on the way to "talk to a")
then earns nothing, and the model's words stand.

No I/O, no state between decodes: :meth:`PhraseBias.bonus` is asked per candidate,
:meth:`PhraseBias.whole` per finished transcript.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from agent.words import normalize

__all__ = ["CANDIDATES", "PhraseBias", "bias_text", "phrase_bias"]

#: How many of the decoder's best candidates each step may be moved among.
CANDIDATES = 8


def bias_text(text: str) -> str:
    """``text`` as phrases are compared: the words :func:`agent.words.normalize` makes of
    it, one space apart ("That's all." -> "thats all")."""
    return " ".join(normalize(text))


@functools.lru_cache(maxsize=256)
def phrase_bias(phrases: tuple[str, ...], weight: float) -> PhraseBias:
    """One :class:`PhraseBias` per phrase set: calls at the same point of a dialogue share
    it (the set changes only with the slot asked)."""
    return PhraseBias(phrases, weight)


class PhraseBias:
    """Phrases to lean toward, and the bonus of a decoder's candidate for them."""

    def __init__(self, phrases: Iterable[str], weight: float, *, min_prefix: int = 4) -> None:
        """``weight``: nats per character of a phrase carried on (0: no bias)."""
        if weight < 0 or min_prefix < 1:
            raise ValueError("weight must be >= 0 and min_prefix >= 1")
        self.weight = float(weight)
        self.min_prefix = min_prefix
        self.phrases = tuple(sorted({p for p in map(bias_text, phrases) if p.strip()}))
        self._prefixes: set[str] = set()
        self._whole: set[str] = set()  # prefixes that end a phrase word
        for p in self.phrases:
            for i in range(1, len(p) + 1):
                self._prefixes.add(p[:i])
                if i == len(p) or p[i] == " ":
                    self._whole.add(p[:i])
        self._longest = max((len(p) for p in self.phrases), default=0)

    @property
    def active(self) -> bool:
        return self.weight > 0 and bool(self.phrases)

    @property
    def reach(self) -> float:
        """The most a candidate can earn: one carrying the longest phrase on whole."""
        return self.weight * self._longest

    def bonus(self, before: str, after: str) -> float:
        """The bonus of a candidate that makes the decoded text ``after`` from ``before``
        (both as :func:`bias_text` gives them): ``weight`` times the characters of a phrase
        it carries on, counted from the phrase's start (0 if none)."""
        if not self.active or after == before:
            return 0.0
        best = 0
        start = max(0, len(after) - self._longest)
        for i in range(start, len(after)):
            if i and after[i - 1] != " ":
                continue
            gain = self._paid(after[i:]) - (self._paid(before[i:]) if i < len(before) else 0)
            best = max(best, gain)
        return self.weight * best

    def whole(self, text: str) -> float:
        """The bonus of a finished transcript (as :func:`bias_text` gives it): ``weight``
        times the characters of each phrase it holds whole, word for word."""
        if not self.active:
            return 0.0
        padded = f" {text} "
        return self.weight * sum(len(p) for p in self.phrases if f" {p} " in padded)

    def _paid(self, tail: str) -> int:
        """The characters of ``tail`` (a candidate phrase start) that earn the bonus: all of
        it if it is a phrase's prefix whose last word is ``min_prefix`` long, or whole and
        the prefix that long; else what its words before the last earn; 0 if it is no
        prefix at all. So a short word alone ("by" -> "bye", "for" -> "four") earns
        nothing: it must carry a longer phrase on ("no" -> "no thanks")."""
        tail = tail.rstrip()
        while tail:
            if tail not in self._prefixes:
                return 0
            last = tail.rsplit(" ", 1)[-1]
            n = self.min_prefix
            if len(last) >= n or (tail in self._whole and len(tail) >= n):
                return len(tail)
            tail = tail[: len(tail) - len(last)].rstrip()
        return 0

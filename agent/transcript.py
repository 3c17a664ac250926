"""What the ASR heard, and how sure it was: a ``str`` (everything that handles text keeps
working) that also carries ``confidence``, the recogniser's probability for the least
certain token it chose (1.0 where no recogniser was involved: keys, typed text).

Why the least certain token: a slot value hangs on one word ("one" or "on", "fifteenth" or
"fiftieth"); an average over a sentence hides it. The dialogue asks a caller back ("the
fifteenth, is that right?") when a slot's value came from words under the slot's
``confirm_below`` (:mod:`agent.dialogue.slot_rules`). Pure; imports nothing of the agent.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["Transcript", "confidence_of", "joined"]


class Transcript(str):
    """ASR text with the probability of its least certain token (0..1)."""

    confidence: float

    def __new__(cls, text: str = "", confidence: float = 1.0) -> Transcript:
        self = super().__new__(cls, text)
        self.confidence = min(1.0, max(0.0, float(confidence)))
        return self

    def __repr__(self) -> str:  # in log lines: the words, as any text is shown
        return repr(str(self))


def confidence_of(text: str) -> float:
    """How sure the ASR was of ``text`` (1.0 for text that no recogniser produced)."""
    return text.confidence if isinstance(text, Transcript) else 1.0


def joined(texts: Iterable[str]) -> Transcript:
    """Pieces of one turn, stripped and joined by spaces; as sure as the least sure piece
    (empty pieces count for nothing)."""
    parts = [(t.strip(), confidence_of(t)) for t in texts]
    said = [(p, c) for p, c in parts if p]
    return Transcript(" ".join(p for p, _ in said), min((c for _, c in said), default=1.0))

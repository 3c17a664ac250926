"""How the agent compares words: what a caller said with what a profile wrote.

A leaf (nothing from agent/ is imported): profiles, backchannels and slot rules all
normalise with it, and none of them may import another just for this.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["has_phrase", "normalize"]


def normalize(text: str) -> tuple[str, ...]:
    """Lower-case words without punctuation ("What's" -> "whats"): how text is compared."""
    text = text.lower().replace("\u2019", "'").replace("'", "")
    return tuple(re.sub(r"[^a-z0-9]+", " ", text).split())


def has_phrase(words: Sequence[str], phrase: Sequence[str]) -> bool:
    """Whether ``phrase`` is in ``words`` as consecutive whole words (both normalised)."""
    return f" {' '.join(phrase)} " in f" {' '.join(words)} "

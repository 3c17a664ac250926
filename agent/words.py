"""How the agent compares words: what a caller said with what a profile wrote.

A leaf (nothing from agent/ is imported): profiles, backchannels and slot rules all
normalise with it, and none of them may import another just for this.
"""

from __future__ import annotations

import re

__all__ = ["normalize"]


def normalize(text: str) -> tuple[str, ...]:
    """Lower-case words without punctuation ("What's" -> "whats"): how text is compared."""
    text = text.lower().replace("\u2019", "'").replace("'", "")
    return tuple(re.sub(r"[^a-z0-9]+", " ", text).split())

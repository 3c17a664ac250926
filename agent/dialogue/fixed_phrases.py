"""What a profile makes the agent say that is the same on every call, piece by piece as the
TTS speaks it: the text a phrase cache renders once, before the first caller hears it.

A template's fixed part is everything but its per-call values: the profile's own
``[variables]`` are known when it loads; the caller's number, slot values, lookup rows and
variables an intent sets are not. Pieces (:func:`~agent.dialogue.sentences.split_sentences`)
that hold a per-call value are left out: they are rendered whole when said.
"""

from __future__ import annotations

from collections.abc import Iterator

from agent.dialogue.engine import TRANSFER_FAILED
from agent.dialogue.profile import AgentProfile, Template
from agent.dialogue.sentences import split_sentences

__all__ = ["fixed_pieces"]

_PER_CALL = "\ufffc"  # stands for a value known only during a call; no piece holding it is kept


def _templates(profile: AgentProfile) -> Iterator[Template]:
    """Every template the engine may say, the most frequent first (the greeting opens every
    call; fallbacks come at any turn)."""
    yield profile.greeting
    fb = profile.fallback
    yield from fb.replies
    for slot in profile.slots.values():
        yield slot.prompt
        yield slot.retry
        yield from (t for t in (slot.confirm_prompt, slot.invalid) if t is not None)
    for intent in profile.intents:
        yield intent.then.reply
        if intent.on_no is not None:
            yield intent.on_no.reply
        if intent.lookup is not None:
            yield intent.lookup.not_found
    yield from (t for t in (fb.escalate_reply, fb.transfer_failed) if t is not None)
    lim = profile.limits
    yield lim.closing
    if lim.no_input_s:
        yield from (lim.no_input_reply, lim.no_input_goodbye)


def _texts(profile: AgentProfile) -> Iterator[str]:
    for template in _templates(profile):
        values = {name: _PER_CALL for name in template.names} | dict(profile.variables)
        yield template.render(values)
    if profile.filler.text:
        yield profile.filler.text
    if profile.fallback.transfer_failed is None:
        yield TRANSFER_FAILED  # the engine's own words


def fixed_pieces(profile: AgentProfile, *, first_max_words: int) -> list[str]:
    """The pieces the TTS will be asked for, without repeats: each text cut as a reply's
    opening (``first_max_words``, as the speaker cuts it) and as a later sentence, since
    the engine may put one text after another (a reason, then the question again)."""
    pieces: dict[str, None] = {}
    for text in _texts(profile):
        for cut in (split_sentences(text, first_max_words=first_max_words), split_sentences(text)):
            pieces.update((p, None) for p in cut if _PER_CALL not in p and p.strip())
    return list(pieces)

"""Backchannels: "uh-huh", "okay", "right" said while the agent talks, to show one listens.

They are not a turn and must not stop the reply for good. The voice agent stops (fades)
as for any barge-in, since a backchannel and the first word of a real interruption sound
alike for the first 250 ms; when the caller falls silent it transcribes what they said,
and if that was only backchannels (or, for up to 0.8 s of speech, nothing it could make
out or up to :data:`MAX_WORDS` words the dialogue would not understand and no
:data:`FLOOR_WORDS`: a hummed "mm-hmm" comes out as "A minimum."; agent.voice decides
that), it goes on from the word it stopped at. This module is the test on the words
(pure: no I/O).
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.words import normalize

__all__ = [
    "DEFAULT_BACKCHANNELS",
    "FLOOR_WORDS",
    "MAX_WORDS",
    "is_backchannel",
    "phrases",
    "takes_floor",
]

#: A backchannel is one to three words ("uh-huh", "all right", "okay, I see"): more, not
#: understood, is the caller saying something the ASR got wrong, not humming
MAX_WORDS = 3

#: What counts unless a profile lists its own ([barge_in] backchannels): the usual ones,
#: as an ASR spells them. Not "yes"/"yeah": said over a question they are its answer.
DEFAULT_BACKCHANNELS = (
    "uh-huh",
    "uh huh",
    "mm-hm",
    "mm-hmm",
    "mhm",
    "mm",
    "hmm",
    "okay",
    "ok",
    "right",
    "alright",
    "all right",
    "i see",
    "got it",
)


#: Words that, said over a reply, ask for the floor even when the dialogue would not make
#: sense of them ("Wait.", "Hello?", "No, no."): the reply stops for them.
FLOOR_WORDS = frozenset(
    ("no", "nope", "wait", "stop", "hold", "hang", "sorry", "excuse", "pardon", "what",
     "hello", "help", "agent", "operator", "person", "human", "repeat", "again")
)  # fmt: skip


def takes_floor(text: str) -> bool:
    """Whether ``text`` holds one of :data:`FLOOR_WORDS`."""
    return any(w in FLOOR_WORDS for w in normalize(text))


def phrases(texts: Iterable[str]) -> tuple[tuple[str, ...], ...]:
    """Backchannels as the words the agent compares (normalised like intents' keywords)."""
    return tuple(p for p in (normalize(t) for t in texts) if p)


def is_backchannel(text: str, known: tuple[tuple[str, ...], ...]) -> bool:
    """Whether ``text`` (what the ASR heard) is only backchannels from ``known``, one or
    several ("okay, right"); nothing made out counts too (a hum the ASR drops). With no
    ``known`` phrases (the profile turned them off) nothing is."""
    if not known:
        return False
    words = normalize(text)
    reach = [True] + [False] * len(words)  # reach[i]: words[:i] split into phrases
    for i in range(len(words)):
        if reach[i]:
            for p in known:
                if words[i : i + len(p)] == p:
                    reach[i + len(p)] = True
    return reach[-1]

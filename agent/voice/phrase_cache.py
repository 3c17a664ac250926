"""Spoken pieces rendered once: a byte-bounded LRU of 8 kHz audio, and the fixed phrases
of a profile to fill it with before the first call.

Why: every call says the same greeting, slot prompts, fallbacks and closings, and Piper
spends 40-100 ms of CPU per second of speech rendering them again (the greeting of the demo
is 13 s of audio, about 0.5-1.3 s of CPU). The voice is deterministic (see
:mod:`agent.voice.tts`), so a piece's audio depends only on the voice, its speed and the text:
that is the key. Audio is cached per piece (what :func:`agent.dialogue.sentences.split_sentences`
makes of a reply), never a whole reply, so a template whose values change still reuses
its fixed sentences, and any piece said before (an LLM's "Anything else?") is reused too.
Pieces are not joined inside a sentence: Piper's prosody spans the sentence, and a value
spliced into cached words would sound pasted in; a piece with a value is rendered whole.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from agent.dialogue.profile import AgentProfile, Template

__all__ = [
    "CacheStats",
    "PhraseCache",
    "constant_pieces",
    "profile_pieces",
    "spoken_templates",
]

# Stand-ins for a template's changing values when looking for its fixed pieces: two values
# as unlike as possible (one word; many words with a comma and a sentence end), so that a
# piece whose text or cut depends on a value differs between the two renderings.
_VALUES_A = "Alex"
_VALUES_B = "Jordan Lee Smith, of nine one two three four five six seven. Then"


class CacheStats(NamedTuple):
    hits: int
    misses: int
    evictions: int
    entries: int
    bytes: int
    max_bytes: int


class PhraseCache:
    """Byte-bounded LRU of read-only int16 arrays; thread-safe (the executor's workers and
    the warm-up share it). ``max_bytes`` 0 keeps nothing. An entry larger than the whole
    bound is not kept."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, NDArray[np.int16]] = OrderedDict()
        self._bytes = 0
        self._hits = self._misses = self._evictions = 0
        self._making: dict[Hashable, threading.Event] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> NDArray[np.int16] | None:
        """The audio under ``key`` (now the most recently used), or None (a miss)."""
        with self._lock:
            pcm = self._entries.get(key)
            if pcm is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return pcm

    def get_or_make(
        self, key: Hashable, make: Callable[[], NDArray[np.int16]]
    ) -> NDArray[np.int16]:
        """The audio under ``key``, made by ``make()`` and kept on a miss. A key another
        thread is making is waited for, not made twice (calls that start together all say
        the greeting; one renders it)."""
        with self._lock:
            pcm = self._entries.get(key)
            if pcm is not None:
                self._entries.move_to_end(key)
                self._hits += 1
                return pcm
            self._misses += 1
            making = self._making.get(key)
            if making is None:
                making = self._making[key] = threading.Event()
                mine = True
            else:
                mine = False
        if not mine:
            making.wait()
            with self._lock:
                pcm = self._entries.get(key)
            if pcm is not None:  # (counted as the miss it was: this call waited for it)
                return pcm
            return self.put(key, make())  # not kept (too big) or its maker failed
        try:
            return self.put(key, make())
        finally:
            with self._lock:
                del self._making[key]
            making.set()

    def __contains__(self, key: Hashable) -> bool:
        """Whether ``key`` is cached; counts neither a hit nor a miss, nor refreshes it."""
        with self._lock:
            return key in self._entries

    def put(self, key: Hashable, pcm: NDArray[np.int16]) -> NDArray[np.int16]:
        """Keep ``pcm`` (made read-only: every call shares it) under ``key``, evicting the
        least recently used entries until the bound holds. Returns the array stored."""
        pcm.flags.writeable = False
        size = int(pcm.nbytes)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= int(old.nbytes)
            if size > self.max_bytes:
                return pcm
            while self._entries and self._bytes + size > self.max_bytes:
                _, gone = self._entries.popitem(last=False)
                self._bytes -= int(gone.nbytes)
                self._evictions += 1
            self._entries[key] = pcm
            self._bytes += size
        return pcm

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, self._evictions, len(self._entries),
                              self._bytes, self.max_bytes)  # fmt: skip


def spoken_templates(profile: AgentProfile) -> list[Template | str]:
    """Everything ``profile`` may say that it writes itself, the greeting first (every call
    begins with it), then the filler phrase, prompts, replies, fallbacks and closings."""
    out: list[Template | str] = [profile.greeting]
    if profile.filler.text:
        out.append(profile.filler.text)
    for slot in profile.slots.values():
        out += [slot.prompt, slot.retry]
        out += [t for t in (slot.confirm_prompt, slot.invalid) if t is not None]
    for intent in profile.intents:
        out += [a.reply for a in (intent.then, intent.on_no) if a is not None]
        if intent.lookup is not None:
            out.append(intent.lookup.not_found)
    fb = profile.fallback
    out += list(fb.replies)
    out += [t for t in (fb.escalate_reply, fb.transfer_failed) if t is not None]
    out.append(profile.limits.closing)
    return out


def constant_pieces(
    template: Template | str,
    split: Callable[[str], list[str]],
    constants: dict[str, str] | None = None,
) -> list[str]:
    """The pieces (``split`` of the rendered text) that every rendering of ``template``
    shares: all of them when it has no placeholder, else those its values cannot change.
    ``constants``: values fixed for the profile (its [variables] that no action sets)."""
    if isinstance(template, str):
        return split(template)
    fixed = constants or {}
    if template.names <= fixed.keys():
        return split(template.render(fixed))
    renderings = []
    for stand_in in (_VALUES_A, _VALUES_B):
        values = {n: fixed.get(n, stand_in) for n in template.names}
        renderings.append(split(template.render(values)))
    other = set(renderings[1])
    return [p for p in renderings[0] if p in other]


def profile_pieces(profile: AgentProfile, split: Callable[[str], list[str]]) -> list[str]:
    """Every piece ``profile`` says the same on every call, in order, once each."""
    dynamic = {
        name
        for intent in profile.intents
        for acts in (intent.then, intent.on_no)
        if acts is not None
        for name, _ in acts.set
    }
    constants = {k: v for k, v in profile.variables.items() if k not in dynamic}
    return list(dict.fromkeys(_pieces(spoken_templates(profile), split, constants)))


def _pieces(
    templates: Iterable[Template | str],
    split: Callable[[str], list[str]],
    constants: dict[str, str],
) -> Iterable[str]:
    for t in templates:
        yield from constant_pieces(t, split, constants)

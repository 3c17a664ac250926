"""Speech the agent says on every call, rendered once per process: the greeting, fixed
replies, slot prompts, fallbacks and closings.

Why: Piper spends 100-330 ms of a core on each sentence on a 2-core node, and most of what
a scripted agent says is the same text on every call ("Anything else?", the greeting, the
fallback). Rendering it again for each caller costs the CPU that many calls need, and the
caller waits for it at the start of a reply. A sentence with a per-call value in it ("Order
1 2 3 4 5 has shipped.") is rendered whole when it is said: Piper's prosody spans the
sentence, and a value spliced between pre-rendered words would not join cleanly.

The key is (voice, speed, text); the value is the piece's finished 8 kHz audio, read-only
(every call shares it). The cache is bounded by bytes and segmented: what a profile was
warmed with, and a piece asked for a second time, is *protected*; a piece said once (a
sentence with an order number in it) waits in *probation* and is the first to go, so the
one-off sentences of many calls never push the fixed phrases out. Two threads asking for
the same missing piece render it once (the second waits for the first). No I/O.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["PhraseCache", "PhraseKey", "PhraseStats", "shared_cache", "shared_stats"]

#: (voice, speed, text): the voice's name, its length scale, the piece's words.
PhraseKey = tuple[str, float, str]

PROTECTED_SHARE = 0.8  # of the bytes: the most the protected segment may hold


@dataclass(frozen=True)
class PhraseStats:
    entries: int
    bytes: int
    max_bytes: int
    hits: int
    misses: int
    evictions: int
    queued: int  # pieces waiting to be rendered ahead (0: the profiles are warm)


class PhraseCache:
    """Rendered phrases by (voice, speed, text), at most ``max_bytes`` of audio (0: off)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._protected: OrderedDict[PhraseKey, NDArray[np.int16]] = OrderedDict()
        self._probation: OrderedDict[PhraseKey, NDArray[np.int16]] = OrderedDict()
        self._protected_bytes = 0
        self._probation_bytes = 0
        self._rendering: dict[PhraseKey, Future[NDArray[np.int16]]] = {}
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0
        self._queued = 0

    def __contains__(self, key: PhraseKey) -> bool:
        with self._lock:
            return key in self._protected or key in self._probation

    @property
    def stats(self) -> PhraseStats:
        with self._lock:
            return PhraseStats(
                len(self._protected) + len(self._probation),
                self._protected_bytes + self._probation_bytes,
                self.max_bytes, self.hits, self.misses, self.evictions, self._queued,
            )  # fmt: skip

    def queued(self, n: int) -> None:
        """``n`` more pieces (or fewer, negative) are waiting to be rendered ahead: what
        :attr:`stats` reports as ``queued`` (a node is warm at 0)."""
        with self._lock:
            self._queued = max(0, self._queued + n)

    def resize(self, max_bytes: int) -> None:
        """A new bound (a reload): what no longer fits goes, least recently used first."""
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        with self._lock:
            self.max_bytes = max_bytes
            self._shrink()

    def get(self, key: PhraseKey) -> NDArray[np.int16] | None:
        """The audio for ``key`` if it is kept (a hit), else None (no miss is counted: the
        render that follows counts it)."""
        with self._lock:
            pcm = self._lookup(key)
            if pcm is not None:
                self.hits += 1
            return pcm

    def render(
        self,
        key: PhraseKey,
        make: Callable[[], NDArray[np.int16]],
        *,
        ahead: bool = False,
    ) -> NDArray[np.int16]:
        """The audio for ``key``: cached, or made by ``make`` (blocking: call it where a
        model may run) and kept. ``ahead``: rendered before anyone asked (warming a
        profile's phrases): kept protected, and never waited for, since a warming thread
        runs at a low priority; a caller who needs the piece meanwhile renders their own."""
        with self._lock:
            pcm = self._lookup(key)
            if pcm is not None:
                if not ahead:
                    self.hits += 1
                return pcm
            pending = self._rendering.get(key)
            mine = pending is None and not ahead
            if not ahead:
                self.misses += 1
                if pending is None:
                    pending = self._rendering[key] = Future()
        if pending is not None and not mine:
            return pending.result()  # a caller is rendering it: its audio, not a second copy
        try:
            pcm = make()
        except BaseException as exc:
            if pending is not None:
                with self._lock:
                    del self._rendering[key]
                pending.set_exception(exc)
            raise
        pcm.flags.writeable = False
        with self._lock:
            if pending is not None:
                del self._rendering[key]
            kept = self._lookup(key)  # rendered meanwhile by the other side (warm, caller)
            pcm = kept if kept is not None else self._insert(key, pcm, protect=ahead)
        if pending is not None:
            pending.set_result(pcm)
        return pcm

    # -- under the lock ----------------------------------------------------------------------

    def _lookup(self, key: PhraseKey) -> NDArray[np.int16] | None:
        pcm = self._protected.get(key)
        if pcm is not None:
            self._protected.move_to_end(key)
            return pcm
        pcm = self._probation.pop(key, None)
        if pcm is None:
            return None
        self._probation_bytes -= pcm.nbytes  # asked for again: promoted
        self._insert(key, pcm, True)
        return pcm

    def _insert(self, key: PhraseKey, pcm: NDArray[np.int16], protect: bool) -> NDArray[np.int16]:
        if pcm.nbytes > self.max_bytes:
            return pcm  # larger than the whole cache (or the cache is off): not kept
        if protect:
            self._protected[key] = pcm
            self._protected_bytes += pcm.nbytes
        else:
            self._probation[key] = pcm
            self._probation_bytes += pcm.nbytes
        self._shrink()
        return pcm

    def _shrink(self) -> None:
        limit = int(self.max_bytes * PROTECTED_SHARE)
        while self._protected_bytes > limit and self._protected:
            key, pcm = self._protected.popitem(last=False)  # demoted, not dropped
            self._protected_bytes -= pcm.nbytes
            self._probation[key] = pcm  # the newest there: a second chance
            self._probation_bytes += pcm.nbytes
        while self._protected_bytes + self._probation_bytes > self.max_bytes and self._probation:
            _, pcm = self._probation.popitem(last=False)
            self._probation_bytes -= pcm.nbytes
            self.evictions += 1


_shared: list[PhraseCache] = []
_shared_lock = threading.Lock()


def shared_cache(max_bytes: int) -> PhraseCache:
    """The process's cache (the voices of every profile share one bound), at ``max_bytes``
    from now on (a reload may change it)."""
    with _shared_lock:
        if not _shared:
            _shared.append(PhraseCache(max_bytes))
        elif _shared[0].max_bytes != max_bytes:
            _shared[0].resize(max_bytes)
        return _shared[0]


def shared_stats() -> PhraseStats | None:
    """The process cache's figures (for /metrics); None before a voice agent made it."""
    with _shared_lock:
        return _shared[0].stats if _shared else None

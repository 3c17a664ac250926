"""The phrase cache keeps what every call says, within its bytes, and renders a piece once."""

from __future__ import annotations

import threading
import time
from functools import partial

import numpy as np
import pytest
from numpy.typing import NDArray

from agent.voice.phrase_cache import PhraseCache, PhraseKey

KB = 1024


def _key(text: str, voice: str = "joe#0", speed: float = 1.0) -> PhraseKey:
    return (voice, speed, text)


def _audio(kb: int, value: int = 1) -> NDArray[np.int16]:
    return np.full(kb * KB // 2, value, np.int16)


class Renders:
    """Counts what was rendered; each text's audio is ``kb`` KB."""

    def __init__(self, kb: int = 10) -> None:
        self.kb = kb
        self.made: list[str] = []

    def __call__(self, text: str) -> NDArray[np.int16]:
        self.made.append(text)
        return _audio(self.kb, len(self.made))


def test_a_piece_is_rendered_once_and_shared_read_only() -> None:
    cache, render = PhraseCache(100 * KB), Renders()
    a = cache.render(_key("Anything else?"), lambda: render("Anything else?"))
    b = cache.render(_key("Anything else?"), lambda: render("Anything else?"))
    assert a is b and render.made == ["Anything else?"]
    assert not a.flags.writeable  # every call plays the same array
    st = cache.stats
    assert (st.hits, st.misses, st.entries, st.bytes) == (1, 1, 1, 10 * KB)


def test_voice_and_speed_are_part_of_the_key() -> None:
    cache, render = PhraseCache(100 * KB), Renders()
    for key in (_key("Hello."), _key("Hello.", speed=1.2), _key("Hello.", voice="amy#0")):
        cache.render(key, lambda: render("Hello."))
    assert len(render.made) == 3 and cache.stats.entries == 3


def test_the_bytes_stay_bounded_and_one_off_sentences_go_before_the_fixed_phrases() -> None:
    cache, render = PhraseCache(100 * KB), Renders(kb=10)
    fixed = [f"Fixed phrase {i}." for i in range(5)]
    for text in fixed:  # warmed: protected
        cache.render(_key(text), partial(render, text), ahead=True)
    for i in range(40):  # a sentence with a caller's order number in it, said once each
        cache.render(_key(f"Order {i} has shipped."), partial(render, f"order {i}"))
        assert cache.stats.bytes <= 100 * KB
    assert all(_key(t) in cache for t in fixed)
    assert _key("Order 39 has shipped.") in cache  # the newest one-off is still there
    assert _key("Order 0 has shipped.") not in cache
    assert cache.stats.evictions == 40 + 5 - 10


def test_a_piece_asked_for_twice_is_promoted_and_survives_one_offs() -> None:
    cache, render = PhraseCache(100 * KB), Renders(kb=10)
    cache.render(_key("Please hold."), lambda: render("hold"))
    cache.render(_key("Please hold."), lambda: render("hold"))  # a second call said it
    for i in range(30):
        cache.render(_key(f"one-off {i}"), partial(render, f"x{i}"))
    assert _key("Please hold.") in cache and render.made.count("hold") == 1


def test_protected_phrases_beyond_their_share_are_demoted_then_evicted_oldest_first() -> None:
    cache, render = PhraseCache(100 * KB), Renders(kb=10)
    for i in range(12):  # a profile bigger than the cache
        cache.render(_key(f"p{i}"), partial(render, f"p{i}"), ahead=True)
    st = cache.stats
    assert st.bytes <= 100 * KB and st.entries == 10
    assert _key("p0") not in cache and _key("p1") not in cache and _key("p11") in cache


def test_off_at_zero_bytes_and_a_piece_larger_than_the_cache_is_not_kept() -> None:
    cache, render = PhraseCache(0), Renders()
    cache.render(_key("a"), lambda: render("a"))
    cache.render(_key("a"), lambda: render("a"))
    assert render.made == ["a", "a"] and cache.stats.entries == 0
    small = PhraseCache(5 * KB)
    small.render(_key("long"), lambda: _audio(10))
    assert small.stats.bytes == 0


def test_resize_drops_what_no_longer_fits() -> None:
    cache, render = PhraseCache(100 * KB), Renders(kb=10)
    for i in range(8):
        cache.render(_key(f"p{i}"), partial(render, f"p{i}"), ahead=True)
    cache.resize(30 * KB)
    st = cache.stats
    assert st.bytes <= 30 * KB and _key("p7") in cache
    with pytest.raises(ValueError):
        cache.resize(-1)


def test_callers_asking_for_the_same_missing_piece_wait_for_one_render() -> None:
    cache = PhraseCache(100 * KB)
    started, release = threading.Event(), threading.Event()
    made: list[int] = []

    def slow() -> NDArray[np.int16]:
        made.append(1)
        started.set()
        assert release.wait(5)
        return _audio(1)

    out: list[NDArray[np.int16]] = []
    first = threading.Thread(target=lambda: out.append(cache.render(_key("x"), slow)))
    first.start()
    assert started.wait(5)
    second = threading.Thread(target=lambda: out.append(cache.render(_key("x"), slow)))
    second.start()
    time.sleep(0.05)
    release.set()
    first.join(5)
    second.join(5)
    assert len(made) == 1 and len(out) == 2 and out[0] is out[1]


def test_a_caller_never_waits_for_a_warming_render_and_a_failure_is_not_kept() -> None:
    cache = PhraseCache(100 * KB)
    started, release = threading.Event(), threading.Event()

    def warming() -> NDArray[np.int16]:
        started.set()
        assert release.wait(5)
        return _audio(1, 7)

    warm = threading.Thread(target=lambda: cache.render(_key("x"), warming, ahead=True))
    warm.start()
    assert started.wait(5)
    mine = cache.render(_key("x"), lambda: _audio(1, 3))  # not blocked by the low-priority one
    assert int(mine[0]) == 3
    release.set()
    warm.join(5)
    assert cache.stats.entries == 1 and cache.stats.bytes == 1 * KB  # kept once

    def broken() -> NDArray[np.int16]:
        raise RuntimeError("model fault")

    with pytest.raises(RuntimeError):
        cache.render(_key("y"), broken)
    assert _key("y") not in cache
    assert int(cache.render(_key("y"), lambda: _audio(1, 5))[0]) == 5  # tried again

"""The TTS phrase cache: bounded by bytes, least recently used out first, keyed by voice,
speed and text, the same samples as a fresh render, and warmed with a profile's fixed
phrases at load and on reload (a stand-in voice, except where the real Piper voice must
show that cached and fresh audio are the same samples)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import pytest
from numpy.typing import NDArray
from prometheus_client.parser import text_string_to_metric_families

from agent.dialogue.profile import parse_template
from agent.dialogue.profile_loader import load_profile
from agent.voice.phrase_cache import PhraseCache, constant_pieces, profile_pieces, spoken_templates
from agent.voice.voice_models import LINE_RATE, VoiceModels
from agent.voice_settings import ModelSettings
from resample import Resampler
from sip_bridge import agents
from sip_bridge.config.config_types import AgentConfig
from sip_bridge.config.loader import BridgeConfig
from sip_bridge.ops.metrics import BridgeMetrics

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "config" / "agents" / "demo.toml"


class ToneVoice:
    """22050 Hz 'speech': 0.1 s of a tone per word, then 0.1 s of silence; counts renders."""

    sample_rate = 22050

    def __init__(self, voice_id: str = "tone", length_scale: float = 1.0) -> None:
        self.voice_id, self.length_scale = voice_id, length_scale
        self.said: list[str] = []

    def synthesize(self, sentence: str) -> NDArray[np.int16]:
        self.said.append(sentence)
        n = round(0.1 * self.length_scale * self.sample_rate) * len(sentence.split())
        t = np.arange(n) / self.sample_rate
        tone = (6000 * np.sin(2 * np.pi * (500 + len(sentence)) * t)).astype(np.int16)
        return np.concatenate([tone, np.zeros(2205, np.int16)])

    def warm_up(self) -> None:
        pass


def _models(
    voice: Any,
    cache: PhraseCache | None = None,
    max_bytes: int = 1 << 20,
    fixed: tuple[str, ...] = (),
) -> VoiceModels:
    """VoiceModels speaking with ``voice``; ``fixed``: pieces marked as fixed phrases."""
    stub = cast(Any, object())
    models = VoiceModels(
        ModelSettings(workers=1, tts_cache_bytes=max_bytes),
        vad=stub, turn=stub, asr=stub, tts=cast(Any, voice), cache=cache,
    )  # fmt: skip
    models.fix(fixed)
    return models


def _pcm(n: int) -> NDArray[np.int16]:
    return np.ones(n, np.int16)


# ---- the cache ----------------------------------------------------------------------------


def test_the_cache_is_bounded_by_bytes_and_drops_the_least_recently_used() -> None:
    cache = PhraseCache(1000)
    cache.put("a", _pcm(200))  # 400 bytes
    cache.put("b", _pcm(200))
    assert cache.get("a") is not None  # a is now the most recent: b goes first
    cache.put("c", _pcm(200))  # 1200 > 1000: one must go
    assert "b" not in cache and "a" in cache and "c" in cache
    st = cache.stats()
    assert (st.entries, st.bytes, st.max_bytes, st.evictions) == (2, 800, 1000, 1)
    cache.put("d", _pcm(450))  # 900 bytes: both others go
    assert [k in cache for k in "acd"] == [False, False, True]
    assert cache.stats().bytes == 900 <= cache.max_bytes
    cache.put("huge", _pcm(600))  # over the whole bound: not kept, nothing evicted for it
    assert "huge" not in cache and "d" in cache
    assert cache.get("b") is None
    st = cache.stats()
    assert (st.hits, st.misses) == (1, 1)
    assert "d" in cache and cache.stats().hits == 1  # `in` counts nothing


def test_a_cached_array_is_read_only_and_size_zero_keeps_nothing() -> None:
    cache = PhraseCache(1 << 10)
    kept = cache.put("a", _pcm(10))
    with pytest.raises(ValueError):
        kept[0] = 5  # shared by every call: nobody may change it
    none = PhraseCache(0)
    none.put("a", _pcm(1))
    assert "a" not in none and none.stats().bytes == 0
    with pytest.raises(ValueError):
        PhraseCache(-1)


def test_a_piece_asked_for_by_many_calls_at_once_is_rendered_once() -> None:
    cache = PhraseCache(1 << 20)
    started, release = threading.Event(), threading.Event()
    made: list[int] = []

    def make() -> NDArray[np.int16]:
        made.append(1)
        started.set()
        release.wait(5)
        return _pcm(100)

    out: list[NDArray[np.int16]] = []
    threads = [threading.Thread(target=lambda: out.append(cache.get_or_make("hi", make)))
               for _ in range(4)]  # fmt: skip
    threads[0].start()
    assert started.wait(5)
    for t in threads[1:]:
        t.start()
    release.set()
    for t in threads:
        t.join(5)
    assert len(made) == 1 and len(out) == 4 and all(o is out[0] for o in out)
    assert cache.get_or_make("hi", make) is out[0] and len(made) == 1
    st = cache.stats()
    assert st.hits + st.misses == 5 and st.entries == 1


def test_pieces_are_keyed_by_voice_speed_and_text() -> None:
    cache = PhraseCache(1 << 20)
    joe, joe_again = ToneVoice("joe"), ToneVoice("joe")
    slow, amy = ToneVoice("joe", length_scale=1.3), ToneVoice("amy")
    fixed = ("Please hold.", "Please hold!")
    first = _models(joe, cache, fixed=fixed).synthesize("Please hold.")
    same = _models(joe_again, cache, fixed=fixed).synthesize("Please hold.")
    assert same is first and joe_again.said == []  # same voice, speed, text: not rendered
    for voice in (slow, amy):  # another speed, another voice: its own render
        out = _models(voice, cache, fixed=fixed).synthesize("Please hold.")
        assert voice.said == ["Please hold."] and out is not first
    _models(joe, cache, fixed=fixed).synthesize("Please hold!")  # another text
    assert joe.said == ["Please hold.", "Please hold!"]
    assert cache.stats().entries == 4


def test_speak_reuses_fixed_pieces_and_each_is_what_synthesize_gives() -> None:
    voice = ToneVoice()
    models = _models(voice, fixed=("Anything else?", "Done."))
    text = "Order 1 2 3 4 5 shipped on Monday. Anything else?"
    first = list(models.speak(text, threading.Event()))
    rendered = list(voice.said)
    assert len(rendered) == 3
    again = list(models.speak("Done. Anything else?", threading.Event()))
    assert voice.said == [*rendered, "Done."]  # "Anything else?" came from the cache
    assert again[-1][1] is first[-1][1]
    for sentence, pcm in first:
        if pcm is not None:
            assert np.array_equal(pcm, models.synthesize(sentence))


def test_a_piece_with_a_callers_value_is_rendered_for_its_call_and_kept_nowhere() -> None:
    """Only fixed phrases are cached: a caller's name or number leaves memory with the
    call's own audio, however often it is said."""
    voice = ToneVoice()
    models = _models(voice, fixed=("Anything else?",))
    for _ in range(2):
        list(models.speak("Booked for Bob Jones at 6 p.m. Anything else?", threading.Event()))
    assert voice.said.count("Booked for Bob Jones at 6 p.m.") == 2
    assert voice.said.count("Anything else?") == 1
    key = (voice.voice_id, voice.length_scale)
    assert (*key, "Anything else?") in models.cache
    assert (*key, "Booked for Bob Jones at 6 p.m.") not in models.cache
    assert models.cache.stats().entries == 1
    assert not models.synthesize("Bob Jones.").flags.writeable  # read-only either way


def test_pieces_join_in_silence_without_clicks() -> None:
    """Each piece is resampled on its own: it ends in exact silence (the TTS's pause
    outlasts the filter), so the next piece starts from the same silent state a continuous
    stream would be in; the whole reply is what one stream across its pieces gave, within a
    sample of phase per piece, at the same level."""
    text = "Thanks for calling today. Your order shipped. Anything else?"
    models = _models(ToneVoice())
    models.fix(models.pieces(text))
    pieces = [pcm for _, pcm in models.speak(text, threading.Event()) if pcm is not None]
    for pcm in pieces:
        assert not np.any(pcm[-400:])  # the last 50 ms: zeros
        assert abs(int(pcm[0])) < 600  # the filter's ramp in, no step
    stream = Resampler(models.tts.sample_rate, LINE_RATE)
    old = np.concatenate(
        [stream.process(ToneVoice().synthesize(s)) for s in models.pieces(text)]
    )  # what speak() gave before the cache: one stream across pieces, never flushed
    new = np.concatenate(pieces)
    assert abs(new.size - old.size) <= len(pieces)
    rms_old = np.sqrt(np.mean(old.astype(np.float64) ** 2))
    rms_new = np.sqrt(np.mean(new.astype(np.float64) ** 2)) * np.sqrt(new.size / old.size)
    assert abs(20 * np.log10(rms_new / rms_old)) < 0.05


def test_cached_audio_is_a_fresh_render_of_the_real_voice_sample_for_sample() -> None:
    from agent.voice.tts import PiperTts

    tts = PiperTts(threads=1)
    fixed = ("Thanks for calling Acme Support.", "Please hold.")
    cached = _models(tts, fixed=fixed)
    fresh = _models(tts, max_bytes=0, fixed=fixed)  # no cache: every piece rendered now
    for piece in fixed:
        a = cached.synthesize(piece)
        b = cached.synthesize(piece)
        assert b is a  # from the cache
        c = fresh.synthesize(piece)
        assert np.array_equal(a, c) and a.dtype == np.int16 and a.size > 4000
    assert cached.cache.stats().hits == 2 and fresh.cache.stats().entries == 0


# ---- the phrases a profile always says -----------------------------------------------------


def test_fixed_pieces_of_templates_with_values_are_found() -> None:
    split = _models(ToneVoice()).pieces
    t = parse_template("Done. I've asked for order {n:spell} to be cancelled. Anything else?")
    pieces = constant_pieces(t, split)
    assert "Anything else?" in pieces and "Done." in pieces
    assert not any("order" in p for p in pieces)  # the value's sentence is rendered per call
    assert constant_pieces(parse_template("Order {n:spell} {order.status}."), split) == []
    greeting = parse_template("Thanks for calling {company}. How can I help?")
    assert constant_pieces(greeting, split, {"company": "Acme"}) == [
        "Thanks for calling Acme.", "How can I help?",
    ]  # fmt: skip


def test_warm_up_renders_every_fixed_phrase_of_the_demo_so_calls_render_none() -> None:
    profile = load_profile(DEMO)
    voice = ToneVoice()
    models = _models(voice)
    rendered = models.warm_phrases([profile]).result(timeout=30)
    assert rendered == len(voice.said) > 10
    key = (voice.voice_id, voice.length_scale)
    assert (
        voice.said[0]
        == models.pieces(  # the greeting first
            profile.greeting.render(dict(profile.variables))
        )[0]
    )
    for t in spoken_templates(profile):  # every template without a slot value is whole
        if isinstance(t, str) or not (t.names - profile.variables.keys()):
            text = t if isinstance(t, str) else t.render(dict(profile.variables))
            assert all((*key, p) in models.cache for p in models.pieces(text)), text
    assert (*key, "Anything else?") in models.cache  # the fixed end of replies with values
    assert not any("1 2 3 4 5" in s for s in voice.said)  # nothing with a caller's value
    before = len(voice.said)
    said = (
        profile.greeting.render(dict(profile.variables)),
        profile.fallback.replies[0].render({}),
        "Sure, I'm putting you through to a colleague. Please hold.",
    )
    for text in said:
        list(models.speak(text, threading.Event()))
    assert len(voice.said) == before  # a call's greeting and fixed replies: all from the cache
    assert models.warm_phrases([profile]).result(timeout=30) == 0  # warm already: no work
    assert profile_pieces(profile, models.pieces)[0] == voice.said[0]


class _ToneModels(VoiceModels):
    """VoiceModels as sip_bridge.agents makes them, with the stand-in voice."""

    voices: ClassVar[list[ToneVoice]] = []

    def __init__(self, settings: ModelSettings, *, length_scale: float | None = None,
                 cache: PhraseCache | None = None) -> None:  # fmt: skip
        voice = ToneVoice(length_scale=length_scale or 1.0)
        self.voices.append(voice)
        stub = cast(Any, object())
        super().__init__(settings, vad=stub, turn=stub, asr=stub, tts=cast(Any, voice),
                         cache=cache)  # fmt: skip

    def warm_up(self) -> float:
        return 0.0


def test_profile_load_and_reload_warm_the_profiles_phrases(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import agent.voice.voice_models

    monkeypatch.setattr(agent.voice.voice_models, "VoiceModels", _ToneModels)
    monkeypatch.setattr(agents, "_models", {})
    monkeypatch.setattr(agents, "_profiles", {})
    monkeypatch.setattr(agents, "_phrase_cache", None)
    profile = tmp_path / "p.toml"
    profile.write_text(DEMO.read_text())
    config = BridgeConfig(agent=AgentConfig(voice_profile=str(profile)))
    agents.load_agent_models(config)  # what the bridge does before it listens
    models, _ = agents.prepare_agents(config)
    assert models.warming is not None and models.warming.result(timeout=30) > 10
    key = ("tone", 1.0)
    assert (*key, "Thanks for calling Acme Support.") in models.cache
    stats = agents.phrase_cache_stats()
    assert stats is not None and stats.entries > 10 and stats.max_bytes == 32 << 20

    # an edit: a new greeting; the reload loads the agents again (BridgeServer.reload)
    text = DEMO.read_text().replace(
        'greeting = """Thanks for calling {company} Support.', 'greeting = """Welcome to {company}.'
    )
    profile.write_text(text)
    import os

    st = profile.stat()
    os.utime(profile, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a new version
    agents.load_agent_models(config)
    again, _ = agents.prepare_agents(config)
    assert again is models  # same voice and speed: the same models and cache
    assert models.warming.result(timeout=30) == 1  # the new greeting's piece, only
    assert (*key, "Welcome to Acme.") in models.cache
    assert _ToneModels.voices[-1].said[-1] == "Welcome to Acme."


def test_the_cache_is_in_the_metrics_once_there_is_one() -> None:
    m = BridgeMetrics()
    stats: list[Any] = [None]
    m.tts_cache(lambda: stats[0])
    assert b"tts_cache" not in m.render()
    cache = PhraseCache(4096)
    cache.put("a", _pcm(100))
    cache.get("a")
    cache.get("b")
    stats[0] = cache.stats()
    values = {
        s.name: s.value
        for f in text_string_to_metric_families(m.render().decode())
        for s in f.samples
        if s.name.startswith("sipbridge_tts_cache")
    }
    assert values == {
        "sipbridge_tts_cache_hits_total": 1.0,
        "sipbridge_tts_cache_misses_total": 1.0,
        "sipbridge_tts_cache_evictions_total": 0.0,
        "sipbridge_tts_cache_entries": 1.0,
        "sipbridge_tts_cache_bytes": 200.0,
        "sipbridge_tts_cache_max_bytes": 4096.0,
    }

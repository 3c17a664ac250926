"""ReplyPlayout: the agent's model of what of its reply the caller has heard.

Barge-in depends on it twice: the RMS of what is on the wire this tick is the echo
reference, and cut() decides what the transcript says the agent said. Both are checked
against numbers worked out here from the samples and the sentence lengths.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from agent.voice.reply_playout import ReplyPlayout

TICK = 160


def _rms(x: NDArray[np.int16]) -> float:
    return float(np.sqrt(np.mean(x.astype(np.float64) ** 2))) if x.size else 0.0


def _noise(n: int, seed: int) -> NDArray[np.int16]:
    return np.random.default_rng(seed).integers(-20000, 20000, n).astype(np.int16)


def _const(n: int, value: int = 1000) -> NDArray[np.int16]:
    return np.full(n, value, np.int16)


def test_nothing_written_plays_nothing() -> None:
    p = ReplyPlayout()
    assert p.advance(TICK) == 0.0
    assert (p.head, p.written, p.queued, p.playing) == (0, 0, 0, False)


def test_advance_returns_rms_of_exactly_the_samples_played() -> None:
    a, b = _const(100, 1000), _const(300, -3000)
    p = ReplyPlayout()
    p.write(a)
    p.write(b)
    assert (p.written, p.queued, p.playing) == (400, 400, True)
    # 100 samples of 1000 and 60 of -3000 went out in this tick
    assert np.isclose(p.advance(TICK), np.sqrt((100 * 1000**2 + 60 * 3000**2) / 160))
    assert (p.head, p.queued) == (160, 240)
    assert np.isclose(p.advance(TICK), 3000.0)
    # only 80 samples are left: the RMS is theirs, not diluted over the tick
    assert np.isclose(p.advance(TICK), 3000.0)
    assert (p.head, p.queued, p.playing) == (400, 0, False)


@settings(max_examples=60, deadline=None)
@given(
    chunks=st.lists(st.integers(0, 700), min_size=1, max_size=8),
    steps=st.lists(st.integers(1, 500), min_size=1, max_size=12),
)
def test_advance_matches_the_concatenated_stream(chunks: list[int], steps: list[int]) -> None:
    audio = [_noise(n, i) for i, n in enumerate(chunks)]
    whole = np.concatenate(audio)
    p = ReplyPlayout()
    for a in audio:
        p.write(a)
    assert p.written == whole.size
    for n in steps:
        before = p.head
        level = p.advance(n)
        assert p.head == min(whole.size, before + n)
        assert np.isclose(level, _rms(whole[before : p.head]), rtol=1e-9)
        assert 0 <= p.queued == whole.size - p.head


def test_advance_past_the_end_stops_at_the_end() -> None:
    p = ReplyPlayout()
    p.write(_const(50))
    assert np.isclose(p.advance(10_000), 1000.0)
    assert (p.head, p.written, p.queued, p.playing) == (50, 50, 0, False)
    assert p.advance(TICK) == 0.0
    assert (p.head, p.queued) == (50, 0)
    p.write(_const(30, 2000))  # more audio later plays from where the head is
    assert np.isclose(p.advance(TICK), 2000.0)
    assert (p.head, p.written, p.queued) == (80, 80, 0)


def test_empty_write_changes_nothing() -> None:
    p = ReplyPlayout()
    p.begin_sentence("Hello.")
    p.write(np.zeros(0, np.int16))
    assert (p.written, p.playing) == (0, False)


def test_take_heard_reports_each_whole_sentence_once() -> None:
    p = ReplyPlayout()
    p.begin_sentence("First one.")
    p.write(_const(320))
    p.begin_sentence("Second one.")
    p.write(_const(480))
    p.advance(300)
    assert p.take_heard() == ""  # 20 samples of the first sentence still to go
    p.advance(20)
    assert p.take_heard() == "First one."
    assert p.take_heard() == ""
    p.advance(479)
    assert p.take_heard() == ""
    p.advance(1)
    assert p.take_heard() == "Second one."
    p.advance(TICK)
    assert p.take_heard() == ""


def test_take_heard_several_sentences_at_once() -> None:
    p = ReplyPlayout()
    for text in ("A.", "B.", "C."):
        p.begin_sentence(text)
        p.write(_const(100))
    p.advance(250)
    assert p.take_heard() == "A. B."
    p.advance(50)
    assert p.take_heard() == "C."


def test_a_sentence_written_in_several_chunks_ends_at_its_last_sample() -> None:
    p = ReplyPlayout()
    p.begin_sentence("One two three four.")
    p.write(_const(200))
    p.write(_const(200))
    p.begin_sentence("Five six.")
    p.write(_const(100))
    p.write(_const(300))
    p.advance(399)
    assert p.take_heard() == ""
    p.advance(1)
    assert p.take_heard() == "One two three four."
    # 3/4 of "Five six." played: int(2 * 0.75) = 1 word
    p.advance(300)
    assert p.cut() == "Five ..."


def test_cut_gives_whole_sentences_then_the_words_played_and_resets() -> None:
    p = ReplyPlayout()
    p.begin_sentence("Thanks for calling.")
    p.write(_const(400))
    p.begin_sentence("one two three four five six seven eight nine ten")
    p.write(_const(1000))
    p.advance(400 + 370)  # 37 % of the ten words: 3 of them
    assert p.cut() == "Thanks for calling. one two three ..."
    assert (p.head, p.written, p.queued, p.playing) == (0, 0, 0, False)
    assert p.advance(TICK) == 0.0
    assert p.take_heard() == ""
    assert p.cut() == ""


def test_cut_does_not_repeat_what_take_heard_already_reported() -> None:
    p = ReplyPlayout()
    p.begin_sentence("Hello there.")
    p.write(_const(200))
    p.begin_sentence("alpha beta gamma delta")
    p.write(_const(400))
    p.advance(200)
    assert p.take_heard() == "Hello there."
    p.advance(200)  # half of the second sentence: 2 of 4 words
    assert p.cut() == "alpha beta ..."


def test_cut_before_a_whole_word_was_heard_says_nothing_of_that_sentence() -> None:
    p = ReplyPlayout()
    p.begin_sentence("Short.")
    p.write(_const(100))
    p.begin_sentence("one two three four")
    p.write(_const(400))
    p.advance(100 + 99)  # 99/400 of four words: int(0.99) = 0
    assert p.cut() == "Short."


def test_cut_after_everything_played_reports_the_unreported_sentences() -> None:
    p = ReplyPlayout()
    p.begin_sentence("All of it.")
    p.write(_const(160))
    p.advance(10 * TICK)
    assert p.cut() == "All of it."


def test_cut_between_a_sentence_start_and_its_audio_does_not_claim_it_was_heard() -> None:
    """The TTS announces a sentence (begin_sentence) before its audio exists; if the one
    before has finished playing and the caller cuts in now, not a word of it was heard."""
    p = ReplyPlayout()
    p.begin_sentence("Thanks for calling.")
    p.write(_const(320))
    p.advance(320)  # the first sentence has been heard
    p.begin_sentence("Here is the second sentence.")  # its audio is still being made
    assert p.cut() == "Thanks for calling."


def test_a_filler_written_aside_plays_before_a_sentence_still_being_synthesised() -> None:
    p = ReplyPlayout()
    p.begin_sentence("Order 5 4 3 2 1 is being packed.")  # announced; its audio not here yet
    p.write_aside(_const(800), "One moment.")
    p.write(_const(1600))  # the sentence's audio comes after the filler
    p.advance(800)
    assert p.last_played == 800 and p.take_heard() == "One moment."
    p.advance(800)
    assert p.take_heard() == ""  # half of the sentence
    p.advance(800)
    assert p.take_heard() == "Order 5 4 3 2 1 is being packed."
    assert p.advance(TICK) == 0.0 and p.last_played == 0


def test_a_tone_aside_is_heard_but_says_nothing() -> None:
    p = ReplyPlayout()
    p.begin_sentence("Hello there.")
    p.write(_const(320))
    p.write_aside(_const(160))  # a pip after it: its own (wordless) sentence
    p.advance(480)
    assert p.take_heard() == "Hello there."
    p.write_aside(_const(320), "One moment.")
    p.advance(160)
    assert p.cut() == "One ..."


def test_cut_with_a_fade_keeps_the_faded_samples_playing() -> None:
    """The bridge plays the fade, so the agent's model plays it too (it is the echo
    canceller's reference): the next samples, multiplied by the same gain, then nothing."""
    p = ReplyPlayout()
    p.begin_sentence("one two three four")
    audio = _noise(4000, 3)
    p.write(audio[:1500])
    p.write(audio[1500:])
    p.play(1000)
    gain = np.linspace(1.0, 0.0, 800, endpoint=False)
    assert p.cut(gain) == "one ..."
    assert p.playing and p.queued == 800
    faded = np.concatenate([p.play(TICK) for _ in range(5)])
    assert np.array_equal(faded, np.rint(audio[1000:1800] * gain).astype(np.int16))
    assert not p.playing and not p.play(TICK).any()
    assert p.take_heard() == ""  # the fade is no sentence: nothing more was "said"


def test_texts_are_every_worded_sentence_until_a_reset() -> None:
    """What the line can echo back to us: played, playing or announced, fillers too."""
    p = ReplyPlayout()
    p.begin_sentence("Thanks for calling.")
    p.write(_const(320))
    p.write_aside(_const(160))  # a tone says nothing
    p.write_aside(_const(320), "One moment.")
    p.begin_sentence("Goodbye.")  # announced, its audio not here yet
    p.advance(320)
    assert p.texts() == ["Thanks for calling.", "One moment.", "Goodbye."]
    p.cut()
    assert p.texts() == []


def test_ringback_is_on_the_wire_ahead_of_the_reply_but_not_part_of_it() -> None:
    """Ringback while a transfer rings goes out beside the reply: the echo reference has
    it (in the bridge's order: before a reply written after it), the reply's timeline does
    not (nothing heard, nothing queued, last_played 0), and a reply's samples still count."""
    p = ReplyPlayout()
    ring = _const(2 * TICK, 700)  # the first ringback write: a frame ahead
    p.write_background(ring)
    assert not p.playing and p.queued == 0
    assert np.array_equal(p.play(TICK), ring[:TICK]) and p.last_played == 0
    p.begin_sentence("Sorry, nobody answered.")
    reply = _noise(2 * TICK, 5)
    p.write(reply)
    assert np.array_equal(p.play(TICK), ring[TICK:]) and p.last_played == 0
    assert (p.head, p.queued) == (0, 2 * TICK)
    assert np.array_equal(p.play(TICK), reply[:TICK]) and p.last_played == TICK
    assert np.array_equal(p.play(TICK), reply[TICK:]) and not p.playing
    p.write_background(_const(TICK // 2, 500))  # (only ever written with no reply queued:
    p.write(reply)  # what comes after it plays after it, in the tick's other half)
    assert np.isclose(p.advance(TICK), _rms(reply[: TICK // 2]))
    assert p.last_played == TICK // 2 and p.head == 2 * TICK + TICK // 2


def test_a_cut_or_a_hold_drops_the_ringback_the_bridge_dropped() -> None:
    p = ReplyPlayout()
    p.write_background(_const(2 * TICK))
    p.cut(np.linspace(1.0, 0.0, 80, endpoint=False))
    assert not p.play(TICK).any()
    p.write(_const(4 * TICK))
    p.play(TICK)
    p.write_background(_const(TICK))
    p.hold(np.linspace(1.0, 0.0, 80, endpoint=False))
    assert not p.play(TICK)[80:].any()


def test_ticks_of_ringback_or_a_tone_say_so() -> None:
    """The echo canceller must not learn the line from a tone (see EchoCanceller.process):
    each tick says whether any of it was ringback, hold audio or a wordless aside."""
    p = ReplyPlayout()
    p.write_background(_const(TICK))
    p.play(TICK)
    assert p.last_tone
    p.begin_sentence("Hello there.")
    p.write(_noise(TICK + 80, 1))
    p.write_aside(_const(TICK))  # a pip after it
    p.write(_noise(TICK, 2))
    played = [(p.play(TICK), p.last_tone)[1] for _ in range(4)]
    assert played == [False, True, True, False]
    p.play(TICK)
    assert not p.last_tone

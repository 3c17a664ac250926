"""Replies prepared during the caller's pause: adopted when the turn ends, dropped without a
trace when the caller goes on (fake models, the harness of test_voice_agent)."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import pytest
from test_voice_agent import HOURS, Call, aio

from agent.dialogue.sentences import split_sentences
from agent.voice.speculation import Speculation
from agent.voice.voice_models import FIRST_WORDS

# serial: the fake models answer on executor threads, and the tests count the ticks until
# their results land ("the tick the turn ends"): other tests' load delays those threads
pytestmark = pytest.mark.serial


@aio
async def test_a_reply_prepared_in_the_pause_goes_out_the_tick_the_turn_ends() -> None:
    first = split_sentences(HOURS, first_max_words=FIRST_WORDS)[0]
    async with Call() as c:
        c.models.asr_texts.append("what are your opening hours")
        c.vad(True, True)
        await c.tick(8, 2000)
        c.vad(False, False)
        await c.tick(4)  # 80 ms of pause: past the 60 ms that starts the speculation
        spec = c.agent._spec
        assert spec is not None
        await c.until(lambda: spec.task.done(), "the reply, prepared in the pause")
        assert spec.first_audio is not None and spec.first_audio[0] == first
        assert c.out.writes == [] or c.out.writes[-1][0] < c.out.tick - 4  # nothing said yet
        n = len(c.out.writes)
        assert c.agent.engine is not None and c.agent.engine.turns == 0  # only the fork knows
        c.models.eot.fire = "model"
        await c.tick()
        turn = c.agent.turns[-1]
        assert turn.speculative and turn.text == "what are your opening hours"
        assert len(c.out.writes) > n and c.out.writes[n][0] == c.out.tick  # at once
        assert turn.tts_first <= turn.turn_end <= turn.first_write
        assert c.agent.engine.turns == 1  # the fork that answered was adopted
        await c.drain()
        assert c.transcript[-1] == ("agent", HOURS)


@aio
async def test_a_first_piece_in_the_phrase_cache_needs_no_model_worker() -> None:
    pieces = split_sentences(HOURS, first_max_words=FIRST_WORDS)
    async with Call() as c:
        c.models.cache = {p: np.full(800, 1000, np.int16) for p in pieces}
        spec = await _spoke_and_paused(c, "what are your opening hours")
        assert spec.first_audio is not None and spec.first_audio[1] is c.models.cache[pieces[0]]
        c.models.eot.fire = "model"
        await c.tick()
        await c.drain()
        assert c.transcript[-1] == ("agent", HOURS)
        assert not set(pieces) & set(c.models.produced)  # no piece went to the TTS


@aio
async def test_a_pause_that_was_not_the_end_leaves_no_trace_and_its_words_are_kept() -> None:
    async with Call() as c:
        # what the transcriber has at each pause: the utterance so far, never split
        c.models.asr_texts.extend(["where is my", "where is my order"])
        c.vad(True, True)
        await c.tick(8, 2000)
        c.vad(False)
        await c.tick(4)  # a speculation on "where is my" starts...
        await c.until(lambda: c.agent._spec is not None and c.agent._spec.heard.is_set())
        c.vad(True)  # ...and the caller goes on
        await c.tick(6, 2000)
        assert c.agent._spec is None and c.out.writes[-1][0] < c.out.tick - 10
        engine = c.agent.engine
        assert engine is not None and engine.turns == 0 and engine.transcript[-1][0] == "agent"
        c.vad(False, False)
        await c.tick(2)
        c.models.eot.fire = "model"
        await c.tick()
        await c.until(lambda: bool(c.agent.turns) and bool(c.agent.turns[-1].text))
        assert c.agent.turns[-1].text == "where is my order"  # the whole utterance
        await c.drain()
        assert ("caller", "where is my order") in c.transcript
        assert c.transcript[-1][0] == "agent" and "order number" in c.transcript[-1][1]


@aio
async def test_dropping_a_speculation_never_cancels_the_transcription_it_carries() -> None:
    """A speculation dropped while it still waits for the ASR must not cancel that
    transcription: its segments are the transcriber's too (cancelling them once cost the
    whole turn its words)."""
    async with Call() as c:
        slow: Future[str] = Future()  # like IncrementalTranscriber's joined result
        c.models.finish_futures.append(slow)
        c.models.asr_texts.append("one two three")
        c.vad(True, True)
        await c.tick(8, 2000)
        c.vad(False)
        await c.tick(4)  # speculation on the slow "one two"...
        assert c.agent._spec is not None and not c.agent._spec.heard.is_set()
        c.vad(True)  # ...dropped while it waits
        await c.tick(4, 2000)
        assert not slow.cancelled()
        slow.set_result("one two")
        c.vad(False, False)
        await c.tick(2)
        c.models.eot.fire = "model"
        await c.tick()
        await c.until(lambda: bool(c.agent.turns) and c.agent.turns[-1].asr_done > 0)
        assert c.agent.turns[-1].text == "one two three"


async def _spoke_and_paused(c: Call, text: str) -> Speculation:
    """The caller said ``text`` (as the ASR will hear it) and paused; the reply prepared in
    the pause is ready."""
    c.models.asr_texts.append(text)
    c.vad(True, True)
    await c.tick(8, 2000)
    c.vad(False, False)
    await c.tick(4)
    spec = c.agent._spec
    assert spec is not None
    await c.until(lambda: spec.task.done(), "the reply, prepared in the pause")
    return spec


@aio
async def test_words_the_dialogue_understood_end_the_turn_after_400_ms_of_pause() -> None:
    """smart-turn unsure (the fake never decides): a question a rule understood is answered
    after UNDERSTOOD_PAUSE_MS, not after max_silence_ms; words it cannot use yet wait."""
    async with Call() as c:
        await _spoke_and_paused(c, "what are your opening hours")
        await c.tick(14)  # 360 ms of pause: not yet
        assert not c.agent.turns
        await c.tick(2)  # 400 ms
        turn = c.agent.turns[-1]
        assert (turn.reason, turn.text, turn.speculative) == (
            "understood",
            "what are your opening hours",
            True,
        )
        await c.drain()
        assert c.transcript[-1] == ("agent", HOURS)


@aio
async def test_words_the_dialogue_cannot_use_yet_keep_the_wait() -> None:
    async with Call() as c:
        spec = await _spoke_and_paused(c, "hi i would like to ask about")
        await c.tick(30)  # 680 ms of pause
        assert not c.agent.turns and spec.engine.last_missed
        c.models.eot.fire = "timeout"  # max_silence_ms
        await c.tick()
        assert c.agent.turns[-1].reason == "timeout"


@aio
async def test_a_goodbye_the_dialogue_understood_ends_the_turn_after_400_ms_too() -> None:
    """A reply that ends the call is given as early as any other (smart-turn scores
    espeak's "No thanks, goodbye." 0.02-0.16): a caller who says more stops it before its
    hang-up, and is answered (tests/test_turn_merge.py)."""
    async with Call() as c:
        spec = await _spoke_and_paused(c, "no thanks goodbye")
        await c.tick(12)  # 320 ms of pause: not yet
        assert not c.agent.turns and spec.engine.ended
        await c.tick(4)
        assert c.agent.turns[-1].reason == "understood"


@aio
async def test_a_whole_value_refused_ends_the_turn_after_400_ms() -> None:
    """Five digits of an order that does not exist: a miss (it counts toward escalation),
    but the caller has said all they meant to, so "I can't find order ..." comes after
    400 ms of pause, not after max_silence_ms; four digits keep the wait."""
    async with Call() as c:
        await _spoke_and_paused(c, "where is my order")
        await c.tick(16)
        await c.drain()
        spec = await _spoke_and_paused(c, "one two three four six")
        await c.tick(16)
        assert spec.engine.last_missed and spec.engine.last_refused
        turn = c.agent.turns[-1]
        assert (turn.reason, turn.text) == ("understood", "one two three four six")
        await c.drain()
        assert "can't find order" in c.transcript[-1][1]
        spec = await _spoke_and_paused(c, "one two three four")
        await c.tick(30)
        assert c.agent.turns[-1] is turn and not spec.engine.last_refused

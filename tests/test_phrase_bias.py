"""Leaning the recogniser toward a profile's phrases: the bonus rule, candidate by
candidate, and the phrases a dialogue listens for at each point (no model here: the
decoder's choice with a bias is in tests/test_asr.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from agent.dialogue.engine import DialogueEngine
from agent.dialogue.profile_loader import load_profile
from agent.dialogue.vocabulary import listening_phrases
from agent.voice.phrase_bias import PhraseBias, bias_text, phrase_bias

DEMO = Path(__file__).resolve().parents[1] / "config" / "agents" / "demo.toml"
W = 0.5


def _bonus(bias: PhraseBias, before: str, piece: str) -> float:
    return bias.bonus(bias_text(before), bias_text(before + piece))


def test_text_is_compared_as_the_engine_normalises_it() -> None:
    assert bias_text("That's all.") == "thats all"
    assert bias_text(" No thanks, good-") == "no thanks good"
    assert bias_text("") == ""


def test_a_candidate_earns_the_characters_it_carries_a_phrase_on() -> None:
    bias = PhraseBias(["goodbye", "no thanks", "order"], W)
    # " good" starts "goodbye" (4 letters: enough to be leaned toward), after a whole phrase
    assert _bonus(bias, "No thanks,", " good") == pytest.approx(W * 4)
    assert _bonus(bias, "No thanks, good", "bye") == pytest.approx(W * 3)
    # the same word in one token earns the same as in two
    assert _bonus(bias, "No thanks,", " goodbye") == pytest.approx(W * 7)
    assert _bonus(bias, "Cancel an", " order") == pytest.approx(W * 5)
    assert _bonus(bias, "Cancel an", " augur") == 0.0
    # punctuation carries nothing on
    assert _bonus(bias, "No thanks", ",") == 0.0


def test_short_prefixes_and_short_words_alone_earn_nothing() -> None:
    bias = PhraseBias(["cancel", "bye", "four", "no thanks"], W)
    assert _bonus(bias, "", "Can") == 0.0  # "Could" must not lean to "Can" for "cancel"
    assert _bonus(bias, "Can", "cel") == pytest.approx(W * 6)  # paid once it is 4 long
    assert _bonus(bias, "Good", " bye") == 0.0  # "by" / "bye": a short word alone
    assert _bonus(bias, "A table for", " four") == pytest.approx(W * 4)  # whole, 4 long
    assert _bonus(bias, "", "No") == 0.0  # "no" alone is short...
    assert _bonus(bias, "No", " thanks") == pytest.approx(W * 9)  # ...carried on, it is paid


def test_off_or_empty_leans_nowhere() -> None:
    assert not PhraseBias(["order"], 0.0).active
    assert not PhraseBias([], W).active
    assert PhraseBias(["order"], 0.0).bonus("", "order") == 0.0
    with pytest.raises(ValueError):
        PhraseBias(["order"], -1.0)
    assert phrase_bias(("order",), W) is phrase_bias(("order",), W)  # shared per set


def test_the_choice_among_candidates_is_moved_only_within_the_bonus() -> None:
    """What the decoder does with it: the best candidate after the bonus. A close second
    that carries a phrase on wins; one far behind does not."""
    bias = PhraseBias(["goodbye"], W)
    logits = {" nor": -0.77, " good": -0.91, ",": -3.0}

    def choose(scores: dict[str, float]) -> str:
        return max(scores, key=lambda p: scores[p] + _bonus(bias, "No thanks,", p))

    assert choose(logits) == " good"
    assert choose(logits | {" good": -0.77 - 2.5}) == " nor"  # 2.5 nats behind: not moved
    assert np.isclose(_bonus(bias, "No thanks,", " nor"), 0.0)


def test_the_dialogue_listens_for_its_keywords_and_the_slot_asked() -> None:
    profile = load_profile(DEMO)
    top = listening_phrases(profile)
    assert {"opening hours", "cancel", "goodbye", "no thanks", "thats all"} <= set(top)
    assert "four" not in top and "yes" not in top  # no slot asked: no digits, no yes/no
    digits = listening_phrases(profile, profile.slots["order_number"])
    assert {"one", "four", "nine"} <= set(digits) and set(top) <= set(digits)
    yes_no = listening_phrases(profile, profile.slots["confirm"])
    assert {"yes", "no", "thats right"} <= set(yes_no)
    confirming = listening_phrases(profile, None, confirming=True)
    assert "yes" in confirming


def _say(engine: DialogueEngine, text: str) -> None:
    async def go() -> None:
        async for _ in engine.respond(text):
            pass

    asyncio.run(go())


def test_the_engine_says_what_it_listens_for_as_the_call_goes_on() -> None:
    engine = DialogueEngine(load_profile(DEMO))
    assert "five" not in engine.listening_for()
    _say(engine, "I need to cancel an order.")  # asks for the order number
    assert "five" in engine.listening_for()
    _say(engine, "one two three four five")  # asks "should I cancel ...? yes or no"
    assert "yes" in engine.listening_for() and "five" not in engine.listening_for()


def test_a_finished_transcript_earns_only_the_phrases_it_holds_whole() -> None:
    bias = PhraseBias(["goodbye", "no thanks", "talk to a"], 0.5)
    assert bias.whole(bias_text("No thanks, goodbye.")) == 0.5 * (len("goodbye") + 9)
    assert bias.whole(bias_text("Talk to Hansel.")) == 0.0  # begun, not finished
    assert bias.whole(bias_text("goodbyes")) == 0.0  # words, not letters
    assert PhraseBias(["goodbye"], 0.0).whole("goodbye") == 0.0

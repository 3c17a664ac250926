"""What counts as a backchannel: only backchannel words, as an ASR spells them, or nothing."""

from __future__ import annotations

import pytest

from agent.dialogue.backchannel import DEFAULT_BACKCHANNELS, is_backchannel, phrases, takes_floor

KNOWN = phrases(DEFAULT_BACKCHANNELS)


@pytest.mark.parametrize(
    "text",
    ["Uh-huh.", "uh huh", "Mm-hmm.", "Okay.", "OK", "Right?", "All right.", "Okay, right.", ""],
)
def test_backchannels_as_the_asr_writes_them(text: str) -> None:
    assert is_backchannel(text, KNOWN)


@pytest.mark.parametrize(
    "text",
    ["Okay, what are your hours?", "right now", "Yes.", "Yeah.", "No.", "Stop.", "all"],
)
def test_words_that_say_something_are_not(text: str) -> None:
    assert not is_backchannel(text, KNOWN)


def test_a_profile_s_own_list_and_none() -> None:
    own = phrases(["you bet", "sure"])
    assert is_backchannel("You bet!", own) and is_backchannel("Sure, sure.", own)
    assert not is_backchannel("Okay.", own)
    assert not is_backchannel("Okay.", ()) and not is_backchannel("", ())  # turned off


@pytest.mark.parametrize(
    ("text", "floor"),
    [("Wait.", True), ("Hello?", True), ("No, no.", True), ("Hold on.", True),
     ("A minimum.", False), ("Ah, her,", False), ("", False), ("nowhere", False)],
)  # fmt: skip
def test_words_that_ask_for_the_floor(text: str, floor: bool) -> None:
    assert takes_floor(text) == floor

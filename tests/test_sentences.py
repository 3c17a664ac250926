"""Sentence splitting for TTS: what a phone reply is cut into, in one go and streamed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.dialogue.sentences import SentenceBuffer, split_sentences


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello there. How are you?", ["Hello there.", "How are you?"]),
        ("Wait! Really?! Yes.", ["Wait!", "Really?!", "Yes."]),
        ("Dr. Smith will call Mr. Jones.", ["Dr. Smith will call Mr. Jones."]),
        ("Bring e.g. a passport. Thanks.", ["Bring e.g. a passport.", "Thanks."]),
        ("It costs 9.30 today. Ok.", ["It costs 9.30 today.", "Ok."]),
        ("We open at 5:00. Bye.", ["We open at 5:00.", "Bye."]),
        ("Your order 12345. It ships.", ["Your order 12345.", "It ships."]),
        ('He said "stop." Then left.', ['He said "stop."', "Then left."]),
        ("Well... I think so.", ["Well...", "I think so."]),
        ("Pens, paper etc. and more.", ["Pens, paper etc. and more."]),
        ("Pens, paper etc. Anything else?", ["Pens, paper etc.", "Anything else?"]),
        ("We are in the U.S. office.", ["We are in the U.S. office."]),
        ("Open at 9 a.m. daily.", ["Open at 9 a.m. daily."]),
        ("1. Open the app\n2. Log in", ["1. Open the app", "2. Log in"]),
        ("  Hello   world  ", ["Hello world"]),
        ("", []),
        ("   \n ", []),
        ("no punctuation at all", ["no punctuation at all"]),
    ],
)
def test_split_cases(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_long_first_sentence_is_cut_at_its_first_comma() -> None:
    text = (
        "Thank you for calling, our office is open from nine to five, Monday to Friday, "
        "and closed on public holidays."
    )
    assert split_sentences(text) == [
        "Thank you for calling,",
        "our office is open from nine to five, Monday to Friday, and closed on public holidays.",
    ]
    # a short first sentence stays whole, and only the first sentence is cut early
    assert split_sentences("Hello, how can I help?") == ["Hello, how can I help?"]
    second = "Fine. " + text
    assert split_sentences(second) == ["Fine.", text]


def test_long_sentence_without_commas_is_cut_after_max_words() -> None:
    words = [f"w{i}" for i in range(60)]
    pieces = split_sentences(" ".join(words) + ".")
    assert [len(p.split()) for p in pieces] == [25, 25, 10]
    assert " ".join(pieces) == " ".join(words) + "."


def test_long_sentence_is_cut_at_its_last_comma_within_the_limit() -> None:
    words = [f"w{i}" for i in range(40)]
    words[5] += ","
    words[20] += ","
    words[30] += ","
    pieces = split_sentences(" ".join(words), max_words=25, first_max_words=10)
    # first piece: earliest comma (word 6); then the last comma within 25 words (word 21
    # of the text is word 15 of the rest; word 31 is beyond the limit)
    assert pieces[0].split() == words[:6]
    assert pieces[1].split() == words[6:31]
    assert pieces[2].split() == words[31:]


def test_buffer_waits_for_the_end_of_a_sentence() -> None:
    buf = SentenceBuffer()
    assert buf.push("Hello there") == []
    assert buf.push(".") == []  # could still be "there.com" or "there..."
    assert buf.push(" How") == ["Hello there."]
    assert buf.push(" are you?") == []
    assert buf.push(" ") == ["How are you?"]
    assert buf.push("Call Dr. ") == []  # a title never ends a sentence
    assert buf.push("Smith at 9.") == []
    assert buf.push("30 please") == []
    assert buf.pending == "Call Dr. Smith at 9.30 please"
    assert buf.flush() == ["Call Dr. Smith at 9.30 please"]
    assert buf.pending == ""


def test_buffer_etc_waits_for_the_next_word() -> None:
    buf = SentenceBuffer()
    assert buf.push("Pens etc. ") == []
    assert buf.push("and") == []
    assert buf.push(" more. Next") == ["Pens etc. and more."]
    assert buf.flush() == ["Next"]


def test_buffer_resets_after_flush() -> None:
    text = "Thank you for calling, our office is open from nine to five today, Monday."
    buf = SentenceBuffer()
    first = buf.push(text + " ") + buf.flush()
    again = buf.push(text + " ") + buf.flush()
    assert first == again == split_sentences(text)
    assert first[0] == "Thank you for calling,"


_PIECES = st.sampled_from(
    [
        "Hello",
        "there",
        "Dr.",
        "Smith",
        "e.g.",
        "etc.",
        "U.S.",
        "9.30",
        "5:00",
        "12345.",
        "ok,",
        "yes;",
        "—",
        "Why?",
        "No!",
        "Well...",
        '"quoted."',
        "(aside).",
        "1.",
        "a.m.",
        "Then",
        "the",
        "office",
        "is",
        "open",
        "\n",
        "  ",
        " ",
        "x",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    words=st.lists(_PIECES, max_size=70),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
    max_words=st.integers(min_value=2, max_value=30),
    first_max_words=st.integers(min_value=1, max_value=12),
)
def test_streaming_in_any_pieces_equals_splitting_at_once(
    words: list[str], cuts: list[int], max_words: int, first_max_words: int
) -> None:
    text = " ".join(words)
    limits = {"max_words": max_words, "first_max_words": first_max_words}
    expected = split_sentences(text, **limits)
    buf = SentenceBuffer(**limits)
    got: list[str] = []
    last = 0
    for c in sorted(min(c, len(text)) for c in cuts):
        got += buf.push(text[last:c])
        last = c
    got += buf.push(text[last:])
    got += buf.flush()
    assert got == expected
    # nothing lost, nothing invented, no piece over the limit
    assert " ".join(got).split() == text.split()
    assert all(0 < len(p.split()) <= max_words for p in got)


def test_a_long_first_sentence_without_a_comma_is_cut_before_a_phrase() -> None:
    text = "Order 1 2 3 4 5 shipped on Monday and should arrive by Thursday."
    assert split_sentences(text, first_max_words=6) == [
        "Order 1 2 3 4 5 shipped",
        "on Monday and should arrive by Thursday.",
    ]
    # only the first piece is cut early; a streamed reply gives the same pieces
    buf = SentenceBuffer(first_max_words=6)
    pieces = [p for word in text.split(" ") for p in buf.push(word + " ")] + buf.flush()
    assert pieces == split_sentences(text, first_max_words=6)

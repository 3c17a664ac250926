"""A profile's fixed phrases: what every call may hear, cut as the speaker cuts it, without
the sentences that hold a caller's value."""

from __future__ import annotations

from pathlib import Path

from agent.dialogue.engine import TRANSFER_FAILED
from agent.dialogue.fixed_phrases import fixed_pieces
from agent.dialogue.profile_loader import load_profile
from agent.dialogue.sentences import split_sentences
from agent.voice.voice_models import FIRST_WORDS

AGENTS = Path(__file__).resolve().parents[1] / "config" / "agents"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "p.toml"
    p.write_text(text)
    return p


def test_the_demo_profiles_greeting_replies_and_closings_are_there_as_spoken() -> None:
    profile = load_profile(AGENTS / "demo.toml")
    pieces = fixed_pieces(profile, first_max_words=FIRST_WORDS)
    assert len(pieces) == len(set(pieces))
    greeting = profile.greeting.render(dict(profile.variables))  # {company} is the profile's
    assert set(split_sentences(greeting, first_max_words=FIRST_WORDS)) <= set(pieces)
    assert "Thanks for calling Acme Support." in pieces
    for said in (
        "Anything else?",
        "Please hold.",
        "Goodbye!",
        "One moment.",
        "Sorry, I didn't catch that.",
        "Are you still there?",  # limits.no_input_reply, and its goodbye
        "I can't hear anything, so I'll hang up now.",
    ):
        assert said in pieces
    # a sentence with the caller's order number is rendered when said, never ahead
    assert not [p for p in pieces if "order_number" in p or "{" in p or "\ufffc" in p]
    assert not [p for p in pieces if p.startswith("I can't find order")]


def test_per_call_values_leave_their_sentence_out_and_the_rest_in(tmp_path: Path) -> None:
    profile = load_profile(
        _write(
            tmp_path,
            """
[agent]
greeting = "Hello {caller}. Welcome to {shop}, how can I help you today with your order?"
filler = ""

[variables]
shop = "Bob's Bikes"

[slots.ref]
type = "digits"
prompt = "Your reference number?"
retry = "Say it again, please."

[intents.hours]
keywords = ["hours"]
slots = ["ref"]
reply = "We open at nine. Your reference is {ref}. Anything else?"

[fallback]
replies = ["Sorry?"]
""",
        )
    )
    pieces = fixed_pieces(profile, first_max_words=FIRST_WORDS)
    assert "Hello ." not in pieces and not [p for p in pieces if p.startswith("Hello")]
    # a later sentence is not cut as a reply's opening is (its first words)
    assert "Welcome to Bob's Bikes, how can I help you today with your order?" in pieces
    assert "Welcome to Bob's Bikes," not in pieces
    assert {"We open at nine.", "Anything else?", "Sorry?", "Your reference number?"} <= set(pieces)
    assert not [p for p in pieces if p.startswith("Your reference is")]
    assert "One moment." not in pieces  # no filler phrase in this profile
    # no [fallback] transfer_failed: the engine's own words are said instead
    assert set(split_sentences(TRANSFER_FAILED)) <= set(pieces)

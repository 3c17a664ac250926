"""The dialogue engine on the demo profile: what it says and does for what callers say."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.dialogue import (
    DialogueEngine,
    Hangup,
    ReplyPart,
    Say,
    SendDtmf,
    Transfer,
    digit_runs,
    yes_no,
)
from agent.profile import load_profile, normalize

ROOT = Path(__file__).resolve().parents[1]
DEMO = load_profile(ROOT / "config" / "agents" / "demo.toml")
AGENT_QUEUE = "sip:agent@127.0.0.1:5070"


def _turn(engine: DialogueEngine, text: str) -> list[ReplyPart]:
    async def go() -> list[ReplyPart]:
        return [p async for p in engine.respond(text)]

    return asyncio.run(go())


def _keys(engine: DialogueEngine, keys: str) -> list[ReplyPart]:
    async def go() -> list[ReplyPart]:
        return [p for k in keys async for p in engine.on_dtmf(k)]

    return asyncio.run(go())


def _said(parts: list[ReplyPart]) -> str:
    return " ".join(p.text for p in parts if isinstance(p, Say))


def _new(**kw: object) -> DialogueEngine:
    return DialogueEngine(DEMO, **kw)  # type: ignore[arg-type]


def test_greeting_offers_the_menu() -> None:
    (g,) = _new().greeting()
    assert isinstance(g, Say)
    assert g.text.startswith("Thanks for calling Acme Support")
    assert "press 1 for opening hours" in g.text


@pytest.mark.parametrize(
    "text",
    [
        "What are your opening hours?",
        "what are your opening ours",  # ASR drops the h
        "When are you open?",
        "When do you close today?",
        "Are you open on Saturday?",
        "What time do you open?",
        "What are your opening times?",
        "Hours.",
    ],
)
def test_hours_intent(text: str) -> None:
    assert _said(_turn(_new(), text)) == (
        "We're open Monday to Friday, 8 a.m. to 6 p.m., and Saturday 9 to 1."
    )


@pytest.mark.parametrize(
    "text",
    [
        "Where is my order?",
        "Where's my ordered?",  # ASR: "ordered"
        "What's the status of my order?",
        "I'm calling about my package.",
        "When will my delivery arrive?",
        "Has my parcel shipped yet?",
        "I'd like to track my orders.",
    ],
)
def test_order_status_asks_for_the_number_then_answers(text: str) -> None:
    e = _new()
    assert _said(_turn(e, text)).startswith("What is your order number?")
    assert _said(_turn(e, "It's 1 2 3 4 5.")) == (
        "Order 1 2 3 4 5 shipped on Monday and should arrive by Thursday."
    )


@pytest.mark.parametrize(
    "number",
    [
        "five four three two one",
        "54321",
        "5, 4, 3, 2, 1.",
        "fifty four thirty two one",
        "five four three to one",
    ],
)
def test_order_number_in_words_or_numerals(number: str) -> None:
    e = _new()
    _turn(e, "where is my order")
    assert _said(_turn(e, number)) == "Order 5 4 3 2 1 is being packed and ships tomorrow."


def test_number_in_the_question_skips_the_prompt() -> None:
    parts = _turn(_new(), "What's the status of order one one one one one?")
    assert _said(parts).startswith("Order 1 1 1 1 1 was delivered yesterday")


def test_unknown_order_asks_again_then_answers() -> None:
    e = _new()
    _turn(e, "Where is my order?")
    assert _said(_turn(e, "9 9 9 9 9")).startswith("I can't find order 9 9 9 9 9.")
    assert _said(_turn(e, "Sorry, 12345")).startswith("Order 1 2 3 4 5 shipped")


def test_wrong_length_number_gets_the_retry_prompt() -> None:
    e = _new()
    _turn(e, "Where is my order?")
    assert _said(_turn(e, "1 2 3")).startswith("Sorry, I need the five digit order number")
    assert _said(_turn(e, "1 2 3 4 5")).startswith("Order 1 2 3 4 5")


def test_another_question_while_a_slot_is_pending_switches_intent() -> None:
    e = _new()
    _turn(e, "Where is my order?")
    assert _said(_turn(e, "Actually, what are your opening hours?")).startswith("We're open")
    assert _said(_turn(e, "12345")).startswith("Sorry, I didn't catch that")  # no longer pending


@pytest.mark.parametrize(
    "text",
    [
        "I want to talk to a person.",
        "Can I speak to someone?",
        "Let me talk to a human.",
        "Representative.",
        "I'd like to speak to an agent, please.",
        "Can I talk to a real persons?",
    ],
)
def test_human_intent_transfers(text: str) -> None:
    e = _new()
    parts = _turn(e, text)
    assert parts == [
        Say("Sure, I'm putting you through to a colleague. Please hold."),
        Transfer(AGENT_QUEUE),
    ]
    assert e.ended and _turn(e, "hello?") == []


def test_failed_transfer_hands_the_caller_back() -> None:
    e = _new()
    _turn(e, "a person please")
    assert e.on_transfer_result(False) == [
        Say("Sorry, nobody is free right now. Is there anything else I can help with?")
    ]
    assert _said(_turn(e, "opening hours")).startswith("We're open")


@pytest.mark.parametrize("text", ["Goodbye.", "Bye!", "No, thank you.", "That's all, thanks."])
def test_goodbye_hangs_up(text: str) -> None:
    assert _turn(_new(), text) == [Say("Thanks for calling Acme. Goodbye!"), Hangup("intent")]


def test_cancel_order_with_yes_no_slot() -> None:
    e = _new()
    assert _said(_turn(e, "I want to cancel my order")).startswith("What is your order number")
    assert _said(_turn(e, "twelve thirty four five")) == (
        "Should I cancel order 1 2 3 4 5? Please say yes or no."
    )
    assert _said(_turn(e, "Yes, please.")).startswith("Done. I've asked for order 1 2 3 4 5")
    e = _new()
    _turn(e, "cancel order 54321")
    assert _said(_turn(e, "maybe")).startswith("Please say yes or no")
    assert (
        _said(_turn(e, "No, don't.")) == "OK, I'll leave order 5 4 3 2 1 as it is. Anything else?"
    )


def test_dtmf_menu_and_keypad_slot_with_hash() -> None:
    e = _new()
    assert _said(_keys(e, "1")).startswith("We're open")
    assert _said(_keys(e, "2")).startswith("What is your order number?")
    assert _keys(e, "123") == []  # still typing
    assert _keys(e, "*") == []  # clears
    assert _said(_keys(e, "54321")) == "Order 5 4 3 2 1 is being packed and ships tomorrow."
    assert ("caller", "(keypad 54321)") in e.transcript
    assert _said(_keys(e, "2")).startswith("What is your order number?")
    assert _said(_keys(e, "12#")).startswith("Sorry, I need the five digit")
    assert _keys(e, "0") == []  # the slot is still pending: 0 is a digit, not the menu
    assert _said(_keys(e, "#")).startswith("Sorry, I need the five digit")
    assert _keys(_new(), "0")[-1] == Transfer(AGENT_QUEUE)
    assert _said(_keys(_new(), "7")).startswith("Sorry, I didn't catch that")


def test_yes_no_from_keypad() -> None:
    e = _new()
    _turn(e, "cancel order 11111")
    assert _said(_keys(e, "2")).startswith("OK, I'll leave order 1 1 1 1 1")


def test_fallback_then_second_fallback_then_escalation() -> None:
    e = _new()
    first = _said(_turn(e, "Blue elephants."))
    second = _said(_turn(e, "Purple giraffes."))
    assert first.startswith("Sorry, I didn't catch that")
    assert second.startswith("Sorry, I still didn't get that. Press 1")
    assert _turn(e, "Green tigers.") == [
        Say("Let me get you to someone who can help."),
        Transfer(AGENT_QUEUE),
    ]


def test_a_match_resets_the_miss_count() -> None:
    e = _new()
    _turn(e, "mumble")
    _turn(e, "mumble")
    _turn(e, "opening hours")
    assert _said(_turn(e, "mumble")).startswith("Sorry, I didn't catch that")


def test_max_turns_says_the_closing_line_and_hangs_up() -> None:
    e = _new()
    for _ in range(19):
        assert _said(_turn(e, "opening hours")).startswith("We're open")
    last = _turn(e, "opening hours")
    assert _said(last[:1]).startswith("We're open")
    assert last[1:] == [
        Say("We're out of time for this call. Thanks for calling Acme. Goodbye!"),
        Hangup("max turns"),
    ]
    assert _turn(e, "opening hours") == []


def test_max_call_length_by_turn_and_by_timer() -> None:
    now = [100.0]
    e = _new(clock=lambda: now[0])
    now[0] += 299.0
    assert e.check_limits() == []
    assert _said(_turn(e, "opening hours")).startswith("We're open")
    now[0] += 1.0
    closing = [
        Say("We're out of time for this call. Thanks for calling Acme. Goodbye!"),
        Hangup("max call length"),
    ]
    assert _turn(e, "opening hours") == closing
    e2 = _new(clock=lambda: now[0])
    now[0] += 300.0
    assert e2.check_limits() == closing
    assert e2.check_limits() == [] and _keys(e2, "1") == []


def test_transcript_records_what_was_heard() -> None:
    e = _new()
    _turn(e, "Where is my order?")
    e.played("What is your order")  # barge-in cut the prompt
    _turn(e, "12345")
    assert e.transcript == [
        ("caller", "Where is my order?"),
        ("agent", "What is your order"),
        ("caller", "12345"),
    ]


def test_actions_set_variables_and_send_dtmf_with_caller(tmp_path: Path) -> None:
    p = tmp_path / "a.toml"
    p.write_text(
        '[agent]\ngreeting = "Hi {caller}."\n'
        '[intents.billing]\nkeywords = ["invoice", "billing"]\n'
        'set = { queue = "billing" }\nreply = "One moment {caller}, {queue} it is."\n'
        'send_dtmf = "42#"\ntransfer = "sip:ivr@pbx"\n'
        '[intents.who]\npatterns = ["^which queue"]\nreply = "Queue: {queue}."\n'
    )
    e = DialogueEngine(load_profile(p), variables={"caller": "Ann"})
    assert e.greeting() == [Say("Hi Ann.")]
    assert _turn(e, "It's about my invoices") == [
        Say("One moment Ann, billing it is."),
        SendDtmf("42#"),
        Transfer("sip:ivr@pbx"),
    ]
    e.on_transfer_result(False)
    assert _said(_turn(e, "Which queue am I in?")) == "Queue: billing."


def test_unrelated_words_do_not_trigger_intents() -> None:
    # short words must match exactly; "house" is not "hours", "other" not "order"
    for text in ("I live in a house", "some other thing", "now what", "by the way"):
        assert _said(_turn(_new(), text)).startswith("Sorry"), text


@pytest.mark.parametrize(
    ("text", "runs"),
    [
        ("one two three", ["123"]),
        ("1 2 3", ["123"]),
        ("12345", ["12345"]),
        ("twelve thirty four", ["1234"]),
        ("double five oh seven", ["5507"]),
        ("one hundred twenty three", ["123"]),
        ("five hundred and five", ["505"]),
        ("oh one", ["1"]),  # a leading "oh" is an exclamation
        ("one two and then three four", ["12", "34"]),
        ("i want to talk for a bit", []),  # soundalikes only between numbers
        ("one to three", ["123"]),
    ],
)
def test_digit_runs(text: str, runs: list[str]) -> None:
    assert digit_runs(normalize(text)) == runs


_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


@given(st.text(alphabet="0123456789", min_size=1, max_size=12), st.booleans())
def test_spoken_single_digits_round_trip(digits: str, as_words: bool) -> None:
    spoken = " ".join(_WORDS[int(d)] if as_words else d for d in digits)
    assert digit_runs(normalize(f"my number is {spoken} thanks")) == [digits]


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("Yes.", "yes"),
        ("Yeah, sure", "yes"),
        ("That's right", "yes"),
        ("No.", "no"),
        ("Nope", "no"),
        ("Please don't", "no"),
        ("Maybe", None),
        ("Yes, no, I don't know", None),
    ],
)
def test_yes_no(text: str, answer: str | None) -> None:
    assert yes_no(normalize(text)) == answer


# -- a sensitive slot: the demo's card payment ------------------------------------------------

CARD = "4111111111111111"  # the standard test card; the demo's cards table knows it


def test_a_keyed_card_number_reaches_the_engine_and_its_transcript_keeps_no_digit() -> None:
    e = _new()
    prompt = _said(_keys(e, "3"))  # the menu key for paying a bill
    assert prompt.startswith("Please type your 16 digit card number") and e.collecting_sensitive
    reply = _said(_keys(e, CARD))
    # the lookup found the card by its real number: the engine got it
    assert reply.startswith("Thank you. Your payment with your Visa card is approved."), reply
    assert not e.collecting_sensitive
    said = " ".join(text for who, text in e.transcript if who == "caller")
    assert "[redacted 16 digits]" in said and "1111" not in said, e.transcript


def test_a_spoken_card_number_reaches_the_engine_and_an_unknown_one_is_asked_again() -> None:
    e = _new()
    assert _said(_turn(e, "I would like to pay my bill")).startswith("Please type your 16")
    declined = _said(_turn(e, "five five five five " * 3 + "four four four four"))
    assert declined.startswith("Sorry, that card was declined") and e.collecting_sensitive
    spoken = "four " + "one " * 15
    assert "Visa card is approved" in _said(_turn(e, spoken))
    assert not any("one one" in text or "5555" in text for _, text in e.transcript)
    assert [t for w, t in e.transcript if w == "caller"][1:] == ["[redacted 16 digits]"] * 2

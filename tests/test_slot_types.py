"""Slot types a booking needs (date, time, number, choice, text): read from what callers say
and key, checked against the slot's rules, asked back when unsure; template formatters; the
shipped booking profile's whole flow on the dialogue engine."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from agent.dialogue.engine import DialogueEngine, ReplyPart, Say
from agent.dialogue.formatters import apply, date_spoken, ordinal, time_spoken
from agent.dialogue.profile import parse_template
from agent.dialogue.profile_loader import load_profile
from agent.dialogue.slot_values import (
    Heard,
    date_from_keys,
    read_choice,
    read_date,
    read_number,
    read_time,
    time_from_keys,
)
from agent.words import normalize
from testkit.dialogue_turns import said

ROOT = Path(__file__).resolve().parents[1]
BOOKING = load_profile(ROOT / "config" / "agents" / "booking.toml")
TODAY = dt.date(2026, 11, 25)  # a Wednesday


@pytest.mark.parametrize(
    ("said", "value", "sure"),
    [
        ("today", "2026-11-25", True),
        ("Tomorrow, please.", "2026-11-26", True),
        ("the day after tomorrow", "2026-11-27", True),
        ("yesterday", "2026-11-24", True),
        ("Next Tuesday.", "2026-12-01", True),
        ("on Wednesday", "2026-12-02", True),  # today is one: the next
        ("The fifteenth.", "2026-12-15", True),  # the next 15th
        ("the twenty first", "2026-12-21", True),
        ("March 3rd", "2027-03-03", True),
        ("the 3rd of March", "2027-03-03", True),
        ("on the 28", "2026-11-28", True),
        ("15 March", "2027-03-15", True),
        ("One time.", "2026-12-01", False),  # a lone number: the 1st, to be asked back
        ("I don't know", None, None),
    ],
)
def test_dates_as_callers_say_them(said: str, value: str | None, sure: bool | None) -> None:
    heard = read_date(normalize(said), TODAY)
    assert (heard.value, heard.sure) == (value, sure) if heard else value is None


@pytest.mark.parametrize(
    ("said", "value", "sure"),
    [
        ("half past two", "14:30", False),  # am or pm? the slot's hours settle it
        ("Half passed two.", "14:30", False),  # as ASR writes it
        ("2:30 p.m.", "14:30", True),
        ("two thirty in the afternoon", "14:30", True),
        ("fourteen hundred", "14:00", True),
        ("quarter to three", "14:45", False),
        ("ten past nine", "09:10", True),
        ("10 a.m.", "10:00", True),
        ("at 9 in the morning", "09:00", True),
        ("three o'clock", "15:00", False),
        ("noon", "12:00", True),
        ("whenever", None, None),
    ],
)
def test_times_as_callers_say_them(said: str, value: str | None, sure: bool | None) -> None:
    heard = read_time(normalize(said))
    assert (heard.value, heard.sure) == (value, sure) if heard else value is None


def test_keys_numbers_and_choices() -> None:
    assert date_from_keys("1503", TODAY) == Heard("2027-03-15")
    assert date_from_keys("2811", TODAY) == Heard("2026-11-28")
    assert date_from_keys("3102", TODAY) is None  # no 31st of February
    assert time_from_keys("1430") == Heard("14:30") and time_from_keys("2460") is None
    assert read_number(normalize("three of us")) == Heard("3")
    assert read_number(normalize("two or three")) == Heard("2", sure=False)
    options = dict(BOOKING.slots["treatment"].options)
    assert read_choice(normalize("I need a scale and polish"), options) == Heard("cleaning")
    assert read_choice(normalize("my check-up"), options) == Heard("checkup")
    assert read_choice(normalize("a cleaning or a filling"), options) is None  # which one?


def test_formatters() -> None:
    assert [ordinal(str(n)) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st",
    ]  # fmt: skip
    assert date_spoken("2026-12-15") == "Tuesday the 15th of December"
    assert [time_spoken(t) for t in ("14:30", "09:00", "12:00", "00:00", "00:05")] == [
        "2:30 pm", "9 am", "12 noon", "midnight", "12:05 am",
    ]  # fmt: skip
    assert apply("spell", "123") == "1 2 3" and apply("ordinal", "x") == "x"  # never fails
    t = parse_template("the {day:ordinal}, {d:date:spoken} at {t:time:spoken}, {n:spell}")
    said = t.render({"day": "1", "d": "2026-12-01", "t": "09:30", "n": "42"})
    assert said == "the 1st, Tuesday the 1st of December at 9:30 am, 4 2"


class Call:
    """The booking profile's dialogue on a fixed day."""

    def __init__(self) -> None:
        self.engine = DialogueEngine(BOOKING, today=lambda: TODAY)

    def say(self, text: str) -> str:
        return said(self.engine, text)

    def keys(self, keys: str) -> str:
        out = []
        for k in keys:
            turn = self.engine.press(k)
            if turn is not None:
                out += [p.text for p in turn.parts if isinstance(p, Say)]
        return " ".join(out)


def test_a_booking_by_voice_fills_what_the_first_sentencesaid() -> None:
    call = Call()
    assert "what time" in call.say("I'd like to book a cleaning on the fifteenth").lower()
    assert "name" in call.say("Half past two.")  # 14:30: the only reading within 08:00-17:30
    assert call.say("Alice Smith") == "I have Alice Smith. Is that right?"  # always asked
    said = call.say("Yes.")
    assert said.startswith(
        "That's a cleaning on Tuesday the 15th of December at 2:30 pm, for Alice Smith."
    ), said
    assert call.say("Yes please.").startswith(
        "You're booked for a cleaning on Tuesday the 15th of December at 2:30 pm."
    )


def test_unsure_values_are_asked_back_and_a_no_asks_again() -> None:
    call = Call()
    assert "check-up, a cleaning, or a filling" in call.say("Can I book an appointment?")
    assert "which day" in call.say("A filling.").lower()
    assert call.say("One time.") == "Tuesday the 1st of December, is that right?"
    assert call.say("No.").startswith("Which day would you like?")
    assert call.say("Uh, one.") == "Tuesday the 1st of December, is that right?"
    assert call.say("No, the second.").startswith("What time")  # a new, sure value
    assert "name" in call.say("three o'clock")  # 15:00: 03:00 is outside the hours
    assert call.say("Bob") == "I have Bob. Is that right?"
    assert "Wednesday the 2nd of December at 3 pm" in call.say("yes")


def test_the_rules_refuse_with_the_reason_then_ask_again() -> None:
    call = Call()
    call.say("book a check up")
    assert call.say("Saturday").startswith("We're closed on Saturdays. Which day?")
    assert call.say("yesterday").startswith("That day has already passed.")
    assert "what time" in call.say("next Monday").lower()  # an answer: the misses start over
    assert call.say("at 7 in the evening").startswith(
        "That's outside our hours, 8 am to 5:30 pm. What time?"
    )
    assert "name" in call.say("2:30 p.m.")
    again = Call()
    again.say("book a filling")
    assert again.say("the 3rd of March").startswith("I can only book up to 90 days ahead.")
    assert again.say("Saturday").startswith("We're closed")
    assert again.say("Sunday") == "Let me put you through to reception."  # 3 in a row


def test_a_booking_by_keypad() -> None:
    call = Call()
    assert "check-up" in call.keys("1")
    assert "which day" in call.say("a check up").lower()
    assert call.keys("2811").startswith("We're closed on Saturdays.")  # DDMM, 4 keys end it
    assert call.keys("#") == ""  # the terminator after a complete entry: no turn
    assert "what time" in call.keys("0112").lower()  # Tuesday the 1st of December
    assert call.keys("0715#").startswith("That's outside our hours")
    assert "name" in call.keys("1645#")
    assert call.say("Carol") == "I have Carol. Is that right?"
    assert "at 4:45 pm" in call.keys("1")
    assert call.keys("1").startswith("You're booked for a checkup on Tuesday the 1st")


def test_a_number_slot_with_min_and_max_and_a_text_slot(tmp_path: Path) -> None:
    f = tmp_path / "party.toml"
    f.write_text(
        '[agent]\ngreeting = "Hi."\n'
        '[slots.people]\ntype = "number"\nprompt = "How many?"\nmin = 1\nmax = 8\n'
        'confirm = "always"\nconfirm_prompt = "{people} people, right?"\n'
        'invalid = "We seat {people} at most... no: 1 to 8 people."\n'
        '[slots.note]\ntype = "text"\nprompt = "Anything we should know?"\n'
        '[intents.table]\nkeywords = ["table"]\nslots = ["people", "note"]\n'
        'reply = "A table for {people}, noted: {note}."\n'
    )
    engine = DialogueEngine(load_profile(f), today=lambda: TODAY)

    def say(text: str) -> str:
        return said(engine, text)

    assert say("a table please") == "How many?"
    assert say("twelve").startswith("We seat 12 at most... no: 1 to 8 people. How many?")
    assert say("four") == "4 people, right?"  # confirm = "always"
    assert say("yes") == "Anything we should know?"
    assert say("A high chair, please.") == "A table for 4, noted: A high chair, please."


@pytest.mark.parametrize(
    ("heard", "name"),
    [("Um, Bob Jones.", "Bob Jones"), ("Bob Jones, uh...", "Bob Jones"), ("Uh, um,", None),
     ("Um,", None), ("Emma", "Emma"), ("Umberto Eco.", "Umberto Eco")],
)  # fmt: skip
def test_a_text_slot_leaves_out_hesitations_and_waits_for_a_name(
    heard: str, name: str | None
) -> None:
    """The booking's name: "Um," alone (the caller still thinking, or the ASR's guess at
    half a word) is no name; it gets the slot's retry, which the voice agent holds until
    the caller has been quiet, rather than "I have Um. Is that right?"."""
    engine = DialogueEngine(BOOKING, today=lambda: TODAY)
    assert "what name" in said(engine, "I'd like a cleaning on Monday at ten").lower()
    reply = said(engine, heard)
    if name is None:
        assert engine.last_missed and "is that right" not in reply.lower()
    else:
        assert reply == f"I have {name}. Is that right?"


# a date that proves who calls (the one on the letter they got): a sensitive date slot
VERIFY = """
[agent]
greeting = "Hi."
[slots.dob]
type = "date"
sensitive = true
prompt = "The date on your letter, please."
[intents.verify]
keywords = ["verify"]
slots = ["dob"]
lookup = { table = "letters", key = "dob", as = "letter" }
not_found = "I can't find that letter. The date on it, please."
reply = "Thank you, {letter.name}."
[data.letters."2026-12-15"]
name = "Dana"
"""


def _verify(tmp_path: Path, extra: str = "") -> DialogueEngine:
    f = tmp_path / "verify.toml"
    f.write_text(VERIFY.replace("sensitive = true\n", "sensitive = true\n" + extra))
    return DialogueEngine(load_profile(f), today=lambda: TODAY)


def _spoken(parts: list[ReplyPart]) -> list[str]:
    return [p.text for p in parts if isinstance(p, Say)]


def test_a_sensitive_date_reaches_the_engine_and_is_never_said_back_or_kept(
    tmp_path: Path,
) -> None:
    """A sensitive date slot, keyed (DDMM) or said: the engine gets the date (its lookup
    finds the letter); its transcript and the agent's words hold none of it, the keypad
    turn is marked sensitive, and an unsure value is not asked back by repeating it."""
    e = _verify(tmp_path)
    assert said(e, "verify me please") == "The date on your letter, please."
    assert e.collecting_sensitive
    turns = [e.press(k) for k in "1512"]
    assert turns[:3] == [None] * 3
    entry = turns[3]
    assert entry is not None and entry.sensitive and entry.keys == "1512"
    assert _spoken(entry.parts) == ["Thank you, Dana."]
    assert not e.collecting_sensitive
    e = _verify(tmp_path)
    said(e, "verify")
    # "One time." is an unsure date (the 1st): with no confirm_prompt of its own a
    # sensitive slot takes it rather than say it back
    assert said(e, "One time.").startswith("I can't find that letter.")
    assert said(e, "The fifteenth.") == "Thank you, Dana."
    callers = [t for who, t in e.transcript if who == "caller"]
    assert callers[0] == "verify" and all(t.startswith("[redacted") for t in callers[1:]), callers
    assert not any(w in t for _, t in e.transcript for w in ("fifteenth", "One", "1st"))


def test_a_sensitive_slot_is_confirmed_only_with_its_own_prompt(tmp_path: Path) -> None:
    e = _verify(tmp_path, 'confirm = "always"\nconfirm_prompt = "Did I get that right?"\n')
    said(e, "verify")
    entry = [e.press(k) for k in "1512"][3]
    assert entry is not None and entry.sensitive
    assert _spoken(entry.parts) == ["Did I get that right?"]
    yes = e.press("1")  # the answer to a sensitive slot's question is masked like it
    assert yes is not None and yes.sensitive
    assert _spoken(yes.parts) == ["Thank you, Dana."]
    assert not any("1512" in t for _, t in e.transcript)

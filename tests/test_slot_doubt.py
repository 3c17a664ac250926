"""A slot value the ASR was unsure of is asked back (``confirm_below``), and dates and times
keep to the profile's business hours (``within_hours``): on the dialogue engine, with
transcripts as the recogniser hands them over (:class:`agent.transcript.Transcript`)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from agent.dialogue.engine import DialogueEngine
from agent.dialogue.profile import ProfileError
from agent.dialogue.profile_loader import load_profile
from agent.transcript import Transcript, confidence_of, joined
from testkit.dialogue_turns import said

TODAY = dt.date(2026, 11, 25)  # a Wednesday

PROFILE = """
[agent]
greeting = "Hi."
[hours]
timezone = "Europe/London"
mon = "08:00-18:00"
tue = "08:00-18:00"
wed = "08:00-12:00, 13:00-17:00"
thu = "08:00-18:00"
fri = "09:00-13:00"
holidays = ["2026-12-25"]
after_hours_profile = "closed.toml"
[slots.day]
type = "date"
prompt = "Which day?"
retry = "Which day, please?"
[slots.at]
type = "time"
prompt = "What time?"
retry = "What time, please?"
[intents.book]
keywords = ["book"]
slots = ["day", "at"]
reply = "Booked for {day:date:spoken} at {at:time:spoken}."
"""


def _engine(tmp_path: Path, extra: str = "confirm_below = 0.5\n") -> DialogueEngine:
    (tmp_path / "closed.toml").write_text('[agent]\ngreeting = "We are closed."\n')
    f = tmp_path / "dentist.toml"
    f.write_text(PROFILE.replace('type = "date"\n', 'type = "date"\n' + extra))
    return DialogueEngine(load_profile(f), today=lambda: TODAY)


def test_a_transcript_is_text_that_knows_how_sure_it_is() -> None:
    t = Transcript("The fifteenth.", 0.3)
    assert t == "The fifteenth." and t.lower() == "the fifteenth." and confidence_of(t) == 0.3
    assert confidence_of("typed") == 1.0  # no recogniser: no doubt
    assert Transcript("x", 7).confidence == 1.0 and Transcript("x", -1).confidence == 0.0
    whole = joined([Transcript(" book ", 0.9), Transcript("", 0.01), Transcript("a day", 0.4)])
    assert (whole, whole.confidence) == ("book a day", 0.4)  # the empty piece says nothing
    assert joined([]).confidence == 1.0 and joined(["a", "b"]) == "a b"


def test_a_day_the_asr_was_unsure_of_is_asked_back_a_sure_one_is_taken(tmp_path: Path) -> None:
    unsure = _engine(tmp_path)
    assert said(unsure, "I'd like to book") == "Which day?"
    asked = said(unsure, Transcript("The fifteenth.", 0.3))
    assert asked == "Tuesday the 15th of December, is that right?"
    assert said(unsure, "yes") == "What time?"
    sure = _engine(tmp_path)
    said(sure, "I'd like to book")
    assert said(sure, Transcript("The fifteenth.", 0.8)) == "What time?"
    # the words alone decide where the slot sets no confirm_below (the default, 0)
    never = _engine(tmp_path, "")
    said(never, "book")
    assert said(never, Transcript("The fifteenth.", 0.01)) == "What time?"


def test_a_day_in_the_first_sentence_is_taken_only_when_heard_surely(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    assert said(engine, Transcript("book the fifteenth", 0.9)) == "What time?"
    doubt = _engine(tmp_path)
    assert said(doubt, Transcript("book the fifteenth", 0.2)) == "Which day?"  # asked for


def test_days_and_times_keep_to_the_profiles_hours(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    said(engine, "book")
    assert said(engine, "Saturday").startswith("We're closed on Saturdays. Which day")
    assert said(engine, "the twenty fifth of December").startswith("We're closed that day.")
    assert said(engine, "Friday") == "What time?"  # Friday the 27th: 09:00-13:00
    assert said(engine, "two thirty in the afternoon").startswith(
        "We're not open then. That day we're open 9 am to 1 pm. What time"
    )
    assert said(engine, "ten a.m.") == "Booked for Friday the 27th of November at 10 am."
    lunch = _engine(tmp_path)
    said(lunch, "book")
    said(lunch, "today")  # Wednesday: closed 12:00-13:00
    assert said(lunch, "12:30 p.m.").startswith("We're not open then. That day we're open")
    off = _engine(tmp_path, "within_hours = false\n")
    said(off, "book")
    assert said(off, "Saturday") == "What time?"  # the date slot ignores the hours


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("confirm_below = 2\n", "confirm_below: must be 0..1"),
        ('confirm_below = "low"\n', "confirm_below: expected int or float"),
        ('within_hours = "yes"\n', "within_hours: expected bool"),
        ("within_hours = true\nmin = 1\n", "only a number slot takes min (this is date)"),
    ],
)
def test_wrong_doubt_and_hours_keys_name_file_line_and_key(
    tmp_path: Path, extra: str, message: str
) -> None:
    with pytest.raises(ProfileError) as err:
        _engine(tmp_path, extra)
    assert message in str(err.value) and "dentist.toml:" in str(err.value)

"""Business hours in agent profiles: open or closed in the call center's time zone, and the
after-hours profile answering when closed."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

import pytest

from agent.dialogue.business_hours import parse_hours
from agent.dialogue.profile import ProfileError
from agent.dialogue.profile_loader import load_profile
from agent.voice.voice_agent import VoiceAgent
from sip_bridge import agents
from sip_bridge.config.loader import DEMO_PROFILE, BridgeConfig

UTC = dt.UTC
HOURS = {
    "timezone": "Europe/London",
    "mon": "08:00-18:00",
    "tue": "08:00-12:00, 13:00-17:30",
    "sat": "09:00-13:00",
    "holidays": ["2026-12-25"],
}


def _at(y: int, mo: int, d: int, h: int, mi: int) -> dt.datetime:
    return dt.datetime(y, mo, d, h, mi, tzinfo=UTC)


def test_open_and_closed_in_the_call_centers_zone() -> None:
    h = parse_hours(HOURS, "/after.toml")
    # Monday 2026-11-23: London is on UTC in November
    assert not h.is_open(_at(2026, 11, 23, 7, 59))
    assert h.is_open(_at(2026, 11, 23, 8, 0)) and h.is_open(_at(2026, 11, 23, 17, 59))
    assert not h.is_open(_at(2026, 11, 23, 18, 0))
    # Tuesday's lunch break, Saturday morning, Sunday closed
    assert h.is_open(_at(2026, 11, 24, 11, 59)) and not h.is_open(_at(2026, 11, 24, 12, 30))
    assert h.is_open(_at(2026, 11, 24, 17, 29)) and not h.is_open(_at(2026, 11, 24, 17, 30))
    assert h.is_open(_at(2026, 11, 28, 12, 0)) and not h.is_open(_at(2026, 11, 29, 12, 0))
    # Summer time: 07:30 UTC is 08:30 in London
    assert h.is_open(_at(2026, 7, 6, 7, 30)) and not h.is_open(_at(2026, 7, 6, 17, 30))
    # Christmas Day is a Friday, and a holiday
    assert not h.is_open(_at(2026, 12, 25, 10, 0))
    # another zone's time is converted: 03:00 in New York (EST) is 08:00 in London
    ny = dt.datetime(2026, 11, 23, 3, 0, tzinfo=dt.timezone(dt.timedelta(hours=-5)))
    assert h.is_open(ny)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"mon": "8-18"}, "mon"),
        ({"mon": "18:00-08:00"}, "ends before it starts"),
        ({"mon": "08:00-25:00"}, "not a time of day"),
        ({"holidays": ["christmas"]}, "holidays"),
        ({"mon": "closed", "tue": "closed", "sat": "closed"}, "no day has opening hours"),
    ],
)
def test_bad_hours_say_what_is_wrong(change: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_hours({**HOURS, **change}, "/after.toml")


def _profiles(tmp_path: Path, hours: str) -> Path:
    after = tmp_path / "after_hours.toml"
    demo = DEMO_PROFILE.read_text()
    after.write_text(demo.replace('name = "acme-demo"', 'name = "after-hours"'))
    main = tmp_path / "main.toml"
    main.write_text(demo + "\n[hours]\n" + hours)
    return main


def test_profile_mistakes_in_hours_name_file_line_and_key(tmp_path: Path) -> None:
    main = _profiles(tmp_path, 'timezone = "Europe/London"\nmon = "08:00-18:00"\n')
    with pytest.raises(ProfileError, match=r"hours\.after_hours_profile: is required"):
        load_profile(main)
    main = _profiles(
        tmp_path, 'timezone = "Europe/London"\nmon = "nine"\nafter_hours_profile = "x.toml"\n'
    )
    with pytest.raises(ProfileError, match="no such file"):
        load_profile(main)
    main = _profiles(
        tmp_path,
        'timezone = "Europe/London"\nmon = "nine"\nafter_hours_profile = "after_hours.toml"\n',
    )
    with pytest.raises(ProfileError) as err:
        load_profile(main)
    lines = main.read_text().splitlines()
    msg = str(err.value)
    assert "hours.mon" in msg and lines[int(msg.split(":")[1]) - 1].startswith("mon =")


def test_calls_after_hours_get_the_after_hours_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    main = _profiles(
        tmp_path,
        'timezone = "Europe/London"\nmon = "08:00-18:00"\n'
        'after_hours_profile = "after_hours.toml"\n',
    )
    base = BridgeConfig.line_check()
    config = replace(base, agent=replace(base.agent, name="voice", voice_profile=str(main)))
    now = [_at(2026, 11, 23, 9, 0)]  # Monday, open

    class Clock(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> dt.datetime:  # type: ignore[override]
            return now[0]

    monkeypatch.setattr(agents, "datetime", Clock)
    agents.load_agent_models(config)  # both profiles load (and would fail) at start
    open_agent = agents.make_agent(config)
    now[0] = _at(2026, 11, 23, 19, 0)  # Monday evening: closed
    closed_agent = agents.make_agent(config)
    assert isinstance(open_agent, VoiceAgent) and isinstance(closed_agent, VoiceAgent)
    assert open_agent.profile.name == "acme-demo"
    assert closed_agent.profile.name == "after-hours"


def test_a_profile_language_without_speech_models_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "de.toml"
    p.write_text(DEMO_PROFILE.read_text().replace('name = "acme-demo"', 'language = "de"'))
    with pytest.raises(ProfileError, match=r"agent\.language: no speech models for 'de'"):
        load_profile(p)
    p.write_text(DEMO_PROFILE.read_text().replace('name = "acme-demo"', 'language = "en"'))
    assert load_profile(p).language == "en"

"""Call-script files: what parses, and mistakes reported with file, line and key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sip_bridge.config.config_types import ConfigError
from sip_bridge.script.script_file import (
    CallerHangup,
    Dtmf,
    Expect,
    ExpectHangup,
    ExpectRefer,
    NoDeadAir,
    Script,
    Speak,
    Wait,
    WaitSeconds,
    load_script,
    parse_script_text,
)

ROOT = Path(__file__).resolve().parents[1]
GOOD = """\
# a comment
[script]
name = "t"
voice = "en-gb-x-rp+f3"
quiet_ms = 900

[[step]]
expect = "thanks for calling"
timeout_s = 20

[[step]]
say = "What are your opening hours?"
barge_in = true
within_ms = 350

[[step]]
play = "hello.wav"
gain_db = -6

[[step]]
dtmf = "54321#"
method = "info"
gap_ms = 300

[[step]]
dtmf = "#"
barge_in = false

[[step]]
wait = "silence"

[[step]]
wait_s = 1.5

[[step]]
expect_refer = "sip:agent@127.0.0.1:5070"
result = "rejected"

[[step]]
expect_no_dead_air = 1.5

[[step]]
expect_hangup = true

[[step]]
hangup = true
"""


def _parse(text: str, tmp_path: Path) -> Script:
    (tmp_path / "hello.wav").write_bytes(b"RIFF")  # only its existence is checked here
    return parse_script_text(text, tmp_path / "s.toml")


def _error(text: str, tmp_path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        _parse(text, tmp_path)
    return info.value


def test_a_script_with_every_step_kind(tmp_path: Path) -> None:
    s = _parse(GOOD, tmp_path)
    steps: Any = s.steps
    kinds = [type(x) for x in steps]
    assert kinds == [Expect, Speak, Speak, Dtmf, Dtmf, Wait, WaitSeconds, ExpectRefer, NoDeadAir,
                     ExpectHangup, CallerHangup]  # fmt: skip
    assert [x.index for x in steps] == list(range(1, 12))
    assert steps[0].timeout_s == 20 and steps[0].quiet_ms == 900  # the script's quiet_ms
    assert steps[1].barge_in is True and steps[1].within_ms == 350
    assert steps[2].wav == tmp_path / "hello.wav" and steps[2].gain_db == -6
    assert steps[3].method == "info" and steps[3].gap_ms == 300 and steps[3].digits == "54321#"
    assert steps[4].barge_in is False
    assert steps[7].result == "rejected"
    assert steps[1].line == 11  # the [[step]] header
    assert s.voice == "en-gb-x-rp+f3"


def test_repeat_on_is_the_scripts_unless_a_step_says_otherwise(tmp_path: Path) -> None:
    text = (
        '[script]\nrepeat_on = "sorry|again"\n[[step]]\nexpect = "a"\n'
        '[[step]]\nexpect = "b"\nrepeat_on = ""\n'
        '[[step]]\nexpect = "c"\nrepeat_on = "pardon"\n'
    )
    steps: Any = _parse(text, tmp_path).steps
    assert [x.repeat_on for x in steps] == ["sorry|again", "", "pardon"]
    assert _parse('[[step]]\nexpect = "a"\n', tmp_path).steps[0].repeat_on == ""  # type: ignore[union-attr]


def test_every_shipped_demo_script_parses() -> None:
    scripts = sorted((ROOT / "config" / "scripts" / "demo").glob("*.toml"))
    assert len(scripts) >= 10
    for path in scripts:
        s = load_script(path)
        assert s.steps and s.description, path


@pytest.mark.parametrize(
    ("text", "line", "key", "words"),
    [
        ('[[step]]\nsay = "hi"\nvoise = "en-us"\n', 3, "step[1].voise", "unknown key"),
        ('[[step]]\nsay = "hi"\nexpect = "x"\n', 1, "step[1]", "exactly one of"),
        ("[[step]]\nnote = 'nothing'\n", 1, "step[1]", "got none"),
        ('[[step]]\nexpect = "(unclosed"\n', 2, "step[1].expect", "regular expression"),
        ('[[step]]\nexpect = "x"\nnot = "[a"\n', 3, "step[1].not", "regular expression"),
        ("[[step]]\nexpect = '\\d{2,1}'\n", 2, "step[1].expect", "'\\d{2,1}' is not a regular"),
        ('[[step]]\nplay = "missing.wav"\n', 2, "step[1].play", "no such file"),
        ('[[step]]\ndtmf = "12x"\n', 2, "step[1].dtmf", "keys are 0-9"),
        ('[[step]]\ndtmf = "1"\nmethod = "sms"\n', 3, "step[1].method", "rfc4733, info"),
        ('[[step]]\ndtmf = "1"\nbarge_in = true\n', 3, "step[1].barge_in", "only barge_in"),
        ('[[step]]\nsay = "a"\nwithin_ms = 300\n', 3, "step[1].within_ms", "barge_in = true"),
        ('[[step]]\nwait = "forever"\n', 2, "step[1].wait", "silence, speech"),
        ("[[step]]\nwait_s = -1\n", 2, "step[1].wait_s", "above 0"),
        ("[[step]]\nexpect_hangup = false\n", 2, "step[1].expect_hangup", "= true"),
        ('[[step]]\nexpect_refer = "agent"\n', 2, "step[1].expect_refer", "URI"),
        ('[[step]]\nexpect_refer = ""\nresult = "ok"\n', 3, "step[1].result", "answered"),
        ('[[step]]\nexpect = "x"\ntimeout_s = "10"\n', 3, "step[1].timeout_s", "expected"),
        ('[[step]]\nsay = "x"\nbarge_in = 1\n', 3, "step[1].barge_in", "expected bool"),
        ('[script]\ndtmf = "pulse"\n[[step]]\nwait_s = 1\n', 2, "script.dtmf", "rfc4733"),
        ('[script]\nvoice = "a b c"\n[[step]]\nwait_s = 1\n', 2, "script.voice", "espeak-ng"),
        ('[script]\nuri = "http://x"\n[[step]]\nwait_s = 1\n', 2, "script.uri", "sip: URI"),
        ("[script]\ncolour = 1\n[[step]]\nwait_s = 1\n", 2, "script.colour", "unknown key"),
        ('[steps]\nsay = "x"\n', 1, "steps", "unknown table"),
        (
            '[script]\nrepeat_on = "(sorry"\n[[step]]\nwait_s = 1\n',
            2,
            "script.repeat_on",
            "regular expression",
        ),
        ('[[step]]\nexpect = "x"\nrepeat_on = "[a"\n', 3, "step[1].repeat_on", "regular"),
        ('[[step]]\nsay = "x"\nrepeat_on = "a"\n', 3, "step[1].repeat_on", "unknown key"),
        ("[script]\n", None, "step", "at least one"),
        ('[[step]]\nsay = "x"\n[[step]]\nsay = "y"\nrate_wpm = 9\n', 5, "step[2].rate_wpm", "80"),
    ],
)
def test_mistakes_name_file_line_and_key(
    tmp_path: Path, text: str, line: int | None, key: str, words: str
) -> None:
    err = _error(text, tmp_path)
    assert err.path == str(tmp_path / "s.toml")
    assert (err.line, err.key) == (line, key), str(err)
    assert words in str(err)


def test_broken_toml_says_where(tmp_path: Path) -> None:
    err = _error('[[step]]\nsay = "unterminated\n', tmp_path)
    assert err.key == "toml" and err.line == 2


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_script(tmp_path / "nope.toml")

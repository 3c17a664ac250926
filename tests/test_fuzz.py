"""A short run of bench/fuzz.py in make test: every parser of what strangers send, and the
config loader, refuse bad input only with their documented error, and the SIP user agent
never raises. The long run (1,000,000 inputs per target) is `bench/fuzz.py`."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import fuzz
from sip_bridge.config.loader import parse_config_text

SHORT = {"config": 400}  # the loader parses a 5 KB file each time: slower


@pytest.mark.parametrize("target", fuzz.targets(), ids=lambda t: t.name)
def test_no_input_crashes_a_parser(target: fuzz.Target) -> None:
    inputs = SHORT.get(target.name, 4000)
    result = fuzz.fuzz(target, inputs, seed=2026, save=False)
    assert result["crashes"] == 0, result["first_crashes"]
    refused = result["refused"]
    assert isinstance(refused, int)
    # the mutations reach past the first check: some inputs are accepted, some refused
    if target.refusal:
        assert 0.02 * inputs < refused < 0.999 * inputs, result


def test_seeds_are_valid_inputs() -> None:
    for target in fuzz.targets():
        for seed in target.seeds:
            target.run(seed)  # raises if a seed itself is refused


@pytest.mark.parametrize(
    "text",
    [
        '[agent.voice]\nprofile = "agents/{long}.toml"\n',  # found by bench/fuzz.py (seed 1)
        '[[routes]]\nname = "r"\ncalled = "1"\nprofile = "{long}.toml"\n',
        '[agent]\nname = "playback"\n[agent.playback]\nfile = "{long}.wav"\n',
        '[agent.voice]\nprofile = "bad\\u0000name.toml"\n',
    ],
)
def test_a_file_name_the_os_refuses_is_a_config_mistake(text: str, tmp_path: Path) -> None:
    """ENAMETOOLONG (or a NUL) from the OS was an OSError out of the loader: a traceback
    instead of ``file:line: key: message``."""
    bad = text.replace("{long}", "x" * 5000)
    with pytest.raises(ValueError, match="no such file"):
        parse_config_text(bad, str(tmp_path / "bridge.toml"))

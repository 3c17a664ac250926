"""The booking profile's call scripts (config/scripts/booking/) through `sip-bridge script`
against `sip-bridge run` with that profile: real calls, the three scripts at once (as
test_demo_scripts plays the demo's), the caller's voice from espeak-ng, the agent's answers
transcribed with our ASR, keys as RFC 4733."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from testkit.demo_bridge import ROOT, records_digest, shipped_bridge

# serial: three calls at once, words and timing heard
pytestmark = [pytest.mark.serial, pytest.mark.timeout(600)]

SCRIPTS = sorted((ROOT / "config" / "scripts" / "booking").glob("*.toml"))


def _booking_config(tmp: Path) -> Path:
    """The shipped bridge.toml answering with the booking profile (paths made absolute)."""
    text = (ROOT / "config" / "bridge.toml").read_text()
    text = text.replace('"agents/demo.toml"', f'"{ROOT / "config" / "agents" / "booking.toml"}"')
    prompt = '"prompts/technical_difficulty.wav"'
    text = text.replace(prompt, f'"{ROOT / "config" / prompt.strip(chr(34))}"')
    path = tmp / "bridge.toml"
    path.write_text(text)
    return path


def test_the_booking_scripts_pass(tmp_path: Path) -> None:
    assert len(SCRIPTS) == 3
    junit = tmp_path / "booking.xml"
    with shipped_bridge(tmp_path / "data", config=_booking_config(tmp_path)) as bridge:
        proc = subprocess.run(
            [sys.executable, "-m", "sip_bridge.cli", "script", *map(str, SCRIPTS),
             "--uri", bridge.uri, "--parallel", "3", "--junit", str(junit)],
            cwd=ROOT, capture_output=True, text=True, timeout=540,
        )  # fmt: skip
    failed = [
        f"{suite.get('name')}: {case.get('name')}: {el.get('message')}"
        for suite in ET.parse(junit).getroot()
        for case in suite.iter("testcase")
        for el in case.findall("failure")
    ]
    if proc.returncode != 0 or failed:  # what the bridge heard, with the runner's tail
        heard = records_digest(tmp_path / "data")
        pytest.fail("\n".join(failed) + "\n" + proc.stdout[-4000:] + "\n" + heard)
    cases = [c for s in ET.parse(junit).getroot() for c in s.iter("testcase")]
    assert len(cases) == 16 + 18 + 26  # every step of the three scripts was played

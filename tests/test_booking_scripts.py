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

from testkit.demo_bridge import ROOT, records_digest, script_reports, shipped_bridge

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
    failures = [
        (str(suite.get("name")), f"{case.get('name')}: {el.get('message')}")
        for suite in ET.parse(junit).getroot()
        for case in suite.iter("testcase")
        for el in case.findall("failure")
    ]
    failed = [f"{name}: {why}" for name, why in failures]
    if proc.returncode != 0 or failed:  # what the bridge heard, with the runner's tail
        heard = records_digest(tmp_path / "data")
        reports = script_reports(proc.stdout, [name for name, _ in failures])
        pytest.fail("\n".join(failed) + "\n" + reports + "\n" + heard)
    cases = [c for s in ET.parse(junit).getroot() for c in s.iter("testcase")]
    assert len(cases) == 16 + 18 + 26  # every step of the three scripts was played


def test_a_failed_scripts_whole_report_is_picked_from_the_runners_output() -> None:
    out = (
        "script a-one (a.toml): sip:x\n  [ 1] PASS\n  PASS: 1/1\n"
        "script b-two (b.toml): sip:x\n  [ 1] FAIL\n  [ 2] SKIP\n  FAIL: 0/2\n"
        "script c-three (c.toml): sip:x\n  [ 1] PASS\n2/3 scripts passed\n"
    )
    assert script_reports(out, ["b-two"]) == (
        "script b-two (b.toml): sip:x\n  [ 1] FAIL\n  [ 2] SKIP\n  FAIL: 0/2\n"
    )
    assert script_reports(out, []) == out  # no junit failure: the tail as it was

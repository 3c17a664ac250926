"""The shipped demo call scripts (config/scripts/demo/*.toml) against the shipped config.

`sip-bridge run --config config/bridge.toml` on free ports; `sip-bridge script` places real
calls to it (the caller's voice is espeak-ng, what it hears is transcribed with our ASR).
The transfer scripts get the demo profile's transfer target from a sipp UAS that answers,
rejects (486) or rings forever, reached through the runner's --transfer-proxy (the REFER
still names the profile's own target, sip:agent@127.0.0.1:5070, and is checked as such).

Every step must pass.
"""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from demo_bridge import (
    DEMO_SCRIPTS,
    ROOT,
    TRANSFER_TARGETS,
    shipped_bridge,
    start_transfer_target,
    stop_transfer_target,
)

pytestmark = pytest.mark.timeout(420)

SCRIPTS = sorted(p.stem for p in DEMO_SCRIPTS.glob("*.toml"))


def _script_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "sip_bridge.cli", "script", *args]


@dataclass
class ScriptRun:
    steps: dict[int, tuple[str, str]]  # step number -> (PASS/FAIL/SKIP, detail)
    output: str  # what the runners printed
    sipp: tuple[int, str] | None  # the transfer target's exit status and output


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ScriptRun]]:
    """Every demo script played once against one bridge."""
    tmp = tmp_path_factory.mktemp("demo")
    with shipped_bridge(tmp / "data") as bridge:
        # about four calls at once: the plain scripts three at a time in one runner, the
        # transfer scripts one after another beside them, each with its own target
        plain = [DEMO_SCRIPTS / f"{s}.toml" for s in SCRIPTS if s not in TRANSFER_TARGETS]
        cmd = _script_cmd(*map(str, plain), "--uri", bridge.uri, "--parallel", "3",
                          "--junit", str(tmp / "plain.xml"))  # fmt: skip
        lane = _start(cmd)
        outputs, sipp = [], {}
        for name, scenario in TRANSFER_TARGETS.items():
            target, port = start_transfer_target(scenario)
            cmd = _script_cmd(str(DEMO_SCRIPTS / f"{name}.toml"), "--uri", bridge.uri,
                              "--transfer-proxy", f"127.0.0.1:{port}",
                              "--junit", str(tmp / f"{name}.xml"))  # fmt: skip
            out, _ = _start(cmd).communicate(timeout=300)
            outputs.append(out)
            sipp[name] = stop_transfer_target(target)
        out, _ = lane.communicate(timeout=300)
        outputs.append(out)
        assert lane.returncode in (0, 1), f"the plain scripts -> {lane.returncode}:\n{out}"
    text = "\n".join(outputs)
    results: dict[str, ScriptRun] = {}
    for junit in tmp.glob("*.xml"):
        for suite in ET.parse(junit).getroot():
            steps: dict[int, tuple[str, str]] = {}
            for case in suite.iter("testcase"):
                m = re.match(r"step (\d+):", case.get("name", ""))
                if m:
                    steps[int(m.group(1))] = _status(case)
            name = Path(suite.get("file", "")).stem
            results[name] = ScriptRun(steps, text, sipp.get(name))
    yield results


def _status(case: ET.Element) -> tuple[str, str]:
    for tag, status in (("failure", "FAIL"), ("skipped", "SKIP")):
        el = case.find(tag)
        if el is not None:
            return status, el.get("message", "")
    return "PASS", ""


def _start(cmd: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_every_intent_and_slot_has_a_demo_script() -> None:
    """The demo covers its profile: every intent, both slots by voice and by keypad."""
    text = {s: (DEMO_SCRIPTS / f"{s}.toml").read_text() for s in SCRIPTS}
    everything = "\n".join(text.values())
    for phrase in ("opening hours", "order", "cancel an order", "person", "goodbye"):
        assert phrase in everything.lower(), phrase
    assert re.search(r'dtmf = "1"', text["hours_by_keypad"])
    assert re.search(r'dtmf = "\d{5}#"', text["order_by_keypad"])  # order number by keypad
    assert re.search(r'dtmf = "2"', text["cancel_no"])  # the yes/no slot by keypad
    assert "one two three four five" in text["cancel_yes"]  # both slots by voice
    assert "Yes" in text["cancel_yes"]
    assert set(TRANSFER_TARGETS) <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_demo_script(runs: dict[str, ScriptRun], script: str) -> None:
    run = runs.get(script)
    assert run is not None, f"no result for {script}"
    text = (DEMO_SCRIPTS / f"{script}.toml").read_text()
    assert len(run.steps) == len(re.findall(r"^\[\[step\]\]", text, re.M)), run.output
    failed = {n: s for n, s in run.steps.items() if s[0] != "PASS"}
    assert not failed, f"{script}: {failed}\n{run.output}"
    if run.sipp is not None:
        rc, out = run.sipp
        assert rc == 0, f"the transfer target's sipp scenario failed:\n{out[-2000:]}"

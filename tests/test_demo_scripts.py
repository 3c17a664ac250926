"""The shipped demo call scripts (config/scripts/demo/*.toml) against the shipped config.

`sip-bridge run --config config/bridge.toml` on free ports; `sip-bridge script` places real
calls to it (the caller's voice is espeak-ng, what it hears is transcribed with our ASR).
The transfer scripts get the demo profile's transfer target from a sipp UAS that answers,
rejects (486) or rings forever, reached through the runner's --transfer-proxy (the REFER
still names the profile's own target, sip:agent@127.0.0.1:5070, and is checked as such).

Every step must pass, except the ones listed in KNOWN_FAILURES: behaviour issue 15 asks of
the agent that is not there yet. Those are reported as xfail (with what happened), and a
listed step that passes is fine: drop it from the list when its fix lands.
"""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit.demo_bridge import (
    DEMO_SCRIPTS,
    ROOT,
    TRANSFER_TARGETS,
    records_digest,
    shipped_bridge,
    start_transfer_target,
    stop_transfer_target,
)

# serial: calls at once, words and timing heard
pytestmark = [pytest.mark.serial, pytest.mark.timeout(420)]

SCRIPTS = sorted(p.stem for p in DEMO_SCRIPTS.glob("*.toml"))

#: script -> {step number: why it fails with today's agent (issue 15)}. A listed step may
#: also pass (some are timing-dependent today); the steps after a listed failure are skipped.
KNOWN_FAILURES: dict[str, dict[int, str]] = {
    "cancel_yes": {
        9: "'No thanks.' sometimes gets the fallback (2 of 5 full runs on a loaded machine); "
        "likely the turn ends after 'No', the caller goes on, and the merged halves are "
        "transcribed apart ('No. Bank.', seen in the pauses script)",
    },
    "pauses": {
        13: "a caller who goes on just as the agent's held apology starts (a pause of about "
        "1.2-1.4 s) hears its first syllable before the merge stops it",
    },
}


def _script_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "sip_bridge.cli", "script", *args]


@dataclass
class ScriptRun:
    steps: dict[int, tuple[str, str]]  # step number -> (PASS/FAIL/SKIP, detail)
    output: str  # what the runners printed
    sipp: tuple[int, str] | None  # the transfer target's exit status and output
    records: str  # what the bridge heard and said in every call (its call records)
    metrics: str  # the bridge's /metrics after the last call


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ScriptRun]]:
    """Every demo script played once against one bridge."""
    tmp = tmp_path_factory.mktemp("demo")
    with shipped_bridge(tmp / "data", args=["--metrics", "127.0.0.1:0"]) as bridge:
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
        url = next(m[1] for line in bridge.banner if (m := re.search(r"metrics: (\S+)", line)))
        with urllib.request.urlopen(url, timeout=5) as r:
            metrics = r.read().decode()
    text = "\n".join(outputs)
    heard = records_digest(tmp / "data")
    results: dict[str, ScriptRun] = {}
    for junit in tmp.glob("*.xml"):
        for suite in ET.parse(junit).getroot():
            steps: dict[int, tuple[str, str]] = {}
            for case in suite.iter("testcase"):
                m = re.match(r"step (\d+):", case.get("name", ""))
                if m:
                    steps[int(m.group(1))] = _status(case)
            name = Path(suite.get("file", "")).stem
            results[name] = ScriptRun(steps, text, sipp.get(name), heard, metrics)
    yield results


def _deferred(text: str) -> set[int]:
    """The expect_no_dead_air steps: judged at the end, they never stop a script."""
    steps = re.split(r"^\[\[step\]\]", text, flags=re.M)[1:]
    return {n for n, body in enumerate(steps, 1) if "expect_no_dead_air" in body}


def _status(case: ET.Element) -> tuple[str, str]:
    for tag, status in (("failure", "FAIL"), ("skipped", "SKIP")):
        el = case.find(tag)
        if el is not None:
            return status, el.get("message", "")
    again = case.find("system-out")  # passed once the caller said it again (repeat_on)
    if again is not None:  # here, on a clean line, a slip all the same
        return "AGAIN", again.text or ""
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


def test_what_every_call_says_was_rendered_once(runs: dict[str, ScriptRun]) -> None:
    """The greeting, "Anything else?", goodbyes: from the phrase cache, not Piper again."""
    metrics = next(iter(runs.values())).metrics
    figures = {
        name: float(value)
        for name, value in re.findall(r"^(sipbridge_phrase_cache_\w+) (\S+)$", metrics, re.M)
    }
    hits = figures["sipbridge_phrase_cache_hits_total"]
    assert hits >= len(SCRIPTS), figures  # at least a greeting a call, on average
    assert figures["sipbridge_phrase_cache_bytes"] > 0, figures


@pytest.mark.parametrize("script", SCRIPTS)
def test_demo_script(runs: dict[str, ScriptRun], script: str) -> None:
    run = runs.get(script)
    assert run is not None, f"no result for {script}"
    text = (DEMO_SCRIPTS / f"{script}.toml").read_text()
    assert len(run.steps) == len(re.findall(r"^\[\[step\]\]", text, re.M)), run.output
    known = KNOWN_FAILURES.get(script, {})
    first_known = min((n for n in known if run.steps[n][0] == "FAIL"
                       and n not in _deferred(text)), default=None)  # fmt: skip
    unexpected = {
        n: s for n, s in run.steps.items()
        if s[0] != "PASS" and n not in known
        and not (s[0] == "SKIP" and first_known is not None and n > first_known)
    }  # fmt: skip
    assert not unexpected, f"{script}: {unexpected}\n{run.output}\n{run.records}"
    if run.sipp is not None:
        rc, out = run.sipp
        assert rc == 0, f"the transfer target's sipp scenario failed:\n{out[-2000:]}"
    failing = {n: s for n, s in run.steps.items() if s[0] == "FAIL"}
    if failing:
        why = "; ".join(f"step {n}: {known[n]} ({s[1]})" for n, s in sorted(failing.items()))
        pytest.xfail(f"issue 15, not there yet: {why}")

"""What a script run says: its lines and its JUnit XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from sip_bridge.script.heard_audio import Gap, Reaction
from sip_bridge.script.script_actions import StepResult, Summary, TalkOver
from sip_bridge.script.script_file import parse_script_text
from sip_bridge.script.script_report import CallReport, format_report, format_step, junit_xml


def _report(tmp_path: Path) -> CallReport:
    script = parse_script_text(
        '[[step]]\nexpect = "hours"\n[[step]]\nsay = "Hi"\nbarge_in = true\n'
        "[[step]]\nexpect_hangup = true\n",
        tmp_path / "demo.toml",
    )
    a, b, c = script.steps
    summary = Summary(
        turn_latencies_s=[0.5, 0.7, 0.9],
        talk_overs=[TalkOver(2, False, True, Reaction(10.0, 11.0, True, 10.3))],
        dead_air=[Gap(1.0, 1.4), Gap(5.0, 7.5)],
    )
    return CallReport(
        script, "sip:voice@127.0.0.1:5060", "PCMU, -25 dBFS", "en-us", True, 200, "OK",
        [StepResult(a, True, 0.0, 12.5, 'heard "we are open"'),
         StepResult(b, False, 12.5, 14.0, "the agent stopped after 600 ms"),
         StepResult(c, None, 14.0, 14.0, "skipped")],
        summary, call_s=14.2, sent_packets=700, lost_packets=21,
    )  # fmt: skip


def test_lines(tmp_path: Path) -> None:
    rep = _report(tmp_path)
    assert format_step(rep.results[1]) == (
        '  [ 2]   12.50   14.00  FAIL  say "Hi" (barge in, stop within 400 ms): '
        "the agent stopped after 600 ms"
    )
    lines = format_report(rep)
    assert lines[0] == "  turn latency: 3 turns, p50 700 ms, p95 880 ms"
    assert "it stopped after p50 300 ms" in lines[1]
    assert lines[2] == "  dead air: longest 2.50 s, total 2.90 s over 2 waits"
    assert lines[3] == "  line: 21 of 700 packets lost"
    assert lines[4] == "  FAIL: 1/3 steps passed in 14.2 s"
    assert not rep.passed


def test_junit(tmp_path: Path) -> None:
    root = ET.fromstring(junit_xml([_report(tmp_path)]).split("\n", 1)[1])
    (suite,) = root
    assert suite.get("name") == "demo" and suite.get("tests") == "3"
    assert (suite.get("failures"), suite.get("skipped")) == ("1", "1")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [
        "step 1: expect /hours/",
        'step 2: say "Hi" (barge in, stop within 400 ms)',
        "step 3: expect hang-up",
    ]
    assert cases[0].find("failure") is None and cases[0].get("time") == "12.500"
    failure = cases[1].find("failure")
    assert failure is not None and failure.get("message") == "the agent stopped after 600 ms"
    assert cases[2].find("skipped") is not None
    assert cases[1].get("line") == "3"
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["target"] == "sip:voice@127.0.0.1:5060" and props["voice"] == "en-us"
    out = suite.find("system-out")
    assert out is not None and "turn latency: 3 turns" in (out.text or "")


def test_a_step_passed_after_the_caller_said_it_again_is_told(tmp_path: Path) -> None:
    rep = _report(tmp_path)
    first = rep.results[0]
    first.detail += ' (said again after "sorry i did not catch that")'
    first.repeats = 1
    assert format_report(rep)[4] == (
        "  FAIL: 1/3 steps passed (1 after the caller said it again) in 14.2 s"
    )
    root = ET.fromstring(junit_xml([rep]).split("\n", 1)[1])
    out = root.find("testsuite/testcase/system-out")
    assert out is not None and "said again after" in (out.text or "")

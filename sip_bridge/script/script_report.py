"""What a call script's run says: the printed lines and the JUnit XML (no I/O).

One :class:`CallReport` per script run: every step's result with its timing, then the
call's figures (turn latency, barge-in reaction, dead air) measured on the wire.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from sip_bridge.script.script_actions import StepResult, Summary
from sip_bridge.script.script_file import Script

__all__ = ["CallReport", "format_report", "format_step", "junit_xml", "percentile"]


@dataclass
class CallReport:
    script: Script
    target: str
    line: str  # the caller's line, described
    voice: str
    answered: bool
    status: int  # the INVITE's final status (0: none)
    reason: str
    results: list[StepResult] = field(default_factory=list)
    summary: Summary = field(default_factory=Summary)
    call_s: float = 0.0
    sent_packets: int = 0
    lost_packets: int = 0
    error: str = ""  # the script could not be played at all

    @property
    def steps_passed(self) -> int:
        return sum(1 for r in self.results if r.passed)

    @property
    def steps_said_again(self) -> int:
        """Expects that passed only after the caller said their answer again."""
        return sum(1 for r in self.results if r.passed and r.repeats)

    @property
    def passed(self) -> bool:
        return (
            not self.error
            and self.answered
            and len(self.results) == len(self.script.steps)
            and all(r.passed for r in self.results)
        )


def percentile(values: Sequence[float] | NDArray[np.float64], q: float) -> float | None:
    """The ``q``-th percentile of ``values`` (a list or an array); None when there are none."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else None


def format_step(r: StepResult) -> str:
    text = f"  [{r.step.index:2d}] {r.start:7.2f} {r.end:7.2f}  {r.status}  {r.step.describe()}"
    return text + (f": {r.detail}" if r.detail else "")


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.0f} ms"


def format_report(report: CallReport) -> list[str]:
    """The summary lines printed after the steps."""
    s = report.summary
    lines: list[str] = []
    lat = s.turn_latencies_s
    lines.append(
        f"  turn latency: {len(lat)} turns, p50 {_ms(percentile(lat, 50))}, "
        f"p95 {_ms(percentile(lat, 95))}"
    )
    stopped = [r.seconds for r in s.reactions if r.seconds is not None]
    kept = [r for r in s.reactions if r.seconds is None]
    lines.append(
        f"  barge-in: {len(s.reactions)} times the caller talked over the agent; it stopped "
        f"after p50 {_ms(percentile(stopped, 50))}, p95 {_ms(percentile(stopped, 95))}"
        + (f"; kept talking {len(kept)} times" if kept else "")
    )
    lines.append(
        f"  dead air: longest {s.longest_dead_air_s:.2f} s, total {s.total_dead_air_s:.2f} s "
        f"over {len(s.dead_air)} waits"
    )
    if report.lost_packets:
        lines.append(f"  line: {report.lost_packets} of {report.sent_packets} packets lost")
    verdict = "PASS" if report.passed else "FAIL"
    again = report.steps_said_again
    lines.append(
        f"  {verdict}: {report.steps_passed}/{len(report.script.steps)} steps passed"
        + (f" ({again} after the caller said it again)" if again else "")
        + f" in {report.call_s:.1f} s"
        + (f" ({report.error})" if report.error else "")
    )
    return lines


def junit_xml(reports: Sequence[CallReport]) -> str:
    """A JUnit XML document: a test suite per script, a test case per step."""
    root = ET.Element("testsuites", name="sip-bridge script")
    for rep in reports:
        failures = sum(1 for r in rep.results if r.passed is False) + (1 if rep.error else 0)
        skipped = sum(1 for r in rep.results if r.passed is None)
        suite = ET.SubElement(
            root,
            "testsuite",
            name=rep.script.name,
            tests=str(len(rep.script.steps)),
            failures=str(failures),
            errors="0",
            skipped=str(skipped),
            time=f"{rep.call_s:.3f}",
            file=str(rep.script.path),
        )
        props = ET.SubElement(suite, "properties")
        for name, value in (("target", rep.target), ("voice", rep.voice), ("line", rep.line)):
            ET.SubElement(props, "property", name=name, value=value)
        for r in rep.results:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=rep.script.name,
                name=f"step {r.step.index}: {r.step.describe()}",
                time=f"{max(0.0, r.end - r.start):.3f}",
            )
            if r.step.line:
                case.set("line", str(r.step.line))
            if r.repeats:  # passed or not, how the agent asked again
                ET.SubElement(case, "system-out").text = r.detail
            if r.passed is None:
                ET.SubElement(case, "skipped", message=r.detail or "skipped")
            elif not r.passed:
                fail = ET.SubElement(case, "failure", message=r.detail or "failed")
                fail.text = r.detail
        if rep.error:
            case = ET.SubElement(suite, "testcase", classname=rep.script.name, name="call")
            ET.SubElement(case, "failure", message=rep.error).text = rep.error
        out = ET.SubElement(suite, "system-out")
        out.text = "\n".join(format_report(rep))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode")

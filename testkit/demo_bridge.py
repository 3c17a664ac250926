"""`sip-bridge run` with the shipped config on free ports, and sipp transfer targets: what
the demo call scripts run against (tests/test_demo_scripts.py, bench/conversations.py)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from testkit.sipp_media import random_port_range
from testkit.sipp_runner import free_port, sipp_command

ROOT = Path(__file__).resolve().parents[1]
DEMO_SCRIPTS = ROOT / "config" / "scripts" / "demo"
#: What the demo profile's transfer target does in each transfer script (a sipp UAS).
TRANSFER_TARGETS = {
    "transfer_answered": "uas_transfer_answer.xml",
    "transfer_rejected": "uas_transfer_busy.xml",
    "transfer_no_answer": "uas_transfer_ring.xml",
}


@dataclass
class RunningBridge:
    uri: str
    port: int
    data: Path  # $SIP_BRIDGE_DATA: the call records are in data / "calls.sqlite"
    proc: subprocess.Popen[str]
    banner: list[str] = field(default_factory=list)  # its start lines up to "dial ..."


@contextlib.contextmanager
def shipped_bridge(
    data: Path,
    start_timeout_s: float = 120.0,
    config: Path = ROOT / "config" / "bridge.toml",
    args: Sequence[str] = (),
) -> Iterator[RunningBridge]:
    """``sip-bridge run --config config/bridge.toml`` (or ``config``) on a free SIP port and
    a random RTP range, records in ``data``; stopped (SIGINT) on exit. ``args``: more
    options of ``sip-bridge run`` (``--max-calls 40``, ``--metrics 127.0.0.1:0``)."""
    low, high = random_port_range(200, 30000, 39000)
    data.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, SIP_BRIDGE_DATA=str(data))
    cmd = [
        sys.executable, "-m", "sip_bridge.cli", "run",
        "--config", str(config),
        "--listen", "127.0.0.1:0", "--rtp-ports", f"{low}-{high}", "--http", "off", *args,
    ]  # fmt: skip
    log = (data / "bridge.log").open("w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT, env=env)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + start_timeout_s
        uri = ""
        banner: list[str] = []
        while time.monotonic() < deadline and not uri:
            line = proc.stdout.readline()
            if not line:
                break
            banner.append(line.rstrip("\n"))
            m = re.search(r"dial (sip:\S+@127\.0\.0\.1:(\d+))", line)
            if m:
                uri = m.group(1)
        assert uri, f"the bridge did not start: {(data / 'bridge.log').read_text()[-2000:]}"
        yield RunningBridge(uri, int(uri.rsplit(":", 1)[1]), data, proc, banner)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def start_transfer_target(
    scenario: str, timeout_s: float = 150.0
) -> tuple[subprocess.Popen[str], int]:
    """A sipp UAS for one call on a free port: the demo profile's transfer target."""
    port = free_port()
    cmd = sipp_command(scenario, None, "-p", str(port), "-m", "1", timeout=timeout_s)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, port


def stop_transfer_target(proc: subprocess.Popen[str], timeout_s: float = 10.0) -> tuple[int, str]:
    """Its exit status (0: the scenario played as written) and output."""
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return proc.returncode, out or ""


def script_reports(output: str, names: Sequence[str]) -> str:
    """The whole report of each script in ``names`` from ``sip-bridge script`` output
    (one "script NAME (FILE): ..." section per script): a failed script's steps, however
    long the others' reports are."""
    sections = re.split(r"^(?=script \S+ \()", output, flags=re.M)
    picked = [s for s in sections if any(s.startswith(f"script {n} (") for n in names)]
    return "".join(picked) or output[-4000:]


def records_digest(data: Path) -> str:
    """What the bridge heard and said, call by call (its call records in ``data``), for a
    failed script's message: a misheard turn shows here with its timings."""
    from sip_bridge.ops.records import CallRecords  # only when a script failed

    path = data / "calls.sqlite"
    if not path.exists():
        return "(no call records)"
    store = CallRecords(path, readonly=True)
    lines = []
    try:
        for call in reversed(store.list(limit=100)):
            shown = store.show(call["call_id"]) or {}
            lines.append(f"call {call['call_id'][:8]} (outcome {call.get('outcome')}):")
            for t in shown.get("turns", []):
                tm = t["timings"] or {}
                keys = ("end_of_turn", "asr_tail", "tts_first_audio", "barged_in", "input")
                timing = ", ".join(f"{k} {tm[k]}" for k in keys if k in tm)
                lines.append(f"  #{t['idx']} {t['caller_text']!r} -> "
                             f"{(t['agent_text'] or '')[:70]!r} ({timing})")  # fmt: skip
    finally:
        store.close()
    return "\n".join(lines)

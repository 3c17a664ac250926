"""Signalling cost of the bridge, measured with sipp on loopback.

Starts `sip-bridge run` as its own process (so its CPU time is its own), has
sipp place calls at a fixed rate, and reads the bridge's CPU time from /proc:

- `answered`: INVITE / 100 / 200 (SDP answer) / ACK / BYE / 200 with a media
  session set up and torn down per call (talk time `--talk-ms`, default 0);
- `rejected`: INVITE / 100 / 503 / ACK with max_calls = 0: the SIP stack alone.

Prints one JSON object. The bridge's idle CPU over the same wall time is
subtracted. Machines are shared: compare runs made side by side.

    .venv/bin/python bench/sip_calls.py [--calls 300] [--rate 30] [--talk-ms 0]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = {
    "answered": ROOT / "bench" / "sipp" / "uac_call.xml",
    "rejected": ROOT / "tests" / "sipp" / "uac_503.xml",
}
TICKS = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _start_bridge(max_calls: int) -> tuple[subprocess.Popen[str], int]:
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "sip_bridge.cli", "run",
            "--config", str(ROOT / "config" / "bridge.toml"),
            "--listen", f"127.0.0.1:{port}", "--http", "off",
            "--rtp-ports", "46000-47999",
            "--max-calls", str(max_calls),
        ],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.readline()  # "listening on ..." once it is up
    return proc, port


def _run(kind: str, calls: int, rate: int, talk_ms: int) -> dict[str, Any]:
    sipp = shutil.which("sipp")
    if sipp is None:
        raise SystemExit("sipp not found: `make setup` installs Debian's sip-tester")
    proc, port = _start_bridge(max_calls=0 if kind == "rejected" else 1000)
    try:
        time.sleep(0.5)
        idle0, t0 = _cpu_s(proc.pid), time.monotonic()
        time.sleep(2.0)
        idle_rate = (_cpu_s(proc.pid) - idle0) / (time.monotonic() - t0)
        cpu0, w0 = _cpu_s(proc.pid), time.monotonic()
        out = subprocess.run(
            [
                sipp, f"127.0.0.1:{port}", "-sf", str(SCENARIOS[kind]),
                "-i", "127.0.0.1", "-p", str(_free_port()), "-mp", str(_free_port()),
                "-m", str(calls), "-r", str(rate), "-l", str(max(10, rate * 3)),
                "-d", str(talk_ms), "-timeout", "120s", "-nostdin",
            ],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        time.sleep(0.5)  # let the last teardowns finish
        wall = time.monotonic() - w0
        cpu = _cpu_s(proc.pid) - cpu0 - idle_rate * wall
        ok = re.search(r"Successful call\s+\|\s+\d+\s+\|\s+(\d+)", out.stdout)
        failed = re.search(r"Failed call\s+\|\s+\d+\s+\|\s+(\d+)", out.stdout)
        return {
            "calls": calls,
            "rate_cps": rate,
            "talk_ms": talk_ms,
            "successful": int(ok.group(1)) if ok else None,
            "failed": int(failed.group(1)) if failed else None,
            "sipp_rc": out.returncode,
            "bridge_cpu_ms_per_call": round(1000 * cpu / calls, 3),
            "bridge_idle_cpu_pct": round(100 * idle_rate, 2),
            "wall_s": round(wall, 1),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rate", type=int, default=30)
    ap.add_argument("--talk-ms", type=int, default=0)
    args = ap.parse_args(argv)
    result = {
        "bench": "sip_calls",
        "answered": _run("answered", args.calls, args.rate, args.talk_ms),
        "rejected": _run("rejected", args.calls, args.rate, 0),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

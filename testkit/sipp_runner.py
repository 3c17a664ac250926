"""Running sipp against an in-process bridge: the one helper every sipp test uses.

sipp exits non-zero on any deviation from its scenario, so ``run_sipp`` asserts its
return code and hands back its output for the test to look at further.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
from pathlib import Path

SCENARIOS = Path(__file__).resolve().parents[1] / "tests" / "sipp"
SIPP = shutil.which("sipp")


def free_port(kind: int = socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sipp_command(
    scenario: str, remote: str | None, *args: str, timeout: float = 40, log: Path | None = None
) -> list[str]:
    """sipp on 127.0.0.1 with free ports; ``remote`` None runs it as a UAS."""
    # Not a skip: `make test` installs Debian's sip-tester, so a missing sipp is a broken setup.
    assert SIPP is not None, "sipp not found: run `make setup` (apt package sip-tester)"
    return [
        SIPP,
        *([remote] if remote else []),
        "-sf", str(SCENARIOS / scenario),
        "-i", "127.0.0.1",
        *([] if "-p" in args else ["-p", str(free_port())]),
        "-mp", str(free_port()),
        "-timeout", f"{int(timeout)}s",
        "-timeout_error",
        "-nostdin",
        *(["-trace_msg", "-message_file", str(log)] if log else []),
        *args,
    ]  # fmt: skip


async def finish(proc: asyncio.subprocess.Process, scenario: str, timeout: float) -> str:
    out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    text = out.decode(errors="replace") if out else ""
    assert proc.returncode == 0, f"sipp {scenario} failed (rc={proc.returncode}):\n{text[-3000:]}"
    return text


async def start_sipp(
    scenario: str, remote: str | None, *args: str, timeout: float = 40, log: Path | None = None
) -> asyncio.subprocess.Process:
    cmd = sipp_command(scenario, remote, *args, timeout=timeout, log=log)
    return await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )


async def run_sipp(
    port: int, scenario: str, *args: str, timeout: float = 40, log: Path | None = None
) -> str:
    """sipp as a UAC against the bridge on 127.0.0.1:``port``; asserts it passed."""
    proc = await start_sipp(scenario, f"127.0.0.1:{port}", *args, timeout=timeout, log=log)
    return await finish(proc, scenario, timeout + 10)

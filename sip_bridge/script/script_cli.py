"""``sip-bridge script FILE.toml [...]``: the command line of the call-script runner.

Exit status: 0 when every step of every script passed, 1 when one failed, 2 when a script
could not be played at all (a mistake in the file, a missing voice or WAV, no target).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from sip_bridge.config.config_types import ConfigError, parse_hostport

__all__ = ["add_parser", "loss_pct_arg", "run", "run_scripts"]


def _dbfs(value: str) -> float:
    v = float(value)
    if not -60.0 <= v <= 0.0:
        raise argparse.ArgumentTypeError("dBFS: -60 to 0")
    return v


def loss_pct_arg(value: str) -> float:
    """An argparse type: a packet loss percentage the line simulator takes."""
    v = float(value)
    if not 0.0 <= v < 50.0:
        raise argparse.ArgumentTypeError("percent: 0 to under 50")
    return v


def _non_negative(value: str) -> float:
    v = float(value)
    if not 0.0 <= v <= 1000.0:
        raise argparse.ArgumentTypeError("0 to 1000")
    return v


def _hostport(value: str) -> tuple[str, int]:
    try:
        return parse_hostport(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``script`` to a ``sip-bridge`` subparsers object."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "script",
        help="place a real call and play a call script (config/scripts/README.md)",
        description="Place a real SIP call and play each script's steps: say, play, press "
        "keys, wait, expect words, hang-up, REFER, no dead air. Exit 0 only if every step "
        "passed.",
    )
    p.add_argument("files", nargs="+", metavar="FILE.toml", help="call scripts")
    p.add_argument("--uri", help="whom to call (default: the script's [script] uri)")
    p.add_argument("--voice", help="espeak-ng voice of say steps, e.g. en-gb-x-rp+f3")
    p.add_argument("--level-dbfs", type=_dbfs, default=-20.0, metavar="L",
                   help="the caller's active speech level (P.56), default -20")  # fmt: skip
    p.add_argument("--loss-pct", type=loss_pct_arg, default=0.0, metavar="P",
                   help="loss of what the caller sends, bursty (Gilbert-Elliott)")  # fmt: skip
    p.add_argument("--jitter-ms", type=_non_negative, default=0.0, metavar="J",
                   help="interarrival jitter (RFC 3550) of what the caller sends")  # fmt: skip
    p.add_argument("--echo-erl-db", type=_non_negative, metavar="E",
                   help="line echo of what the caller hears, this many dB down")  # fmt: skip
    p.add_argument("--echo-delay-ms", type=_non_negative, default=60.0, metavar="D",
                   help="... and this much later (default 60)")  # fmt: skip
    p.add_argument("--codec", choices=("PCMU", "PCMA"), default="PCMU")
    p.add_argument("--seed", type=int, default=0, help="seed of the loss and jitter")
    p.add_argument("--transfer-proxy", type=_hostport, metavar="HOST:PORT",
                   help="send the call to a REFER's target here (an outbound proxy)")  # fmt: skip
    p.add_argument("--transfer-ring-s", type=_non_negative, default=60.0, metavar="S",
                   help="stop ringing a REFER's target after this long (default 60)")  # fmt: skip
    p.add_argument("--keep-going", action="store_true", help="play the steps after a failure")
    p.add_argument("--parallel", type=int, default=1, metavar="N",
                   help="calls at once (output per script, when each ends)")  # fmt: skip
    p.add_argument("--junit", metavar="OUT.xml", help="write a JUnit XML report")
    p.add_argument("-v", "--verbose", action="store_true", help="log SIP and media events")
    return p


async def run_scripts(args: argparse.Namespace) -> int:
    from sip_bridge.script.script_file import load_script
    from sip_bridge.script.script_leg import LineOptions
    from sip_bridge.script.script_report import CallReport, junit_xml
    from sip_bridge.script.script_runner import RunOptions, Transcriber, run_script

    scripts = [load_script(f) for f in args.files]  # every file checked before any call
    line = LineOptions(
        codec=args.codec, level_dbfs=args.level_dbfs, loss_pct=args.loss_pct,
        jitter_ms=args.jitter_ms, echo_erl_db=args.echo_erl_db,
        echo_delay_ms=args.echo_delay_ms, seed=args.seed,
    )  # fmt: skip
    opts = RunOptions(
        uri=args.uri or "", voice=args.voice, line=line, transfer_proxy=args.transfer_proxy,
        transfer_ring_s=args.transfer_ring_s, keep_going=args.keep_going,
    )  # fmt: skip
    transcriber = Transcriber()
    gate = asyncio.Semaphore(max(1, args.parallel))
    stream = args.parallel <= 1

    async def one(script: Any) -> CallReport:
        lines: list[str] = []
        emit = (lambda s: print(s, flush=True)) if stream else lines.append
        async with gate:
            report = await run_script(script, opts, transcriber, on_line=emit)
        if lines:
            print("\n".join(lines), flush=True)
        return report

    try:
        reports = await asyncio.gather(*(one(s) for s in scripts))
    finally:
        transcriber.close()
    if args.junit:
        Path(args.junit).write_text(junit_xml(reports), encoding="utf-8")
    if len(reports) > 1:
        ok = sum(1 for r in reports if r.passed)
        print(f"{ok}/{len(reports)} scripts passed", flush=True)
    return 0 if all(r.passed for r in reports) else 1


def run(args: argparse.Namespace) -> int:
    from model_runtime.store import ModelError
    from sip_bridge.script.script_voice import ScriptError

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    try:
        return asyncio.run(run_scripts(args))
    except (ConfigError, ScriptError, ModelError) as exc:
        print(f"sip-bridge script: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # an unresolvable target, no route, no free port
        print(f"sip-bridge script: {exc}", file=sys.stderr)
        return 2

"""``sip-bridge calls list|show|export|purge``: the call records the bridge wrote.

``list``, ``show`` and ``export`` only read; ``purge`` deletes calls (and their recordings)
started before a date or of one caller (:mod:`sip_bridge.ops.records_retention`), beside a
running bridge if need be. ``cli.py`` wires it in with ``add_parser(sub)`` and, for
``args.command == "calls"``, ``return run(args)``. Exit status 0 on success, 1 with one
line on stderr when the database is missing, unreadable or corrupt, the call id is unknown
or malformed, or a date or number is not one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from sip_bridge.ops.records import OUTCOMES, CallRecords, RecordsError, valid_call_id

PROG = "sip-bridge calls"


def default_db_path() -> Path:
    """``$SIP_BRIDGE_DATA/calls.sqlite``, else ``~/.local/share/sip-bridge/calls.sqlite``."""
    data = os.environ.get("SIP_BRIDGE_DATA")
    if data:
        return Path(data) / "calls.sqlite"
    return Path.home() / ".local" / "share" / "sip-bridge" / "calls.sqlite"


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return n


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``calls`` (with ``list`` and ``show``) to a ``sip-bridge`` subparsers object."""
    calls: argparse.ArgumentParser = subparsers.add_parser(
        "calls", help="list, show, export and purge recorded calls"
    )
    sub = calls.add_subparsers(dest="calls_command", required=True,
                               metavar="{list,show,export,purge}")  # fmt: skip
    db_help = "call-record database (default: $SIP_BRIDGE_DATA/calls.sqlite)"
    ls = sub.add_parser("list", help="the newest calls first")
    ls.add_argument("--limit", type=_positive, default=20, metavar="N", help="at most N calls")
    ls.add_argument("--outcome", choices=OUTCOMES, help="only calls with this outcome")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.add_argument("--db", metavar="PATH", help=db_help)
    show = sub.add_parser("show", help="one call: details, stats, turns and timeline")
    show.add_argument("call_id", metavar="CALL_ID", help="a Call-ID (or its unique prefix)")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.add_argument("--db", metavar="PATH", help=db_help)
    export = sub.add_parser("export", help="one caller's calls as JSON (a data-subject request)")
    export.add_argument("--caller", required=True, metavar="NUMBER", help="the caller's number")
    export.add_argument("--out", metavar="FILE", help="write here (mode 600), not to stdout")
    export.add_argument("--db", metavar="PATH", help=db_help)
    purge = sub.add_parser("purge", help="delete calls and their recordings, by age or caller")
    before = "calls started before this (YYYY-MM-DD or ISO time, local)"
    purge.add_argument("--before", metavar="DATE", type=_date, help=before)
    purge.add_argument("--caller", metavar="NUMBER", help="calls of this caller")
    purge.add_argument("--recordings", metavar="DIR",
                       help="with --before: also WAV files there older than DATE")  # fmt: skip
    purge.add_argument("--dry-run", action="store_true", help="say what would go, delete nothing")
    purge.add_argument("--db", metavar="PATH", help=db_help)
    return calls


def _date(text: str) -> float:
    """``YYYY-MM-DD`` (local midnight) or an ISO 8601 time (local unless it says) -> unix s."""
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date: {text!r} (YYYY-MM-DD)") from None


def run(args: argparse.Namespace) -> int:
    """Run ``calls list|show|export|purge``; the exit status."""
    path = Path(args.db) if getattr(args, "db", None) else default_db_path()
    try:
        if args.calls_command == "purge":
            text = _purge(path, args)
        else:
            if args.calls_command == "show" and not valid_call_id(args.call_id):
                raise RecordsError(f"malformed call id {args.call_id!r}")
            store = CallRecords(path, readonly=True)
            try:
                text = _READERS[args.calls_command](store, args)
            finally:
                store.close()
    except (RecordsError, ValueError, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    if text:
        print(text, flush=True)
    return 0


def _export(store: CallRecords, args: argparse.Namespace) -> str:
    from sip_bridge.ops.records_retention import export_caller

    data = export_caller(store, args.caller)
    text = json.dumps(data, indent=2)
    if not args.out:
        return text
    out = Path(args.out)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # personal data
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    print(f"{len(data['calls'])} call(s) of {args.caller} written to {out}", file=sys.stderr)
    return ""


def _purge(path: Path, args: argparse.Namespace) -> str:
    from sip_bridge.ops.records_retention import purge

    if args.before is None and args.caller is None:
        raise ValueError("say what to purge: --before DATE, --caller NUMBER or both")
    if not path.is_file():
        raise RecordsError(f"no call records at {path}")
    done = purge(path, before=args.before, caller=args.caller, recordings_dir=args.recordings or "",
                 dry_run=args.dry_run)  # fmt: skip
    return f"{'would purge' if args.dry_run else 'purged'} {done}"


def main(argv: list[str] | None = None) -> int:
    """``python -m sip_bridge.ops.records_cli list ...``: the same without the main CLI."""
    parser = argparse.ArgumentParser(prog="sip-bridge")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(["calls", *(sys.argv[1:] if argv is None else argv)]))


def _list(store: CallRecords, args: argparse.Namespace) -> str:
    rows = store.list(limit=args.limit, outcome=args.outcome)
    if args.json:
        return json.dumps(rows, indent=2)
    if not rows:
        return "no calls recorded" + (f" with outcome {args.outcome}" if args.outcome else "")
    head = ("started", "call id", "outcome", "duration", "dead air", "caller", "callee",
            "agent", "trunk", "reason")  # fmt: skip
    table = [
        (
            _when(r["started_at"]),
            _cut(r["call_id"], 32),
            r["outcome"] or "in progress",
            _secs(r["duration_s"]),
            _secs(None if r["dead_air_max_ms"] is None else r["dead_air_max_ms"] / 1000),
            _cut(r["caller"], 32),
            _cut(r["callee"], 32),
            r["agent"] + (f" ({r['profile']})" if r.get("profile") else "") if r["agent"] else "-",
            r["trunk"] or "-",
            _cut(r["end_reason"], 40),
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(head)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in (head, *table)
    ]
    return "\n".join(lines)


def _show(store: CallRecords, args: argparse.Namespace) -> str:
    ids = store.find(args.call_id)
    if not ids:
        raise RecordsError(f"no call {args.call_id!r} in {store.path}")
    if len(ids) > 1:
        raise RecordsError(f"call id {args.call_id!r} is ambiguous: {', '.join(ids[:3])}...")
    record = store.show(ids[0])
    if record is None:  # deleted between the two reads
        raise RecordsError(f"no call {args.call_id!r} in {store.path}")
    if args.json:
        return json.dumps(record, indent=2)
    call, stats = record["call"], record["stats"]
    lines = [f"call {call['call_id']}"]
    keys = ("outcome", "end_reason", "caller", "callee", "trunk", "node", "agent", "profile",
            "codec")  # fmt: skip
    lines += [f"  {k.replace('_', ' '):<12} {_text(call[k])}" for k in (*keys, "remote")]
    lines.append(f"  {'started':<12} {_when(call['started_at'])}")
    lines.append(f"  {'duration':<12} {_secs(call['duration_s'])}")
    figures = [f"{k}={_num(v)}" for k, v in stats.items() if k != "duration_s" and v is not None]
    lines.append(f"  {'stats':<12} {' '.join(figures) or '-'}")
    lines.append("timeline")
    t0 = call["started_at"]
    lines += [
        f"  {_offset(item['at'] - t0):>10}  {item['kind']:<12} {_detail(item)}".rstrip()
        for item in record["timeline"]
    ]
    if record["turns"]:
        lines.append("turns")
    for t in record["turns"]:
        lines.append(f"  #{t['idx']}  caller: {t['caller_text'] or ''}")
        lines.append(f"       agent:  {t['agent_text'] or ''}")
        if t["timings"]:
            timing = t["timings"]
            text = (
                " ".join(f"{k}={_num(v)}" for k, v in timing.items())
                if isinstance(timing, dict)
                else str(timing)
            )
            lines.append(f"       timings: {text}")
    return "\n".join(lines)


def _detail(item: dict[str, Any]) -> str:
    data = item["data"]
    if item["kind"] == "turn":
        return (
            f"#{data['idx']} caller: {_cut(data['caller'], 50)} | agent: {_cut(data['agent'], 50)}"
        )
    if isinstance(data, dict):
        return " ".join(f"{k}={_num(v)}" for k, v in data.items())
    return "" if data is None else str(data)


def _offset(s: float) -> str:
    return f"+{s:.3f}s"


def _text(v: Any) -> str:
    return "-" if v is None or v == "" else str(v)


def _when(t: float | None) -> str:
    """ISO 8601 in local time with its zone (``2026-11-25T18:26:27+01:00``), as the console
    shows it: one format, and an unambiguous one when bridges and people are in other zones."""
    if t is None:
        return "-"
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def _secs(s: float | None) -> str:
    return "-" if s is None else f"{s:.1f}s"


def _num(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _cut(text: str | None, n: int) -> str:
    if not text:
        return "-"
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


_READERS = {"list": _list, "show": _show, "export": _export}

if __name__ == "__main__":
    sys.exit(main())

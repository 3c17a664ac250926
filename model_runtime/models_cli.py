"""`sip-bridge models fetch|list|verify`: the operator's handle on the model store.

Kept out of sip_bridge/cli.py so the SIP side never imports the store's dependencies; the
lead wires `add_models_parser` / `run_models` into the main parser. Every failure is one
line on stderr and exit status 1, so scripts and Makefiles can rely on it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from model_runtime.store import ModelError, ModelStore, default_store


def add_models_parser(subparsers: Any) -> None:
    """Add `models` (with fetch, list, verify) to an argparse subparsers object."""
    models = subparsers.add_parser("models", help="fetch, list and verify the speech models")
    sub = models.add_subparsers(dest="models_command", required=True)

    def with_dir(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--dir",
            type=Path,
            default=None,
            help="store directory (default: $SIP_BRIDGE_MODELS or ~/.cache/sip-bridge/models)",
        )
        return p

    fetch = with_dir(sub.add_parser("fetch", help="download, check and convert models"))
    fetch.add_argument("names", nargs="*", metavar="NAME", help="models to fetch (default: all)")
    fetch.add_argument("--force", action="store_true", help="fetch again even if ready")
    fetch.add_argument("--quiet", action="store_true", help="no progress output")
    fetch.add_argument("--find-links", type=Path, default=None, help=argparse.SUPPRESS)
    fetch.add_argument("--index-url", default=None, help="PyPI-compatible index to use")
    lst = with_dir(sub.add_parser("list", help="show models and whether they are ready"))
    lst.add_argument("--json", action="store_true", help="machine-readable output")
    verify = with_dir(sub.add_parser("verify", help="re-hash every stored file"))
    verify.add_argument("names", nargs="*", metavar="NAME", help="models to verify (default: all)")


def _store(args: argparse.Namespace) -> ModelStore:
    find_links = getattr(args, "find_links", None)
    index_url = getattr(args, "index_url", None)
    if args.dir is None and find_links is None and index_url is None:
        return default_store()
    return ModelStore(args.dir, find_links=find_links, index_url=index_url)


def _human(size: int) -> str:
    if size >= 1_000_000:
        return f"{size / 1e6:.1f} MB"
    return f"{size / 1e3:.0f} kB"


def _list(store: ModelStore, as_json: bool) -> int:
    rows = store.status()
    if as_json:
        out = [
            {
                "name": r.name,
                "kind": r.kind,
                "sources": list(r.sources),
                "size": r.size,
                "license": r.license,
                "ready": r.ready,
                "problem": r.problem,
            }
            for r in rows
        ]
        print(json.dumps({"root": str(store.root), "models": out}, indent=2))
        return 0
    print(f"model store: {store.root}")
    width = max(len(r.name) for r in rows)
    for r in rows:
        state = "ready" if r.ready else "MISSING" if "missing" in (r.problem or "") else "BAD"
        print(
            f"{r.name:<{width}} {r.kind:<6} {state:<8} {_human(r.size):>9}  {r.license:<13} "
            + " + ".join(r.sources)
        )
    not_ready = [r for r in rows if not r.ready]
    if not_ready:
        names = " ".join(r.name for r in not_ready)
        print(f"{len(not_ready)} not ready: run `sip-bridge models fetch {names}`")
    return 0


def run_models(args: argparse.Namespace) -> int:
    """Run one `models` subcommand; 0 on success, 1 with a one-line error on stderr."""
    try:
        store = _store(args)
        if args.models_command == "fetch":
            made = store.fetch(args.names or None, force=args.force, progress=not args.quiet)
            if not args.quiet:
                what = ", ".join(made) if made else "nothing to do, all ready"
                print(f"fetched: {what}", file=sys.stderr)
            return 0
        if args.models_command == "list":
            return _list(store, args.json)
        if args.models_command == "verify":
            problems = store.verify(args.names or None)
            for line in problems:
                print(line, file=sys.stderr)
            if not problems:
                print("all models verified (sha256)")
            return 1 if problems else 0
    except ModelError as exc:
        print(f"sip-bridge: {exc}", file=sys.stderr)
        return 1
    print(f"sip-bridge: unknown models command {args.models_command!r}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    """`python -m model_runtime.models_cli ...` until the lead wires it into sip-bridge."""
    parser = argparse.ArgumentParser(prog="sip-bridge")
    add_models_parser(parser.add_subparsers(dest="command", required=True))
    return run_models(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

"""The `sip-bridge` command line."""

from __future__ import annotations

import argparse
import sys

from sip_bridge import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sip-bridge", description=__doc__)
    parser.add_argument("--version", action="version", version=f"sip-bridge {__version__}")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("run", help="answer calls (the SIP leg is not built yet)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        # Honest about what exists: the media core is here, the SIP leg is the next issue.
        print(f"sip-bridge {__version__}")
        print("SIP leg not built yet: the media core (RTP, G.711, jitter buffer, resampler)")
        print("is in place; try `make test` and `make bench`.")
        return 0
    build_parser().print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())

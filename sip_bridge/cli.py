"""The `sip-bridge` command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

from sip_bridge import __version__
from sip_bridge.config import BridgeConfig, ConfigError, load_config
from sip_bridge.transport import TransportError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sip-bridge", description="SIP voice-agent bridge")
    parser.add_argument("--version", action="version", version=f"sip-bridge {__version__}")
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="answer calls")
    run.add_argument("--config", default=None, help="bridge.toml (default: built-in defaults)")
    run.add_argument("--listen", metavar="HOST:PORT", help="override sip.listen")
    run.add_argument("--agent", metavar="NAME", help="override agent.name")
    run.add_argument("--rtp-ports", metavar="LOW-HIGH", help="override rtp.ports")
    run.add_argument("--max-calls", metavar="N", type=int, help="override sip.max_calls")
    run.add_argument("--http", metavar="HOST:PORT", help="override http.listen ('off': none)")
    run.add_argument("-v", "--verbose", action="store_true", help="log every call")
    status = sub.add_parser("status", help="show a running bridge's calls and registrations")
    status.add_argument("--config", default=None, help="the bridge.toml it runs with")
    status.add_argument("--listen", metavar="HOST:PORT", help="the --listen it runs with")
    status.add_argument("--socket", metavar="PATH", help="its control socket (control.socket)")
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    config = sub.add_parser("config", help="check a bridge.toml (and the agent profiles it names)")
    config.add_argument("action", choices=["check"])
    config.add_argument("file", nargs="?", default="config/bridge.toml", help="bridge.toml")
    from model_runtime.models_cli import add_models_parser
    from sip_bridge.records_cli import add_parser as add_calls_parser

    add_calls_parser(sub)

    add_models_parser(sub)
    from sip_bridge.script_cli import add_parser as add_script_parser

    add_script_parser(sub)
    call = sub.add_parser("call", help="place one outbound call: play a WAV, record the answer")
    call.add_argument("uri", metavar="SIP_URI", help="whom to call, e.g. sip:echo@192.0.2.1")
    call.add_argument("--play", metavar="FILE.wav", required=True, help="16-bit PCM WAV to say")
    call.add_argument("--record", metavar="OUT.wav", required=True, help="8 kHz WAV of the reply")
    call.add_argument("--duration", metavar="S", type=float, help="seconds after answer")
    call.add_argument("--dtmf", metavar="DIGITS", default="", help="keys to press after answer")
    call.add_argument("--rtp-ports", metavar="LOW-HIGH", default="40000-40999")
    call.add_argument("--timeout", metavar="S", type=float, default=30.0, help="ring timeout")
    call.add_argument("-v", "--verbose", action="store_true", help="log SIP and media events")
    return parser


async def run_call(args: argparse.Namespace) -> int:
    """``sip-bridge call``: 0 when the call was answered and ended, 1 when it failed."""
    from pathlib import Path

    from sip_bridge.caller import CallOptions, place_call

    low, _, high = args.rtp_ports.partition("-")
    opts = CallOptions(
        args.uri,
        Path(args.play),
        Path(args.record),
        duration_s=args.duration,
        dtmf=args.dtmf,
        rtp_ports=(int(low), int(high or low)),
        answer_timeout_s=args.timeout,
    )
    result = await place_call(opts)
    if not result.answered:
        print(f"call failed: {result.status} {result.reason}", flush=True)
        return 1
    print(f"call answered ({result.status}), ended: {result.reason}", flush=True)
    print(f"recorded {result.recorded_s:.2f} s to {args.record}", flush=True)
    return 0


async def _serve(args: argparse.Namespace) -> int:
    from sip_bridge.reload import ConfigWatcher, reload_bridge, watched_files
    from sip_bridge.server import BridgeServer, settle_heap

    config = load_config(args.config).with_overrides(
        listen=args.listen, agent=args.agent, rtp_ports=args.rtp_ports, max_calls=args.max_calls,
        http=args.http,
    )  # fmt: skip
    server = BridgeServer(config, control=True)
    await server.start()
    settle_heap()
    transports = "+".join(config.sip.transports)
    print(f"sip-bridge {__version__} listening on {transports} {config.sip.listen}", flush=True)
    print(f"dial {server.uri} (agent: {config.agent.name}); Ctrl-C to stop", flush=True)
    sock = config.control.socket_path(server.port)
    print(f"status: sip-bridge status --socket {sock}", flush=True)
    print(f"media path: {server.media_path}", flush=True)
    if server.web is not None:
        print(f"talk to an agent in a browser: {server.web.url}/talk", flush=True)
        print(f"operator console: {server.web.url}/console", flush=True)
    loop = asyncio.get_running_loop()
    stop, drain, wake = asyncio.Event(), asyncio.Event(), asyncio.Event()

    def load() -> BridgeConfig:
        return load_config(args.config).with_overrides(
            listen=args.listen, agent=args.agent, rtp_ports=args.rtp_ports,
            max_calls=args.max_calls, http=args.http,
        )  # fmt: skip

    reloading: list[asyncio.Task[bool]] = []

    def reload() -> None:
        if not any(not t.done() for t in reloading):  # one at a time
            reloading[:] = [loop.create_task(reload_bridge(server, load))]

    watcher = ConfigWatcher(watched_files(config))

    def signalled(event: asyncio.Event) -> None:
        event.set()
        wake.set()

    for sig, event in ((signal.SIGINT, stop), (signal.SIGTERM, drain)):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, signalled, event)
    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGHUP, reload)
    while not (stop.is_set() or drain.is_set()):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), 1.0)
        if server.config.control.reload_on_change and watcher.changed():
            reload()
            await reloading[0]
            watcher.watch(watched_files(server.config))
    if drain.is_set() and not stop.is_set():  # SIGTERM: finish calls first (SIGINT: now)
        await server.drain()
    else:
        await server.stop()
    return 0


def show_status(args: argparse.Namespace) -> int:
    """``sip-bridge status``: 0 and the bridge's state, 1 when no bridge answers."""
    import json

    from sip_bridge.config import parse_hostport
    from sip_bridge.control import ControlError, format_status, query

    path = args.socket
    if path is None:
        config = load_config(args.config)
        port = parse_hostport(args.listen)[1] if args.listen else config.sip.listen_port
        path = config.control.socket_path(port)
    try:
        answer = query(path)
    except ControlError as exc:
        print(f"sip-bridge status: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=2) if args.json else format_status(answer), flush=True)
    return 0


def check_config(path: str) -> int:
    """``sip-bridge config check``: 0 and a summary line, or 2 and the first mistake (file,
    line, key) in the file or in an agent profile it names."""
    from agent.profile import ProfileError, load_profile

    try:
        config = load_config(path)
        profiles = sorted({c.agent.voice_profile for c in config.agent_configs()
                           if c.agent.name == "voice"})  # fmt: skip
        for profile in profiles:
            load_profile(Path(profile))
    except (ConfigError, ProfileError) as exc:
        print(f"sip-bridge config: {exc}", file=sys.stderr)
        return 2
    print(
        f"{path}: ok: agent {config.agent.name}, {len(config.trunks)} trunk(s), "
        f"{len(config.routes)} route(s), {len(profiles)} agent profile(s)",
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "config":
        return check_config(args.file)
    if args.command == "calls":
        from sip_bridge import records_cli

        return records_cli.run(args)
    if args.command == "status":
        try:
            return show_status(args)
        except (ConfigError, ValueError) as exc:
            print(f"sip-bridge status: {exc}", file=sys.stderr)
            return 2
    if args.command == "script":
        from sip_bridge import script_cli

        return script_cli.run(args)
    if args.command == "models":
        from model_runtime.models_cli import run_models

        return run_models(args)
    if args.command == "call":
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
        try:
            return asyncio.run(run_call(args))
        except (OSError, ValueError) as exc:  # unreadable WAV, bad URI, no route, ...
            print(f"sip-bridge call: {exc}", file=sys.stderr)
            return 2
    if args.command != "run":
        parser.print_help()
        return 0
    # Hundreds of calls each doing tiny matrix products: BLAS worker threads only add
    # wake-ups and spinning. Set before numpy is first imported (the server imports it);
    # an operator's own setting wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("sip_bridge.registration").setLevel(logging.INFO)  # always worth a line
    from agent.profile import ProfileError
    from model_runtime.store import ModelError
    from sip_bridge.native import NativeBuildError
    from sip_bridge.records import RecordsError

    try:
        return asyncio.run(_serve(args))
    except (
        ConfigError, TransportError, ProfileError, ModelError, NativeBuildError, RecordsError
    ) as exc:  # fmt: skip
        # a bad file, a busy port, a broken agent profile, a missing or corrupt model, a
        # stale compiled media path: one line that says what and where (and the fix)
        print(f"sip-bridge: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

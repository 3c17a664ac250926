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

# Hundreds of calls each doing tiny matrix products: BLAS worker threads only add wake-ups
# and spinning. OpenBLAS reads this when numpy is first imported, which the config loader's
# imports below already do (it was set in `run`, after them, and one thread spun
# at 14 % of a core beside the media loop); an operator's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from sip_bridge import __version__
from sip_bridge.config.config_files import LOOKUP, RUNTIME_DIR, ConfigChoice, find_config
from sip_bridge.config.loader import BridgeConfig, ConfigError, load_config
from sip_bridge.sip.transport import TransportError

_LOOKUP_HELP = f"bridge.toml (default: the first of {', '.join(LOOKUP)})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sip-bridge", description="SIP voice-agent bridge")
    parser.add_argument("--version", action="version", version=f"sip-bridge {__version__}")
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="answer calls")
    run.add_argument("--config", default=None, help=_LOOKUP_HELP)
    run.add_argument("--listen", metavar="HOST:PORT", help="override sip.listen")
    run.add_argument("--agent", metavar="NAME", help="override agent.name")
    run.add_argument("--rtp-ports", metavar="LOW-HIGH", help="override rtp.ports")
    run.add_argument("--max-calls", metavar="N", type=int, help="override sip.max_calls")
    run.add_argument("--http", metavar="HOST:PORT", help="override http.listen ('off': none)")
    run.add_argument(
        "--metrics", metavar="HOST:PORT", help="override metrics.listen ('off': none; port 0: any)"
    )
    run.add_argument("-v", "--verbose", action="store_true", help="log every call")
    status = sub.add_parser("status", help="show a running bridge's calls and registrations")
    status.add_argument("--config", default=None, help=f"the {_LOOKUP_HELP}")
    status.add_argument("--listen", metavar="HOST:PORT", help="the --listen it runs with")
    status.add_argument("--socket", metavar="PATH", help="its control socket (control.socket)")
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    config = sub.add_parser("config", help="check a bridge.toml (and the agent profiles it names)")
    config.add_argument("action", choices=["check"])
    config.add_argument("file", nargs="?", default=None, help=_LOOKUP_HELP)
    init = sub.add_parser(
        "init", help="write an editable config (bridge.toml, agent profiles, prompts) to DIR"
    )
    init.add_argument("dir", metavar="DIR", type=Path, help="e.g. /etc/sip-bridge or ./config")
    from model_runtime.models_cli import add_models_parser
    from sip_bridge.ops.records_cli import add_parser as add_calls_parser

    add_calls_parser(sub)

    add_models_parser(sub)
    from sip_bridge.script.script_cli import add_parser as add_script_parser

    add_script_parser(sub)
    call = sub.add_parser("call", help="place one outbound call: play a WAV, record the answer")
    call.add_argument("uri", metavar="SIP_URI", help="whom to call, e.g. sip:echo@192.0.2.1")
    call.add_argument("--play", metavar="FILE.wav", required=True, help="16-bit PCM WAV to say")
    call.add_argument("--record", metavar="OUT.wav", required=True, help="8 kHz WAV of the reply")
    call.add_argument("--duration", metavar="S", type=float, help="seconds after answer")
    call.add_argument("--dtmf", metavar="DIGITS", default="", help="keys to press after answer")
    call.add_argument(
        "--dtmf-at", metavar="SECONDS|prompt", type=_dtmf_at, default=0.5,
        help="when to press them: seconds after the answer (default 0.5), or 'prompt': once "
        "the far end's first prompt ended (speech, then 0.8 s of quiet)",
    )  # fmt: skip
    call.add_argument("--rtp-ports", metavar="LOW-HIGH", default="40000-40999")
    call.add_argument("--timeout", metavar="S", type=float, default=30.0, help="ring timeout")
    call.add_argument("-v", "--verbose", action="store_true", help="log SIP and media events")
    return parser


def _dtmf_at(value: str) -> float | str:
    if value == "prompt":
        return value
    try:
        at = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: seconds (e.g. 6.5) or 'prompt'") from None
    if not 0 <= at <= 3600:
        raise argparse.ArgumentTypeError(f"{value!r}: 0..3600 seconds after the answer")
    return at


async def run_call(args: argparse.Namespace) -> int:
    """``sip-bridge call``: 0 when the call was answered and ended, 1 when it failed."""
    from pathlib import Path

    from sip_bridge.script.caller import CallOptions, place_call

    low, _, high = args.rtp_ports.partition("-")
    opts = CallOptions(
        args.uri,
        Path(args.play),
        Path(args.record),
        duration_s=args.duration,
        dtmf=args.dtmf,
        dtmf_at_s=args.dtmf_at if isinstance(args.dtmf_at, float) else 0.5,
        dtmf_after_prompt=args.dtmf_at == "prompt",
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


def _load(args: argparse.Namespace, choice: ConfigChoice) -> BridgeConfig:
    return load_config(choice.path).with_overrides(
        listen=args.listen, agent=args.agent, rtp_ports=args.rtp_ports, max_calls=args.max_calls,
        http=args.http, metrics=args.metrics,
    )  # fmt: skip


async def _serve(args: argparse.Namespace, choice: ConfigChoice, config: BridgeConfig) -> int:
    from sip_bridge import logs
    from sip_bridge.ops.reload import ConfigWatcher, reload_bridge, watched_files
    from sip_bridge.ops.sd_notify import ServiceNotifier
    from sip_bridge.server import BridgeServer, settle_heap

    loop = asyncio.get_running_loop()
    notifier = ServiceNotifier()  # systemd (Type=notify), when it started us
    notifier.status("loading the speech models and binding the ports")
    notifier.start_watchdog(loop)  # from now on: model loading runs beside the loop
    server = BridgeServer(config, control=True)
    server.config_source = choice.source
    stop, drain, wake = asyncio.Event(), asyncio.Event(), asyncio.Event()

    def signalled(event: asyncio.Event) -> None:
        event.set()
        wake.set()

    # before the start and the banner: a Ctrl-C as soon as "listening on" shows (or while
    # the models load) is a stop after the start, never asyncio's default, which cancels
    # this coroutine mid-way and leaves the started server's threads keeping us alive
    for sig, event in ((signal.SIGINT, stop), (signal.SIGTERM, drain)):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, signalled, event)
    try:
        await server.start()
    except BaseException:
        notifier.close()
        raise
    settle_heap()
    fmt = config.log.format

    def say(line: str) -> None:
        logs.banner(line, fmt)

    transports = "+".join(config.sip.transports)
    host = config.sip.listen_host
    where = f"[{host}]:{server.port}" if ":" in host else f"{host}:{server.port}"
    say(f"sip-bridge {__version__} listening on {transports} {where}")
    scrape = server.telemetry.http
    if scrape is not None:  # the port it really got (--metrics HOST:0)
        h = f"[{scrape.host}]" if ":" in scrape.host else scrape.host
        say(f"metrics: http://{h}:{scrape.port}/metrics")
    say(f"dial {server.uri} (agent: {config.agent.name}); Ctrl-C to stop")
    sock = config.control.socket_path(server.port)
    say(f"status: sip-bridge status --socket {sock}")
    say(f"media path: {server.media_path}")
    if server.web is not None:
        say(f"talk to an agent in a browser: {server.web.url}/talk")
        say(f"operator console: {server.web.url}/console")
    say(choice.describe())
    notifier.ready(f"answering calls at {server.uri}")
    reloading: list[asyncio.Task[bool]] = []

    async def reload_and_tell() -> bool:
        notifier.reloading()
        ok = await reload_bridge(server, lambda: _load(args, choice))
        if ok:  # [log] may have changed too
            log_cfg = server.config.log
            logs.configure(log_cfg.format, log_cfg.level, verbose=args.verbose,
                           redact=server.config.records.redact_card_numbers)  # fmt: skip
        what = "config reloaded" if ok else "config reload refused (see the log)"
        notifier.ready(f"answering calls at {server.uri}; {what}")
        return ok

    def reload() -> None:
        if not any(not t.done() for t in reloading):  # one at a time
            reloading[:] = [loop.create_task(reload_and_tell())]

    watcher = ConfigWatcher(watched_files(config))
    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGHUP, reload)
    while not (stop.is_set() or drain.is_set()):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), 1.0)
        if server.config.control.reload_on_change and watcher.changed():
            reload()
            await reloading[0]
            watcher.watch(watched_files(server.config))
    grace_s = 10.0  # BYEs answered, registrations removed, records closed
    try:
        if drain.is_set() and not stop.is_set():  # SIGTERM: finish calls first (SIGINT: now)
            drain_s = server.config.sip.drain_s
            notifier.stopping(drain_s + grace_s, f"draining {len(server.calls)} call(s)")
            await server.drain()
        else:
            notifier.stopping(grace_s, "hanging up and stopping")
            await server.stop()
    finally:
        notifier.close()
    return 0


def show_status(args: argparse.Namespace) -> int:
    """``sip-bridge status``: 0 and the bridge's state, 1 when no bridge answers."""
    import json
    import tempfile

    from sip_bridge.config.loader import parse_hostport
    from sip_bridge.ops.control import ControlError, format_status, query, running_bridges

    paths = [args.socket] if args.socket else []
    if not paths:
        config = load_config(find_config(args.config).path)  # the bridge it would run
        port = parse_hostport(args.listen)[1] if args.listen else config.sip.listen_port
        paths = [config.control.socket_path(port)]
        if not config.control.socket:  # where the systemd unit's bridge has it
            paths.append(str(RUNTIME_DIR / Path(paths[0]).name))
    path = next((p for p in paths if Path(p).exists()), paths[0])
    try:
        answer = query(path)
    except ControlError as exc:
        also = f" (nor on {', '.join(paths[1:])})" if len(paths) > 1 else ""
        print(f"sip-bridge status: {exc}{also}", file=sys.stderr)
        if args.socket:
            return 1
        # a bridge started on another port (--listen): look for the running ones
        runtime = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
        folders = [f for f in (runtime, tempfile.gettempdir(), str(RUNTIME_DIR)) if f]
        found = running_bridges(folders, skip=paths)
        if len(found) == 1:
            path, answer = found[0]
            print(f"sip-bridge status: the bridge running here answers on {path}", file=sys.stderr)
        else:
            for sock, st in found:
                cfg = (st.get("config") or {}).get("path", "?")
                print(f"  {sock}  listening {st.get('listen', '?')}  config {cfg}", file=sys.stderr)
            hint = "pick one" if found else "for a bridge with its own control.socket, give it"
            print(f"sip-bridge status: {hint}: sip-bridge status --socket PATH", file=sys.stderr)
            return 1
    print(json.dumps(answer, indent=2) if args.json else format_status(answer), flush=True)
    return 0


def check_config(file: str | None) -> int:
    """``sip-bridge config check``: 0 and a summary line, or 2 and the first mistake (file,
    line, key) in the file or in an agent profile it names."""
    from agent.dialogue.profile import ProfileError
    from agent.dialogue.profile_loader import load_profile

    choice = find_config(file)
    target = file if file is not None else choice.path  # a named file: as it was named
    path = str(target or "(built-in defaults)")
    if file is None:
        print(choice.describe(), flush=True)
    try:
        config = load_config(target)
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
    for profile in profiles:
        print(f"  profile loaded: {profile}", flush=True)
    for warning in config.warnings:
        print(f"warning: {warning}", flush=True)
    return 0


def init_config(directory: Path) -> int:
    """``sip-bridge init DIR``: 0 and what to do next, or 1 (nothing written) and why."""
    from sip_bridge.config.init_dir import InitError, next_steps, write_starting_point

    try:
        written = write_starting_point(directory)
    except InitError as exc:
        print(f"sip-bridge init: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {len(written)} files to {directory}:", flush=True)
    for f in written:
        print(f"  {f.relative_to(directory)}")
    print(next_steps(directory), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "config":
        return check_config(args.file)
    if args.command == "init":
        return init_config(args.dir)
    if args.command == "calls":
        from sip_bridge.ops import records_cli

        return records_cli.run(args)
    if args.command == "status":
        try:
            return show_status(args)
        except (ConfigError, ValueError) as exc:
            print(f"sip-bridge status: {exc}", file=sys.stderr)
            return 2
    if args.command == "script":
        from sip_bridge.script import script_cli

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
    from agent.dialogue.profile import ProfileError
    from model_runtime.store import ModelError
    from sip_bridge import logs
    from sip_bridge.native import NativeBuildError
    from sip_bridge.ops.records import RecordsError

    choice = find_config(args.config)
    try:
        config = _load(args, choice)  # its mistakes name the file
    except ConfigError as exc:
        print(f"sip-bridge: {exc}", file=sys.stderr)
        return 2
    logs.configure(config.log.format, config.log.level, verbose=args.verbose,
                   redact=config.records.redact_card_numbers)  # fmt: skip
    for warning in config.warnings:  # allowed, but probably not what the operator meant
        logging.getLogger("sip_bridge.config.loader").warning("%s", warning)
    try:
        return asyncio.run(_serve(args, choice, config))
    except (
        ConfigError, TransportError, ProfileError, ModelError, NativeBuildError, RecordsError
    ) as exc:  # fmt: skip
        # a bad file, a busy port, a broken agent profile, a missing or corrupt model, a
        # stale compiled media path: one line that says what and where (and the fix)
        where = "" if isinstance(exc, ConfigError) else f" (config: {choice.short()})"
        print(f"sip-bridge: {exc}{where}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

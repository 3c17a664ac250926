"""An INVITE flood from one source while real calls are up: are those calls still clean?

Runs `BridgeServer` (echo agent) in this process on 127.0.0.1. sipp #1 places `--calls`
legitimate calls from 127.0.0.2 (RTP both ways, `bench/sipp/uac_rtp_call.xml`); once they
are all up and a quiet stretch has been measured, sipp #2 floods INVITEs from 127.0.0.3
at `--flood-rate` per second for `--flood-s` seconds (`bench/sipp/uac_flood.xml`: it never
ACKs a rejection, as scanners don't). The bridge refuses a source it does not trust
(403, or 503 over its rate) with one response and no transaction (RFC 3261 26.3.2.4);
only a 503 for max_calls, to an admitted source, is retransmitted until Timer H. Once a
source has been refused `[inbound] silence_after` times (200) its datagrams are dropped
unread (`silenced`), which is what makes a long flood cheap.

Two modes (both by default, one after the other):
- ``trunk``: the legitimate calls come over an IP-authenticated trunk (`acl`), the
  flooding source belongs to no trunk: 403, or 503 once over its per-source rate.
- ``open``: the embedded default (no trunks, anyone may call): the per-source rate limit
  answers 503 past its burst, what gets through is answered until `max_calls`, then 503.

Per mode: the legitimate calls' media (late or missing frames, pacing jitter: the same
figures and targets as bench/calls.py), how the flood was answered (the bridge's own
admission counters), the bridge's CPU per flood INVITE (the flood stretch minus the quiet
one), RSS and SIP transactions before, at the peak and after Timer H (bounded: back to
where they were).

    .venv/bin/python bench/flood.py [--calls 50] [--flood-rate 500] [--flood-s 10]
        [--mode trunk|open|both] [--quick]

Prints JSON; writes bench/out/flood.json and bench/out/flood.png.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

from bench.calls import (  # noqa: E402
    TONE_NAME,
    _free_port,
    _rss_mb,
    call_row,
    find_sipp,
    media_figures,
    parse_sipp_counts,
    write_tone,
)
from sip_bridge.config.loader import BridgeConfig, InboundConfig  # noqa: E402
from sip_bridge.config.trunks import TrunkConfig  # noqa: E402
from sip_bridge.server import BridgeServer, settle_heap  # noqa: E402

CALL_SCENARIO = ROOT / "bench" / "sipp" / "uac_rtp_call.xml"
FLOOD_SCENARIO = ROOT / "bench" / "sipp" / "uac_flood.xml"
LEGIT_IP, FLOOD_IP = "127.0.0.2", "127.0.0.3"
TARGETS = {"late_or_missing_frames_pct": 0.1, "pacing_jitter_p99_ms": 5}
TARGET_LATE = TARGETS["late_or_missing_frames_pct"]
SAMPLE_S = 0.25


def bridge_config(mode: str, calls: int, ports: str, t1: float = 0.5) -> BridgeConfig:
    """The bridge under test: room for the legitimate calls and a few more."""
    base = BridgeConfig.line_check()
    trunks: tuple[TrunkConfig, ...] = ()
    if mode == "trunk":
        trunks = (TrunkConfig(name="carrier", acl=(f"{LEGIT_IP}/32",)),)
    return replace(
        base,
        sip=replace(
            base.sip,
            listen="127.0.0.1:0",
            max_calls=calls + 10,
            timers=replace(base.sip.timers, t1=t1),
        ),
        rtp=replace(base.rtp, ports=ports),
        inbound=InboundConfig(rate_per_s=50.0, burst=100),
        trunks=trunks,
    )


def _sipp_cmd(sipp: str, port: int, scenario: Path, source: str, *extra: str) -> list[str]:
    return [
        sipp, f"127.0.0.1:{port}", "-sf", str(scenario), "-i", source,
        "-p", str(_free_port()), "-nostdin", *extra,
    ]  # fmt: skip


async def run_flood(
    mode: str,
    calls: int,
    flood_rate: int,
    flood_s: float,
    quiet_s: float,
    out: Path,
    *,
    t1: float = 0.5,
) -> dict[str, Any]:
    """One mode's run (see the module docstring); `t1` shortens Timer H for tests."""
    sipp = find_sipp()
    out.mkdir(parents=True, exist_ok=True)
    write_tone(out / TONE_NAME)
    talk_s = quiet_s + flood_s + 8.0  # the legitimate calls outlast the flood
    server = BridgeServer(bridge_config(mode, calls, "52000-53999", t1))
    await server.start()
    settle_heap()
    assert server.ua is not None and server.policy is not None
    ua, policy = server.ua, server.policy
    t0 = time.monotonic()
    samples: list[dict[str, float]] = []
    procs: list[asyncio.subprocess.Process] = []  # every sipp: none outlives the run

    def sample() -> None:
        samples.append({
            "t": round(time.monotonic() - t0, 3), "cpu_s": time.process_time(),
            "rss_mb": _rss_mb(), "calls": len(server.calls), "transactions": ua.transactions,
        })  # fmt: skip

    async def sample_until(fut: asyncio.Future[Any] | None, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not (fut is not None and fut.done()):
            await asyncio.sleep(SAMPLE_S)
            sample()

    try:
        sample()
        legit = await asyncio.create_subprocess_exec(
            *_sipp_cmd(
                sipp, server.port, CALL_SCENARIO, LEGIT_IP, "-mi", LEGIT_IP, "-mp", "34000",
                "-m", str(calls), "-l", str(calls), "-r", "25", "-d", str(int(talk_s * 1000)),
                "-timeout", f"{int(talk_s + 60)}s", "-timeout_error",
            ),
            cwd=out, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        procs.append(legit)
        legit_done = asyncio.ensure_future(legit.communicate())
        deadline = time.monotonic() + calls / 25 + 10
        while len(server.calls) < calls and time.monotonic() < deadline:
            await sample_until(legit_done, SAMPLE_S)
        before = {"rss_mb": _rss_mb(), "transactions": ua.transactions}
        quiet_from = len(samples)
        await sample_until(legit_done, quiet_s)
        quiet = (samples[quiet_from], samples[-1])
        counts0 = dict(policy.counts)
        silenced0 = policy.silenced_count
        offered0 = server.stats["offered"]
        n_flood = int(flood_rate * flood_s)
        flood = await asyncio.create_subprocess_exec(
            *_sipp_cmd(
                sipp, server.port, FLOOD_SCENARIO, FLOOD_IP,
                "-m", str(n_flood), "-r", str(flood_rate), "-l", str(n_flood), "-nr",
                "-timeout", f"{int(flood_s + 30)}s",
            ),
            cwd=out, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        procs.append(flood)
        flood_done = asyncio.ensure_future(flood.communicate())
        flood_from = len(samples)
        sample()
        await sample_until(flood_done, flood_s + 30)
        flood_window = (samples[flood_from], samples[-1])
        flood_text = (flood_done.result()[0] or b"").decode(errors="replace")
        await sample_until(legit_done, talk_s + 60)
        legit_text = (legit_done.result()[0] or b"").decode(errors="replace")
        # Timer H (64 * T1) after the last rejection: every flood transaction gone.
        settle = 64 * server.config.sip.timers.t1 + 2
        end = time.monotonic() + settle
        while (ua.transactions or server.calls) and time.monotonic() < end:
            await sample_until(None, 0.5)
        sample()
        finished = [s for s in server.finished if s.remote[0] == LEGIT_IP]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await server.stop()
    counts = {k: policy.counts[k] - counts0.get(k, 0) for k in policy.counts}
    silenced = policy.silenced_count - silenced0
    answered_calls = server.stats["offered"] - offered0
    quiet_rate = (quiet[1]["cpu_s"] - quiet[0]["cpu_s"]) / max(quiet[1]["t"] - quiet[0]["t"], 1e-9)
    flood_wall = flood_window[1]["t"] - flood_window[0]["t"]
    flood_cpu = flood_window[1]["cpu_s"] - flood_window[0]["cpu_s"] - quiet_rate * flood_wall
    peak = max(samples[flood_from:], key=lambda s: s["rss_mb"])
    ok, failed = parse_sipp_counts(legit_text)
    flood_ok, flood_failed = parse_sipp_counts(flood_text)
    media = media_figures([call_row(s) for s in finished])
    late = media.get("late_or_missing_frames_pct")
    return {
        "mode": mode,
        "legit_calls": calls,
        "legit_completed": ok,
        "legit_failed": failed,
        "legit_finished_on_bridge": len(finished),
        **media,
        "flood": {
            "rate_cps": flood_rate,
            "seconds": flood_s,
            "invites": n_flood,
            "sipp_completed": flood_ok,
            "sipp_failed": flood_failed,
            "answered": counts,  # admitted / challenged / forbidden (403) / rate_limited (503)
            "silenced": silenced,  # dropped unread: refused [inbound] silence_after times
            "became_calls": answered_calls,
            "refused_full": counts["admitted"] - answered_calls,  # 503: max_calls
            "cpu_pct_during": round(100 * (flood_cpu / flood_wall + quiet_rate), 1),
            "cpu_us_per_invite": round(1e6 * flood_cpu / n_flood, 1) if n_flood else None,
        },
        "cpu_pct_quiet": round(100 * quiet_rate, 1),
        "rss_mb": {
            "before_flood": round(before["rss_mb"], 1),
            "peak": round(peak["rss_mb"], 1),
            "after_timer_h": round(samples[-1]["rss_mb"], 1),
        },
        "transactions": {
            "before_flood": before["transactions"],
            "peak": max(int(s["transactions"]) for s in samples),
            "after_timer_h": int(samples[-1]["transactions"]),
        },
        "clean": bool(ok == calls and not failed and late is not None and late <= TARGET_LATE),
        "samples": samples,
        "flood_window_s": [flood_window[0]["t"], flood_window[1]["t"]],
    }


def _plot(path: Path, runs: list[dict[str, Any]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 3.4 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        s = run["samples"]
        t = [x["t"] for x in s]
        pairs = itertools.pairwise(s)
        cpu = [0.0] + [100 * (b["cpu_s"] - a["cpu_s"]) / (b["t"] - a["t"] or 1) for a, b in pairs]
        ax.plot(t, cpu, label="bridge CPU %", lw=1)
        ax.plot(t, [x["transactions"] / 10 for x in s], label="SIP transactions / 10", lw=1)
        ax.plot(t, [x["calls"] for x in s], label="calls up", lw=1)
        ax2 = ax.twinx()
        ax2.plot(t, [x["rss_mb"] for x in s], color="grey", ls="--", label="RSS MB")
        ax2.set_ylabel("RSS MB")
        ax.axvspan(*run["flood_window_s"], color="red", alpha=0.1, label="flood")
        ax.set_title(
            f"{run['mode']}: {run['flood']['rate_cps']} INVITE/s for {run['flood']['seconds']} s; "
            f"legit late/missing {run['late_or_missing_frames_pct']} %"
        )
        ax.set_xlabel("s")
        ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=50, help="legitimate calls kept up")
    ap.add_argument("--flood-rate", type=int, default=500, help="flood INVITEs per second")
    ap.add_argument("--flood-s", type=float, default=10.0, help="how long the flood lasts")
    ap.add_argument("--quiet-s", type=float, default=5.0, help="measured stretch before it")
    ap.add_argument("--mode", choices=("trunk", "open", "both"), default="both")
    ap.add_argument("--quick", action="store_true", help="10 calls, 300/s for 3 s")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = ap.parse_args(argv)
    if args.quick:
        args.calls, args.flood_rate, args.flood_s, args.quiet_s = 10, 300, 3.0, 2.0
    modes = ("trunk", "open") if args.mode == "both" else (args.mode,)
    load_avg = os.getloadavg()[0]
    runs = [
        asyncio.run(run_flood(m, args.calls, args.flood_rate, args.flood_s, args.quiet_s, args.out))
        for m in modes
    ]
    _plot(args.out / "flood.png", runs)
    result = {
        "bench": "flood",
        "targets": TARGETS,
        "load_avg_at_start": load_avg,
        "cpus": os.cpu_count(),
        "runs": [{k: v for k, v in r.items() if k != "samples"} for r in runs],
        "clean": all(r["clean"] for r in runs),
    }
    text = json.dumps(result, indent=2)
    (args.out / "flood.json").write_text(
        json.dumps({**result, "samples": {r["mode"]: r["samples"] for r in runs}}) + "\n"
    )
    print(text)
    return 0 if result["clean"] else 1


if __name__ == "__main__":
    sys.exit(main())

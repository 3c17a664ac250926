"""N concurrent echo calls with RTP both ways: signalling and media figures under load.

Runs `BridgeServer` (echo agent) in this process on 127.0.0.1 and has sipp
(`bench/sipp/uac_rtp_call.xml`) place N calls at `--rate` calls/s, each one
streaming a looping 8 kHz mu-law tone with sipp's `rtp_stream` for `--duration`
seconds before its BYE. The bridge is in-process so its CPU (`time.process_time`)
and RSS (`/proc/self/status`) are read directly; sipp is C and runs apart.

Setup time is the INVITE -> 200 response time that sipp measures itself
(`rtd="true"` on the 200, every call dumped with `-trace_rtt -rtt_freq 1`):
sipp's clock, no parsing of its screen. Media figures come from the
`MediaStats` of every finished call (`server.finished`).

Prints one JSON object; writes bench/out/calls.png and bench/out/calls.json.
Machines are shared: the load average at the start is in the JSON.

    .venv/bin/python bench/calls.py [--calls 200] [--duration 20] [--rate 20] [--quick]
        [--workers 2]   # N bridge processes side by side (as behind a dispatcher), merged
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

# The bridge in this process runs as `sip-bridge run` runs it: OpenBLAS on one thread, set
# before numpy loads (sip_bridge/cli.py says why).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from resample.g711 import ulaw_encode  # noqa: E402
from sip_bridge.config.loader import BridgeConfig  # noqa: E402
from sip_bridge.media.call_media import MediaStats  # noqa: E402
from sip_bridge.server import BridgeServer, settle_heap  # noqa: E402

SCENARIO = ROOT / "bench" / "sipp" / "uac_rtp_call.xml"
TONE_NAME = "sip_bridge_bench_tone.ulaw"  # the name the scenario's rtp_stream reads
TARGETS = {
    "calls": 200,
    "pacing_jitter_p99_ms": 5,
    "late_or_missing_frames_pct": 0.1,
    "cpu_pct_per_call": 0.5,
}
SAMPLE_S = 0.25
TICKS = os.sysconf("SC_CLK_TCK")


def find_sipp() -> str:
    """sipp's path, or the one line that says how to get it."""
    sipp = shutil.which("sipp")
    if sipp is None:
        raise SystemExit("sipp not found: `make setup` installs Debian's sip-tester")
    return sipp


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _machine_busy_s() -> float:
    """CPU-seconds all cores spent busy (not idle/iowait), from /proc/stat: the contention."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / TICKS


def _proc_cpu_s(pid: int | None) -> float:
    """CPU-seconds (user + system) a process has used, from /proc (0 when gone)."""
    if pid is None:
        return 0.0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class GcPauses:
    """Every garbage collection from creation to :meth:`close`, as (monotonic end,
    generation, ms): a pause stalls every call's media at once."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, int, float]] = []
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._started = now
        else:
            self.pauses.append((time.monotonic(), info["generation"], 1e3 * (now - self._started)))

    def close(self) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self, t0: float, t1: float) -> dict[str, Any]:
        """Collections that ended in [t0, t1]: how many, the longest, the full ones."""
        inside = [p for p in self.pauses if t0 <= p[0] <= t1]
        return {
            "collections": len(inside),
            "max_ms": round(max((p[2] for p in inside), default=0.0), 2),
            "full_collections": sum(1 for p in inside if p[1] == 2),
        }


def write_tone(path: Path, seconds: float = 4.0) -> None:
    """A 440 Hz + 1 kHz tone as raw mu-law; speech-level, so the echo path does real work."""
    t = np.arange(int(8000 * seconds)) / 8000
    x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 1000 * t)
    path.write_bytes(ulaw_encode((x * 32767).astype(np.int16)).tobytes())


def parse_rtt(path: Path) -> list[float]:
    """Response times (ms) from sipp's `-trace_rtt` CSV (`date_ms;rtt_ms;rtd_no` rows)."""
    out: list[float] = []
    for line in path.read_text().splitlines():
        parts = line.strip().split(";")
        if len(parts) >= 2:
            try:
                out.append(float(parts[1]))
            except ValueError:
                continue  # the header row
    return out


def parse_sipp_counts(text: str) -> tuple[int | None, int | None]:
    """(successful, failed) cumulative call counts from sipp's final screen."""
    ok = re.findall(r"Successful call\s+\|\s+\d+\s+\|\s+(\d+)", text)
    failed = re.findall(r"Failed call\s+\|\s+\d+\s+\|\s+(\d+)", text)
    return (int(ok[-1]) if ok else None, int(failed[-1]) if failed else None)


def call_row(s: MediaStats) -> dict[str, float]:
    """The figures of one finished call that the summary needs (plain, for --workers)."""
    return {
        "p50": s.pacing_jitter_p50_ms,
        "p99": s.pacing_jitter_p99_ms,
        "max": s.pacing_jitter_max_ms,
        "sent": s.packets_out,
        "late": s.pacer_late_frames,
        "skipped": s.pacer_skipped_frames,
        "rx": s.jitter.received,
        "rx_late": s.jitter.late,
        "rx_lost": s.jitter.lost,
        "concealed": s.jitter.concealed,
        "packets_in": s.packets_in,
        "underrun": s.playout_underrun_frames,
        "send_errors": s.send_errors,
        "agent_errors": s.agent_errors,
        "jb_target": s.jitter.target_delay_ms,
        "jb_delay": s.jitter.current_delay_ms,
        "pop_after_due": s.pop_after_due_ms,
        "held": s.held_frames,
        "held_max": s.held_wait_max_ms,
        "spurts": s.talkspurts,
        "ffd_p50": s.first_frame_delay_p50_ms,
        "ffd_p99": s.first_frame_delay_p99_ms,
        "ffd_max": s.first_frame_delay_max_ms,
    }


def media_figures(rows: list[dict[str, float]]) -> dict[str, Any]:
    """Pacing and jitter-buffer figures over all finished calls (rows of :func:`call_row`)."""
    if not rows:
        return {"pacing_jitter_ms": None, "late_or_missing_frames_pct": None}

    def total(key: str) -> int:
        return int(sum(r[key] for r in rows))

    sent, rx = total("sent"), total("rx")
    return {
        "pacing_jitter_ms": {
            "p50": round(float(np.median([r["p50"] for r in rows])), 3),
            "p99": round(float(np.percentile([r["p99"] for r in rows], 99)), 3),
            "max": round(float(max(r["max"] for r in rows)), 3),
        },
        "late_or_missing_frames_pct": round(
            100 * (total("late") + total("skipped")) / max(1, sent), 4
        ),
        "pacer_late_frames": total("late"),
        "pacer_skipped_frames": total("skipped"),
        "frames_sent": sent,
        "packets_in": total("packets_in"),
        "rx_late_pct": round(100 * total("rx_late") / max(1, rx), 4),
        "rx_lost_pct": round(100 * total("rx_lost") / max(1, rx + total("rx_lost")), 4),
        # The jitter buffer's target and its delay at the last pop (the pop's own clock).
        "jb_target_delay_ms_mean": round(float(np.mean([r["jb_target"] for r in rows])), 2),
        "jb_delay_ms_mean": round(float(np.mean([r["jb_delay"] for r in rows])), 2),
        "pop_after_due_ms_mean": round(float(np.mean([r["pop_after_due"] for r in rows])), 2),
        "rx_concealed_pct": round(100 * total("concealed") / max(1, rx), 4),
        "playout_underrun_frames": total("underrun"),
        # Frames an echo's late receive pop made wait past their slot (not pacing lateness).
        "held_frames_pct": round(100 * total("held") / max(1, sent), 4),
        "held_wait_max_ms": round(float(max(r["held_max"] for r in rows)), 3),
        # Agent write -> first packet of each talkspurt (an echo call has one, at its start):
        # p50 is the median of the calls' medians, p99 the 99th percentile of their maxima.
        "first_frame_delay_ms": _first_frame_delay([r for r in rows if r.get("spurts")]),
        "send_errors": total("send_errors"),
        "agent_errors": total("agent_errors"),
    }


def _first_frame_delay(rows: list[dict[str, float]]) -> dict[str, Any] | None:
    if not rows:
        return None
    return {
        "p50": round(float(np.median([r["ffd_p50"] for r in rows])), 3),
        "p99": round(float(np.percentile([r["ffd_max"] for r in rows], 99)), 3),
        "max": round(float(max(r["ffd_max"] for r in rows)), 3),
        "talkspurts": int(sum(r["spurts"] for r in rows)),
    }


async def _run(
    calls: int, duration_s: float, rate: int, out: Path, worker: int = 0
) -> dict[str, Any]:
    sipp = find_sipp()
    out.mkdir(parents=True, exist_ok=True)
    write_tone(out / TONE_NAME)
    for old in out.glob("uac_rtp_call_*_rtt.csv"):
        old.unlink()
    base = BridgeConfig.line_check()
    config = replace(
        base,
        sip=replace(base.sip, listen="127.0.0.1:0", max_calls=calls + 10),
        rtp=replace(base.rtp, ports=f"{50000 + 2000 * worker}-{51999 + 2000 * worker}"),
    )
    load_avg = os.getloadavg()[0]
    server = BridgeServer(config)
    await server.start()
    settle_heap()  # as `sip-bridge run` does
    loop = asyncio.get_running_loop()
    samples: list[tuple[float, float, float, int]] = []  # wall, cpu, rss, concurrent
    busy: list[float] = []  # machine-wide busy CPU-seconds at each sample
    sipp_cpu: list[float] = []  # the load generator's CPU-seconds at each sample
    sipp_pid: list[int] = []

    def sample() -> None:
        samples.append((time.monotonic(), time.process_time(), _rss_mb(), len(server.calls)))
        busy.append(_machine_busy_s())
        sipp_cpu.append(_proc_cpu_s(sipp_pid[0] if sipp_pid else None))

    pauses = GcPauses()
    try:
        sample()
        await asyncio.sleep(1.0)
        sample()
        idle = samples[-1]
        idle_cpu_pct = 100 * (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0])
        proc = await asyncio.create_subprocess_exec(
            sipp, f"127.0.0.1:{server.port}", "-sf", str(SCENARIO),
            "-i", "127.0.0.1", "-p", str(_free_port()),
            "-mi", "127.0.0.1", "-mp", str(30000 + 4000 * worker),
            "-m", str(calls), "-l", str(calls), "-r", str(rate), "-d", str(int(duration_s * 1000)),
            "-trace_rtt", "-rtt_freq", "1", "-timeout", f"{int(duration_s + 60)}s",
            "-timeout_error", "-nostdin",
            cwd=out, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        sipp_pid.append(proc.pid)
        reader = asyncio.ensure_future(proc.communicate())
        while not reader.done():
            await asyncio.wait([reader], timeout=SAMPLE_S)
            sample()
        stdout = (reader.result()[0] or b"").decode(errors="replace")
        deadline = loop.time() + 5
        while server.calls and loop.time() < deadline:
            await asyncio.sleep(0.1)
        finished = list(server.finished)
    finally:
        pauses.close()
        await server.stop()
    peak = max(s[3] for s in samples)
    steady_idx = [i for i, s in enumerate(samples) if s[3] >= peak and peak > 0]
    steady = [samples[i] for i in steady_idx]
    cpu_pct = rss_growth = machine_pct = sipp_pct = None
    if len(steady) >= 2:
        wall = steady[-1][0] - steady[0][0]
        cpu_pct = 100 * (steady[-1][1] - steady[0][1]) / wall if wall > 0 else None
        machine_pct = 100 * (busy[steady_idx[-1]] - busy[steady_idx[0]]) / wall if wall else None
        a, b = sipp_cpu[steady_idx[0]], sipp_cpu[steady_idx[-1]]
        sipp_pct = 100 * (b - a) / wall if wall and a and b else None
        rss_growth = max(s[2] for s in steady) - idle[2]
    rtt = sorted(x for p in out.glob("uac_rtp_call_*_rtt.csv") for x in parse_rtt(p))
    ok, failed = parse_sipp_counts(stdout)
    result: dict[str, Any] = {
        "bench": "calls",
        "calls": calls,
        "rate_cps": rate,
        "concurrent_peak": peak,
        "duration_s": duration_s,
        "completed_all": ok == calls and failed == 0 and len(finished) == calls,
        "sipp": {"successful": ok, "failed": failed, "rc": proc.returncode},
        "finished_calls": len(finished),
        "setup_ms": {
            "p50": round(float(np.percentile(rtt, 50)), 2) if rtt else None,
            "p99": round(float(np.percentile(rtt, 99)), 2) if rtt else None,
            "n": len(rtt),
        },
        "steady_s": round(steady[-1][0] - steady[0][0], 1) if len(steady) >= 2 else 0,
        "cpu_pct_steady": round(cpu_pct, 1) if cpu_pct is not None else None,
        "cpu_pct_idle": round(idle_cpu_pct, 2),
        "machine_cpu_pct_steady": round(machine_pct, 1) if machine_pct is not None else None,
        # The load generator shares the machine: what is left for the bridge is the rest.
        "sipp_cpu_pct_steady": round(sipp_pct, 1) if sipp_pct is not None else None,
        "cpu_pct_per_call": round(cpu_pct / peak, 3) if cpu_pct is not None else None,
        # One event loop, one core: near 100 % the per-call figure is a floor, not a cost.
        "bridge_saturated": cpu_pct is not None and cpu_pct >= 90,
        # collections while every call was up (sip-bridge run's heap settling is on)
        "gc_during_calls": pauses.summary(steady[0][0], steady[-1][0]) if steady else None,
        "media_path": server.media_path,
        "rss_mb_idle": round(idle[2], 1),
        "rss_mb_per_call": round(rss_growth / peak, 3) if rss_growth is not None else None,
        **media_figures([call_row(s) for s in finished]),
        "load_avg_at_start": load_avg,
        "cpus": os.cpu_count(),
        "targets": TARGETS,
    }
    if proc.returncode != 0 and ok is None:
        result["sipp_tail"] = stdout[-2000:]
    _plot(out / "calls.png", finished, samples, result)
    result["raw"] = {"rows": [call_row(s) for s in finished], "rtt": rtt}
    return result


def _plot(
    path: Path,
    stats: list[MediaStats],
    samples: list[tuple[float, float, float, int]],
    result: dict[str, Any],
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    p99 = [s.pacing_jitter_p99_ms for s in stats]
    a.hist(p99, bins=40, color="tab:blue")
    a.axvline(TARGETS["pacing_jitter_p99_ms"], color="tab:red", ls="--", label="target p99")
    a.set_xlabel("per-call pacing jitter p99 (ms)")
    a.set_ylabel("calls")
    a.set_title(f"{len(stats)} calls, outbound pacing")
    a.legend()
    t0 = samples[0][0]
    ts = [(s[0] + p[0]) / 2 - t0 for p, s in itertools.pairwise(samples)]
    cpu = [100 * (s[1] - p[1]) / max(1e-9, s[0] - p[0]) for p, s in itertools.pairwise(samples)]
    b.plot(ts, cpu, color="tab:orange", label="bridge CPU (% of one core)")
    b.set_xlabel("time (s)")
    b.set_ylabel("CPU %")
    c = b.twinx()
    c.plot([s[0] - t0 for s in samples], [s[3] for s in samples], color="tab:green", label="calls")
    c.set_ylabel("concurrent calls")
    b.set_title(f"bridge CPU, {result['cpu_pct_per_call']} % of a core per call")
    b.legend(loc="upper left")
    c.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _run_workers(args: argparse.Namespace) -> dict[str, Any]:
    """Run ``--workers`` bridge processes side by side (each: its own BridgeServer, SIP
    port, RTP range and sipp) and merge their figures into the node's."""
    k = args.workers
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--raw",
                "--calls",
                str(args.calls // k),
                "--duration",
                str(args.duration),
                "--rate",
                str(max(1, args.rate // k)),
                "--out",
                str(args.out / f"worker{i}"),
                "--worker-index",
                str(i),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(k)
    ]
    parts = [json.loads(p.communicate()[0]) for p in procs]
    rows = [r for part in parts for r in part["raw"]["rows"]]
    rtt = sorted(x for part in parts for x in part["raw"]["rtt"])
    calls = sum(part["calls"] for part in parts)
    cpu = [part["cpu_pct_steady"] for part in parts]
    total_cpu = sum(cpu) if all(c is not None for c in cpu) else None
    sipp = [part["sipp_cpu_pct_steady"] or 0.0 for part in parts]
    return {
        "bench": "calls",
        "workers": k,
        "calls": calls,
        "rate_cps": sum(part["rate_cps"] for part in parts),
        "concurrent_peak": sum(part["concurrent_peak"] for part in parts),
        "duration_s": args.duration,
        "completed_all": all(part["completed_all"] for part in parts),
        "finished_calls": sum(part["finished_calls"] for part in parts),
        "setup_ms": {
            "p50": round(float(np.percentile(rtt, 50)), 2) if rtt else None,
            "p99": round(float(np.percentile(rtt, 99)), 2) if rtt else None,
            "n": len(rtt),
        },
        "cpu_pct_steady_per_worker": cpu,
        "cpu_pct_steady": round(total_cpu, 1) if total_cpu is not None else None,
        "machine_cpu_pct_steady": max(part["machine_cpu_pct_steady"] or 0.0 for part in parts),
        "sipp_cpu_pct_steady": round(sum(sipp), 1),
        "cpu_pct_per_call": round(total_cpu / calls, 3) if total_cpu is not None else None,
        "bridge_saturated": any(part["bridge_saturated"] for part in parts),
        **media_figures(rows),
        "load_avg_at_start": parts[0]["load_avg_at_start"],
        "cpus": os.cpu_count(),
        "targets": TARGETS,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--duration", type=float, default=20.0, help="seconds each call streams")
    ap.add_argument("--rate", type=int, default=20, help="new calls per second")
    ap.add_argument("--quick", action="store_true", help="20 calls x 5 s")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    ap.add_argument(
        "--workers",
        type=int,
        default=1,
        help="bridge processes (each with its own sipp, calls and rate split evenly), as\n"
        "behind a dispatcher: the node's figures are merged",
    )
    ap.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.calls, args.duration = 20, 5.0
    if args.workers > 1:
        result = _run_workers(args)
    else:
        result = asyncio.run(
            _run(args.calls, args.duration, args.rate, args.out, args.worker_index)
        )
        if not args.raw:
            del result["raw"]
    text = json.dumps(result, indent=2)
    (args.out / "calls.json").write_text(text + "\n")
    print(text)
    return 0 if result["completed_all"] else 1


if __name__ == "__main__":
    sys.exit(main())

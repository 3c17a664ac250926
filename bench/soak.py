"""Soak: mixed load on two bridge nodes behind Kamailio, one of them killed and restarted.

For `--minutes` (default 10) on loopback:
- sipp places calls through Kamailio (pbx_examples/kamailio, the shipped cfg) at `--rate`
  calls/s, each streaming a tone for `--hold` seconds (RTP both ways, echo agent);
- every `--flood-every` seconds an INVITE flood (`bench/sipp/uac_flood.xml`, 300/s for
  5 s) hits node A straight from 127.0.0.3, a source no trunk owns;
- garbage (fuzz-mutated SIP, RTP and random bytes, bench/fuzz.py's mutator) goes at
  ~50 datagrams/s to both nodes' SIP ports and to ports in their RTP ranges;
- halfway, node B is killed with SIGKILL and started again 5 s later.

The nodes are `sip-bridge run` processes with call records (SQLite) and call events over
MQTT (a private mosquitto); the bench subscribes to every event. At the end the nodes are
stopped with SIGTERM (drain) and the figures are read back:

- calls attempted / completed / failed by reason: sipp's own counters (`-trace_stat`);
- CDRs lost: calls sipp completed (their Call-IDs, `-trace_logs`) with no answered record
  on either node: must be 0; calls that were up on the killed node: `interrupted` records;
- events lost: per node, sequence numbers the node assigned (its spool cursor) that the
  subscriber never got, plus calls (completed by sipp, or with a record on a node) without
  a `started` and an `ended` event: must be 0;
- frames late or missing (records' late frames over frames sent), peak RSS per node.

    .venv/bin/python bench/soak.py [--minutes 10] [--rate 4] [--hold 15] [--quick]

Prints JSON; writes bench/out/soak.json and bench/out/soak.png.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiomqtt

ROOT = Path(__file__).resolve().parents[1]

from bench import fuzz  # noqa: E402
from bench.calls import TONE_NAME, _free_port, find_sipp, write_tone  # noqa: E402
from testkit.kamailio_runner import Kamailio  # noqa: E402
from testkit.mosquitto_runner import Mosquitto  # noqa: E402

BRIDGE = Path(sys.executable).with_name("sip-bridge")
CALL_SCENARIO = ROOT / "bench" / "sipp" / "uac_soak_call.xml"
FLOOD_SCENARIO = ROOT / "bench" / "sipp" / "uac_flood.xml"
FLOOD_IP, GARBAGE_IP = "127.0.0.3", "127.0.0.4"
SAMPLE_S = 1.0

NODE_CONFIG = """\
[node]
name = "{name}"
[sip]
listen = "127.0.0.1:{port}"
max_calls = {max_calls}
drain_s = 20
transports = ["udp"]
[rtp]
ports = "{rtp}"
[agent]
name = "echo"
[[trunks]]
name = "proxy"
acl = ["127.0.0.1/32"]
[records]
enabled = true
db = "{name}.sqlite"
[mqtt]
enabled = true
port = {mqtt_port}
spool_dir = "{name}-spool"
[control]
socket = "{name}.sock"
[http]
listen = ""
"""


@dataclass
class Node:
    """One `sip-bridge run` process and what the bench knows of it."""

    name: str
    port: int
    rtp: tuple[int, int]
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    peak_rss_mb: float = 0.0
    rss: list[tuple[float, float]] = field(default_factory=list)

    def start(self) -> None:
        self.starts += 1
        log = (self.workdir / f"{self.name}.log").open("ab")
        self.proc = subprocess.Popen(
            [str(BRIDGE), "run", "--config", str(self.workdir / f"{self.name}.toml")],
            cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def sock(self) -> Path:
        return self.workdir / f"{self.name}.sock"

    def rss_mb(self) -> float:
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 40.0) -> None:
        """SIGTERM: the bridge drains its calls and closes its records and spool."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


async def _wait_ready(node: Node, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not node.sock().exists():
        if node.proc is None or node.proc.poll() is not None or time.monotonic() > deadline:
            log = (node.workdir / f"{node.name}.log").read_text(errors="replace")
            raise SystemExit(f"node {node.name} did not start:\n{log[-3000:]}")
        await asyncio.sleep(0.1)


class Events:
    """Every call event the broker delivers: (node, seq) seen, and per call its kinds."""

    def __init__(self) -> None:
        self.seqs: dict[str, set[int]] = {}
        self.by_call: dict[str, set[str]] = {}
        self.timeline: list[tuple[float, str]] = []  # (monotonic, event)
        self.duplicates = 0

    def take(self, payload: bytes) -> None:
        doc = json.loads(payload)
        seen = self.seqs.setdefault(doc["node"], set())
        if doc["seq"] in seen:
            self.duplicates += 1  # at-least-once delivery: a resend after a reconnect
            return
        seen.add(doc["seq"])
        self.by_call.setdefault(doc["call_id"], set()).add(doc["event"])
        self.timeline.append((time.monotonic(), doc["event"]))


async def _subscribe(port: int, events: Events, ready: asyncio.Event) -> None:
    async with aiomqtt.Client("127.0.0.1", port, identifier="soak-bench") as client:
        await client.subscribe("sipbridge/+/calls/#", qos=1)
        ready.set()
        async for message in client.messages:
            events.take(bytes(message.payload))


async def _garbage(nodes: list[Node], rate: float, stop: asyncio.Event) -> int:
    """Mutated SIP/RTP and random bytes at the nodes' SIP ports and RTP ranges."""
    rng = random.Random(4475)
    targets = {t.name: t for t in fuzz.targets()}
    seeds = targets["sip"].seeds + targets["rtp"].seeds
    sent = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((GARBAGE_IP, 0))
        s.setblocking(False)
        while not stop.is_set():
            node = rng.choice(nodes)
            rtp_port = rng.randrange(node.rtp[0], node.rtp[1] + 1)
            port = node.port if rng.random() < 0.5 else rtp_port
            data = (
                fuzz.mutate(rng, rng.choice(seeds), seeds)
                if rng.random() < 0.8
                else rng.randbytes(rng.randrange(1, 1400))
            )
            with contextlib.suppress(OSError):
                s.sendto(data, ("127.0.0.1", port))
                sent += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1 / rate)
    return sent


async def _flood(sipp: str, node: Node, workdir: Path, rate: int, seconds: float) -> None:
    proc = await asyncio.create_subprocess_exec(
        sipp, f"127.0.0.1:{node.port}", "-sf", str(FLOOD_SCENARIO), "-i", FLOOD_IP,
        "-p", str(_free_port()), "-m", str(int(rate * seconds)), "-r", str(rate),
        "-l", str(int(rate * seconds)), "-timeout", f"{int(seconds + 30)}s", "-nostdin",
        cwd=workdir, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    await proc.wait()


def _sipp_failures(stat_csv: Path) -> tuple[dict[str, int], dict[str, int]]:
    """sipp's cumulative counters from the last row of its `-trace_stat` file:
    (totals, failures by reason)."""
    rows = [ln.split(";") for ln in stat_csv.read_text().splitlines() if ln.strip()]
    header, last = rows[0], rows[-1]
    values = dict(zip(header, last, strict=False))

    def num(key: str) -> int:
        try:
            return int(values.get(key, "0") or 0)
        except ValueError:
            return 0

    totals = {
        "attempted": num("TotalCallCreated"),
        "completed": num("SuccessfulCall(C)"),
        "failed": num("FailedCall(C)"),
    }
    failures = {
        k[len("Failed") : -3]: num(k)
        for k in header
        if k.startswith("Failed") and k.endswith("(C)") and k != "FailedCall(C)" and num(k)
    }
    return totals, failures


def _records(nodes: list[Node]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for node in nodes:
        db = node.workdir / f"{node.name}.sqlite"
        with contextlib.closing(sqlite3.connect(db)) as conn:
            conn.row_factory = sqlite3.Row
            for row in conn.execute("SELECT * FROM calls"):
                out[row["call_id"]] = {**dict(row), "node_name": node.name}
    return out


def _spool_next_seq(node: Node) -> int:
    cursor = json.loads((node.workdir / f"{node.name}-spool" / "cursor.json").read_text())
    return int(cursor["next_seq"])


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    sipp = find_sipp()
    work = args.out / "soak"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    write_tone(work / TONE_NAME)
    duration = 60 * args.minutes
    max_calls = int(args.rate * args.hold * 2) + 20
    broker = Mosquitto(work)
    broker.start()
    nodes = [
        Node("soak-a", _free_port(), (46000, 46999), work),
        Node("soak-b", _free_port(), (47000, 47999), work),
    ]
    for node in nodes:
        (work / f"{node.name}.toml").write_text(NODE_CONFIG.format(
            name=node.name, port=node.port, max_calls=max_calls,
            rtp=f"{node.rtp[0]}-{node.rtp[1]}", mqtt_port=broker.port,
        ))  # fmt: skip
        node.start()
    events = Events()
    stop = asyncio.Event()
    ready = asyncio.Event()
    marks: list[tuple[float, str]] = []
    sipps: list[asyncio.subprocess.Process] = []
    t0 = time.monotonic()
    subscriber = asyncio.create_task(_subscribe(broker.port, events, ready))
    try:
        for node in nodes:
            await _wait_ready(node)
        await asyncio.wait_for(ready.wait(), 10)
        async with Kamailio(work, _free_port(), [n.port for n in nodes], ping_interval_s=1) as kam:
            garbage = asyncio.create_task(_garbage(nodes, 50.0, stop))
            total_calls = int(args.rate * max(duration - args.hold - 5, 1))
            caller = await asyncio.create_subprocess_exec(
                sipp, f"127.0.0.1:{kam.port}", "-sf", str(CALL_SCENARIO),
                "-i", "127.0.0.1", "-p", str(_free_port()), "-mi", "127.0.0.1",
                "-mp", "36000", "-m", str(total_calls), "-r", str(args.rate),
                "-l", str(max_calls), "-d", str(int(args.hold * 1000)),
                "-trace_stat", "-stf", str(work / "stat.csv"), "-fd", "2",
                "-trace_logs", "-log_file", str(work / "completed.log"),
                "-timeout", f"{int(duration + 120)}s", "-nostdin",
                cwd=work, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            sipps.append(caller)
            flood_at = args.flood_every
            floods: list[asyncio.Task[None]] = []
            kill_at = duration / 2
            killed = False
            while caller.returncode is None:
                now = time.monotonic() - t0
                for node in nodes:
                    rss = node.rss_mb()
                    node.rss.append((now, rss))
                    node.peak_rss_mb = max(node.peak_rss_mb, rss)
                if now >= flood_at:
                    marks.append((now, "flood"))
                    floods.append(asyncio.create_task(_flood(sipp, nodes[0], work, 300, 5.0)))
                    flood_at += args.flood_every
                if not killed and now >= kill_at:
                    marks.append((now, "kill B"))
                    nodes[1].kill()
                    killed = True
                    await asyncio.sleep(5.0)
                    nodes[1].start()
                    await _wait_ready(nodes[1])
                    marks.append((time.monotonic() - t0, "B back"))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(caller.wait(), SAMPLE_S)
            stop.set()
            garbage_sent = await garbage
            await asyncio.gather(*floods)
        for node in nodes:
            node.stop()
        # the nodes flushed their spools on the way out; give the broker a moment
        await asyncio.sleep(2.0)
    finally:
        stop.set()
        for proc in sipps:  # none outlives the run, whatever happened
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        subscriber.cancel()
        with contextlib.suppress(BaseException):
            await subscriber
        for node in nodes:
            node.stop(timeout=5)
        broker.stop()
    return _summary(args, work, nodes, events, marks, t0, garbage_sent)


def _summary(
    args: argparse.Namespace,
    work: Path,
    nodes: list[Node],
    events: Events,
    marks: list[tuple[float, str]],
    t0: float,
    garbage_sent: int,
) -> dict[str, Any]:
    totals, failures = _sipp_failures(work / "stat.csv")
    completed_ids = {
        ln.split("completed ", 1)[1].strip()
        for ln in (work / "completed.log").read_text(errors="replace").splitlines()
        if "completed " in ln
    }
    records = _records(nodes)
    cdrs_lost = sorted(c for c in completed_ids if records.get(c, {}).get("outcome") != "answered")
    outcomes: dict[str, int] = {}
    for rec in records.values():
        outcomes[rec["outcome"] or "?"] = outcomes.get(rec["outcome"] or "?", 0) + 1
    seq_gaps = {}
    for node in nodes:
        expected = set(range(1, _spool_next_seq(node)))
        seq_gaps[node.name] = len(expected - events.seqs.get(node.name, set()))
    # every call sipp completed, and every call record (interrupted ones included: their
    # `ended` comes when the killed node starts again), has its `started` and `ended`
    missing_events = sorted(
        c
        for c in completed_ids | set(records)
        if not {"started", "ended"} <= events.by_call.get(c, set())
    )
    answered = [r for r in records.values() if r["outcome"] == "answered"]
    sent = sum(r["packets_out"] or 0 for r in answered)
    late = sum(r["late_frames"] or 0 for r in answered)
    result: dict[str, Any] = {
        "bench": "soak",
        "minutes": args.minutes,
        "rate_cps": args.rate,
        "hold_s": args.hold,
        "calls": {**totals, "failed_by_reason": failures},
        "records": {"total": len(records), "by_outcome": outcomes},
        "cdrs_lost": len(cdrs_lost),
        "cdrs_lost_ids": cdrs_lost[:10],
        "events": {
            "received": sum(len(s) for s in events.seqs.values()),
            "duplicates": events.duplicates,
            "seq_gaps": seq_gaps,
            "calls_missing_started_or_ended": len(missing_events),
            "calls_missing_ids": missing_events[:10],
        },
        "events_lost": sum(seq_gaps.values()) + len(missing_events),
        "frames_late_or_missing_pct": round(100 * late / sent, 4) if sent else None,
        "frames_sent": sent,
        "peak_rss_mb": {n.name: round(n.peak_rss_mb, 1) for n in nodes},
        "node_starts": {n.name: n.starts for n in nodes},
        "garbage_datagrams": garbage_sent,
        "marks": [(round(t, 1), what) for t, what in marks],
        "load_avg_end": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }
    result["ok"] = result["cdrs_lost"] == 0 and result["events_lost"] == 0
    _plot(args.out / "soak.png", nodes, events, marks, t0, result)
    return result


def _plot(
    path: Path,
    nodes: list[Node],
    events: Events,
    marks: list[tuple[float, str]],
    t0: float,
    result: dict[str, Any],
) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    up, t, level = 0, [], []
    for at, ev in sorted(events.timeline):
        up += 1 if ev == "started" else -1 if ev == "ended" else 0
        t.append(at - t0)
        level.append(up)
    top.step(t, level, where="post", lw=1)
    top.set_ylabel("calls up (started - ended events)")
    for node in nodes:
        bottom.plot([x for x, _ in node.rss], [y for _, y in node.rss], label=node.name, lw=1)
    bottom.set_ylabel("RSS MB")
    bottom.set_xlabel("s")
    bottom.legend(fontsize=8)
    for ax in (top, bottom):
        for at, what in marks:
            ax.axvline(at, color="red" if "kill" in what else "grey", lw=0.8, ls=":")
    top.set_title(
        f"soak {result['minutes']} min: {result['calls']['completed']}/"
        f"{result['calls']['attempted']} calls completed, CDRs lost {result['cdrs_lost']}, "
        f"events lost {result['events_lost']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=4.0, help="new calls per second")
    ap.add_argument("--hold", type=float, default=15.0, help="seconds each call streams")
    ap.add_argument("--flood-every", type=float, default=120.0, help="seconds between floods")
    ap.add_argument("--quick", action="store_true", help="2 minutes, 2 calls/s of 8 s")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = ap.parse_args(argv)
    if args.quick:
        args.minutes, args.rate, args.hold, args.flood_every = 2.0, 2.0, 8.0, 40.0
    result = asyncio.run(soak(args))
    text = json.dumps(result, indent=2)
    (args.out / "soak.json").write_text(text + "\n")
    print(text)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

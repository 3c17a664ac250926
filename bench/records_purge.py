"""Does purging old call records stall the media loop?

A call's records are written from the bridge's event loop, the loop that also paces every
call's audio in 20 ms ticks; a purge (``[records] keep_days``, at start and daily) deletes
many rows from the same SQLite file. This bench builds a store with ``--calls`` old calls
(turns and events like a real call's), then runs a stand-in for the media loop: a tick
every 20 ms on a fixed grid that writes one timeline event through the bridge's own
``CallRecords`` (far more often than live calls write) and measures how late each tick's
work is done. Three runs, each on a fresh copy of the store:

- ``idle``: no purge (the loop's own noise floor);
- ``purge``: the bridge's purge (``records_retention.purge`` in a thread, 25 calls per
  transaction) of every old call, while the loop ticks;
- ``one_transaction``: the naive way for comparison, one big DELETE on the loop.

    .venv/bin/python bench/records_purge.py [--calls 20000] [--out bench/out]

Prints and writes OUT/records_purge.json: per run, how late each tick's work was done
(p50/p99/max ms, its own record write included), the loop's record writes (count, slowest
ms, failed), and the purge's duration, batches and longest lock. Timings on a shared
machine are noisy: compare runs of one invocation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from sip_bridge.ops.records import CallRecords  # noqa: E402
from sip_bridge.ops.records_retention import DAY_S, purge  # noqa: E402

TICK_S = 0.020
TURNS, EVENTS = 8, 12  # per old call
SAY = "I would like to know where my order is, it was supposed to arrive on Monday " * 2


def build(path: Path, calls: int) -> None:
    """A store of ``calls`` calls started 100 days ago, in one transaction."""
    CallRecords(path).close()  # the schema, as the bridge makes it
    db = sqlite3.connect(path)
    old = time.time() - 100 * DAY_S
    with db:
        db.executemany(
            "INSERT INTO calls (call_id, node, caller, callee, started_at, answered_at, "
            "ended_at, duration_s, outcome) VALUES (?, 'n1', ?, 'sip:support@acme', ?, ?, ?, "
            "60, 'answered')",
            ((f"old-{i}", f"sip:+4420794{i:06d}@carrier", old + i, old + i + 1, old + i + 61)
             for i in range(calls)),
        )  # fmt: skip
        db.executemany(
            "INSERT INTO turns (call_id, idx, at, caller_text, agent_text, timings) "
            "VALUES (?, ?, ?, ?, ?, '{\"asr_tail\": 41.0}')",
            ((f"old-{i}", k, old + i + k, SAY, SAY) for i in range(calls) for k in range(TURNS)),
        )  # fmt: skip
        db.executemany(
            "INSERT INTO events (call_id, at, kind, data) VALUES (?, ?, 'dtmf', "
            "'{\"digit\": \"5\"}')",
            ((f"old-{i}", old + i + k) for i in range(calls) for k in range(EVENTS)),
        )  # fmt: skip
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


async def ticking(store: CallRecords, stop: asyncio.Event) -> list[float]:
    """Tick every 20 ms on a grid until ``stop``; each tick writes an event. Per tick, how
    long after its grid time its work was done (s): what a call's audio would wait."""
    loop = asyncio.get_running_loop()
    late: list[float] = []
    store.call_started("live-1", node="n1", caller="sip:alice@example.com")
    due = loop.time() + TICK_S
    while not stop.is_set():
        await asyncio.sleep(max(0.0, due - loop.time()))
        store.event("live-1", "tick", {"n": len(late)})
        late.append(loop.time() - due)
        due += TICK_S
        while due < loop.time():  # a stall: the grid goes on, the missed ticks count once
            due += TICK_S
    return late


def _ms(xs: list[float] | np.ndarray) -> dict[str, float]:
    a = np.asarray(xs, dtype=np.float64) * 1000
    if a.size == 0:
        return {}
    stats = (("p50", np.percentile(a, 50)), ("p99", np.percentile(a, 99)), ("max", a.max()))
    return {k: round(float(v), 2) for k, v in stats}


async def run(path: Path, how: str, idle_s: float) -> dict[str, Any]:
    store = CallRecords(path)
    stop = asyncio.Event()
    ticks = asyncio.ensure_future(ticking(store, stop))
    await asyncio.sleep(0.5)
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    cutoff = time.time() - 90 * DAY_S
    if how == "purge":
        done = await asyncio.to_thread(purge, path, before=cutoff)
        out.update(calls=done.calls, batches=done.batches,
                   longest_lock_ms=round(done.longest_batch_ms, 2))  # fmt: skip
    elif how == "one_transaction":
        await asyncio.sleep(0)
        db = sqlite3.connect(path, timeout=30, isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        old = "SELECT call_id FROM calls WHERE started_at < ?"
        for table in ("turns", "events"):
            db.execute(f"DELETE FROM {table} WHERE call_id IN ({old})", (cutoff,))
        n = db.execute("DELETE FROM calls WHERE started_at < ?", (cutoff,)).rowcount
        db.execute("COMMIT")
        db.close()
        out.update(calls=n)
    else:
        await asyncio.sleep(idle_s)
    out["purge_s"] = round(time.perf_counter() - t0, 2)
    await asyncio.sleep(0.5)
    stop.set()
    late = await ticks
    writes = store.write_times_s
    store.close()
    return {
        **out,
        "ticks": len(late),
        "tick_done_late_ms": _ms(late),
        "record_writes": {
            "count": len(writes),
            "slowest_ms": _ms(writes).get("max", 0.0),
            "failed": store.errors,
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = p.parse_args()
    result: dict[str, Any] = {"calls": args.calls, "turns_per_call": TURNS,
                              "events_per_call": EVENTS}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        master = Path(tmp) / "master.sqlite"
        t0 = time.perf_counter()
        build(master, args.calls)
        result["build_s"] = round(time.perf_counter() - t0, 1)
        result["db_mb"] = round(master.stat().st_size / 1e6, 1)
        for how in ("idle", "purge", "one_transaction"):
            copy = Path(tmp) / f"{how}.sqlite"
            shutil.copy(master, copy)
            idle_s = result.get("purge", {}).get("purge_s", 5.0)
            result[how] = asyncio.run(run(copy, how, idle_s))
            print(how, json.dumps(result[how]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "records_purge.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

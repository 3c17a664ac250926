"""How long callers' data is kept, and what a data-subject request takes out.

- :func:`purge` deletes calls (their row, turns and events) and their recordings: those
  started before a time (``[records] keep_days``, ``sip-bridge calls purge --before``), or
  one caller's (``--caller``). It works in small transactions on a connection of its own,
  so it can run in a thread beside a live bridge: each batch holds the database's write
  lock for milliseconds, which is all a call's record write may wait (the store's busy
  timeout is 100 ms), and the write-ahead log is checkpointed as it goes so that no commit
  of the bridge's has to. Deleted pages are overwritten (``secure_delete``), and the log is
  truncated at the end, so what was purged is not left in free space either.
- :func:`purge_daily` is the bridge's task: at start, then every day.
- :func:`export_caller` is one caller's rows as JSON (``sip-bridge calls export``).

Callers are matched on their number (:func:`caller_key`): the user part of the From URI,
without spaces, dashes, dots or brackets, and without a leading ``+`` or ``00``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sip_bridge.ops.records import CallRecords, RecordsError

if TYPE_CHECKING:
    from sip_bridge.config.config_types import RecordsConfig

__all__ = ["DAY_S", "Purged", "caller_key", "export_caller", "purge", "purge_daily"]

log = logging.getLogger(__name__)

DAY_S = 86400.0
BATCH = 25  # calls per transaction: ~5 ms of lock (bench/records_purge.py)
PAUSE_S = 0.005  # between two transactions: the bridge's own writes go in there


def caller_key(value: str | None) -> str:
    """The number (or user) a caller is known by: ``"Ann" <sip:+44 20-7946@host;x=y>`` and
    ``0044207946`` are both ``44207946``."""
    v = (value or "").strip()
    bracketed = re.search(r"<([^>]*)>", v)
    if bracketed:
        v = bracketed.group(1)
    for scheme in ("sips:", "sip:", "tel:"):
        if v.lower().startswith(scheme):
            v = v[len(scheme) :]
            break
    v = re.sub(r"[\s\-.()/]", "", v.split("@", 1)[0].split(";", 1)[0]).lower()
    return v[1:] if v.startswith("+") else v[2:] if v.startswith("00") else v


@dataclass
class Purged:
    """What a purge removed (or, dry, would remove)."""

    calls: int = 0
    turns: int = 0
    events: int = 0
    recordings: int = 0
    batches: int = 0
    longest_batch_ms: float = 0.0  # the longest the database's write lock was held

    def __str__(self) -> str:
        return (f"{self.calls} call(s) ({self.turns} turn(s), {self.events} event(s)) and "
                f"{self.recordings} recording(s)")  # fmt: skip


def _open(db: Path) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(db, timeout=5.0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA secure_delete = ON")  # freed pages are zeroed, not left behind
        has = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'calls'").fetchone()
    except sqlite3.Error as exc:
        raise RecordsError(f"cannot open call records {db}: {exc}") from exc
    if has is None:
        conn.close()
        raise RecordsError(f"{db} holds no call records")
    return conn


def _chunks(ids: list[str], n: int) -> Iterator[list[str]]:
    for i in range(0, len(ids), n):
        yield ids[i : i + n]


def _matching(conn: sqlite3.Connection, caller: str, before: float | None) -> list[str]:
    """Call ids of one caller (started before ``before``)."""
    want = caller_key(caller)
    sql = "SELECT call_id, caller FROM calls"
    rows = conn.execute(sql + (" WHERE started_at < ?" if before is not None else ""),
                        () if before is None else (before,))  # fmt: skip
    return [r[0] for r in rows if want and caller_key(r[1]) == want]


def purge(
    db: Path | None,
    *,
    before: float | None = None,
    caller: str | None = None,
    recordings_dir: str = "",
    dry_run: bool = False,
    batch: int = BATCH,
    pause_s: float = PAUSE_S,
    stop: threading.Event | None = None,
) -> Purged:
    """Delete the calls started before ``before`` and/or of ``caller``, with their turns,
    events and recording files; with ``recordings_dir`` and ``before``, also the WAV files
    there last written before it (recordings whose record is gone). ``stop`` set: it stops
    after the batch in hand. RecordsError when the database cannot be used."""
    if before is None and caller is None:
        raise ValueError("purge what? give before, caller or both")
    if caller is not None and not caller_key(caller):
        raise ValueError(f"no number in caller {caller!r}")
    done = Purged()
    gone: set[Path] = set()  # recordings counted with their calls
    if db is not None and db.is_file():
        conn = _open(db)
        try:
            _purge_calls(conn, done, gone, before, caller, dry_run, batch, pause_s, stop)
        except sqlite3.Error as exc:
            raise RecordsError(f"purge of {db} stopped: {exc}") from exc
        finally:
            conn.close()
    if recordings_dir and before is not None and caller is None:
        done.recordings += _sweep(Path(recordings_dir), before, dry_run, gone)
    return done


def _purge_calls(conn: sqlite3.Connection, done: Purged, gone: set[Path], before: float | None,
                 caller: str | None, dry_run: bool, batch: int, pause_s: float,
                 stop: threading.Event | None) -> None:  # fmt: skip
    ids = _matching(conn, caller, before) if caller is not None else None
    chunks = _chunks(ids, batch) if ids is not None else None
    while stop is None or not stop.is_set():
        if chunks is not None:
            chunk = next(chunks, None)
        elif dry_run:  # nothing is deleted: page through instead
            offset = done.calls
            chunk = [r[0] for r in conn.execute(
                "SELECT call_id FROM calls WHERE started_at < ? ORDER BY started_at, call_id "
                "LIMIT ? OFFSET ?", (before, batch, offset))]  # fmt: skip
        else:
            sql = "SELECT call_id FROM calls WHERE started_at < ? LIMIT ?"
            chunk = [r[0] for r in conn.execute(sql, (before, batch))]
        if not chunk:
            break
        done.calls += len(chunk) if dry_run else 0
        _one_batch(conn, chunk, done, gone, dry_run)
        time.sleep(pause_s)
    if done.batches and not dry_run:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # busy readers: it does what it can


def _one_batch(
    conn: sqlite3.Connection, ids: list[str], done: Purged, gone: set[Path], dry_run: bool
) -> None:
    marks = ", ".join("?" * len(ids))
    t0 = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    try:
        paths = [
            _recording_path(r[0])
            for r in conn.execute(
                f"SELECT data FROM events WHERE kind = 'recording' AND call_id IN ({marks})", ids
            )
        ]
        if dry_run:
            for table in ("turns", "events"):
                sql = f"SELECT count(*) FROM {table} WHERE call_id IN ({marks})"
                setattr(done, table, getattr(done, table) + conn.execute(sql, ids).fetchone()[0])
            conn.execute("ROLLBACK")
        else:
            for table in ("turns", "events", "calls"):
                n = conn.execute(f"DELETE FROM {table} WHERE call_id IN ({marks})", ids).rowcount
                setattr(done, table, getattr(done, table) + n)
            conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    done.batches += 1
    done.longest_batch_ms = max(done.longest_batch_ms, 1000 * (time.perf_counter() - t0))
    if not dry_run:
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")  # here, not in a bridge's commit
    for path in paths:
        if path is not None and path.suffix == ".wav" and path.is_file():
            done.recordings += 1
            gone.add(path.resolve())
            if not dry_run:
                _unlink(path)


def _recording_path(data: str | None) -> Path | None:
    try:
        path = json.loads(data or "").get("path")
    except (ValueError, AttributeError):
        return None
    return Path(path) if isinstance(path, str) and path else None


def _unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.error("retention: cannot delete recording %s: %s", path, exc)


def _sweep(folder: Path, before: float, dry_run: bool, gone: set[Path]) -> int:
    """WAV files in ``folder`` last written before ``before`` (not counted in ``gone``)."""
    n = 0
    for f in folder.glob("*.wav") if folder.is_dir() else ():
        if f.resolve() in gone:
            continue
        try:
            old = f.is_file() and f.stat().st_mtime < before
        except OSError:
            continue
        if old:
            n += 1
            if not dry_run:
                _unlink(f)
    return n


async def purge_daily(records: Callable[[], RecordsConfig], db: Path | None,
                      every_s: float = DAY_S) -> None:  # fmt: skip
    """The bridge's retention task: purge what is older than ``keep_days`` (read anew each
    time: a reload may change it) now, then every ``every_s``, in a thread."""
    while True:
        cfg = records()
        if cfg.keep_days > 0:
            cutoff = time.time() - cfg.keep_days * DAY_S
            stop = threading.Event()
            try:
                done = await asyncio.to_thread(
                    purge, db, before=cutoff, recordings_dir=cfg.recordings_dir, stop=stop
                )
            except asyncio.CancelledError:
                stop.set()  # the bridge stops: the thread ends after its batch
                raise
            except (RecordsError, OSError) as exc:
                log.error("retention: %s", exc)
            else:
                if done.calls or done.recordings:
                    log.warning("retention: purged %s older than %d days (longest lock %.1f ms)",
                                done, cfg.keep_days, done.longest_batch_ms)  # fmt: skip
        await asyncio.sleep(every_s)


def export_caller(store: CallRecords, caller: str) -> dict[str, Any]:
    """Everything the records hold of one caller: each call as ``calls show`` has it, and
    the recordings' files."""
    want = caller_key(caller)
    if not want:
        raise ValueError(f"no number in caller {caller!r}")
    calls = [c for c in (store.show(i) for i in store.call_ids(lambda c: caller_key(c) == want))
             if c is not None]  # fmt: skip
    recordings = [
        e["data"]["path"] for c in calls for e in c["events"]
        if e["kind"] == "recording" and isinstance(e["data"], dict) and "path" in e["data"]
    ]  # fmt: skip
    return {
        "caller": caller,
        "matched_on": want,
        "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "records": str(store.path),
        "calls": calls,
        "recordings": [{"path": p, "exists": Path(p).is_file()} for p in recordings],
    }

# size: the call-records database in one owner: schema, writer, queries, redaction on read and
#       retention
"""Call records (CDRs) in SQLite, so an operator can see every call after a crash.

One row per call in ``calls``, its dialogue turns in ``turns`` and a timeline of notable
events in ``events``. The database runs in WAL mode with ``synchronous=NORMAL``: every write
is its own small autocommitted transaction, so a call recorded before a ``kill -9`` is
there afterwards (WAL + NORMAL is durable against a process crash; only a power loss can
drop the last commits), and readers (``sip-bridge calls list``) never block the bridge.

Writes never raise: a full disk, a locked or read-only database is logged and counted in
``CallRecords.errors`` and the call goes on. Opening the store (at start-up) raises
:class:`RecordsError` with a one-line message instead, so the bridge can say what is wrong.

Wiring into ``server.py`` (timestamps: pass wall-clock ``time.time()``, the default, never
``loop.time()``):

- ``CallOffered`` (``_offered``): ``call_started(call_id, node=..., trunk=ev.trunk,
  caller=ev.from_uri, callee=ev.request_uri, remote=f"{host}:{port}" of ev.source)``.
- ``CallEstablished`` once the media runs (``_established``): ``call_answered(call_id,
  codec=neg.codec, agent=config.agent.name, remote=...)``; ``setup_ms`` defaults to
  answered - started.
- ``ua.reject`` (503, ports exhausted, admission...): ``call_ended(call_id,
  outcome="rejected", end_reason="503 ...")``.
- ``CallEnded`` (``_teardown``): ``call_ended(call_id, outcome=..., end_reason=ev.reason,
  media=call.media.stats)``: ``answered`` when it had media, ``cancelled`` when the caller
  gave up before the answer (``ev.by == "remote"``), else ``failed``; left out, it is
  ``answered`` when ``call_answered`` was recorded and ``failed`` otherwise.
- The agent's turn results (transcript + reply + stage timings): ``turn(call_id,
  caller_text=..., agent_text=..., timings={"end_of_turn_ms": ..., ...})``.
- Anything worth a line in the timeline: ``event(call_id, kind, {...})``, e.g. DTMF
  (``"dtmf"``), transfers (``"transfer"``, ``TransferProgress``), re-INVITEs
  (``"media_updated"``), barge-in, agent hang-up, the call length limit.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sip_bridge.media.media_params import MediaStats

log = logging.getLogger(__name__)

# Columns added since are nullable and added to an older store when a bridge opens it
# (an older bridge reads its own columns by name and ignores them): no new version.
SCHEMA_VERSION = 1
OUTCOMES = ("answered", "rejected", "cancelled", "failed", "interrupted")
# "interrupted": in progress when the bridge died (kill -9, a crash); set at its next start
# the caller's longest wait in silence and all of them (agent.dead_air); NULL: not measured
DEAD_AIR_FIELDS = ("dead_air_max_ms", "dead_air_total_ms")
STAT_FIELDS = ("packets_in", "packets_out", "jitter_ms", "loss_pct", "jb_delay_ms", "late_frames")
CALL_FIELDS = (
    "call_id",
    "node",
    "trunk",
    "caller",
    "callee",
    "agent",
    "profile",
    "started_at",
    "answered_at",
    "ended_at",
    "duration_s",
    "outcome",
    "end_reason",
    "codec",
    "remote",
    *STAT_FIELDS,
    "setup_ms",
    *DEAD_AIR_FIELDS,
)
MAX_CALL_ID = 256  # longer ids are refused: nothing real sends them, and they bloat the table
_BUSY_TIMEOUT_S = 0.1  # a locked database costs a write at most this long on the event loop

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS calls (
    call_id TEXT PRIMARY KEY,
    node TEXT, trunk TEXT, caller TEXT, callee TEXT, agent TEXT,
    started_at REAL NOT NULL, answered_at REAL, ended_at REAL, duration_s REAL,
    outcome TEXT, end_reason TEXT, codec TEXT, remote TEXT,
    packets_in INTEGER, packets_out INTEGER, jitter_ms REAL, loss_pct REAL,
    jb_delay_ms REAL, late_frames INTEGER, setup_ms REAL,
    dead_air_max_ms REAL, dead_air_total_ms REAL, profile TEXT
);
CREATE INDEX IF NOT EXISTS calls_started ON calls (started_at);
CREATE TABLE IF NOT EXISTS turns (
    call_id TEXT NOT NULL, idx INTEGER NOT NULL, at REAL NOT NULL,
    caller_text TEXT, agent_text TEXT, timings TEXT,
    PRIMARY KEY (call_id, idx)
);
CREATE TABLE IF NOT EXISTS events (
    call_id TEXT NOT NULL, at REAL NOT NULL, kind TEXT NOT NULL, data TEXT
);
CREATE INDEX IF NOT EXISTS events_call ON events (call_id, at);
"""


Row = dict[str, Any]
Rows = list[Row]  # an alias: inside CallRecords, ``list`` names the method
CallIds = list[str]

_ENDED_SQL = f"""INSERT INTO calls (call_id, started_at, ended_at, duration_s, outcome,
        end_reason, remote, {", ".join(STAT_FIELDS)}, {", ".join(DEAD_AIR_FIELDS)})
    VALUES (?, ?, ?, 0, coalesce(?, 'failed'), ?, ?, {", ".join("?" * len(STAT_FIELDS))},
        ?, ?)
    ON CONFLICT (call_id) DO UPDATE SET
        ended_at = excluded.ended_at,
        duration_s = CASE WHEN answered_at IS NULL THEN 0
            ELSE round(max(excluded.ended_at - answered_at, 0), 3) END,
        outcome = coalesce(?, CASE WHEN answered_at IS NULL THEN 'failed' ELSE 'answered' END),
        end_reason = excluded.end_reason,
        remote = coalesce(excluded.remote, remote),
        {", ".join(f"{k} = coalesce(excluded.{k}, {k})" for k in STAT_FIELDS + DEAD_AIR_FIELDS)}"""


class RecordsError(Exception):
    """The store cannot be opened or read; the message is one line for the operator."""


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def valid_call_id(call_id: object) -> bool:
    """A Call-ID we store: a non-empty printable string of sane length."""
    return (
        isinstance(call_id, str)
        and 0 < len(call_id) <= MAX_CALL_ID
        and call_id.isprintable()
        and not call_id.isspace()
    )


def media_summary(stats: MediaStats) -> dict[str, float | int]:
    """The columns a call record keeps from a call's :class:`MediaStats` at hang-up."""
    jb = stats.jitter
    expected = jb.received + jb.lost
    return {
        "packets_in": stats.packets_in,
        "packets_out": stats.packets_out,
        "jitter_ms": round(jb.jitter_ms, 3),
        "loss_pct": round(100.0 * jb.lost / expected, 3) if expected else 0.0,
        "jb_delay_ms": round(jb.current_delay_ms, 3),
        "late_frames": jb.late,
    }


def _json(data: Any) -> str:
    return json.dumps(data, default=str, separators=(",", ":"))


def _loads(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _finite(x: float | None) -> float | None:
    return x if x is None or math.isfinite(x) else None


class CallRecords:
    """The call-record store; one per process, used from the event loop's thread."""

    def __init__(
        self,
        path: str | Path,
        *,
        readonly: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self.clock = clock
        self.errors = 0  # failed writes (logged), for status and tests
        self.last_error: str | None = None
        self.write_times_s: list[float] = []  # the last writes' durations (bounded)
        self._lock = threading.Lock()
        self._db = self._open()

    # -- opening ----------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        try:
            if self.readonly:
                return self._open_readonly()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # a patient open: another bridge process may be creating the schema right now
            db = sqlite3.connect(
                self.path, timeout=5.0, isolation_level=None, check_same_thread=False
            )
        except (sqlite3.Error, OSError) as exc:
            raise RecordsError(f"cannot open call records {self.path}: {_one_line(exc)}") from exc
        try:
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(f"journal_mode is {mode}, not wal")
            db.execute("PRAGMA synchronous=NORMAL")
            self._check_version(db, create=True)
            db.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")
        except (sqlite3.Error, RecordsError) as exc:
            db.close()
            if isinstance(exc, RecordsError):
                raise
            raise RecordsError(f"cannot open call records {self.path}: {_one_line(exc)}") from exc
        return db

    def _open_readonly(self) -> sqlite3.Connection:
        if not self.path.is_file():
            raise RecordsError(f"no call records at {self.path}")
        uri = f"{self.path.resolve().as_uri()}?mode=ro"
        try:
            return self._connect_ro(uri)
        except sqlite3.OperationalError as exc:
            # A WAL database in a place we cannot write (a copy, another user's file): with
            # no -wal file left over, everything is in the main file and may be read as is.
            wal = Path(f"{self.path}-wal")
            if "readonly" not in str(exc) or (wal.exists() and wal.stat().st_size > 0):
                raise RecordsError(f"cannot read {self.path}: {_one_line(exc)}") from exc
        except sqlite3.Error as exc:
            raise RecordsError(f"cannot read {self.path}: {_one_line(exc)}") from exc
        try:
            return self._connect_ro(f"{uri}&immutable=1")
        except sqlite3.Error as exc:
            raise RecordsError(f"cannot read {self.path}: {_one_line(exc)}") from exc

    def _connect_ro(self, uri: str) -> sqlite3.Connection:
        db = sqlite3.connect(uri, uri=True, timeout=1.0, check_same_thread=False)
        try:
            self._check_version(db, create=False)
        except BaseException:
            db.close()
            raise
        return db

    def _check_version(self, db: sqlite3.Connection, *, create: bool) -> None:
        has_meta = db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
        ).fetchone()
        if has_meta is None:
            if not create:
                raise RecordsError(f"{self.path} holds no call records (no schema)")
            db.executescript(_SCHEMA)  # an empty file, or a fresh one
            db.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = int(row[0]) if row is not None and str(row[0]).isdigit() else None
        if version is None:
            raise RecordsError(f"{self.path} holds no call-record schema version")
        if version > SCHEMA_VERSION:
            raise RecordsError(
                f"{self.path} has call-record schema {version}; this sip-bridge knows "
                f"{SCHEMA_VERSION} (upgrade sip-bridge)"
            )
        if create:  # a store an older bridge made: add the columns it lacks
            _add_columns(db)
        cols = {r[1] for r in db.execute("PRAGMA table_info(calls)")}
        # read-only on an older store: the columns it lacks read as NULL
        self._fields = ", ".join(f if f in cols else f"NULL AS {f}" for f in CALL_FIELDS)

    @property
    def schema_version(self) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0])

    @property
    def journal_mode(self) -> str:
        return str(self._db.execute("PRAGMA journal_mode").fetchone()[0]).lower()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- writes (never raise) --------------------------------------------------------------

    def _write(self, what: str, call_id: str, sql: str, params: tuple[Any, ...]) -> bool:
        if not valid_call_id(call_id):
            return self._failed(what, call_id, "malformed call id")
        t0 = time.perf_counter()
        try:
            with self._lock:
                self._db.execute(sql, params)
        except (sqlite3.Error, ValueError, OverflowError) as exc:
            return self._failed(what, call_id, _one_line(exc))
        finally:
            times = self.write_times_s
            times.append(time.perf_counter() - t0)
            if len(times) > 4096:
                del times[:2048]
        return True

    def _failed(self, what: str, call_id: object, why: str) -> bool:
        self.errors += 1
        self.last_error = f"{what} {call_id!r}: {why}"
        log.error("call records %s: %s", self.path, self.last_error)
        return False

    def call_started(
        self,
        call_id: str,
        *,
        caller: str | None = None,
        callee: str | None = None,
        trunk: str | None = None,
        node: str | None = None,
        agent: str | None = None,
        remote: str | None = None,
        at: float | None = None,
    ) -> bool:
        """An INVITE was offered: the call's row exists from now on (True when written)."""
        sql = """INSERT INTO calls (call_id, node, trunk, caller, callee, agent, remote,
                     started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                 ON CONFLICT (call_id) DO UPDATE SET
                     node = coalesce(excluded.node, node),
                     trunk = coalesce(excluded.trunk, trunk),
                     caller = coalesce(excluded.caller, caller),
                     callee = coalesce(excluded.callee, callee),
                     agent = coalesce(excluded.agent, agent),
                     remote = coalesce(excluded.remote, remote)"""
        now = self.clock() if at is None else at
        params = (call_id, node, trunk, caller, callee, agent, remote, now)
        return self._write("call_started", call_id, sql, params)

    def call_answered(
        self,
        call_id: str,
        *,
        codec: str | None = None,
        agent: str | None = None,
        remote: str | None = None,
        setup_ms: float | None = None,
        at: float | None = None,
        profile: str | None = None,
    ) -> bool:
        """The call was answered and its media runs; ``setup_ms`` defaults to answer - start;
        ``profile``: the voice agent's profile that answered (its name)."""
        now = self.clock() if at is None else at
        sql = """INSERT INTO calls (call_id, started_at, answered_at, codec, agent, remote,
                     setup_ms, profile) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                 ON CONFLICT (call_id) DO UPDATE SET
                     answered_at = excluded.answered_at,
                     codec = coalesce(excluded.codec, codec),
                     agent = coalesce(excluded.agent, agent),
                     profile = coalesce(excluded.profile, profile),
                     remote = coalesce(excluded.remote, remote),
                     setup_ms = coalesce(excluded.setup_ms,
                                         round((excluded.answered_at - started_at) * 1000, 3))"""
        params = (call_id, now, now, codec, agent, remote, _finite(setup_ms), profile or None)
        return self._write("call_answered", call_id, sql, params)

    def turn(
        self,
        call_id: str,
        *,
        caller_text: str | None = None,
        agent_text: str | None = None,
        timings: Mapping[str, Any] | None = None,
        at: float | None = None,
    ) -> bool:
        """One dialogue turn (what the caller said, what the agent answered, stage timings)."""
        now = self.clock() if at is None else at
        sql = """INSERT INTO turns (call_id, idx, at, caller_text, agent_text, timings)
                 SELECT ?, coalesce(max(idx) + 1, 0), ?, ?, ?, ?
                 FROM turns WHERE call_id = ?"""
        data = _json(dict(timings)) if timings is not None else None
        params = (call_id, now, caller_text, agent_text, data, call_id)
        return self._write("turn", call_id, sql, params)

    def event(
        self,
        call_id: str,
        kind: str,
        data: Mapping[str, Any] | None = None,
        *,
        at: float | None = None,
    ) -> bool:
        """A line in the call's timeline (DTMF, transfer, re-INVITE, barge-in...)."""
        now = self.clock() if at is None else at
        sql = "INSERT INTO events (call_id, at, kind, data) VALUES (?, ?, ?, ?)"
        params = (call_id, now, str(kind), _json(dict(data)) if data is not None else None)
        return self._write("event", call_id, sql, params)

    def mark_interrupted(self, node: str, reason: str = "the bridge stopped mid-call") -> Rows:
        """At start: calls of ``node`` that never ended were cut off when the bridge died;
        say so, and return their rows as now recorded (for their ``ended`` events). A store
        shared by several nodes leaves the others' calls."""
        try:
            with self._lock:
                ids = [
                    r[0]
                    for r in self._db.execute(
                        "SELECT call_id FROM calls WHERE ended_at IS NULL AND node IS ?", (node,)
                    )
                ]
                self._db.execute(
                    "UPDATE calls SET outcome = 'interrupted', end_reason = ?, ended_at = ? "
                    "WHERE ended_at IS NULL AND node IS ?",
                    (reason, self.clock(), node),
                )
        except sqlite3.Error as exc:
            self._failed("mark_interrupted", node, _one_line(exc))
            return []
        if not ids:
            return []
        marks = ", ".join("?" * len(ids))
        try:
            return self._rows(f"SELECT * FROM calls WHERE call_id IN ({marks})", tuple(ids))
        except RecordsError as exc:
            self._failed("mark_interrupted", node, str(exc))
            return []

    def call_ended(
        self,
        call_id: str,
        *,
        outcome: str | None = None,
        end_reason: str | None = None,
        media: MediaStats | None = None,
        stats: Mapping[str, float | int | None] | None = None,
        dead_air: tuple[float, float] | None = None,
        at: float | None = None,
    ) -> bool:
        """The call is over: outcome, reason, duration and the media's quality figures.

        ``media`` (a :class:`MediaStats`) or ``stats`` (columns of :data:`STAT_FIELDS`)
        give the quality figures; ``outcome`` defaults to answered/failed; ``dead_air``:
        (longest, total) silence the caller waited in, ms (None: not measured).
        """
        now = self.clock() if at is None else at
        if outcome is not None and outcome not in OUTCOMES:
            self._failed("call_ended", call_id, f"unknown outcome {outcome!r}, stored as failed")
            end_reason = f"{end_reason or ''} (outcome {outcome!r})".strip()
            outcome = "failed"
        figures: dict[str, Any] = dict.fromkeys(STAT_FIELDS)
        try:
            if media is not None:
                figures.update(media_summary(media))
            if stats is not None:
                figures.update({k: v for k, v in stats.items() if k in figures})
        except (AttributeError, TypeError, ZeroDivisionError) as exc:
            self._failed("call_ended", call_id, f"media stats unusable: {_one_line(exc)}")
        remote = None
        if media is not None and isinstance(getattr(media, "remote", None), tuple):
            remote = f"{media.remote[0]}:{media.remote[1]}"  # where the media really came from
        values = tuple(figures[k] for k in STAT_FIELDS)
        longest, total = (None, None) if dead_air is None else map(_finite, dead_air)
        params = (
            call_id, now, now, outcome, end_reason, remote, *values, longest, total, outcome
        )  # fmt: skip
        return self._write("call_ended", call_id, _ENDED_SQL, params)

    # -- reads -------------------------------------------------------------------------------

    def _rows(self, sql: str, params: tuple[Any, ...]) -> Rows:
        try:
            with self._lock:
                cur = self._db.execute(sql, params)
                names = [d[0] for d in cur.description]
                return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        except sqlite3.Error as exc:
            raise RecordsError(f"cannot read {self.path}: {_one_line(exc)}") from exc

    def list(self, limit: int = 50, since: float | None = None, outcome: str | None = None) -> Rows:
        """The newest calls first (started at or after ``since``, of one ``outcome``)."""
        where: CallIds = []
        params: list[Any] = []
        if since is not None:
            where.append("started_at >= ?")
            params.append(since)
        if outcome is not None:
            where.append("outcome = ?")
            params.append(outcome)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        sql = (
            f"SELECT {self._fields} FROM calls {clause} "
            "ORDER BY started_at DESC, rowid DESC LIMIT ?"
        )
        return self._rows(sql, (*params, max(0, int(limit))))

    def call_ids(self, caller: Callable[[str | None], bool]) -> CallIds:
        """Ids of the calls whose caller (From URI) ``caller`` accepts, oldest first."""
        rows = self._rows("SELECT call_id, caller FROM calls ORDER BY started_at, rowid", ())
        return [r["call_id"] for r in rows if caller(r["caller"])]

    def find(self, call_id: str) -> CallIds:
        """Call ids equal to ``call_id``, else those it is a prefix of (at most 10)."""
        if not valid_call_id(call_id):
            return []
        exact = self._rows("SELECT call_id FROM calls WHERE call_id = ?", (call_id,))
        if exact:
            return [call_id]
        rows = self._rows(
            "SELECT call_id FROM calls WHERE substr(call_id, 1, ?) = ? "
            "ORDER BY started_at LIMIT 10",
            (len(call_id), call_id),
        )
        return [r["call_id"] for r in rows]

    def show(self, call_id: str) -> dict[str, Any] | None:
        """One call: its row, stats, turns and a merged timeline; None when unknown."""
        if not valid_call_id(call_id):
            return None
        calls = self._rows(f"SELECT {self._fields} FROM calls WHERE call_id = ?", (call_id,))
        if not calls:
            return None
        call = calls[0]
        turns = self._rows(
            "SELECT idx, at, caller_text, agent_text, timings FROM turns WHERE call_id = ? "
            "ORDER BY idx",
            (call_id,),
        )
        for t in turns:
            t["timings"] = _loads(t["timings"])
        events = self._rows(
            "SELECT at, kind, data FROM events WHERE call_id = ? ORDER BY at, rowid", (call_id,)
        )
        for e in events:
            e["data"] = _loads(e["data"])
        timeline: list[dict[str, Any]] = []
        for kind in ("started", "answered", "ended"):
            at = call[f"{kind}_at"]
            if at is not None:
                timeline.append({"at": at, "kind": kind, "data": _milestone(call, kind)})
        timeline += [{"at": e["at"], "kind": e["kind"], "data": e["data"]} for e in events]
        timeline += [
            {
                "at": t["at"],
                "kind": "turn",
                "data": {"idx": t["idx"], "caller": t["caller_text"], "agent": t["agent_text"]},
            }
            for t in turns
        ]
        order = {"started": 0, "answered": 1}
        timeline.sort(key=lambda x: (x["at"], order.get(x["kind"], 2), x["kind"] == "ended"))
        stats = {k: call[k] for k in (*STAT_FIELDS, "setup_ms", "duration_s", *DEAD_AIR_FIELDS)}
        return {
            "call": call,
            "stats": stats,
            "turns": turns,
            "events": events,
            "timeline": timeline,
        }


_ADDED_COLUMNS = {**dict.fromkeys(DEAD_AIR_FIELDS, "REAL"), "profile": "TEXT"}


def _add_columns(db: sqlite3.Connection) -> None:
    """The columns added since the schema began (dead air, the voice agent's profile), on a
    store made before them (once, even with two bridges opening it at the same time)."""
    if set(_ADDED_COLUMNS) <= {r[1] for r in db.execute("PRAGMA table_info(calls)")}:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        have = {r[1] for r in db.execute("PRAGMA table_info(calls)")}
        for name, kind in _ADDED_COLUMNS.items():
            if name not in have:
                db.execute(f"ALTER TABLE calls ADD COLUMN {name} {kind}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _milestone(call: Mapping[str, Any], kind: str) -> dict[str, Any]:
    if kind == "started":
        return {k: call[k] for k in ("caller", "callee", "trunk", "remote") if call[k]}
    if kind == "answered":
        return {k: call[k] for k in ("codec", "agent", "setup_ms") if call[k] is not None}
    return {k: call[k] for k in ("outcome", "end_reason") if call[k] is not None}

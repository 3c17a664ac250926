"""Call records: the SQLite store, its crash safety, and ``sip-bridge calls list|show``."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jitter.jitter_ingest import JitterStats
from sip_bridge.media.media_params import MediaStats
from sip_bridge.ops import records_cli
from sip_bridge.ops.records import SCHEMA_VERSION, CallRecords, RecordsError, media_summary

REPO = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000.0


def _record_call(store: CallRecords, call_id: str = "a84b4c76e66710@pc33.example.com") -> None:
    """One whole answered call, with fixed timestamps."""
    store.call_started(
        call_id,
        caller="sip:alice@example.com",
        callee="sip:voice@bridge.example.com",
        trunk="carrier-1",
        node="node-a",
        remote="192.0.2.10:5060",
        at=T0,
    )
    store.call_answered(call_id, codec="PCMU", agent="voice", at=T0 + 0.125, profile="dentist")
    store.event(call_id, "dtmf", {"digit": "1"}, at=T0 + 1.0)
    store.turn(
        call_id,
        caller_text="what are your opening hours",
        agent_text="We're open nine to five.",
        timings={"end_of_turn_ms": 362.0, "tts_first_audio_ms": 153.5},
        at=T0 + 4.0,
    )
    store.turn(call_id, caller_text="thanks", agent_text="Goodbye.", at=T0 + 7.0)
    store.call_ended(
        call_id,
        end_reason="remote BYE",
        stats={
            "packets_in": 450,
            "packets_out": 440,
            "jitter_ms": 2.5,
            "loss_pct": 0.2,
            "jb_delay_ms": 20.0,
            "late_frames": 1,
        },
        at=T0 + 9.125,
    )


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    parser = argparse.ArgumentParser(prog="sip-bridge")
    records_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["calls", *argv])
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = records_cli.run(args)
    return rc, out.getvalue(), err.getvalue()


def _one_line_error(rc: int, out: str, err: str) -> str:
    assert rc == 1
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("sip-bridge calls: ")
    return err


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "calls.sqlite"


# -- the store --------------------------------------------------------------------------------


def test_schema_wal_and_version(db: Path) -> None:
    store = CallRecords(db)
    assert db.is_file()  # the data directory was created
    assert store.journal_mode == "wal"
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert store.schema_version == SCHEMA_VERSION == 1
    store.close()
    raw = sqlite3.connect(db)
    cols = {
        t: [r[1] for r in raw.execute(f"PRAGMA table_info({t})")]
        for t in ("meta", "calls", "turns", "events")
    }
    assert cols["calls"] == [
        "call_id", "node", "trunk", "caller", "callee", "agent", "started_at", "answered_at",
        "ended_at", "duration_s", "outcome", "end_reason", "codec", "remote", "packets_in",
        "packets_out", "jitter_ms", "loss_pct", "jb_delay_ms", "late_frames", "setup_ms",
        "dead_air_max_ms", "dead_air_total_ms", "profile",
    ]  # fmt: skip
    assert cols["turns"] == ["call_id", "idx", "at", "caller_text", "agent_text", "timings"]
    assert cols["events"] == ["call_id", "at", "kind", "data"]
    assert raw.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("1",)
    assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)  # persistent
    raw.close()
    CallRecords(db).close()  # reopening an existing store works and keeps the version


V1_CALLS = """CREATE TABLE calls (
    call_id TEXT PRIMARY KEY, node TEXT, trunk TEXT, caller TEXT, callee TEXT, agent TEXT,
    started_at REAL NOT NULL, answered_at REAL, ended_at REAL, duration_s REAL,
    outcome TEXT, end_reason TEXT, codec TEXT, remote TEXT,
    packets_in INTEGER, packets_out INTEGER, jitter_ms REAL, loss_pct REAL,
    jb_delay_ms REAL, late_frames INTEGER, setup_ms REAL)"""


def _v1_store(db: Path) -> None:
    """A store as a bridge before the dead-air columns left it, with one call."""
    db.parent.mkdir(parents=True, exist_ok=True)
    raw = sqlite3.connect(db)
    raw.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('schema_version', '1');"
        f"{V1_CALLS};"
        "CREATE TABLE turns (call_id TEXT NOT NULL, idx INTEGER NOT NULL, at REAL NOT NULL,"
        " caller_text TEXT, agent_text TEXT, timings TEXT, PRIMARY KEY (call_id, idx));"
        "CREATE TABLE events (call_id TEXT NOT NULL, at REAL NOT NULL, kind TEXT NOT NULL,"
        " data TEXT);"
        "INSERT INTO calls (call_id, started_at, outcome) VALUES ('old-call', 1.0, 'answered');"
    )
    raw.commit()
    raw.close()


def test_an_older_store_reads_as_it_is_and_gains_the_dead_air_columns(db: Path) -> None:
    _v1_store(db)
    ro = CallRecords(db, readonly=True)  # a reader never changes it: NULLs stand in
    old = ro.show("old-call")
    assert old is not None and old["stats"]["dead_air_max_ms"] is None
    ro.close()
    store = CallRecords(db)  # a bridge opening it adds them, keeping its calls...
    assert store.schema_version == 1  # ...and its version: an older bridge still opens it
    assert store.call_ended("new-call", outcome="answered", dead_air=(812.5, 1460.0))
    new = store.show("new-call")
    assert new is not None and new["stats"]["dead_air_max_ms"] == 812.5
    assert new["stats"]["dead_air_total_ms"] == 1460.0
    assert store.show("old-call") is not None
    assert store.call_answered("answered", agent="voice", profile="dentist")  # and the profile
    shown = store.show("answered")
    assert shown is not None and shown["call"]["profile"] == "dentist"
    store.close()
    CallRecords(db).close()  # again: nothing left to add
    raw = sqlite3.connect(db)  # what an older bridge reads, by name, is all there
    assert raw.execute(
        "SELECT outcome, setup_ms FROM calls WHERE call_id = 'new-call'"
    ).fetchone() == ("answered", None)
    raw.close()


def test_a_whole_call_round_trips(db: Path) -> None:
    store = CallRecords(db)
    _record_call(store)
    assert store.errors == 0
    rec = store.show("a84b4c76e66710@pc33.example.com")
    assert rec is not None
    call = rec["call"]
    assert call["caller"] == "sip:alice@example.com"
    assert call["trunk"] == "carrier-1" and call["node"] == "node-a"
    assert call["outcome"] == "answered"  # inferred: it was answered
    assert call["end_reason"] == "remote BYE"
    assert call["duration_s"] == pytest.approx(9.0)  # from the answer
    assert rec["stats"]["setup_ms"] == pytest.approx(125.0)  # answer - start
    assert rec["stats"]["packets_in"] == 450 and rec["stats"]["late_frames"] == 1
    assert [t["idx"] for t in rec["turns"]] == [0, 1]
    assert rec["turns"][0]["timings"] == {"end_of_turn_ms": 362.0, "tts_first_audio_ms": 153.5}
    assert rec["turns"][1]["timings"] is None
    assert rec["events"] == [{"at": T0 + 1.0, "kind": "dtmf", "data": {"digit": "1"}}]
    kinds = [(e["kind"], e["at"] - T0) for e in rec["timeline"]]
    assert kinds == [
        ("started", 0.0),
        ("answered", 0.125),
        ("dtmf", 1.0),
        ("turn", 4.0),
        ("turn", 7.0),
        ("ended", 9.125),
    ]
    assert rec["timeline"][-1]["data"] == {"outcome": "answered", "end_reason": "remote BYE"}
    assert store.show("no-such-call") is None
    store.close()


def test_outcomes_and_list_filters(db: Path) -> None:
    clock = [T0]
    store = CallRecords(db, clock=lambda: clock[0])
    for i in range(5):
        clock[0] = T0 + 10 * i
        store.call_started(f"c{i}", caller=f"sip:{i}@x")
    store.call_ended("c0", outcome="rejected", end_reason="503 no RTP ports")
    store.call_ended("c1", outcome="cancelled", end_reason="CANCEL")
    store.call_ended("c2", end_reason="timeout")  # never answered: failed
    store.call_answered("c3", codec="PCMA")
    clock[0] += 30.0
    store.call_ended("c3", end_reason="agent hung up")
    # c4 is still running
    rows = store.list(limit=10)
    assert [r["call_id"] for r in rows] == ["c4", "c3", "c2", "c1", "c0"]  # newest first
    assert [r["outcome"] for r in rows] == [None, "answered", "failed", "cancelled", "rejected"]
    assert rows[1]["duration_s"] == pytest.approx(30.0) and rows[1]["codec"] == "PCMA"
    assert rows[3]["duration_s"] == 0
    assert [r["call_id"] for r in store.list(limit=2)] == ["c4", "c3"]
    assert [r["call_id"] for r in store.list(since=T0 + 20)] == ["c4", "c3", "c2"]
    assert [r["call_id"] for r in store.list(outcome="cancelled")] == ["c1"]
    assert store.list(outcome="answered", since=T0 + 35) == []
    assert store.errors == 0
    store.close()


def test_upserts_tolerate_missed_and_repeated_events(db: Path) -> None:
    store = CallRecords(db)
    store.call_ended("lost-start", outcome="failed", end_reason="media timeout", at=T0)
    store.call_answered("late", codec="PCMU", at=T0 + 1)
    store.call_started("late", caller="sip:a@x", at=T0 + 5)  # a duplicate INVITE later
    late = store.show("late")
    assert late is not None and late["call"]["started_at"] == T0 + 1  # the first start stays
    assert late["call"]["caller"] == "sip:a@x" and late["call"]["codec"] == "PCMU"
    lost = store.show("lost-start")
    assert lost is not None and lost["call"]["outcome"] == "failed"
    assert lost["call"]["started_at"] == T0 and lost["call"]["duration_s"] == 0
    assert store.errors == 0
    store.close()


def test_media_stats_become_the_quality_columns(db: Path) -> None:
    jb = JitterStats(received=990, lost=10, late=3, jitter_ms=4.25, current_delay_ms=40.0)
    media = MediaStats(
        local_port=30000, remote=("198.51.100.7", 40002), latched=True, packets_in=1000,
        packets_accepted=990, malformed=0, rtcp_in=2, wrong_source=0, wrong_payload_type=0,
        wrong_ssrc=0, dtmf_digits=1, packets_out=995, octets_out=159200, send_errors=0,
        jitter=jb, pacer_late_frames=0, pacer_skipped_frames=0, pacing_jitter_p50_ms=0.1,
        pacing_jitter_p99_ms=0.5, pacing_jitter_max_ms=1.0, playout_underrun_frames=0,
        playout_queued_ms=0.0, agent_errors=0,
    )  # fmt: skip
    assert media_summary(media) == {
        "packets_in": 1000,
        "packets_out": 995,
        "jitter_ms": 4.25,
        "loss_pct": 1.0,
        "jb_delay_ms": 40.0,
        "late_frames": 3,
    }
    store = CallRecords(db)
    store.call_started("m", remote="192.0.2.1:5060", at=T0)
    store.call_answered("m", at=T0 + 0.5)
    store.call_ended("m", media=media, end_reason="bye", at=T0 + 20.5)
    rec = store.show("m")
    assert rec is not None
    assert rec["call"]["remote"] == "198.51.100.7:40002"  # the latched media address
    assert rec["stats"]["loss_pct"] == 1.0 and rec["stats"]["packets_out"] == 995
    assert rec["call"]["duration_s"] == pytest.approx(20.0)
    store.close()


def test_bad_input_is_logged_and_counted_never_raised(
    db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CallRecords(db)
    assert store.call_started("") is False
    assert store.call_started("   ") is False
    assert store.event("bad\nid", "dtmf") is False
    assert store.turn("x" * 300) is False
    assert store.errors == 4
    assert "malformed call id" in caplog.text
    assert store.call_ended("c", outcome="exploded", end_reason="oops") is True
    assert store.errors == 5
    rec = store.show("c")
    assert rec is not None and rec["call"]["outcome"] == "failed"  # kept, not lost
    assert "exploded" in rec["call"]["end_reason"]
    assert store.event("c", "weird", {"obj": object()}) is True  # unserialisable: str()
    assert store.show("") is None and store.find("") == []
    store.close()
    assert store.call_started("after-close") is False  # a closed store only counts
    assert store.errors == 6


def test_locked_database_costs_a_bounded_wait_and_a_count(db: Path) -> None:
    store = CallRecords(db)
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another writer holds the lock
    t = time.perf_counter()
    assert store.call_started("blocked", at=T0) is False
    assert time.perf_counter() - t < 1.0
    assert store.errors == 1 and "locked" in (store.last_error or "")
    other.execute("ROLLBACK")
    other.close()
    assert store.call_started("blocked", at=T0) is True  # and it recovers
    store.close()


def test_disk_full_is_counted(db: Path) -> None:
    store = CallRecords(db)
    store.call_started("big", at=T0)
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages + 2}")  # a nearly full disk
    assert store.event("big", "blob", {"x": "y" * 200_000}) is False
    assert store.errors == 1 and "full" in (store.last_error or "")
    assert store.show("big") is not None  # earlier records stay readable
    store.close()


def test_writes_are_small_and_fast(db: Path) -> None:
    store = CallRecords(db)
    for i in range(250):
        cid = f"load-{i}"
        store.call_started(cid, caller="sip:x@y")
        store.call_answered(cid, codec="PCMU")
        store.turn(cid, caller_text="hi", agent_text="hello", timings={"t": 1.0})
        store.call_ended(cid, end_reason="bye")
    assert store.errors == 0
    times = store.write_times_s[-1000:]
    assert len(times) == 1000
    # Generous sanity bounds (a shared, busy machine): a write is a small transaction.
    assert statistics.median(times) < 0.02
    assert max(times) < 1.0
    assert len(store.list(limit=1000)) == 250
    store.close()


def test_unopenable_stores_raise_one_line(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not an sqlite database, just some text\n" * 100)
    with pytest.raises(RecordsError) as exc:
        CallRecords(garbage)
    assert "\n" not in str(exc.value) and "garbage.sqlite" in str(exc.value)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RecordsError, match="cannot open"):
        CallRecords(blocker / "calls.sqlite")  # its directory is a file
    newer = tmp_path / "newer.sqlite"
    CallRecords(newer).close()
    raw = sqlite3.connect(newer)
    raw.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    raw.commit()
    raw.close()
    with pytest.raises(RecordsError, match="schema 99"):
        CallRecords(newer)


# -- crash safety and concurrency ----------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from sip_bridge.ops.records import CallRecords
    store = CallRecords(sys.argv[1])
    t0 = 1_700_000_000.0
    store.call_started("done", caller="sip:alice@x", at=t0)
    store.call_answered("done", codec="PCMA", at=t0 + 0.1)
    store.turn("done", caller_text="hello", agent_text="hi there", at=t0 + 1)
    store.call_ended("done", end_reason="remote BYE", stats={"packets_in": 77}, at=t0 + 2)
    store.call_started("running", at=t0 + 3)
    if sys.argv[2] == "self":
        os.kill(os.getpid(), signal.SIGKILL)
    print("ready", flush=True)
    i = 0
    while True:  # keep writing until the parent kills us
        store.event("running", "tick", {"i": i})
        i += 1
    """
)


@pytest.mark.parametrize("how", ["self", "parent"])
def test_a_completed_call_survives_kill_9(db: Path, how: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(db), how], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert proc.stdout is not None
    if how == "parent":
        assert proc.stdout.readline() == "ready\n"
        time.sleep(0.2)  # mid-write, most likely
        proc.kill()
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert Path(f"{db}-wal").exists()  # it died without a checkpoint
    store = CallRecords(db, readonly=True)
    assert store._db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    rec = store.show("done")
    assert rec is not None
    assert rec["call"]["outcome"] == "answered" and rec["call"]["end_reason"] == "remote BYE"
    assert rec["call"]["codec"] == "PCMA" and rec["stats"]["packets_in"] == 77
    assert rec["turns"][0]["agent_text"] == "hi there"
    running = store.show("running")
    assert running is not None and running["call"]["ended_at"] is None
    if how == "parent":
        ticks = [e["data"]["i"] for e in running["events"]]
        assert ticks == list(range(len(ticks))) and ticks  # a gap-free prefix
    store.close()
    rc, out, _ = _cli("list", "--db", str(db))
    assert rc == 0 and "done" in out and "in progress" in out


_WRITER = textwrap.dedent(
    """
    import sys
    from sip_bridge.ops.records import CallRecords
    store = CallRecords(sys.argv[1])
    for i in range(300):
        cid = f"w{i:04d}"
        store.call_started(cid, caller="sip:load@x", at=1e9 + i)
        store.call_answered(cid, codec="PCMU", at=1e9 + i + 0.1)
        store.call_ended(cid, end_reason="bye", at=1e9 + i + 0.5)
    print(store.errors, flush=True)
    store.close()
    """
)


def test_readers_do_not_disturb_a_writer(db: Path) -> None:
    CallRecords(db).close()
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(db)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    reader = CallRecords(db, readonly=True)
    seen: list[int] = []
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        rows = reader.list(limit=1000)
        seen.append(len(rows))
        for r in rows[:3]:  # what a reader sees is whole calls, or calls in progress
            assert r["outcome"] in (None, "answered")
        if rows:
            assert reader.show(rows[0]["call_id"]) is not None
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.strip() == "0"  # the writer never failed
    assert seen == sorted(seen)  # never a call lost or a torn read
    assert any(0 < n < 300 for n in seen)  # it did read while the writer wrote
    assert len(reader.list(limit=1000)) == 300
    reader.close()


# -- the CLI ---------------------------------------------------------------------------------


def test_cli_list_table_and_json(db: Path) -> None:
    store = CallRecords(db)
    _record_call(store)
    store.call_started("rejected-1", caller="sip:bob@x", at=T0 + 60)
    store.call_ended("rejected-1", outcome="rejected", end_reason="503 busy", at=T0 + 60.01)
    store.close()
    rc, out, err = _cli("list", "--db", str(db))
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == [
        "started", "call", "id", "outcome", "duration", "dead", "air", "caller", "callee",
        "agent", "trunk", "reason",
    ]  # fmt: skip
    assert "rejected-1" in lines[1] and "rejected" in lines[1] and "503 busy" in lines[1]
    assert "a84b4c76e66710@pc33.example.com" in lines[2]
    assert "answered" in lines[2] and "9.0s" in lines[2] and "carrier-1" in lines[2]
    assert " voice (dentist) " in lines[2]  # the profile that answered, by its name
    assert len(lines) == 3
    rc, out, _ = _cli("list", "--limit", "1", "--db", str(db))
    assert rc == 0 and len(out.splitlines()) == 2 and "rejected-1" in out
    rc, out, _ = _cli("list", "--outcome", "answered", "--json", "--db", str(db))
    rows = json.loads(out)
    assert [r["call_id"] for r in rows] == ["a84b4c76e66710@pc33.example.com"]
    assert rows[0]["setup_ms"] == pytest.approx(125.0)
    rc, out, _ = _cli("list", "--outcome", "cancelled", "--db", str(db))
    assert rc == 0 and out == "no calls recorded with outcome cancelled\n"


def test_cli_show_timeline_and_json(db: Path) -> None:
    store = CallRecords(db)
    _record_call(store)
    store.call_started("a84b-other", at=T0 + 100)
    store.close()
    rc, out, err = _cli("show", "a84b4c76e66710@pc33.example.com", "--db", str(db))
    assert rc == 0 and err == ""
    assert out.startswith("call a84b4c76e66710@pc33.example.com\n")
    assert "  outcome      answered\n" in out and "  end reason   remote BYE\n" in out
    assert "setup_ms=125" in out and "packets_in=450" in out
    timeline = out.split("timeline\n")[1].split("turns\n")[0].splitlines()
    assert [line.split()[1] for line in timeline] == [
        "started", "answered", "dtmf", "turn", "turn", "ended",
    ]  # fmt: skip
    assert timeline[0].split()[0] == "+0.000s" and timeline[-1].split()[0] == "+9.125s"
    assert "digit=1" in timeline[2]
    assert "what are your opening hours" in timeline[3]
    assert "timings: end_of_turn_ms=362 tts_first_audio_ms=153.5" in out
    rc, out, _ = _cli("show", "a84b4c76e667", "--json", "--db", str(db))  # a unique prefix
    data = json.loads(out)
    assert rc == 0 and data["call"]["call_id"] == "a84b4c76e66710@pc33.example.com"
    assert len(data["timeline"]) == 6 and data["turns"][1]["agent_text"] == "Goodbye."
    err = _one_line_error(*_cli("show", "a84b", "--db", str(db)))
    assert "ambiguous" in err


@pytest.mark.parametrize("call_id", ["nope", "", "  ", "bad\nid", "x" * 300])
def test_cli_unknown_or_malformed_id(db: Path, call_id: str) -> None:
    store = CallRecords(db)
    _record_call(store)
    store.close()
    err = _one_line_error(*_cli("show", call_id, "--db", str(db)))
    assert ("no call" in err) if call_id == "nope" else ("malformed call id" in err)


def test_cli_missing_corrupt_or_foreign_db(tmp_path: Path) -> None:
    missing = tmp_path / "missing.sqlite"
    err = _one_line_error(*_cli("list", "--db", str(missing)))
    assert "no call records at" in err and str(missing) in err
    assert not missing.exists()  # reading never creates the database
    _one_line_error(*_cli("show", "abc", "--db", str(missing)))
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(os.urandom(8192))
    err = _one_line_error(*_cli("list", "--db", str(corrupt)))
    assert "cannot read" in err
    half = tmp_path / "half.sqlite"
    store = CallRecords(half)
    _record_call(store)
    store.close()
    data = bytearray(half.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # the schema page is trash
    half.write_bytes(bytes(data))
    _one_line_error(*_cli("list", "--db", str(half)))
    foreign = tmp_path / "foreign.sqlite"
    raw = sqlite3.connect(foreign)
    raw.execute("CREATE TABLE other (x)")
    raw.commit()
    raw.close()
    err = _one_line_error(*_cli("list", "--db", str(foreign)))
    assert "no call records" in err or "no schema" in err


def test_cli_usage_errors_exit_2(db: Path) -> None:
    for argv in (["list", "--limit", "0"], ["list", "--outcome", "maybe"], ["show"]):
        with pytest.raises(SystemExit) as exc, contextlib.redirect_stderr(io.StringIO()):
            _cli(*argv, "--db", str(db))
        assert exc.value.code == 2


def test_default_db_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SIP_BRIDGE_DATA", str(tmp_path / "data"))
    assert records_cli.default_db_path() == tmp_path / "data" / "calls.sqlite"
    store = CallRecords(records_cli.default_db_path())
    _record_call(store, "env-call")
    store.close()
    rc, out, _ = _cli("list")  # no --db: the default path
    assert rc == 0 and "env-call" in out
    monkeypatch.delenv("SIP_BRIDGE_DATA")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    expected = tmp_path / "home" / ".local" / "share" / "sip-bridge" / "calls.sqlite"
    assert records_cli.default_db_path() == expected


def test_main_in_a_subprocess(db: Path) -> None:
    store = CallRecords(db)
    _record_call(store, "sub-call")
    store.close()
    code = "import sys; from sip_bridge.ops.records_cli import main; sys.exit(main())"
    run = subprocess.run(
        [sys.executable, "-c", code, "show", "sub-call", "--db", str(db)],
        capture_output=True, text=True, timeout=30, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 0 and run.stdout.startswith("call sub-call\n")
    run = subprocess.run(
        [sys.executable, "-c", code, "show", "other", "--db", str(db)],
        capture_output=True, text=True, timeout=30, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr == f"sip-bridge calls: no call 'other' in {db}\n"


# -- read-only files (as a user who cannot write them) ---------------------------------------


def _unprivileged(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a forked child that cannot write others' files; its JSON-able result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(r)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            result = fn()
            os.write(w, json.dumps(result).encode())
        except BaseException as exc:  # report anything to the parent
            os.write(w, json.dumps({"child_error": repr(exc)}).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    result = json.loads(data)
    assert not (isinstance(result, dict) and "child_error" in result), result
    return result


def test_read_only_db_files() -> None:
    base = Path(tempfile.mkdtemp(prefix="records-ro-"))
    try:
        db = base / "calls.sqlite"
        store = CallRecords(db)
        _record_call(store, "ro-call")
        store.close()  # a clean close: no -wal left
        os.chmod(db, 0o444)
        os.chmod(base, 0o555)  # nobody may create files next to it either

        def attempt() -> dict[str, Any]:
            try:
                CallRecords(db)
                opened = "opened"
            except RecordsError as exc:
                opened = str(exc)
            return {"writer": opened, "cli": list(_cli("list", "--db", str(db)))}

        got = _unprivileged(attempt)
        assert got["writer"].startswith(f"cannot open call records {db}: ")
        assert "readonly" in got["writer"] and "\n" not in got["writer"]
        rc, out, err = got["cli"]
        assert rc == 0 and err == "" and "ro-call" in out  # a read-only copy still lists
        # a writer that crashed: its -wal (and -shm) are left, read-only to this user
        os.chmod(base, 0o755)
        os.chmod(db, 0o644)
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(db), "self"], cwd=REPO, stdout=subprocess.PIPE
        )
        assert proc.wait(timeout=30) == -signal.SIGKILL
        for p in base.iterdir():
            os.chmod(p, 0o444)
        os.chmod(base, 0o555)
        rc, out, err = _unprivileged(lambda: _cli("list", "--db", str(db)))
        assert rc == 0 and err == ""  # SQLite reads the WAL through the read-only -shm
        assert "running" in out and "done" in out and "ro-call" in out
        # without the -shm, the WAL cannot be read here and is not ignored: one line
        os.chmod(base, 0o755)
        Path(f"{db}-shm").unlink()
        os.chmod(base, 0o555)
        err = _one_line_error(*_unprivileged(lambda: _cli("list", "--db", str(db))))
        assert f"cannot read {db}: " in err
    finally:
        os.chmod(base, 0o755)
        for p in base.iterdir():
            p.unlink()
        base.rmdir()

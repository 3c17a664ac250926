"""How long callers' data is kept and how it is taken out: purge by age (by hand, and by the
bridge at start), purge and export by caller, recordings with their records, and nothing of
a purged call left in the database file's free pages."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from sip_bridge.config.loader import BridgeConfig
from sip_bridge.ops.records import CallRecords
from sip_bridge.ops.records_retention import DAY_S, caller_key, export_caller, purge
from sip_bridge.server import BridgeServer

NOW = time.time()
OLD = NOW - 100 * DAY_S
NEW = NOW - 1 * DAY_S
ROOT = Path(__file__).resolve().parents[1]


def _call(store: CallRecords, call_id: str, caller: str, at: float, rec_dir: Path | None) -> None:
    store.call_started(call_id, caller=caller, callee="sip:support@acme", at=at)
    store.call_answered(call_id, codec="PCMU", at=at + 1)
    for i in range(3):
        store.turn(call_id, caller_text=f"secret words of {call_id} #{i}", agent_text="ok",
                   at=at + 2 + i)  # fmt: skip
    store.event(call_id, "dtmf", {"digit": "5"}, at=at + 6)
    if rec_dir is not None:
        wav = rec_dir / f"{call_id}.wav"
        wav.write_bytes(b"RIFF....WAVE")
        os.utime(wav, (at + 60, at + 60))
        store.event(call_id, "recording", {"path": str(wav)}, at=at + 1)
    store.call_ended(call_id, at=at + 60)


@pytest.fixture
def store(tmp_path: Path) -> CallRecords:
    rec = tmp_path / "recordings"
    rec.mkdir()
    s = CallRecords(tmp_path / "calls.sqlite")
    for i in range(7):
        _call(s, f"old-{i}", f"sip:+44207946000{i % 2}@carrier", OLD + i, rec)
    _call(s, "new-0", "sip:+442079460000@carrier", NEW, rec)
    _call(s, "new-1", '"Bob" <sip:bob@10.0.0.5>', NEW, None)
    orphan = rec / "20200101-000000_gone.wav"  # its record was purged by hand long ago
    orphan.write_bytes(b"RIFF")
    os.utime(orphan, (OLD, OLD))
    return s


def _ids(store: CallRecords) -> set[str]:
    return {r["call_id"] for r in store.list(limit=100)}


def test_purge_by_age_takes_rows_turns_events_and_recordings_in_small_batches(
    store: CallRecords, tmp_path: Path
) -> None:
    rec = tmp_path / "recordings"
    done = purge(store.path, before=NOW - 90 * DAY_S, recordings_dir=str(rec), batch=3)
    assert (done.calls, done.turns, done.events) == (7, 21, 14), done
    assert done.recordings == 8  # seven calls' WAVs and the orphan
    assert done.batches == 3 and done.longest_batch_ms > 0  # 3 + 3 + 1 calls
    assert _ids(store) == {"new-0", "new-1"}
    assert sorted(p.name for p in rec.iterdir()) == ["new-0.wav"]
    shown = store.show("new-0")
    assert shown is not None and len(shown["turns"]) == 3  # the rest untouched
    # nothing of the purged calls is left in the file, its free pages or its log
    store.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("calls.sqlite*"))
    assert b"secret words of old-" not in raw and b"secret words of new-0" in raw


def test_a_dry_run_counts_and_deletes_nothing(store: CallRecords, tmp_path: Path) -> None:
    before = NOW - 90 * DAY_S
    dry = purge(store.path, before=before, recordings_dir=str(tmp_path / "recordings"),
                dry_run=True, batch=2)  # fmt: skip
    assert (dry.calls, dry.turns, dry.events, dry.recordings) == (7, 21, 14, 8)
    assert len(_ids(store)) == 9 and len(list((tmp_path / "recordings").iterdir())) == 9


def test_callers_are_matched_on_their_number() -> None:
    assert caller_key("sip:+44 20-7946-0000@carrier;user=phone") == "442079460000"
    assert caller_key('"Ann" <sips:00442079460000@pbx>') == "442079460000"
    assert caller_key("tel:+44(20)79460000") == caller_key("442079460000")
    assert caller_key("sip:Bob@10.0.0.5") == "bob" and caller_key("sip:@host") == ""


def test_one_callers_calls_are_exported_then_purged(store: CallRecords) -> None:
    data = export_caller(store, "+44 20 7946 0000")
    ids = [c["call"]["call_id"] for c in data["calls"]]
    assert ids == ["old-0", "old-2", "old-4", "old-6", "new-0"]  # oldest first
    assert all(len(c["turns"]) == 3 for c in data["calls"])
    assert data["matched_on"] == "442079460000" and len(data["recordings"]) == 5
    assert all(r["exists"] for r in data["recordings"])
    done = purge(store.path, caller="0044-20-7946-0000")
    assert done.calls == 5 and done.recordings == 5
    assert _ids(store) == {"old-1", "old-3", "old-5", "new-1"}
    assert export_caller(store, "+442079460000")["calls"] == []
    with pytest.raises(ValueError, match="no number"):
        purge(store.path, caller="sip:@x")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sip_bridge.cli", "calls", *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip


def test_the_calls_command_exports_and_purges(store: CallRecords, tmp_path: Path) -> None:
    db = str(store.path)
    out = tmp_path / "ann.json"
    r = _cli("export", "--caller", "+442079460001", "--out", str(out), "--db", db)
    assert r.returncode == 0 and "3 call(s)" in r.stderr, r.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600  # personal data: the owner's only
    assert [c["call"]["call_id"] for c in json.loads(out.read_text())["calls"]] == [
        "old-1", "old-3", "old-5"
    ]  # fmt: skip
    day = time.strftime("%Y-%m-%d", time.localtime(NOW - 30 * DAY_S))
    r = _cli("purge", "--before", day, "--dry-run", "--db", db)
    assert r.returncode == 0 and r.stdout.startswith("would purge 7 call(s)"), r.stdout
    r = _cli("purge", "--before", day, "--caller", "+442079460001", "--db", db)
    assert r.returncode == 0 and r.stdout.startswith("purged 3 call(s) (9 turn(s)"), r.stdout
    r = _cli("purge", "--before", day, "--db", db, "--recordings", str(tmp_path / "recordings"))
    assert r.returncode == 0 and "purged 4 call(s)" in r.stdout and "5 recording(s)" in r.stdout
    assert _ids(store) == {"new-0", "new-1"}
    bad = _cli("purge", "--before", "last tuesday", "--db", db)
    assert bad.returncode == 2 and "not a date" in bad.stderr
    r = _cli("purge", "--db", db)
    assert r.returncode == 1 and "--before DATE, --caller NUMBER" in r.stderr
    r = _cli("purge", "--before", day, "--db", str(tmp_path / "none.sqlite"))
    assert r.returncode == 1 and "no call records" in r.stderr


def test_the_bridge_purges_what_is_older_than_keep_days_when_it_starts(
    store: CallRecords, tmp_path: Path
) -> None:
    base = BridgeConfig.line_check()
    rec = tmp_path / "recordings"
    config = replace(
        base,
        sip=replace(base.sip, listen="127.0.0.1:0"),
        records=replace(base.records, enabled=True, db=str(store.path), keep_days=30,
                        recordings_dir=str(rec)),
    )  # fmt: skip

    async def main() -> set[str]:
        server = BridgeServer(config)
        await server.start()
        try:
            for _ in range(200):
                if len(_ids(store)) == 2:
                    break
                await asyncio.sleep(0.05)
            return _ids(store)
        finally:
            await server.stop()

    assert asyncio.run(main()) == {"new-0", "new-1"}
    assert sorted(p.name for p in rec.iterdir()) == ["new-0.wav"]


def test_keep_days_zero_keeps_everything(store: CallRecords) -> None:
    base = BridgeConfig.line_check()
    config = replace(
        base,
        sip=replace(base.sip, listen="127.0.0.1:0"),
        records=replace(base.records, enabled=True, db=str(store.path), keep_days=0),
    )

    async def main() -> None:
        server = BridgeServer(config)
        await server.start()
        await asyncio.sleep(0.5)
        await server.stop()

    asyncio.run(main())
    assert len(_ids(store)) == 9

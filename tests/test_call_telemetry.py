"""CallTelemetry: a keypad turn and a call's dead air reach the record, the events and
the metrics in the shapes operators read (no sockets: a list stands in for MQTT)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.base import DeadAir, TurnCompleted
from sip_bridge.ops.call_telemetry import CallFacts, CallTelemetry
from sip_bridge.ops.metrics import BridgeMetrics
from sip_bridge.ops.records import CallRecords


def test_keypad_turns_and_dead_air_reach_records_events_and_metrics(tmp_path: Path) -> None:
    events: list[tuple[str, str, dict[str, Any]]] = []
    records = CallRecords(tmp_path / "calls.sqlite")
    t = CallTelemetry("n1", records=records, metrics=BridgeMetrics(),
                      events=lambda c, k, f: events.append((c, k, f)))  # fmt: skip
    facts = CallFacts("c-1", "sip:alice@x", "sip:support@y", None, None, "voice", "1.2.3.4:5")
    t.offered(facts)
    t.answered(facts, "PCMU", "1.2.3.4:4000", "voice")
    keyed = TurnCompleted(
        "(keypad 54321)", "Order 5 4 3 2 1 is being packed.",
        {"dialogue": 0.2, "tts_first_audio": 180.0, "total": 240.5}, input="keypad",
        keys="54321",
    )  # fmt: skip
    t.turn("c-1", keyed)
    for ms in (420.0, 1310.5, 60.0):
        t.dead_air_gap("c-1", DeadAir(ms))
    tally = t.dead_air["c-1"]
    assert (tally.gaps, tally.longest_ms, tally.total_ms) == (3, 1310.5, 1790.5)
    t.ended(facts, "answered", "caller hung up")
    assert "c-1" not in t.dead_air
    rec = records.show("c-1")
    assert rec is not None
    (turn,) = rec["turns"]
    assert turn["caller_text"] == "(keypad 54321)"
    assert turn["timings"] == {"dialogue": 0.2, "tts_first_audio": 180.0, "total": 240.5,
                               "barged_in": False, "input": "keypad", "keys": "54321"}  # fmt: skip
    assert rec["stats"]["dead_air_max_ms"] == 1310.5
    assert rec["stats"]["dead_air_total_ms"] == 1790.5
    kinds = {k: f for _, k, f in events}
    assert kinds["turn"]["input"] == "keypad" and kinds["turn"]["keys"] == "54321"
    assert kinds["turn"]["timings_ms"]["total"] == 240.5
    assert kinds["ended"]["stats"]["dead_air_max_ms"] == 1310.5
    assert t.metrics is not None
    total = t.metrics.registry.get_sample_value("sipbridge_dead_air_seconds_total")
    assert total == pytest.approx(1.7905)
    records.close()


def test_a_measured_call_whose_waits_were_all_answered_at_once_reads_zero(
    tmp_path: Path,
) -> None:
    """The agent says at the start that it measures dead air: a call with no gap in it is
    0 ms in the console and the record (not "not measured"), and no gap is observed."""
    records = CallRecords(tmp_path / "calls.sqlite")
    t = CallTelemetry("n1", records=records, metrics=BridgeMetrics())
    facts = CallFacts("c-1", "sip:alice@x", "sip:support@y", None, None, "voice", "1.2.3.4:5")
    t.offered(facts)
    t.answered(facts, "PCMU", "1.2.3.4:4000", "voice")
    t.dead_air_gap("c-1", DeadAir(None))
    tally = t.dead_air["c-1"]
    assert (tally.gaps, tally.longest_ms, tally.total_ms) == (0, 0.0, 0.0)
    t.ended(facts, "answered", "caller hung up")
    rec = records.show("c-1")
    assert rec is not None
    assert (rec["stats"]["dead_air_max_ms"], rec["stats"]["dead_air_total_ms"]) == (0.0, 0.0)
    assert t.metrics is not None
    get = t.metrics.registry.get_sample_value
    assert get("sipbridge_dead_air_gap_seconds_count") == 0  # no gap observed
    assert get("sipbridge_call_dead_air_longest_seconds_count") == 1  # a call that measured 0
    assert get("sipbridge_call_dead_air_longest_seconds_sum") == 0
    records.close()


def test_the_profile_that_answered_reaches_the_record_and_the_events(tmp_path: Path) -> None:
    """History, /api/history and MQTT name the voice agent's profile, not only "voice"."""
    from agent.dialogue.profile_loader import load_profile
    from sip_bridge.agents import profile_name

    class Voice:  # what the bridge reads of a voice agent: the profile it answers with
        profile = load_profile(Path(__file__).resolve().parents[1] / "config/agents/demo.toml")

    assert profile_name(Voice()) == "acme-demo"  # type: ignore[arg-type]
    assert profile_name(object()) == ""  # type: ignore[arg-type]
    events: list[tuple[str, str, dict[str, Any]]] = []
    records = CallRecords(tmp_path / "calls.sqlite")
    t = CallTelemetry("n1", records=records, events=lambda c, k, f: events.append((c, k, f)))
    facts = CallFacts("c-2", "sip:alice@x", "sip:support@y", None, None, "voice", "1.2.3.4:5")
    t.offered(facts)
    t.answered(facts, "PCMU", "1.2.3.4:4000", "voice", "acme-demo")
    t.ended(facts, "answered", "caller hung up")
    (row,) = records.list()
    assert (row["agent"], row["profile"]) == ("voice", "acme-demo")
    kinds = {k: f for _, k, f in events}
    assert kinds["answered"]["profile"] == kinds["ended"]["profile"] == "acme-demo"
    echo = CallFacts("c-3", "sip:bob@x", "sip:echo@y", None, None, "echo", "1.2.3.4:5")
    t.offered(echo)
    t.answered(echo, "PCMU", "1.2.3.4:4002", "echo")
    assert "profile" not in events[-1][2]  # a line check has none
    assert records.show("c-3")["call"]["profile"] is None  # type: ignore[index]
    records.close()

"""What a call's records and events keep of what the caller said and keyed: card numbers and a
sensitive slot's keys are masked before any sink sees them (CallTelemetry, records on disk,
an event sink standing in for MQTT)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agent.base import TurnCompleted
from sip_bridge import call_telemetry
from sip_bridge.call_telemetry import CallTelemetry
from sip_bridge.records import CallRecords

CARD = "4111111111111111"


class Sink:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def __call__(self, call_id: str, kind: str, fields: dict[str, Any]) -> None:
        self.events.append((call_id, kind, json.loads(json.dumps(fields))))

    def keys(self) -> str:
        return "".join(f["digit"] for _, k, f in self.events if k == "dtmf")


def _telemetry(tmp_path: Path) -> tuple[CallTelemetry, Sink]:
    sink = Sink()
    store = CallRecords(tmp_path / "calls.sqlite")
    store.call_started("c1", caller="sip:+15550100@pbx")
    return CallTelemetry("n1", records=store, events=sink), sink


def _timeline(t: CallTelemetry) -> list[tuple[str, Any]]:
    assert t.records is not None
    shown = t.records.show("c1")
    assert shown is not None
    return [(e["kind"], e["data"]) for e in shown["timeline"] if e["kind"] not in ("started",)]


def test_a_keyed_card_number_leaves_masked_and_in_order(tmp_path: Path) -> None:
    t, sink = _telemetry(tmp_path)
    for key in "1" + CARD + "#":
        t.dtmf("c1", key)
    assert sink.keys() == "1" + "*" * 16 + "#"
    masked = [f["masked"] for _, k, f in sink.events if k == "dtmf"]
    assert masked == [False] + [True] * 16 + [False]
    stored = "".join(d["digit"] for k, d in _timeline(t) if k == "dtmf")
    assert stored == sink.keys()


def test_other_keys_wait_for_the_run_to_end_and_keep_the_timeline_order(tmp_path: Path) -> None:
    t, sink = _telemetry(tmp_path)
    for key in "12345":
        t.dtmf("c1", key)
    assert sink.events == [], "held: they might be the start of a card number"
    t.turn("c1", TurnCompleted("thanks", "You're welcome.", {}))  # another event ends the run
    assert [k for _, k, _ in sink.events] == ["dtmf"] * 5 + ["turn"]
    assert sink.keys() == "12345"
    assert [k for k, _ in _timeline(t)] == ["dtmf"] * 5 + ["turn"]


def test_held_keys_go_out_after_the_gap_on_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(call_telemetry, "KEY_GAP_S", 0.05)
    t, sink = _telemetry(tmp_path)

    async def main() -> None:
        for key in "42":
            t.dtmf("c1", key)
        assert sink.events == []
        await asyncio.sleep(0.2)

    asyncio.run(main())
    assert sink.keys() == "42"


def test_keys_of_a_sensitive_slot_are_stars_at_once(tmp_path: Path) -> None:
    t, sink = _telemetry(tmp_path)
    t.dtmf("c1", "3")  # the menu key: held, then out unmasked before the first masked one
    for key in "1234":  # a PIN: not a card number, masked all the same
        t.dtmf("c1", key, sensitive=True)
    assert sink.keys() == "3****"
    assert [f["masked"] for _, _, f in sink.events] == [False, True, True, True, True]


def test_turns_and_operator_texts_keep_no_card_number(tmp_path: Path) -> None:
    t, sink = _telemetry(tmp_path)
    said = "my card is four one one one one one one one one one one one one one one one"
    assert t.turn("c1", TurnCompleted(said, "Sorry, I didn't catch that.", {"asr_tail": 20.0}))
    assert not t.turn("c1", TurnCompleted("order 12345", "It shipped.", {}))
    t.operator("c1", "say", "alice", "http", text=f"Your card {CARD} was charged.")
    texts = json.dumps(sink.events) + json.dumps(_timeline(t))
    assert "one one one" not in texts and CARD not in texts
    assert texts.count("[redacted 16 digits]") == 4  # turn and say, in the sink and on disk
    assert "order 12345" in texts  # other numbers stay
    assert t.recent_turns["c1"][0].caller_text == "my card is [redacted 16 digits]"
    (op,) = [d for k, d in _timeline(t) if k == "operator"]
    assert op["by"] == "alice" and op["via"] == "http" and op["action"] == "say"


def test_nothing_is_masked_when_redaction_is_off(tmp_path: Path) -> None:
    t, sink = _telemetry(tmp_path)
    t.redact = False
    for key in CARD:
        t.dtmf("c1", key)
    assert sink.keys() == CARD
    assert not t.turn("c1", TurnCompleted(CARD, "", {}))

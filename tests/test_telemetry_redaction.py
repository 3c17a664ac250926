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
from sip_bridge.ops import call_telemetry
from sip_bridge.ops.call_telemetry import CallTelemetry
from sip_bridge.ops.records import CallRecords

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


# -- keypad turns (issue 15) and the keys in them ----------------------------------------------


def _keyed(keys: str, text: str | None = None) -> TurnCompleted:
    """A keypad turn as the voice agent reports it."""
    shown = f"(keypad {keys})" if text is None else text
    return TurnCompleted(shown, "Sorry, I didn't catch that.", {"total": 120.0}, input="keypad",
                         keys=keys)  # fmt: skip


def _turns(sink: Sink) -> list[tuple[str, str]]:
    return [(f["caller_text"], f["keys"]) for _, k, f in sink.events if k == "turn"]


def test_a_card_keyed_one_menu_key_per_turn_leaves_no_turn_with_its_digits(
    tmp_path: Path,
) -> None:
    """Every menu key is a turn, reported when the next key cuts its reply short: the
    turns wait for their keys' verdict, and go to every sink masked, after their keys."""
    t, sink = _telemetry(tmp_path)
    for i, key in enumerate(CARD):
        t.dtmf("c1", key)
        if i:
            t.turn("c1", _keyed(CARD[i - 1]))
    assert _turns(sink) == [], "held with their keys"
    t.turn("c1", TurnCompleted("thanks", "You're welcome.", {}))  # the run is over
    t.turn("c1", _keyed(CARD[-1]))
    masked = ("(keypad [redacted 1 digit])", "*")
    assert _turns(sink) == [masked] * 15 + [("thanks", ""), masked]
    # each turn right after its key: the timeline's order
    assert [k for _, k, _ in sink.events] == ["dtmf", "turn"] * 15 + ["dtmf", "turn", "turn"]
    stored = json.dumps(_timeline(t)) + json.dumps(t.recent_turns["c1"], default=repr)
    assert "(keypad 1)" not in stored and "(keypad 4)" not in stored
    assert sink.keys() == "*" * 16


def test_a_card_keyed_into_an_entry_is_masked_and_other_entries_stay(tmp_path: Path) -> None:
    t, sink = _telemetry(tmp_path)
    for key in "54321#":
        t.dtmf("c1", key)
    t.turn("c1", _keyed("54321"))
    for key in CARD + "#":  # an account slot that is not sensitive: the Luhn rule masks it
        t.dtmf("c1", key)
    assert t.turn("c1", _keyed(CARD)), "a card number: the recording's caller side is blanked"
    assert _turns(sink) == [("(keypad 54321)", "54321"), ("(keypad [redacted 16 digits])",
                                                           "*" * 16)]  # fmt: skip
    assert sink.keys() == "54321#" + "*" * 16 + "#"
    assert CARD not in json.dumps(_timeline(t))


def test_a_sensitive_entry_reported_masked_goes_out_as_it_is(tmp_path: Path) -> None:
    t, sink = _telemetry(tmp_path)
    t.dtmf("c1", "3")
    t.turn("c1", _keyed("3"))
    for key in "1234":  # a PIN: the agent asked for a sensitive slot
        t.dtmf("c1", key, sensitive=True)
    t.turn("c1", _keyed("****", "[redacted 4 digits]"))  # as the voice agent reports it
    assert _turns(sink) == [("(keypad 3)", "3"), ("[redacted 4 digits]", "****")]
    assert sink.keys() == "3****"


def test_held_keypad_turns_go_out_when_the_call_ends(tmp_path: Path) -> None:
    t, sink = _telemetry(tmp_path)
    t.dtmf("c1", "2")
    t.turn("c1", _keyed("2"))
    assert _turns(sink) == []
    t.ended(call_telemetry.CallFacts("c1", "", "", None, None, "", ""), "answered", "bye")
    assert _turns(sink) == [("(keypad 2)", "2")]
    assert [k for _, k, _ in sink.events][:2] == ["dtmf", "turn"]

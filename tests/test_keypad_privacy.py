"""Keypad turns through the voice agent into the call's record: what a caller keys for a
sensitive slot, or keys as a card number anywhere, is stored, published and shown masked.

The voice agent runs on the fake models of tests/test_voice_agent.py; around it, what the
bridge does with one call (sip_bridge.server, CallMedia): each key goes to
:class:`CallTelemetry` first, with the agent's ``sensitive`` state it was typed in, then to
the agent; every turn the agent reports goes to the telemetry. The telemetry writes a real
call store (SQLite) and an event sink standing in for MQTT; its live turns are what the
console shows. The real SIP call with real models is tests/test_card_privacy_call.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from test_telemetry_redaction import Sink
from test_voice_agent import Call, aio

from agent.base import AgentEvent, DtmfEvent, TurnCompleted
from sip_bridge.ops.call_telemetry import CallFacts, CallTelemetry
from sip_bridge.ops.records import CallRecords

CARD = "4111111111111111"  # the standard test card; the demo's cards table knows it
CALL = "call-1"
# eight digits of the card in order, whatever stands between them (the agent spells them;
# fewer would match times and timings: the store holds unix times such as 1764111...)
LEAK = re.compile(r"4\W{0,3}(?:1\W{0,3}){7}|(?:1\W{0,3}){7}1")
APPROVED = "Thank you. Your payment with your Visa card"

ACCOUNT = """
[agent]
name = "accounts"
greeting = "Press 5 for your account."
[slots.account]
type = "digits"
min_length = 4
max_length = 19
prompt = "Type your account number, then press hash."
[intents.account]
dtmf = "5"
slots = ["account"]
reply = "Account {account:spell}. Anything else?"
"""


class Bridge:
    """One call's keys and turns, handled in the bridge's order around ``c.agent``."""

    def __init__(self, c: Call, tmp_path: Path) -> None:
        self.c = c
        self.store = CallRecords(tmp_path / "calls.sqlite")
        self.store.call_started(CALL, caller="sip:+15550100@pbx")
        self.sink = Sink()
        self.telemetry = CallTelemetry("n1", records=self.store, events=self.sink)
        emit = c.out.emit

        def reported(event: AgentEvent) -> None:
            emit(event)
            if isinstance(event, TurnCompleted):
                self.telemetry.turn(CALL, event)

        c.out.emit = reported  # type: ignore[method-assign]

    async def press(self, keys: str, ticks: int = 8) -> None:
        """Keys about 160 ms apart; each recorded before the agent hears it (CallMedia)."""
        for k in keys:
            self.telemetry.dtmf(CALL, k, "rfc4733", self.c.agent.sensitive)
            self.c.agent.on_event(DtmfEvent(k, 100.0))
            await self.c.tick(ticks)

    def end(self) -> dict[str, Any]:
        """The call ends: its record, as ``sip-bridge calls show`` reads it."""
        facts = CallFacts(CALL, "sip:+15550100@pbx", "sip:support@pbx", None, None, "voice", "")
        self.telemetry.ended(facts, "answered", "caller hung up")
        shown = self.store.show(CALL)
        self.store.close()
        assert shown is not None
        return shown


def _keyed(shown: dict[str, Any]) -> list[tuple[str, str]]:
    """The record's keypad turns: (caller text, keys)."""
    return [(t["caller_text"], t["timings"]["keys"]) for t in shown["turns"]
            if t["timings"].get("input") == "keypad"]  # fmt: skip


def _dtmf(shown: dict[str, Any]) -> str:
    return "".join(e["data"]["digit"] for e in shown["events"] if e["kind"] == "dtmf")


def _published(sink: Sink) -> list[tuple[str, str]]:
    return [(f["caller_text"], f["keys"]) for _, k, f in sink.events
            if k == "turn" and f["input"] == "keypad"]  # fmt: skip


def _no_card_left(tmp_path: Path, *texts: str) -> None:
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("calls.sqlite*")).decode("latin-1")
    for text in (*texts, raw):
        assert LEAK.findall(text) == []


@aio
async def test_a_card_keyed_for_the_sensitive_slot_is_stored_as_how_many_keys(
    tmp_path: Path,
) -> None:
    """Menu key 3, the card keyed into the demo's sensitive payment slot, then menu key 2
    and an order number typed with '#': the card's turn is ``[redacted 16 digits]`` with 16
    '*' keys in the record, the events and the console; the other keypad turns as keyed."""
    async with Call() as c:
        b = Bridge(c, tmp_path)
        await b.press("3")
        await c.until(lambda: c.agent.sensitive, "the card asked for")
        await c.drain()
        await b.press(CARD, ticks=2)
        await c.until(lambda: not c.agent.sensitive, "the slot filled")
        await c.drain()
        assert c.models.spoken[-1].startswith(APPROVED)  # the engine got the real number
        console = [(t.caller_text, t.keys) for t in b.telemetry.recent_turns[CALL]]
        assert console == [("(keypad 3)", "3"), ("[redacted 16 digits]", "*" * 16)]
        await b.press("2")
        await c.drain()
        await b.press("54321#")
        await c.until(lambda: c.models.spoken[-1].startswith("Order 5 4 3 2 1"), "the order")
        await c.drain()
        engine_saw = list(c.transcript)
        assert c.agent.turns[1].text == f"(keypad {CARD})"  # the agent's own view only
    shown = b.end()
    expected = [
        ("(keypad 3)", "3"),
        ("[redacted 16 digits]", "*" * 16),
        ("(keypad 2)", "2"),
        ("(keypad 54321)", "54321"),
    ]
    assert _keyed(shown) == expected
    assert _published(b.sink) == expected
    assert _dtmf(shown) == "3" + "*" * 16 + "2" + "54321#"
    masked = [e["data"]["masked"] for e in shown["events"] if e["kind"] == "dtmf"]
    assert masked == [False] + [True] * 16 + [False] * 7
    assert ("caller", "[redacted 16 digits]") in engine_saw  # what an LLM would read
    _no_card_left(tmp_path, json.dumps(shown), json.dumps(b.sink.events), repr(engine_saw))


@aio
async def test_a_card_keyed_one_menu_key_at_a_time_leaves_no_turn_with_a_digit_of_it(
    tmp_path: Path,
) -> None:
    """No slot asks: the caller keys the card at the menu, every key a turn whose reply the
    next key cuts short. Each turn waits for its key's verdict and is stored masked."""
    async with Call() as c:
        b = Bridge(c, tmp_path)
        await b.press(CARD)
        await c.drain()
        assert len(c.agent.turns) == 16 and c.agent.turns[0].text == "(keypad 4)"
    shown = b.end()
    one = ("(keypad [redacted 1 digit])", "*")
    assert _keyed(shown) == [one] * 16
    assert _published(b.sink) == [one] * 16
    assert _dtmf(shown) == "*" * 16
    _no_card_left(tmp_path, json.dumps(shown), json.dumps(b.sink.events))


@aio
async def test_a_card_keyed_into_an_ordinary_entry_is_masked_and_other_entries_are_not(
    tmp_path: Path,
) -> None:
    """An account slot that is not sensitive: an account number is kept as keyed; a card
    number typed into it is masked by the card rule (``[records] redact_card_numbers``), in
    the turn's keys and both texts (the agent spells it back)."""
    profile = tmp_path / "accounts.toml"
    profile.write_text(ACCOUNT)
    async with Call(profile) as c:
        b = Bridge(c, tmp_path)
        await b.press("5")
        await c.drain()
        await b.press("98765#", ticks=2)
        await c.until(lambda: c.models.spoken[-1].startswith("Account 9 8"), "the account")
        await c.drain()
        await b.press("5")
        await c.drain()
        await b.press(CARD + "#", ticks=2)
        await c.until(lambda: c.models.spoken[-1].startswith("Account 4 1"), "the card")
        await c.drain()
    shown = b.end()
    # (menu key 5: no Luhn-valid stretch holds it with the card's digits; a key that one
    # does, such as 3, is masked with them, its turn as its dtmf event)
    assert _keyed(shown) == [
        ("(keypad 5)", "5"),
        ("(keypad 98765)", "98765"),
        ("(keypad 5)", "5"),
        ("(keypad [redacted 16 digits])", "*" * 16),
    ]
    assert _dtmf(shown) == "598765#5" + "*" * 16 + "#"
    (agent_said,) = [t["agent_text"] for t in shown["turns"] if "16" in t["caller_text"]]
    assert agent_said.startswith("Account [redacted 16 digits]"), agent_said
    _no_card_left(tmp_path, json.dumps(shown), json.dumps(b.sink.events))

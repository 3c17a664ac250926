"""VoiceAgent with fake models: keypad turns, transfer ringback, fillers and dead air.

The harness of tests/test_voice_agent.py (fake VAD, ASR and TTS; the agent driven tick by
tick). What a caller would notice is checked: a '#' after a complete entry and a key the
menu ignores do not cut the agent off; every keypad turn is reported with what was keyed
and its latency; after a transfer's reply the caller hears ringback until the outcome is
known; a wait the agent fills once it reaches the profile's filler_after_ms.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
from test_voice_agent import (
    FRAME,
    GREETING,
    HOURS,
    Call,
    _len8k,
    _rms,
    _ticks,
    aio,
)

from agent.base import (
    DtmfEvent,
    HangupEvent,
    PauseAgent,
    ResumeAgent,
    TransferRequest,
    TransferResult,
    TurnCompleted,
)
from agent.dialogue.profile import Filler
from agent.dialogue.sentences import split_sentences

PROMPT = "What is your order number? You can say it or type it, then press hash."
PACKED = "Order 5 4 3 2 1 is being packed and ships tomorrow."
PUT_THROUGH = "Sure, I'm putting you through to a colleague. Please hold."


def _turns(c: Call) -> list[TurnCompleted]:
    return [e for _, e in c.out.of("emit") if isinstance(e, TurnCompleted)]


def _tone_power(pcm: np.ndarray, freq: float) -> float:
    n = np.arange(pcm.size)
    return float(abs(np.dot(pcm.astype(np.float64), np.exp(-2j * np.pi * freq * n / 8000))))


async def _keys(c: Call, keys: str, ticks_between: int = 8) -> None:
    """Keys as a caller presses them: about 160 ms apart (RFC 4733 ends arrive like that)."""
    for k in keys:
        c.agent.on_event(DtmfEvent(k, 100.0))
        await c.tick(ticks_between)


@aio
async def test_order_number_typed_then_hash_is_answered_in_full() -> None:
    async with Call() as c:
        await _keys(c, "2", 1)
        await c.until(lambda: c.models.spoken[-1] == PROMPT, "the prompt's TTS")
        await c.drain()
        n = len(c.out.writes)
        await _keys(c, "5432", 8)
        assert len(c.out.writes) == n and c.out.flushes == []  # typing: nothing said
        c.agent.on_event(DtmfEvent("1"))  # the 5th digit: the slot is complete
        await c.until(lambda: c.models.spoken[-1] == PACKED, "the answer's TTS")
        await c.until(lambda: c.agent.playout.playing, "the answer's audio")
        await c.tick(8)  # the answer is playing ...
        assert c.agent.playout.playing
        c.agent.on_event(DtmfEvent("#"))  # ... when the caller presses hash as told
        await c.drain()
        assert c.out.flushes == []  # the answer was not cut
        assert c.out.written(n).size == _len8k(split_sentences(PACKED))
        assert c.transcript[-2:] == [("caller", "(keypad 54321)"), ("agent", PACKED)]
        menu, entry = _turns(c)[-2:]
        assert (menu.input, menu.keys, menu.caller_text) == ("keypad", "2", "(keypad 2)")
        assert (entry.input, entry.keys, entry.agent_text) == ("keypad", "54321", PACKED)
        assert not entry.barged_in
        assert set(entry.stages_ms) == {"dialogue", "tts_first_audio", "total"}
        assert 0 < entry.stages_ms["total"] < 2000  # key -> first reply audio
        assert c.agent.turns[-1].keys == "54321" and c.agent.turns[-1].reason == "keypad length"


@aio
async def test_keys_the_menu_ignores_do_not_stop_the_greeting() -> None:
    async with Call(greeted=False) as c:
        await c.tick(10)
        await _keys(c, "#*AD", 3)
        await c.drain()
        assert c.out.flushes == [] and _turns(c) == []
        assert c.out.written().size == _len8k(GREETING)  # all of it
        assert c.transcript == [("agent", " ".join(GREETING))]


@aio
async def test_a_menu_key_still_stops_the_greeting() -> None:
    async with Call(greeted=False) as c:
        await c.tick(10)
        c.agent.on_event(DtmfEvent("1"))
        assert c.out.flushes == [10]
        await c.until(lambda: c.models.spoken[-1] == HOURS, "the hours' TTS")
        await c.drain()
        (turn,) = _turns(c)
        assert turn.keys == "1" and turn.agent_text == HOURS


@aio
async def test_typing_ahead_during_the_prompt_does_not_cut_it_until_the_entry_is_done() -> None:
    async with Call() as c:
        c.agent.on_event(DtmfEvent("2"))
        await c.until(lambda: c.models.spoken[-1] == PROMPT, "the prompt's TTS")
        await c.tick(10)
        await _keys(c, "5432", 4)  # while the prompt plays
        assert c.out.flushes == []
        c.agent.on_event(DtmfEvent("1"))
        assert len(c.out.flushes) == 1  # the finished entry is a turn: the prompt stops
        await c.until(lambda: c.models.spoken[-1] == PACKED, "the answer's TTS")
        await c.drain()
        assert _turns(c)[-1].keys == "54321"


VARIABLE = """
[agent]
greeting = "Hi."
filler = ""
filler_tone_hz = 0
[slots.account]
type = "digits"
min_length = 4
max_length = 8
digit_timeout_s = 1
prompt = "Your account number."
[intents.account]
dtmf = "3"
slots = ["account"]
reply = "Account {account:spell}."
"""


@aio
async def test_a_variable_length_entry_ends_after_the_inter_digit_timeout(tmp_path: Path) -> None:
    profile = tmp_path / "variable.toml"
    profile.write_text(VARIABLE)
    async with Call(profile) as c:
        c.agent.on_event(DtmfEvent("3"))
        await c.drain()
        await _keys(c, "98765", 2)
        last_key = time.monotonic()
        assert c.models.spoken[-1] == "Your account number."
        while c.models.spoken[-1] != "Account 9 8 7 6 5." and time.monotonic() - last_key < 3:
            await c.tick()
            await asyncio.sleep(0.01)
        waited = time.monotonic() - last_key
        assert c.models.spoken[-1] == "Account 9 8 7 6 5."
        assert 0.9 <= waited <= 1.6, waited  # digit_timeout_s = 1
        await c.drain()
        turn = _turns(c)[-1]
        assert turn.keys == "98765" and c.agent.turns[-1].reason == "keypad timeout"


def _after(c: Call, tick: int) -> np.ndarray:
    """Everything written after ``tick``, as one array."""
    parts = [w for t, w in c.out.writes if t > tick]
    return np.concatenate(parts) if parts else np.zeros(0, np.int16)


async def _transfer(c: Call) -> tuple[TransferRequest, int]:
    """Press 0 (the demo's "a person"), let the reply play: the REFER and its tick."""
    c.agent.on_event(DtmfEvent("0"))
    await c.until(lambda: c.models.spoken[-1] == PUT_THROUGH, "the reply's TTS")
    await c.until(lambda: c.agent.playout.playing, "the reply's audio")
    for _ in range(_ticks(split_sentences(PUT_THROUGH)) + 200):  # (a slow TTS thread: later)
        asked = [(t, e) for t, e in c.out.of("emit") if isinstance(e, TransferRequest)]
        if asked:
            return asked[0][1], asked[0][0]
        await c.tick()
    raise AssertionError("no transfer asked for")


@aio
async def test_ringback_follows_the_transfer_reply_until_the_outcome() -> None:
    async with Call() as c:
        request, at = await _transfer(c)
        await c.tick(150)  # 3 s: a ringback burst (2 s) and the start of its pause
        ring = _after(c, at)
        assert ring.size >= 149 * FRAME  # a frame every tick from the next one on
        on = ring[: 2 * 8000 - FRAME]
        assert _tone_power(on, 440) > 20 * _tone_power(on, 1000)
        assert _tone_power(on, 480) > 20 * _tone_power(on, 1000)
        level = 20 * np.log10(_rms(on) / 32768)
        assert -21 < level < -17  # two tones at -22 dBFS each
        assert _rms(ring[2 * 8000 + FRAME : 2 * 8000 + 40 * FRAME]) == 0  # the cadence's off time
        # no dead air between the reply and the ringback, nor in the cadence
        assert all(ms <= 60 for _, ms in c.out.dead_air), c.out.dead_air
        assert c.out.dead_air_from == 0  # measured from the answer, gaps or none
        # the target is busy: ringback stops, the apology plays, then nothing more
        n = len(c.out.writes)
        c.agent.on_event(TransferResult(request.target, "failed", 486))
        sorry = "Sorry, nobody is free right now. Is there anything else I can help with?"
        await c.until(lambda: c.models.spoken[-1] == sorry, "the apology's TTS")
        await c.drain()
        after = c.out.written(n)
        assert after.size <= _len8k(split_sentences(sorry)) + FRAME  # at most one ring frame
        n = len(c.out.writes)
        await c.tick(20)
        assert len(c.out.writes) == n  # quiet: the caller's turn, no more ringback
        assert c.transcript[-1] == ("agent", sorry)


@aio
async def test_hold_audio_loops_instead_of_ringback_and_stops_on_success() -> None:
    music = (3000 * np.sin(2 * np.pi * 700 * np.arange(4000) / 8000)).astype(np.int16)
    async with Call(hold_audio=music) as c:
        request, at = await _transfer(c)
        await c.tick(60)
        held = _after(c, at)
        assert held.size >= 59 * FRAME
        loops = np.tile(music, 3)
        assert np.array_equal(held[:5000], loops[:5000])  # from its start, and it wraps around
        c.agent.on_event(TransferResult(request.target, "succeeded", 200))
        n = len(c.out.writes)
        await c.tick(10)
        assert len(c.out.writes) == n  # connected elsewhere: we fall silent


@aio
async def test_a_slow_answer_gets_the_filler_before_1_5_s_of_silence() -> None:
    filler = Filler(text="One moment.", tone_hz=440, after_ms=300)
    c = Call(filler=filler)
    async with c:
        await c.until(lambda: c.agent.flow.phrase is not None, "the filler's TTS")
        first = split_sentences(HOURS, first_max_words=6)[0]
        c.models.hold = {first}  # the answer's TTS is slow
        i = await c.turn("what are your hours", wait_tts=False)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.6:
            await c.tick()
            await asyncio.sleep(0.005)
        said = c.out.written(i)
        assert said.size >= _len8k(["One moment."]) - FRAME, "no filler"
        c.models.release.set()
        await c.drain()
        assert c.agent.flow.fillers >= 1
        assert c.transcript[-1][1].startswith("One moment. We're open")  # as heard
        assert c.out.dead_air, "no wait measured"
        # the waits were cut at filler_after_ms (plus a tick or two of scheduling)
        assert max(ms for _, ms in c.out.dead_air) < 300 + 200, c.out.dead_air


@aio
async def test_the_caller_hanging_up_on_dead_air_is_counted() -> None:
    async with Call() as c:
        c.models.hold = {split_sentences(HOURS, first_max_words=6)[0]}
        await c.turn("what are your hours", wait_tts=False)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.2:
            await c.tick()
            await asyncio.sleep(0.01)
        c.agent.on_event(HangupEvent("caller hung up"))
        ((_, ms),) = c.out.dead_air
        assert 1100 < ms < 2500, ms
        c.models.release.set()


@aio
async def test_keys_while_an_operator_has_the_call_are_not_the_agents() -> None:
    async with Call() as c:
        c.agent.on_event(PauseAgent())
        n = len(c.out.writes)
        c.agent.on_event(DtmfEvent("1"))
        await c.tick(20)
        assert len(c.out.writes) == n and _turns(c) == [] and c.agent.engine is not None
        assert c.agent.engine.turns == 0
        c.agent.on_event(ResumeAgent())
        c.agent.on_event(DtmfEvent("1"))
        await c.until(lambda: c.models.spoken[-1] == HOURS, "the hours' TTS")

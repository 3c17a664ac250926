"""Card numbers and sensitive input: found in text written or spoken, and in keys pressed one
by one, and replaced by what may be kept (agent.redaction, no I/O)."""

from __future__ import annotations

import random

import pytest

from agent.redaction import (
    HeldKey,
    KeypadRun,
    KeypadTurns,
    card_mask,
    count_digits,
    luhn_valid,
    mask_card_keys,
    redact_card_numbers,
    sensitive_text,
)

VISA = "4111111111111111"  # the standard test cards
MASTERCARD = "5555555555554444"
AMEX = "378282246310005"  # 15 digits
DINERS = "30569309025904"  # 14


def _luhn_digit(body: str) -> str:
    """The check digit that makes ``body`` + it Luhn-valid."""
    return next(d for d in "0123456789" if luhn_valid(body + d))


@pytest.mark.parametrize("number", [VISA, MASTERCARD, AMEX, DINERS, "4222222222222"])
def test_test_cards_pass_luhn_and_one_changed_digit_fails(number: str) -> None:
    assert luhn_valid(number)
    wrong = number[:-1] + str((int(number[-1]) + 1) % 10)
    assert not luhn_valid(wrong)


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (f"my card is {VISA} thanks", "my card is [redacted 16 digits] thanks"),
        ("my card is 4111 1111 1111 1111.", "my card is [redacted 16 digits]."),
        ("4111-1111-1111-1111", "[redacted 16 digits]"),
        ("It's 5555, 5555, 5555, 4444", "It's [redacted 16 digits]"),
        (f"amex {AMEX} and diners {DINERS}",
         "amex [redacted 15 digits] and diners [redacted 14 digits]"),
        # spoken, as an ASR writes it, digit by digit or in pairs
        ("four " + "one " * 14 + "one", "[redacted 16 digits]"),
        ("Four, one, one, one. One one one one, one one one one, one one one one.",
         "[redacted 16 digits]."),
        ("forty-one eleven eleven eleven eleven eleven eleven eleven", "[redacted 16 digits]"),
        ("four one double one one one triple one " + "one " * 6 + "one", "[redacted 16 digits]"),
        # a menu key before it: the run is 17 keys, the card 16 of them
        (f"1 {VISA}", "1 [redacted 16 digits]"),
        # "for" is a 4 only between digits: the words around stay
        ("card number for four one one one one one one one one one one one one one one one",
         "card number for [redacted 16 digits]"),
    ],
)  # fmt: skip
def test_card_numbers_written_or_spoken_are_masked(text: str, kept: str) -> None:
    out, found = redact_card_numbers(text)
    assert out == kept and found >= 1


@pytest.mark.parametrize(
    "text",
    [
        "order 12345 please",
        "call me on +44 20 7946 0958",  # 12 digits: too short for a card
        "4111 1111 1111 2",  # 13 digits, not Luhn-valid
        "paid 1764111111.25 at 10.5",  # decimals are not groups of a number
        "at 10:11:12 on 2026-11-25",
        "one two three four five",
        "I have four kids and one dog",
        "",
    ],
)
def test_other_numbers_and_words_stay(text: str) -> None:
    assert redact_card_numbers(text) == (text, 0)


def test_a_long_run_is_masked_where_a_card_lies_in_it() -> None:
    digits = "99" + VISA + "9"  # 19 digits, the card inside
    mask = card_mask(digits)
    assert any(mask[2:18]) and redact_card_numbers(digits)[1] == 1
    assert card_mask("7" * 200) == [True] * 200  # nobody keys that much: all of it


def test_random_twelve_digit_numbers_are_never_touched() -> None:
    rng = random.Random(7)
    for _ in range(500):
        n = "".join(rng.choice("0123456789") for _ in range(12))
        assert redact_card_numbers(f"ref {n}") == (f"ref {n}", 0)


def test_random_card_numbers_with_a_check_digit_are_always_masked() -> None:
    rng = random.Random(11)
    for length in range(13, 20):
        body = "".join(rng.choice("0123456789") for _ in range(length - 1))
        card = body + _luhn_digit(body)
        out, found = redact_card_numbers(f"the number is {card} ok")
        assert found == 1 and card not in out and out.endswith("ok"), (card, out)


def test_sensitive_text_keeps_only_how_many_digits() -> None:
    assert sensitive_text("four one one one 1111") == "[redacted 8 digits]"
    assert sensitive_text("(keypad 1234)") == "[redacted 4 digits]"
    assert sensitive_text("um") == "[redacted 0 digits]"
    assert sensitive_text("7") == "[redacted 1 digit]"
    assert count_digits("double five, oh nine") == 4  # "55", "09": "oh" between digits


def _press(run: KeypadRun, keys: str, t0: float = 0.0) -> list[tuple[str, bool]]:
    out = []
    for i, k in enumerate(keys):
        out += [(key.digit, masked) for key, masked in run.push(HeldKey(k, t0 + 0.3 * i))]
    return out


def test_keys_of_a_card_number_leave_masked_and_others_unmasked() -> None:
    run = KeypadRun(gap_s=4.0)
    out = _press(run, "1" + VISA + "#")  # a menu key, the card, then hash
    assert [d for d, _ in out] == list("1" + VISA + "#"), "in order, every key"
    assert [m for _, m in out] == [False] + [True] * 16 + [False]
    assert not run.holding


def test_keys_are_held_until_their_card_stretches_are_known() -> None:
    run = KeypadRun(gap_s=4.0)
    out = _press(run, "12345")
    assert out == [] and run.holding and run.deadline == pytest.approx(1.2 + 4.0)
    assert run.due(3.0) == []  # still within the gap
    late = run.due(5.2)
    assert [(k.digit, m) for k, m in late] == [(d, False) for d in "12345"]
    # a long run releases from its front as soon as 18 more keys came after a key
    out = _press(run, "0" * 30, t0=10.0)
    assert len(out) == 30 - 18 and run.holding


def test_keys_pressed_apart_are_not_one_number() -> None:
    """The card's halves with a pause longer than the gap between them: two runs of 8."""
    run = KeypadRun(gap_s=4.0)
    first = _press(run, VISA[:8])
    first += [(k.digit, m) for k, m in run.due(100.0)]
    second = _press(run, VISA[8:], t0=200.0) + [(k.digit, m) for k, m in run.flush()]
    assert not any(m for _, m in first + second)


# -- keypad turns (a menu key, an entry): their keys as the run judged them ---------------------


def test_an_entry_holding_a_card_number_is_masked_where_the_card_is() -> None:
    assert mask_card_keys("54321") == ("54321", 0)
    assert mask_card_keys(VISA) == ("*" * 16, 16)
    assert mask_card_keys("5" + VISA + "#") == ("5" + "*" * 16 + "#", 16)


def test_a_card_keyed_one_menu_key_at_a_time_masks_every_turn_of_it() -> None:
    """16 menu keys, 16 keypad turns, each reported when the next key barged in on its
    reply: each turn waits for its key's verdict, and every one of them is masked."""
    run, turns = KeypadRun(), KeypadTurns[str]()
    out: list[tuple[str, list[bool]]] = []
    for i, k in enumerate(VISA):
        seq = turns.pressed(k)
        released = run.push(HeldKey(k, 0.3 * i, seq=seq))
        if i:  # this key barged in on the reply to the one before: that turn is reported
            out += turns.add(VISA[i - 1], f"turn {i - 1}")
        for key, masked in released:
            out += turns.released(key.seq, masked)
    assert out == [] and turns.waiting, "no verdict yet: a card number may be under way"
    for key, masked in run.flush():  # the run ends (a pause, another event)
        out += turns.released(key.seq, masked)
    out += turns.add(VISA[-1], "turn 15")
    assert [t for t, _ in out] == [f"turn {i}" for i in range(16)], "in order"
    assert all(mask == [True] for _, mask in out)


def test_a_keypad_turn_claims_its_own_keys_not_later_ones() -> None:
    """'2' at the menu, then 54321 typed during the prompt: the menu key's turn is reported
    after all six keys (the entry's last key stops the prompt), and claims the first '2'."""
    turns = KeypadTurns[str]()
    seqs = [turns.pressed(k) for k in "254321"]
    assert turns.add("2", "menu") == []
    assert turns.add("54321", "entry") == []
    out = [x for s in seqs for x in turns.released(s, s == 4)]  # only the entry's '2' masked
    assert out == [("menu", [False]), ("entry", [False, False, False, True, False])]


def test_keys_no_turn_claims_are_passed_over_and_a_turn_without_digits_leaves_at_once() -> None:
    turns = KeypadTurns[str]()
    for k in "12":  # typed, then cleared with '*' (no turn)
        turns.released(turns.pressed(k), False)
    seqs = [turns.pressed(k) for k in "12345"]
    assert turns.add("12345", "entry") == []
    assert turns.add("*" * 16, "sensitive") == []  # behind the entry, in order
    for s in seqs[:-1]:
        assert turns.released(s, False) == []
    assert turns.released(seqs[-1], False) == [
        ("entry", [False] * 5),
        ("sensitive", []),
    ]
    assert turns.add("*", "a bound '*' key") == [("a bound '*' key", [])]


def test_turns_left_waiting_at_the_end_of_the_call_count_as_masked() -> None:
    turns = KeypadTurns[str]()
    turns.pressed("4")
    turns.add("4", "menu")
    assert turns.drain() == [("menu", [True])] and not turns.waiting

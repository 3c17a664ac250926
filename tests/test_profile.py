"""Agent profiles: the demo loads, and every operator mistake names file, line and key."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from agent.dialogue.profile import ProfileError, parse_template
from agent.dialogue.profile_loader import load_profile

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "config" / "agents" / "demo.toml"

MINIMAL = """\
[agent]
greeting = "Hello {caller}."

[intents.hours]
keywords = ["hours"]
reply = "We're open {hours}."

[variables]
hours = "9 to 5"
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "agent.toml"
    p.write_text(text)
    return p


def test_demo_profile_loads_with_its_intents_slots_and_orders() -> None:
    prof = load_profile(DEMO)
    assert prof.name == "acme-demo"
    names = {i.name for i in prof.intents}
    assert {"hours", "order_status", "cancel_order", "human", "goodbye"} <= names
    assert {i.dtmf: i.name for i in prof.intents if i.dtmf} == {
        "1": "hours",
        "2": "order_status",
        "3": "pay_bill",
        "0": "human",
    }
    assert prof.slots["payment"].sensitive and prof.slots["payment"].max_length == 16
    assert prof.slots["order_number"].kind == "digits"
    assert (prof.slots["order_number"].min_length, prof.slots["order_number"].max_length) == (5, 5)
    assert prof.slots["confirm"].kind == "yes_no"
    assert "shipped" in prof.data["orders"]["12345"]["status"]
    assert prof.greeting.render(prof.variables).startswith("Thanks for calling Acme Support")
    assert prof.llm is None  # mode = "off" in the demo
    assert prof.limits.max_turns == 20 and prof.limits.max_call_s == 300
    assert (prof.limits.no_input_s, prof.limits.no_input_prompts) == (8, 2)
    assert prof.limits.no_input_reply.render(prof.variables) == "Are you still there?"
    assert "Thanks for calling Acme" in prof.limits.no_input_goodbye.render(prof.variables)
    assert prof.fallback.escalate_after == 3
    assert prof.fallback.escalate_transfer.startswith("sip:")
    assert prof.barge_in.enabled and prof.barge_in.min_speech_ms == 250
    assert prof.voice.length_scale == 1.0


def test_minimal_profile_gets_defaults(tmp_path: Path) -> None:
    prof = load_profile(_write(tmp_path, MINIMAL))
    assert prof.name == "agent"  # the file name
    assert prof.llm is None and prof.limits.max_turns == 0
    assert prof.limits.no_input_s == 0  # never asks a silent caller unless told to
    assert prof.greeting.render({"caller": "Ann"}) == "Hello Ann."
    assert prof.intents[0].then.reply.render(prof.variables) == "We're open 9 to 5."


def test_backchannels_default_listed_or_off(tmp_path: Path) -> None:
    default = load_profile(_write(tmp_path, MINIMAL)).barge_in.backchannels
    assert ("uh", "huh") in default and ("okay",) in default and ("yes",) not in default
    own = MINIMAL + '[barge_in]\nbackchannels = ["Uh-huh", "you bet"]\n'
    assert load_profile(_write(tmp_path, own)).barge_in.backchannels == (
        ("uh", "huh"),
        ("you", "bet"),
    )
    off = MINIMAL + "[barge_in]\nbackchannels = []\n"
    assert load_profile(_write(tmp_path, off)).barge_in.backchannels == ()


def test_matching_phrases_are_read_normalised_and_the_boost_can_be_off(tmp_path: Path) -> None:
    default = load_profile(_write(tmp_path, MINIMAL)).matching
    assert default.phrase_boost == 0.5 and default.phrases == ()  # the measured lean
    own = MINIMAL + '[matching]\nphrases = ["Acme Pro", "order-ID"]\nphrase_boost = 0\n'
    matching = load_profile(_write(tmp_path, own)).matching
    assert matching.phrases == ("acme pro", "order id") and matching.phrase_boost == 0.0


def test_llm_section_is_read(tmp_path: Path) -> None:
    text = MINIMAL + (
        '[llm]\nmode = "primary"\nbase_url = "http://127.0.0.1:8080/v1"\nmodel = "m"\n'
        'system_prompt = "Hours: {hours}"\ntimeout_s = 2\n'
    )
    llm = load_profile(_write(tmp_path, text)).llm
    assert llm is not None and llm.mode == "primary" and llm.model == "m"
    assert llm.timeout_s == 2.0 and llm.max_tokens == 150
    assert llm.system_prompt.render({"hours": "9-5"}) == "Hours: 9-5"


def test_templates_escape_braces_and_spell_digits() -> None:
    t = parse_template("Order {n:spell} {{ok}} {row.status}")
    assert t.names == {"n", "row.status"}
    assert t.render({"n": "12345", "row.status": "shipped"}) == "Order 1 2 3 4 5 {ok} shipped"
    for bad in ("{", "a } b", "{1x}", "{a b}", "{n:upper}"):
        with pytest.raises(ValueError):
            parse_template(bad)


@pytest.mark.parametrize(
    ("extra", "line", "key", "words"),
    [
        # a template naming an unknown slot, caught at load time
        (
            '[intents.order]\nkeywords = ["order"]\nslots = ["order_number"]\n'
            'reply = "Order {order_numbr}."\n[slots.order_number]\ntype = "digits"\n'
            'prompt = "Number?"\n',
            13,
            "intents.order.reply",
            "unknown placeholder {order_numbr}",
        ),
        ("[agent2]\nx = 1\n", 10, "agent2", "unknown section"),
        ("[limits]\nmax_turn = 3\n", 11, "limits.max_turn", "unknown key"),
        ('[limits]\nmax_turns = "3"\n', 11, "limits.max_turns", "expected int"),
        ("[limits]\nmax_call_s = -1\n", 11, "limits.max_call_s", "must be 0..86400"),
        ("[limits]\nno_input_s = 1\n", 11, "limits.no_input_s", "must be 3..600"),
        ("[limits]\nno_input_prompts = 11\n", 11, "limits.no_input_prompts", "must be 0..10"),
        (
            '[limits]\nno_input_reply = "Hello {nobody}?"\n',
            11,
            "limits.no_input_reply",
            "unknown placeholder {nobody}",
        ),
        ('[intents.x]\nreply = "hi"\n', 10, "intents.x", "can never match"),
        ('[intents.x]\nno_to = ["?"]\nreply = "hi"\n', 11, "intents.x.no_to", "each entry"),
        (
            '[intents.x]\npatterns = ["(open"]\nreply = "hi"\n',
            11,
            "intents.x.patterns",
            "bad regular",
        ),
        (  # shown as the file has it, not with Python's doubled backslashes
            "[intents.x]\npatterns = ['^\\d+(\\s']\nreply = \"hi\"\n",
            11,
            "intents.x.patterns",
            "bad regular expression '^\\d+(\\s': missing ), unterminated subpattern",
        ),
        (
            '[intents.x]\npatterns = ["^\\\\d+(\\\\s"]\nreply = "hi"\n',
            11,
            "intents.x.patterns",
            'bad regular expression "^\\\\d+(\\\\s": missing )',
        ),
        ('[intents.x]\nkeywords = ["x"]\n', 10, "intents.x.reply", "is required"),
        (
            '[intents.x]\nkeywords = ["x"]\nslots = ["nope"]\nreply = "a"\n',
            12,
            "intents.x.slots",
            "unknown slot 'nope'",
        ),
        ('[intents.x]\nkeywords = [1]\nreply = "a"\n', 11, "intents.x.keywords", "list of strings"),
        (
            '[intents.x]\ndtmf = "12"\nkeywords = ["x"]\nreply = "a"\n',
            11,
            "intents.x.dtmf",
            "one key",
        ),
        (
            '[intents.x]\ndtmf = "1"\nreply = "a"\n[intents.y]\ndtmf = "1"\nreply = "b"\n',
            14,
            "intents.y.dtmf",
            "also x",
        ),
        (
            '[intents.x]\nkeywords = ["x"]\nreply = "a"\nsend_dtmf = "12x"\n',
            13,
            "intents.x.send_dtmf",
            "allowed",
        ),
        (
            '[intents.x]\nkeywords = ["x"]\nreply = "a"\nset = { topic = "{nothing}" }\n',
            13,
            "intents.x.set.topic",
            "unknown placeholder {nothing}",
        ),
        ('[slots.s]\ntype = "datetime"\nprompt = "?"\n', 11, "slots.s.type", "not one of digits"),
        ('[slots.s]\ntype = "date"\nprompt = "?"\nmin = 3\n', 13, "slots.s.min", "only a number"),
        (
            '[slots.s]\ntype = "time"\nprompt = "?"\nearliest = "8am"\n',
            13,
            "slots.s.earliest",
            "HH:MM",
        ),
        (
            '[slots.s]\ntype = "date"\nprompt = "?"\nweekdays = ["mon", "fr"]\n',
            13,
            "slots.s.weekdays",
            "a list of mon",
        ),
        (
            '[slots.s]\ntype = "number"\nprompt = "?"\nmin = 3\nmax = 1\n',
            14,
            "slots.s.max",
            "below min",
        ),
        ('[slots.s]\ntype = "choice"\nprompt = "?"\n', 10, "slots.s.options", "need a table"),
        (
            '[slots.s]\ntype = "choice"\nprompt = "?"\n[slots.s.options]\na = ["x"]\nb = ["x"]\n',
            15,
            "slots.s.options.b",
            "'x' is also a",
        ),
        (
            '[slots.s]\ntype = "text"\nprompt = "?"\nconfirm = "maybe"\n',
            13,
            "slots.s.confirm",
            "auto, always, never",
        ),
        (
            '[slots.s]\ntype = "date"\nprompt = "{s:date:long}?"\n',
            12,
            "slots.s.prompt",
            "malformed placeholder",
        ),
        ('[barge_in]\nbackchannels = "okay"\n', 11, "barge_in.backchannels", "expected list"),
        ("[barge_in]\nbackchannels = [1]\n", 11, "barge_in.backchannels", "list of strings"),
        ('[barge_in]\nbackchannels = ["..."]\n', 11, "barge_in.backchannels", "has no words"),
        (
            '[barge_in]\nbackchannels = ["yes I see that now"]\n',
            11,
            "barge_in.backchannels",
            "1-3 words",
        ),
        ('[slots.s]\ntype = "digits"\n', 10, "slots.s.prompt", "is required"),
        ('[fallback]\nreplies = ["Sorry {who}?"]\n', 11, "fallback.replies", "{who}"),
        (
            '[llm]\nbase_url = "https://api.example.com"\nmodel = "m"\n',
            11,
            "llm.base_url",
            "http://",
        ),
        (
            '[llm]\nmode = "always"\nbase_url = "http://h:1"\nmodel = "m"\n',
            11,
            "llm.mode",
            "not one of off",
        ),
        ('[llm]\nbase_url = "http://h:1"\n', 10, "llm.model", "is required"),
        ("[voice]\nlength_scale = 5\n", 11, "voice.length_scale", "must be 0.5..2"),
        ("[data.orders]\nx = 1\n", 11, "data.orders.x", "row table"),
        # a sensitive slot is one a caller keys or says a value into (digits, date, time,
        # number), and no reply may say it back (replies are stored)
        (
            '[slots.ok]\ntype = "yes_no"\nsensitive = true\nprompt = "?"\n',
            12,
            "slots.ok.sensitive",
            "only a digits, date, time or number slot can be sensitive",
        ),
        (
            '[slots.c]\ntype = "choice"\nsensitive = true\nprompt = "?"\n'
            '[slots.c.options]\na = ["x"]\n',
            12,
            "slots.c.sensitive",
            "only a digits, date, time or number slot can be sensitive",
        ),
        (
            '[slots.dob]\ntype = "date"\nsensitive = true\nconfirm = "always"\nprompt = "?"\n',
            13,
            "slots.dob.confirm",
            "never spoken back",
        ),
        (
            '[slots.dob]\ntype = "date"\nsensitive = true\nprompt = "?"\n'
            'confirm_prompt = "{dob:date:spoken}, right?"\n',
            14,
            "slots.dob.confirm_prompt",
            "slot 'dob' is sensitive",
        ),
        (
            '[slots.pin]\ntype = "digits"\nsensitive = true\nprompt = "PIN?"\n'
            '[intents.x]\nkeywords = ["x"]\nslots = ["pin"]\nreply = "Your PIN is {pin:spell}."\n',
            17,
            "intents.x.reply",
            "slot 'pin' is sensitive",
        ),
        (
            '[slots.pin]\ntype = "digits"\nsensitive = true\nprompt = "PIN?"\n'
            '[slots.again]\ntype = "digits"\nprompt = "Was it {pin}?"\n',
            16,
            "slots.again.prompt",
            "slot 'pin' is sensitive",
        ),
        (
            '[slots.s]\ntype = "digits"\nprompt = "?"\ndigit_timeout_s = 0.5\n',
            13,
            "slots.s.digit_timeout_s",
            "must be 1..30",
        ),
        (
            '[slots.s]\ntype = "yes_no"\nprompt = "?"\ndigit_timeout_s = 3\n',
            13,
            "slots.s.digit_timeout_s",
            "only digits, date, time, number slots have keypad entry",
        ),
        ("[matching]\nphrase_boost = 3\n", 11, "matching.phrase_boost", "must be 0..2"),
        ('[matching]\nphrases = ["!!"]\n', 11, "matching.phrases", "'!!' has no words"),
        ('[matching]\nphrases = "acme"\n', 11, "matching.phrases", "expected list"),
        ('[transfer]\nhold_music = "x.wav"\n', 11, "transfer.hold_music", "unknown key"),
        ('[transfer]\nhold_audio = "nope.wav"\n', 11, "transfer.hold_audio", "no such file"),
        (
            '[transfer]\nhold_audio = "agent.toml"\n',
            11,
            "transfer.hold_audio",
            "not a WAV file (no RIFF/WAVE header): use 16-bit PCM",
        ),
    ],
)
def test_mistakes_name_file_line_and_key(
    tmp_path: Path, extra: str, line: int, key: str, words: str
) -> None:
    p = _write(tmp_path, MINIMAL + extra)
    with pytest.raises(ProfileError) as err:
        load_profile(p)
    e = err.value
    assert (e.path, e.line, e.key) == (str(p), line, key), str(e)
    assert words in str(e)
    assert str(e).startswith(f"{p}:{line}: {key}: ")


@pytest.mark.parametrize(
    ("agent_line", "key", "words"),
    [
        ("filler_after_ms = 2000", "agent.filler_after_ms", "must be 200..1300"),
        ('filler_after_ms = "1s"', "agent.filler_after_ms", "expected int"),
        ("filler_tone_hz = 50", "agent.filler_tone_hz", "100..3400"),
        ('filler = "' + "One moment please " * 6 + '"', "agent.filler", "at most 80"),
        ("filler = 3", "agent.filler", "expected str"),
    ],
)
def test_filler_mistakes_name_the_line(
    tmp_path: Path, agent_line: str, key: str, words: str
) -> None:
    p = _write(tmp_path, MINIMAL.replace("[agent]\n", f"[agent]\n{agent_line}\n"))
    with pytest.raises(ProfileError) as err:
        load_profile(p)
    assert (err.value.line, err.value.key) == (2, key), str(err.value)
    assert words in str(err.value)


def test_filler_digit_timeout_and_hold_audio_are_read(tmp_path: Path) -> None:
    wav = tmp_path / "hold.wav"
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(np.zeros(1600, "<i2").tobytes())
    text = MINIMAL.replace(
        "[agent]\n", '[agent]\nfiller = "Just a   second."\nfiller_tone_hz = 0\n'
    ) + (
        '[slots.pin]\ntype = "digits"\nprompt = "PIN?"\nmin_length = 4\nmax_length = 6\n'
        'digit_timeout_s = 4.5\n[transfer]\nhold_audio = "hold.wav"\n'
    )
    prof = load_profile(_write(tmp_path, text))
    assert prof.filler.text == "Just a second." and prof.filler.tone_hz == 0
    assert prof.filler.after_ms == 1000 and prof.filler.enabled
    assert prof.slots["pin"].digit_timeout_s == 4.5
    assert prof.transfer.hold_audio == str(wav)
    plain = load_profile(_write(tmp_path, MINIMAL))  # the defaults
    assert plain.filler.text == "One moment." and plain.filler.tone_hz == 440
    assert plain.transfer.hold_audio == ""


def test_lookup_mistakes(tmp_path: Path) -> None:
    base = MINIMAL + (
        '[slots.n]\ntype = "digits"\nprompt = "Number?"\n'
        '[data.orders.123]\nstatus = "shipped"\n'
        "[intents.o]\n"
        'keywords = ["order"]\nslots = ["n"]\n'
    )
    cases = [
        (
            'lookup = { table = "order", key = "n", as = "o" }\nnot_found = "?"\nreply = "x"\n',
            "no table data.'order'",
        ),
        (
            'lookup = { table = "orders", key = "m", as = "o" }\nnot_found = "?"\nreply = "x"\n',
            "must be one of this intent's slots",
        ),
        ('lookup = { table = "orders", key = "n", as = "o" }\nreply = "x"\n', "not_found"),
        (
            'lookup = { table = "orders", key = "n", as = "o" }\nnot_found = "?"\n'
            'reply = "{o.colour}"\n',
            "unknown placeholder {o.colour}",
        ),
    ]
    for tail, words in cases:
        with pytest.raises(ProfileError, match=words) as err:
            load_profile(_write(tmp_path, base + tail))
        assert err.value.line is not None and err.value.line >= 15  # [intents.o] or below
    ok = load_profile(
        _write(
            tmp_path,
            base + 'lookup = { table = "orders", key = "n", as = "o" }\n'
            'not_found = "No {n}."\nreply = "{n} {o.status}"\n',
        )
    )
    assert ok.intents[1].lookup is not None and ok.intents[1].lookup.alias == "o"


def test_yes_no_branch_needs_a_yes_no_slot(tmp_path: Path) -> None:
    text = MINIMAL + '[intents.x]\nkeywords = ["x"]\nreply = "a"\n[intents.x.no]\nreply = "b"\n'
    with pytest.raises(ProfileError, match="needs a yes_no slot") as err:
        load_profile(_write(tmp_path, text))
    assert err.value.key == "intents.x.no"


def test_syntax_error_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ProfileError) as err:
        load_profile(_write(tmp_path, MINIMAL + "[limits\n"))
    assert err.value.key == "syntax" and err.value.line == 10
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "missing.toml")
    with pytest.raises(ProfileError, match="greeting"):
        load_profile(_write(tmp_path, '[intents.x]\nkeywords = ["x"]\nreply = "a"\n'))

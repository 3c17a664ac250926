"""The word error rate of bench/asr_wer.py: its edit counts on hand-made cases, its word
rule, and the bridge's receive path (RTP, G.711, jitter buffer, the voice agent's VAD,
end of turn and incremental segments) hearing real human telephone prompts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bench.asr_wer import BridgeListener, Prompt, heard_clean, line_audio, load_prompts, main
from sip_bridge.config.loader import load_config
from testkit.wer import WordErrors, wer_words, word_errors

ROOT = Path(__file__).resolve().parents[1]


def _e(ref: str, hyp: str) -> tuple[int, int, int]:
    e = word_errors(ref.split(), hyp.split())
    return e.substitutions, e.deletions, e.insertions


def test_edit_counts() -> None:
    assert _e("a b c", "a b c") == (0, 0, 0)
    assert _e("a b c", "a x c") == (1, 0, 0)
    assert _e("a b c", "a c") == (0, 1, 0)
    assert _e("a b c", "a b c d") == (0, 0, 1)
    assert _e("a b c d", "x b d") == (1, 1, 0)
    assert _e("a b", "x b c") == (1, 0, 1)
    assert _e("a b c d e", "a c d e f g") == (0, 1, 2)
    assert _e("a b c", "") == (0, 3, 0)
    assert _e("", "a b") == (0, 0, 2)
    assert _e("press four to mark", "pressed for to mark") == (2, 0, 0)
    # a word moved: the fewest edits are a deletion and an insertion, not two substitutions
    assert _e("one two three four five", "two three four five one") == (0, 1, 1)


def test_totals() -> None:
    total = word_errors(list("abcd"), list("abxd")) + word_errors(list("ab"), list("abz"))
    assert total == WordErrors(1, 0, 1, 6)
    assert total.errors == 2
    assert total.wer_pct == pytest.approx(100 * 2 / 6)
    assert WordErrors(0, 0, 0, 0).wer_pct == 0.0


def test_words_compare_as_said() -> None:
    """Case, punctuation, numbers written or said, and the keypad's symbols do not count."""
    same = [
        ("Press 1 to mute, 2 to lock.", "press one to mute two to lock"),
        ("extension 1234", "extension one two three four"),
        ("extension 1234", "Extension twelve thirty-four."),
        ("the fifteenth", "The 15th."),
        ("the twenty-first", "the 21st"),
        ("press * then #", "Press star, then pound."),
        ("a 28.8 kilobit modem", "a twenty eight point eight kilobit modem"),
        ("What's that?", "whats that"),
        ("[beep] Goodbye", "goodbye"),
        ("Goodbye! (simple tone sound plays)", "Good-bye."),
        ("an xray", "an X-ray"),
    ]
    for ref, hyp in same:
        assert wer_words(ref) == wer_words(hyp), (ref, hyp)
    assert wer_words("five hundred") == ("500",)
    assert wer_words("a hundred") == ("a", "hundred")  # "hundred" alone is a word
    for note in ("[ascending tones]", "(10 seconds of silence)", "<beep ascending>"):
        assert wer_words(note) == ()
    assert wer_words("press 4") != wer_words("press for")  # a homophone is an error


# -- the bridge's receive path on real prompts --------------------------------------------------

KEY_WORDS = {  # prompt: words its transcript must hold (the ones a dialogue would act on)
    "agent-pass": {"password", "pound", "key"},
    "vm-review-urgent": {"mark", "message", "urgent"},
    "conf-getpin": {"conference", "pin"},
    "queue-thankyou": {"thank", "patience"},
}


@pytest.fixture(scope="module")
def prompts() -> dict[str, Prompt]:
    found, skipped = load_prompts()
    assert len(found) > 500  # every prompt of the package, with words, up to 12 s
    assert skipped["no_words"] > 0 and skipped["too_long"] > 0
    by_name = {p.name: p for p in found}
    assert "digits/7" in by_name  # the sub-folders' prompts too
    return by_name


@pytest.fixture(scope="module")
def listener() -> Iterator[BridgeListener]:
    bridge = BridgeListener(load_config(ROOT / "config" / "bridge.toml"))
    yield bridge
    bridge.close()


def test_bridge_path_hears_human_prompts(
    prompts: dict[str, Prompt], listener: BridgeListener
) -> None:
    assert listener.stages().startswith(
        "RTP in -> G711Decode(PCMU) -> JitterBuffer(adaptive 20..200 ms) -> Agent(voice"
    )
    for i, (name, words) in enumerate(KEY_WORDS.items()):
        line = line_audio(prompts[name], None, None, seed=i)
        heard = asyncio.run(listener.hear(line))
        assert heard.turns >= 1 and heard.answered, (name, heard)
        assert words <= set(wer_words(heard.text)), (name, heard.text)
        clean = heard_clean(listener.models, line)
        assert words <= set(wer_words(clean)), (name, clean)


def test_bridge_path_quiet_noisy_line_alaw(
    prompts: dict[str, Prompt], listener: BridgeListener
) -> None:
    """A quiet caller (-35 dBFS active speech) over hiss 25 dB down, through PCMA."""
    line = line_audio(prompts["agent-pass"], -35.0, 25.0, seed=7)
    level = 20 * np.log10(np.sqrt(np.mean(line.astype(np.float64) ** 2)) / 32768)
    assert -50 < level < -33  # quiet, pauses included
    listener.codec = "PCMA"
    try:
        assert listener.stages().startswith("RTP in -> G711Decode(PCMA)")
        heard = asyncio.run(listener.hear(line))
    finally:
        listener.codec = "PCMU"
    assert {"password", "pound", "key"} <= set(wer_words(heard.text)), heard.text


@pytest.mark.parametrize("bad", ["100", "-1", "lots"])
def test_a_loss_out_of_range_is_a_usage_error_not_a_traceback(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--loss-pct", bad])
    assert stop.value.code == 2
    assert "--loss-pct" in capsys.readouterr().err

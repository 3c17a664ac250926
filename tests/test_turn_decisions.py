"""smart-turn's end-of-turn decisions, pinned: what fails when a model or ONNX Runtime
upgrade changes when the agent thinks a caller has finished.

Each window is what :class:`agent.voice.turn.EndOfTurn` hands the model at a pause: a turn's
audio from 0.5 s before its first speech to 200 ms into the pause, after the phone line
(8 kHz, G.711 mu-law, back up to 16 kHz as the voice agent does). Three voices: a man
reading Beckett (human), a woman's telephone prompts (Debian's asterisk-core-sounds-en-wav,
human, cut at every pause), and the demo's questions by espeak-ng. Beckett's sentences
are also cut mid-word, and scored with the whole recording in the window.

The decisions (probability >= the shipped threshold) must be the ones pinned in
``data/smart_turn_decisions.json`` on every CPU: :class:`agent.voice.turn.SmartTurn` computes the
int8 model exactly wherever it runs (see ``model_runtime/unsigned_weights.py``), and
``test_kernel_paths.py`` checks it on the AVX2 path under qemu. Windows within 0.01 of the
threshold are pinned but not compared (a rounding change may move them either way).

Regenerate the pin after a deliberate upgrade, and read the diff:
``.venv/bin/python tests/test_turn_decisions.py --pin``.
"""

from __future__ import annotations

import json
import sys
import wave
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from agent.voice.turn import EndOfTurn, SmartTurn
from agent.voice_settings import VoiceSettings
from resample import g711
from resample.resampler import Resampler
from sip_bridge.script.script_voice import espeak_ng
from testkit.models import model_file

PIN = Path(__file__).parent / "data" / "smart_turn_decisions.json"
THRESHOLD = VoiceSettings().turn_threshold  # the shipped default
UNDECIDED = 0.01
PRE_S, PAUSE_S = EndOfTurn.pre_speech_s, VoiceSettings().pause_ms / 1000
PROMPTS = Path("/usr/share/asterisk/sounds/en_US_f_Allison")
HUMAN = ("agent-incorrect", "confbridge-pin", "demo-echotest", "vm-intro", "queue-thankyou")
QUESTIONS = (
    "What are your opening hours?",
    "I would like to check the status of my order.",
    "Can I speak to a person, please?",
    "Great, thanks. That's all. Goodbye.",
)


def _over_the_line(x8: NDArray[np.int16]) -> NDArray[np.int16]:
    """8 kHz audio as the agent gets it: mu-law on the wire, then up to 16 kHz."""
    line = g711.ulaw_decode(g711.ulaw_encode(x8))
    up = Resampler(8000, 16000)
    return np.concatenate([up.process(line), up.flush()]).astype(np.int16)


def _read(path: Path) -> tuple[NDArray[np.int16], int]:
    with wave.open(str(path)) as w:
        assert w.getnchannels() == 1 and w.getsampwidth() == 2, path
        return np.frombuffer(w.readframes(w.getnframes()), np.int16).copy(), w.getframerate()


def speech_runs(x: NDArray[np.int16], rate: int) -> list[tuple[int, int]]:
    """(start, end) samples of the talk between pauses of 250 ms or more: 20 ms frames
    within 18 dB of the loudest (breaths and room noise stay under), runs under 150 ms
    (a breath, a click) dropped."""
    frame = rate // 50
    f = x[: x.size // frame * frame].astype(np.float64).reshape(-1, frame)
    db = 10 * np.log10(np.mean(f**2, axis=1) + 1.0)
    runs: list[list[int]] = []
    for i in np.flatnonzero(db > db.max() - 18):
        if runs and i - runs[-1][1] <= 12:
            runs[-1][1] = int(i)
        else:
            runs.append([int(i), int(i)])
    return [(a * frame, (b + 1) * frame) for a, b in runs if b - a >= 7]


def _turn_windows(name: str, x: NDArray[np.int16]) -> dict[str, NDArray[np.int16]]:
    """At each pause: the turn so far (the whole clip is one turn) plus 200 ms of it."""
    rate = SmartTurn.sample_rate
    runs = speech_runs(x, rate)
    start = max(0, runs[0][0] - round(PRE_S * rate))
    return {
        f"{name}/pause{k + 1}": x[start : b + round(PAUSE_S * rate)]
        for k, (_, b) in enumerate(runs)
    }


@cache
def windows() -> dict[str, NDArray[np.int16]]:
    rate = SmartTurn.sample_rate
    raw, r = _read(model_file("beckett", "beckett.wav"))
    down = Resampler(r, 8000)
    beckett = _over_the_line(np.concatenate([down.process(raw), down.flush()]).astype(np.int16))
    out: dict[str, NDArray[np.int16]] = {}
    pre, pause = round(PRE_S * rate), round(PAUSE_S * rate)
    for k, (a, b) in enumerate(speech_runs(beckett, rate)):  # each sentence its own turn
        out[f"beckett/end{k + 1}"] = beckett[max(0, a - pre) : b + pause]
        out[f"beckett/mid{k + 1}"] = beckett[max(0, a - pre) : (a + b) // 2]
        out[f"beckett/whole-file-end{k + 1}"] = beckett[: b + pause]
    for name in HUMAN:
        x8, r = _read(PROMPTS / f"{name}.wav")
        assert r == 8000, (name, r)
        out.update(_turn_windows(f"prompt/{name}", _over_the_line(x8)))
    for i, q in enumerate(QUESTIONS):
        x8 = np.concatenate([np.zeros(4000, np.int16), espeak_ng(q), np.zeros(4000, np.int16)])
        out.update(_turn_windows(f"espeak/q{i + 1}", _over_the_line(x8)))
    return out


@cache
def _turn() -> SmartTurn:
    return SmartTurn(threads=2)


def score() -> dict[str, float]:
    st = _turn()
    return {name: round(st.probability(x), 4) for name, x in windows().items()}


def test_decisions_are_the_pinned_ones() -> None:
    if not PROMPTS.is_dir():
        pytest.fail(f"{PROMPTS} missing: make setup installs asterisk-core-sounds-en-wav")
    pinned: dict[str, float] = json.loads(PIN.read_text())["probabilities"]
    now = score()
    assert set(now) == set(pinned), "the windows changed: regenerate the pin (see the docstring)"
    moved = [
        f"{k}: pinned {pinned[k]:.3f} ({'complete' if pinned[k] >= THRESHOLD else 'incomplete'}),"
        f" now {now[k]:.3f}"
        for k in pinned
        if abs(pinned[k] - THRESHOLD) >= UNDECIDED
        and (pinned[k] >= THRESHOLD) != (now[k] >= THRESHOLD)
    ]
    assert not moved, (
        f"smart-turn's end-of-turn decisions moved at threshold {THRESHOLD} "
        f"(kernel: {_turn().kernel}):\n  " + "\n  ".join(moved)
    )
    # the table means something: both outcomes occur, and most pauses are clear calls
    decided = [p for p in pinned.values() if abs(p - THRESHOLD) >= UNDECIDED]
    assert len(decided) >= 0.9 * len(pinned)
    assert sum(p >= THRESHOLD for p in decided) >= 10 and sum(p < THRESHOLD for p in decided) >= 5


def test_every_sentence_end_of_a_human_voice_is_complete() -> None:
    """What a caller notices: after each of beckett's sentences the model ends the turn
    at the first pause it is asked about, with room to spare."""
    st = _turn()
    ends = {k: st.probability(x) for k, x in windows().items() if k.startswith("beckett/end")}
    assert len(ends) == 6 and min(ends.values()) >= THRESHOLD + 0.15, ends


def pin() -> None:
    PIN.write_text(
        json.dumps(
            {
                "threshold": THRESHOLD,
                "note": "written by tests/test_turn_decisions.py --pin; see its docstring",
                "probabilities": score(),
            },
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )
    print(f"wrote {PIN}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--pin"]:
        sys.exit("usage: tests/test_turn_decisions.py --pin")
    pin()

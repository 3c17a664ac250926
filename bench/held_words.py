"""What a held reply's probe makes of words said over it: hums (which must let the reply
go on) and short questions (which must stop it), each heard as the voice agent hears them
(espeak-ng voices at 8 kHz, a line level, bursty loss of 20 ms packets, G.711, brought to
the recogniser's 16 kHz), transcribed plainly and then leaning toward the phrases the demo
dialogue listens for at its greeting. Per kind, how often the agent's verdict lets the
reply go on (a known backchannel; or up to three words, none asking for the floor, that
the dialogue does not understand), with the lean (as the agent asks: a second hearing of
words not understood) and without it (plain), and how often each hearing was understood.
The verdict's other rule, at most 0.8 s of speech, is left out: the words here are short.

    .venv/bin/python bench/held_words.py --out /tmp/held_words.json

A hum understood either way would stop a reply for a backchannel; a question understood
neither way lets the reply go on over it (docs/voice-agent.md, "Backchannels").
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from agent.dialogue.backchannel import MAX_WORDS, is_backchannel, takes_floor
from agent.dialogue.engine import DialogueEngine
from agent.dialogue.profile_loader import load_profile
from agent.voice.asr import MoonshineAsr
from agent.voice.phrase_bias import phrase_bias
from agent.words import normalize
from sip_bridge.script.line_sim import PacketSchedule
from sip_bridge.script.script_voice import espeak_ng
from testkit.line_echo import at_level, g711
from testkit.vad_audio import resampled

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "config" / "agents" / "demo.toml"
HUMS = ("uh-huh", "mm-hmm", "mhm", "hmm", "yeah yeah", "okay okay", "right right", "oh wow")
QUESTIONS = ("Where is my order?", "When are you open?", "I want to pay my bill.")
VOICES = ("en-us", "en-gb-x-rp+f3", "en-us+m3", "en-us+f2", "en-gb")
LEVELS = (-15.0, -25.0, -35.0)
LOSSES = (0.0, 3.0)
FRAME = 160  # 20 ms at 8 kHz


def on_the_line(x: NDArray[np.int16], level: float, loss: float, seed: int) -> NDArray[np.int16]:
    """``x`` at ``level`` dBFS through G.711, its lost packets silent, at 16 kHz."""
    y = g711(np.clip(at_level(x, level), -32768, 32767).astype(np.int16)).copy()
    schedule = PacketSchedule(loss_pct=loss, seed=seed)
    for start in range(0, y.size, FRAME):
        if schedule.next() is None:
            y[start : start + FRAME] = 0
    return resampled(y, 8000, 16000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("held_words.json"))
    args = ap.parse_args()
    profile = load_profile(DEMO)
    engine = DialogueEngine(profile)
    bias = phrase_bias(engine.listening_for(), profile.matching.phrase_boost)
    asr = MoonshineAsr(threads=1, weights="int8", device="cpu")
    rows: list[dict[str, Any]] = []
    cases = [(t, "hum") for t in HUMS] + [(t, "question") for t in QUESTIONS]
    known = profile.barge_in.backchannels

    def goes_on(*heard: str) -> bool:
        """The held reply goes on for words heard so (each hearing in turn)."""
        first = heard[0]
        if is_backchannel(first, known):
            return True
        few = len(normalize(first)) <= MAX_WORDS and not takes_floor(first)
        return few and not any(engine.understands(h) for h in heard)

    for seed, ((text, kind), voice) in enumerate(itertools.product(cases, VOICES)):
        x = espeak_ng(text, voice)  # as `sip-bridge script`'s caller says it
        for level, loss in itertools.product(LEVELS, LOSSES):
            clip = on_the_line(x, level, loss, seed)
            plain = str(asr.transcribe(clip))
            leaning = str(asr.transcribe(clip, bias=bias))
            rows.append({"kind": kind, "said": text, "voice": voice, "level_dbfs": level,
                         "loss_pct": loss, "plain": plain, "leaning": leaning,
                         "plain_understood": engine.understands(plain),
                         "leaning_understood": engine.understands(leaning),
                         "goes_on": goes_on(plain, leaning),
                         "goes_on_plain": goes_on(plain)})  # fmt: skip
    summary = {}
    for kind in ("hum", "question"):
        mine = [r for r in rows if r["kind"] == kind]
        summary[kind] = {
            "heard": len(mine),
            "reply_goes_on": sum(r["goes_on"] for r in mine),
            "reply_goes_on_plain_hearing_only": sum(r["goes_on_plain"] for r in mine),
            "understood_plainly": sum(r["plain_understood"] for r in mine),
            "understood_leaning": sum(r["leaning_understood"] for r in mine),
        }
    args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

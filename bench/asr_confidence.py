"""How well the recogniser's confidence tells a right transcript from a wrong one, to choose
a slot's ``confirm_below`` (config/agents/README.md).

Each phrase a booking caller says is spoken by espeak-ng voices at phone line levels,
through G.711, and transcribed by Moonshine; a transcript is right when its words are the
phrase's (case and punctuation aside). For each threshold the JSON gives the share of
right transcripts that would be asked back (a cost: one more question) and of wrong ones
that would (the point: a misheard day is not booked silently).

    .venv/bin/python bench/asr_confidence.py            # bench/out/asr_confidence.json

Synthetic voices are harder for the recogniser than people (more wrong transcripts than a
real line gives); the scores move a little between CPU kernel paths (docs/models.md, "The
same decisions on every CPU"), so read the ranges, not the third decimal.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from agent.voice.asr import MoonshineAsr
from agent.words import normalize
from resample.resampler import Resampler
from sip_bridge.script.script_voice import espeak_ng
from testkit.line_echo import at_level, g711

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
PHRASES = (  # what config/scripts/booking/ and the demo's callers say
    "Could I come in next Monday?",
    "Could I come in on Wednesday?",
    "Can I come on Saturday?",
    "The fifteenth, please.",
    "Tomorrow at ten.",
    "Half past two.",
    "I would like to come at half past two in the afternoon.",
    "Six in the evening.",
    "One time.",
    "March third.",
    "Yes, that's right.",
    "What are your opening hours?",
    "I'd like to make an appointment for a cleaning.",
    "Alice Smith.",
)
VOICES = ("en-us", "en-gb+f3", "en-us+m3", "en+f4")
LEVELS = (-25.0, -35.0)
THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5)


def _heard(asr: MoonshineAsr, phrase: str, voice: str, level: float) -> tuple[str, float]:
    line = g711(at_level(espeak_ng(phrase, voice), level))  # 8 kHz, as the bridge hears
    pad = np.zeros(2400, np.int16)
    up = Resampler(8000, 16000)
    pcm = np.concatenate([up.process(np.concatenate([pad, line, pad])), up.flush()])
    text = asr.transcribe(pcm)
    return str(text), text.confidence


def _spread(values: list[float]) -> list[float]:
    return [min(values), float(np.median(values)), max(values)] if values else []


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="asr_confidence.json")
    args = p.parse_args()
    asr = MoonshineAsr(threads=2, device="cpu")
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    for phrase in PHRASES:
        for voice in VOICES:
            for level in LEVELS:
                text, conf = _heard(asr, phrase, voice, level)
                ok = normalize(text) == normalize(phrase)
                row = {"phrase": phrase, "voice": voice, "level_dbfs": level, "heard": text}
                rows.append(row | {"right": ok, "confidence": round(conf, 4)})
    right = [r["confidence"] for r in rows if r["right"]]
    # nothing heard is no value to ask back: such clips are counted, not scored
    wrong = [r["confidence"] for r in rows if not r["right"] and r["heard"]]

    def share(values: list[float], below: float) -> float:
        return round(sum(v < below for v in values) / len(values), 3) if values else 0.0

    result = {
        "clips": len(rows),
        "right": len(right),
        "wrong": len(wrong),
        "nothing_heard": sum(not r["heard"] for r in rows),
        "right_confidence_min_median_max": _spread(right),
        "wrong_confidence_min_median_max": _spread(wrong),
        "asked_back": {
            str(t): {"right": share(right, t), "wrong": share(wrong, t)} for t in THRESHOLDS
        },
        "seconds": round(time.monotonic() - t0, 1),
        "rows": rows,
    }  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))


if __name__ == "__main__":
    main()

"""Re-render the shipped prompts with the project's own Piper voice (en_US-joe-medium).

The WAVs next to this file are data, committed once: a bridge must be able to apologise
when its models are what failed, so the prompt may not need a model at call time. Run
this after changing a text or the voice, with the bridge's Python: in a checkout

    .venv/bin/python config/prompts/render_prompts.py

and in a directory `sip-bridge init` wrote (the venv the wheel is installed in)

    /opt/sip-bridge/bin/python /etc/sip-bridge/prompts/render_prompts.py

Output: 16 kHz mono 16-bit PCM (wideband, a quarter the size of Piper's 22.05 kHz at
24 kHz; the bridge resamples to the call's rate), one file per entry of ``PROMPTS``.
"""

from __future__ import annotations

import sys
import wave
from pathlib import Path

import numpy as np

_CHECKOUT = Path(__file__).resolve().parents[2]
if (_CHECKOUT / "agent" / "tts.py").is_file():  # a checkout; an installed bridge imports as is
    sys.path.insert(0, str(_CHECKOUT))

from agent.voice.tts import PiperTts  # noqa: E402 (after the checkout joins sys.path)
from resample import Resampler  # noqa: E402

RATE = 16000
PROMPTS = {
    "technical_difficulty.wav": [
        "Sorry, we are having technical difficulties.",
        "Please call again later.",
    ],
}
GAP_S = 0.25  # between sentences


def render(sentences: list[str], tts: PiperTts) -> np.ndarray:
    gap = np.zeros(round(GAP_S * RATE), np.int16)
    parts: list[np.ndarray] = []
    for sentence in sentences:
        down = Resampler(tts.sample_rate, RATE)
        pcm = tts.synthesize(sentence)
        parts += [np.concatenate([down.process(pcm), down.flush()]), gap]
    return np.concatenate(parts)


def main() -> None:
    tts = PiperTts(threads=2)
    here = Path(__file__).resolve().parent
    for name, sentences in PROMPTS.items():
        pcm = render(sentences, tts)
        with wave.open(str(here / name), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(RATE)
            w.writeframes(pcm.astype("<i2").tobytes())
        print(f"{name}: {pcm.size / RATE:.2f} s, {here / name}")


if __name__ == "__main__":
    main()

"""What the models compute on this process's CPU kernels, as JSON on stdout.

``test_kernel_paths.py`` runs it natively and under ``qemu-x86_64 -cpu Haswell`` (the AVX2
kernels, whatever the host has) and compares: the toy QDQ matmul of
``test_unsigned_weights.py`` with int8 and with uint8 weights against its exact integer
result, and :class:`agent.voice.turn.SmartTurn` (the graph it chose, and its score on windows of
beckett.wav as the agent hands them to it).
"""

from __future__ import annotations

import json
import sys
import wave

import numpy as np
import test_unsigned_weights as toy

from agent.voice.turn import SmartTurn
from model_runtime.unsigned_weights import unsigned_weights
from testkit.models import model_file

#: (start, end) seconds of beckett.wav scored: "Ever tried." with 200 ms of the pause
#: after it, and a cut in the middle of "Ever failed" (two windows: emulation is slow).
WINDOWS = {"end1": (0.0, 1.64), "mid2": (1.36, 2.25)}


def main() -> None:
    x = np.full((2, 64), 12.5, np.float32)
    x[1, ::2] = 11.0
    xq = np.clip(np.round(x / toy.X_SCALE), 0, 255).astype(np.int64)
    w_q = toy._weights()
    exact = (xq @ w_q.astype(np.int64)).astype(np.float64) * float(toy.X_SCALE * toy.W_SCALE)
    model = toy._toy(w_q)
    signed = toy._run(model, x)
    unsigned_weights(model)
    out: dict[str, object] = {
        "toy_int8_rel_err": float(np.max(np.abs(signed - exact) / np.abs(exact))),
        "toy_uint8_rel_err": float(np.max(np.abs(toy._run(model, x) - exact) / np.abs(exact))),
    }
    with wave.open(str(model_file("beckett", "beckett.wav"))) as w:
        audio = np.frombuffer(w.readframes(w.getnframes()), np.int16)
        rate = w.getframerate()
    st = SmartTurn(threads=1)
    out["smart_turn_graph"] = st.path.name
    out["smart_turn"] = {
        k: st.probability(audio[round(a * rate) : round(b * rate)]) for k, (a, b) in WINDOWS.items()
    }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()

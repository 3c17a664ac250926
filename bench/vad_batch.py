"""Silero VAD at 8 kHz: one run per call per window vs one batched run per media tick.

N calls of real speech (beckett.wav at staggered offsets) are fed as the bridge feeds
them: every 20 ms tick each call's VadStream gets 160 samples, inside an asyncio loop
that turns once per tick. "unbatched" runs each completed window inline (one model run
per call); "batched" submits them to one TickBatcher, so a tick's windows become one
run. "raw" repeats both with bare SileroVad.run calls (no stream, no loop) to show the
model's own share.
Figures are CPU time (process_time, threads=1) per call per 32 ms window, best of
``--repeat``; a 32 ms window every 32 ms means ``32000 / us`` calls fit on one core.

    .venv/bin/python bench/vad_batch.py [--seconds 2] [--streams 1 10 50 100 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort  # type: ignore[import-untyped]
from numpy.typing import NDArray

from agent.voice.vad import SileroVad, VadStream
from resample.resampler import Resampler

OUT = Path(__file__).resolve().parent / "out"
FRAME = 160  # 20 ms at 8 kHz
WINDOW = 256


def load_speech(path: Path | None) -> NDArray[np.int16]:
    """beckett.wav (16 kHz) as 8 kHz int16."""
    if path is None:
        from model_runtime.store import default_store

        path = default_store().path("beckett", "beckett.wav")
    with wave.open(str(path)) as w:
        x = np.frombuffer(w.readframes(w.getnframes()), np.int16)
        rate = w.getframerate()
    r = Resampler(rate, 8000)
    return np.concatenate((r.process(x), r.flush()))


def make_signals(speech: NDArray[np.int16], n: int, seconds: float) -> NDArray[np.int16]:
    """n different calls: the recording rolled by a different offset each."""
    length = int(seconds * 8000) // FRAME * FRAME
    reps = -(-length // speech.size) + 1
    long = np.tile(speech, reps)
    return np.stack([long[(k * 1237) % speech.size :][:length] for k in range(n)])


def cpu_best(fn: Callable[[], Any], repeat: int) -> float:
    """Least CPU seconds over ``repeat`` runs (noise on a shared machine only adds)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def streams_unbatched(vad: SileroVad, sig: NDArray[np.int16]) -> int:
    async def main() -> int:
        streams = [VadStream(vad) for _ in sig]
        windows = 0
        for i in range(0, sig.shape[1], FRAME):  # the same loop turn per tick as batched
            for s, x in zip(streams, sig, strict=True):
                windows += len(s.push(x[i : i + FRAME]))
            await asyncio.sleep(0)
        return windows

    return asyncio.run(main())


def streams_batched(vad: SileroVad, sig: NDArray[np.int16]) -> int:
    async def main() -> int:
        batcher = vad.batcher()
        counts = [0]

        def count(_: float) -> None:
            counts[0] += 1

        streams = [VadStream(vad, batcher=batcher, on_prob=count) for _ in sig]
        for i in range(0, sig.shape[1], FRAME):  # one media-clock tick
            for s, x in zip(streams, sig, strict=True):
                s.push(x[i : i + FRAME])
            await asyncio.sleep(0)
        return counts[0]

    return asyncio.run(main())


def raw(vad: SileroVad, sig: NDArray[np.int16], batched: bool) -> int:
    audio = sig.astype(np.float32) / np.float32(32768)
    n, w = audio.shape[0], audio.shape[1] // WINDOW
    states = vad.initial_states(n)
    ctx = np.zeros((n, vad.context), np.float32)
    for k in range(w):
        win = audio[:, k * WINDOW : (k + 1) * WINDOW]
        if batched:
            _, states = vad.run(win, states, ctx)
        else:
            for j in range(n):
                _, st = vad.run(win[j : j + 1], states[:, j : j + 1], ctx[j : j + 1])
                states[:, j : j + 1] = st
        ctx = win[:, -vad.context :]
    return int(n * w)


def measure(vad: SileroVad, sig: NDArray[np.int16], repeat: int) -> dict[str, Any]:
    n = sig.shape[0]
    windows = n * (sig.shape[1] // WINDOW)
    assert streams_unbatched(vad, sig) == windows == streams_batched(vad, sig)
    row: dict[str, Any] = {"streams": n, "windows_per_stream": windows // n}
    for name, fn in [
        ("unbatched", lambda: streams_unbatched(vad, sig)),
        ("batched", lambda: streams_batched(vad, sig)),
        ("raw_unbatched", lambda: raw(vad, sig, False)),
        ("raw_batched", lambda: raw(vad, sig, True)),
    ]:
        row[f"{name}_us"] = round(cpu_best(fn, repeat) / windows * 1e6, 2)
    row["speedup"] = round(row["unbatched_us"] / row["batched_us"], 2)
    row["raw_speedup"] = round(row["raw_unbatched_us"] / row["raw_batched_us"], 2)
    # calls one core can keep up with (a window every 32 ms), batched through streams
    row["calls_per_core_batched"] = int(32000 / row["batched_us"])
    row["calls_per_core_unbatched"] = int(32000 / row["unbatched_us"])
    return row


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    n = [r["streams"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for key, label in [
        ("unbatched_us", "VadStream, one run per call"),
        ("batched_us", "VadStream + TickBatcher, one run per tick"),
        ("raw_unbatched_us", "SileroVad.run, B=1"),
        ("raw_batched_us", "SileroVad.run, B=N"),
    ]:
        ax.plot(n, [r[key] for r in rows], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("concurrent calls")
    ax.set_ylabel("CPU µs per call per 32 ms window")
    ax.set_title("Silero VAD 8 kHz, 1 thread")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 10, 50, 100, 200])
    ap.add_argument("--seconds", type=float, default=2.0, help="audio per call")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--model", type=Path, help="silero_vad.onnx (default: the model store)")
    ap.add_argument("--speech", type=Path, help="beckett.wav (default: the model store)")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args()
    vad = SileroVad(args.model, threads=1)
    speech = load_speech(args.speech)
    rows = [measure(vad, make_signals(speech, n, args.seconds), args.repeat) for n in args.streams]
    result: dict[str, Any] = {
        "bench": "vad_batch",
        "model": "silero-vad 8 kHz, 256-sample windows",
        "threads": 1,
        "onnxruntime": ort.__version__,
        "provider": vad.session.get_providers()[0],
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "unit": "CPU µs per call per window (best of repeat)",
        "rows": rows,
    }
    OUT.mkdir(exist_ok=True)
    (OUT / "vad_batch.json").write_text(json.dumps(result, indent=2) + "\n")
    if not args.no_plot and plot(rows, OUT / "vad_batch.png"):
        result["plot"] = str(OUT / "vad_batch.png")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

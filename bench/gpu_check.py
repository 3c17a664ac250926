"""The CUDA path of ``model_runtime/`` on a lent GPU machine: each model file given opens
through :func:`model_runtime.sessions.create_session` with ``device="cuda"`` (which
refuses a silent CPU fallback), runs, and is timed against the same file on the CPU.

Run where onnxruntime-gpu is importable (docs/benchmarks.md says how to carry it to a
machine with no network)::

    python3 bench/gpu_check.py MODEL.onnx [MODEL.onnx ...] [--runs 50] [--out gpu_check.json]
    python3 bench/gpu_check.py --asr MOONSHINE_DIR SPEECH.wav [--runs 20]

``--asr``: Moonshine as the agent runs it (:class:`agent.voice.asr.MoonshineAsr`: encoder,
then greedy decoding token by token with past key values) transcribing the first 1, 2.5, 5
and 10 s of a 16 kHz mono WAV (beckett.wav), on CUDA and on the CPU: a whole utterance's
time, and whether the two heard the same words.

``--streams 1,4,16``: also N threads at once sharing each session (as the calls of one
bridge share its models): runs per second in all and the latency of one run (for the ASR:
the 2.5 s clip).

Known inputs get real shapes (Silero VAD: 512 samples at 16 kHz and its state; smart-turn:
8 s of log-mel features; Piper: 100 phoneme ids); any other input gets its declared shape,
symbolic dimensions as 1. Prints JSON: per model, the provider each session got, the
median and p95 of a run on each, and the largest difference between the two outputs
(Piper samples noise inside: its outputs differ from run to run anyway).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import wave
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort  # type: ignore[import-untyped]

from model_runtime.sessions import create_session

#: Shapes of inputs this project's models declare with symbolic dimensions.
KNOWN_SHAPES = {
    "input": (1, 512),  # Silero VAD: one 32 ms window at 16 kHz
    "state": (2, 1, 128),
    "input_features": (1, 80, 800),  # smart-turn: 8 s of 80 log-mel bins
}
DTYPES = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32}


def feeds_for(session: ort.InferenceSession, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for inp in session.get_inputs():
        dtype = DTYPES.get(inp.type, np.float32)
        if inp.name == "sr":
            out[inp.name] = np.array(16000, dtype=np.int64)
            continue
        shape = KNOWN_SHAPES.get(inp.name) or tuple(
            d if isinstance(d, int) and d > 0 else 1 for d in inp.shape
        )
        if dtype == np.float32:
            out[inp.name] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[inp.name] = np.ones(shape, dtype=dtype)
    if "input_lengths" in out:  # Piper: 100 phoneme ids (a sentence), lengths and scales
        out["input"] = rng.integers(1, 60, (1, 100)).astype(np.int64)
        out["input_lengths"] = np.array([100], dtype=np.int64)
        out["scales"] = np.array([0.667, 1.0, 0.8], dtype=np.float32)
    return out


def run_times(fn: Callable[[], object], runs: int, into: list[float] | None = None) -> list[float]:
    """Milliseconds of each of ``runs`` calls of ``fn`` (appended to ``into`` if given)."""
    times = [] if into is None else into
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return times


def median_p95(times: list[float], digits: int) -> tuple[float, float]:
    """The median and the nearest-rank p95 of ``times``, rounded."""
    ordered = sorted(times)
    p95 = ordered[int(0.95 * (len(ordered) - 1))]
    return round(statistics.median(ordered), digits), round(p95, digits)


def timed(session: ort.InferenceSession, feeds: dict[str, np.ndarray], runs: int) -> dict[str, Any]:
    for _ in range(3):  # first runs: allocation, kernel choice
        session.run(None, feeds)
    median, p95 = median_p95(run_times(lambda: session.run(None, feeds), runs), 3)
    return {"provider": session.get_providers()[0], "median_ms": median, "p95_ms": p95}


def streams(fn: Callable[[], object], counts: Sequence[int], runs: int) -> dict[str, Any]:
    """``fn`` run by N threads at once (calls sharing one session), ``runs`` each: runs per
    second in all, and the p50 and p95 of one run, for each N in ``counts``."""
    out: dict[str, Any] = {}
    for n in counts:
        times: list[float] = []  # (list.append is atomic: the threads share it)
        threads = [threading.Thread(target=run_times, args=(fn, runs, times)) for _ in range(n)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        p50, p95 = median_p95(times, 1)
        out[str(n)] = {"runs_per_s": round(len(times) / wall, 1), "p50_ms": p50, "p95_ms": p95}
    return out


def check(path: Path, runs: int, counts: Sequence[int] = ()) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    gpu = create_session(path, device="cuda", threads=1)
    cpu = create_session(path, name=f"{path.stem}-cpu", device="cpu", threads=1)
    feeds = feeds_for(cpu, rng)
    a = gpu.run(None, feeds)
    b = cpu.run(None, feeds)
    diff = max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
               for x, y in zip(a, b, strict=True))  # fmt: skip
    return {
        "model": path.name,
        "cuda": timed(gpu, feeds, runs)
        | {"streams": streams(lambda: gpu.run(None, feeds), counts, max(2, runs // 8))},
        "cpu": timed(cpu, feeds, runs),
        "max_abs_diff": diff,
        "outputs_agree": diff < 1e-2,
    }


def read_speech(wav: Path) -> np.ndarray:
    """A 16 kHz mono 16-bit WAV's samples (what Moonshine takes)."""
    with wave.open(str(wav)) as w:
        if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (16000, 1, 2):
            raise SystemExit(f"{wav}: not 16 kHz mono 16-bit")
        return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)


def check_asr(
    model_dir: Path,
    wav: Path,
    runs: int,
    *,
    devices: tuple[str, ...] = ("cuda", "cpu"),
    seconds: tuple[float, ...] = (1.0, 2.5, 5.0, 10.0),
    counts: Sequence[int] = (),
) -> dict[str, Any]:
    from agent.voice.asr import MoonshineAsr  # the agent's own decode loop

    pcm = read_speech(wav)
    asrs = {
        d: MoonshineAsr(
            model_dir / "encoder_model.onnx",
            model_dir / "decoder_model_merged.onnx",
            model_dir / "tokenizer.json",
            device=d,
        )
        for d in devices
    }
    rows = []
    for secs in seconds:
        clip = pcm[: int(secs * 16000)]
        row: dict[str, Any] = {"seconds": secs}
        for d, asr in asrs.items():
            turn = partial(asr.transcribe, clip)
            text = turn()  # and a first run: allocation, kernel choice
            median, p95 = median_p95(run_times(turn, runs), 2)
            row[d] = {
                "provider": asr.decoder.get_providers()[0],
                "median_ms": median,
                "p95_ms": p95,
                "text": text,
            }
            if secs == 2.5 and counts:  # a typical turn's words, several calls at once
                row[d]["streams"] = streams(turn, counts, max(2, runs // 2))
        row["texts_agree"] = len({row[d]["text"] for d in devices}) == 1
        rows.append(row)
    return {"model": model_dir.name, "wav": wav.name, "clips": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", type=Path)
    ap.add_argument("--asr", nargs=2, type=Path, metavar=("MOONSHINE_DIR", "SPEECH_WAV"))
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--streams", default="", metavar="N,N,...",
                    help="also N threads at once sharing each session, e.g. 1,4,16")  # fmt: skip
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    counts = [int(n) for n in args.streams.split(",") if n.strip()]
    if not args.models and not args.asr:
        ap.error("give model files, --asr, or both")
    report: dict[str, Any] = {
        "onnxruntime": ort.__version__,
        "available_providers": ort.get_available_providers(),
        "device": ort.get_device(),
        "models": [check(p, args.runs, counts) for p in args.models],
    }
    if args.asr:
        model_dir, wav = args.asr
        report["asr"] = check_asr(model_dir, wav, args.runs, counts=counts)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()

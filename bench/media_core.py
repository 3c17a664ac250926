"""Media-core benchmark: resamplers, jitter buffer, and the whole per-call chain.

Prints one JSON object on stdout and writes PNG plots under bench/out/.
Every comparison (our resampler vs soxr presets, our jitter buffer vs a fixed
60 ms buffer vs aiortc's) is measured side by side in the same run, because
the machines are shared and noisy: ratios within one run are what count.

    .venv/bin/python bench/media_core.py [--quick] [--out bench/out]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_jitter import bench_jitter
from bench.bench_resample import bench_resamplers
from jitter import JitterBuffer
from resample import Resampler
from resample.g711 import ulaw_decode, ulaw_encode


def _chain_frames(frames: int) -> tuple[list[bytes], list[float]]:
    t = np.arange(160 * frames) / 8000.0
    wobble = 1 + 0.5 * np.sin(2 * np.pi * 3 * t)
    speechish = (6000 * np.sin(2 * np.pi * 180 * t) * wobble).astype(np.int16)
    payloads = [ulaw_encode(speechish[i * 160 : (i + 1) * 160]).tobytes() for i in range(frames)]
    jitter_s = np.random.default_rng(1).uniform(0, 0.015, frames).tolist()
    return payloads, jitter_s


def _chain_round(payloads: list[bytes], jitter_s: list[float]) -> tuple[float, float]:
    """One call's media path over all frames: (wall µs, process CPU µs) per frame."""
    jb = JitterBuffer()
    up = Resampler(8000, 24000)
    down = Resampler(24000, 8000)
    w0, c0 = time.perf_counter(), time.process_time()
    for i, payload in enumerate(payloads):
        now = i * 0.02
        pcm = ulaw_decode(np.frombuffer(payload, dtype=np.uint8))
        jb.push(i & 0xFFFF, (i * 160) & 0xFFFFFFFF, pcm, now - 0.02 + jitter_s[i])
        ulaw_encode(down.process(up.process(jb.pop(now))))
    n = len(payloads)
    return (time.perf_counter() - w0) / n * 1e6, (time.process_time() - c0) / n * 1e6


def _stage_costs(payloads: list[bytes], jitter_s: list[float]) -> dict[str, float]:
    """Each stage alone, best of 3 rounds, µs per frame (timer overhead excluded)."""
    frames = len(payloads)
    codes = [np.frombuffer(p, dtype=np.uint8) for p in payloads]
    pcm = [ulaw_decode(c) for c in codes]
    wide = Resampler(8000, 24000).process(np.concatenate(pcm)).reshape(frames, 480)

    def jitter() -> None:
        jb = JitterBuffer()
        for i in range(frames):
            jb.push(i & 0xFFFF, (i * 160) & 0xFFFFFFFF, pcm[i], i * 0.02 - 0.02 + jitter_s[i])
            jb.pop(i * 0.02)

    def up() -> None:
        r = Resampler(8000, 24000)
        for x in pcm:
            r.process(x)

    def down() -> None:
        r = Resampler(24000, 8000)
        for x in wide:
            r.process(x)

    stages: dict[str, Callable[[], object]] = {
        "decode": lambda: [ulaw_decode(c) for c in codes],
        "jitter_buffer": jitter,
        "resample_8k_24k": up,
        "resample_24k_8k": down,
        "encode": lambda: [ulaw_encode(x) for x in pcm],
    }
    out = {}
    for name, fn in stages.items():
        best = np.inf
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        out[name] = round(best / frames * 1e6, 1)
    return out


def bench_chain(frames: int = 3000, rounds: int = 7) -> dict[str, Any]:
    """One call's receive + send media path per 20 ms frame, in µs of CPU.

    decode(PCMU) -> JitterBuffer push/pop -> 8k->24k -> 24k->8k -> encode(PCMU):
    the agent sits between the two resamplers and is not counted here. The
    machines are shared: `best` (the least disturbed round, as timeit advises)
    is the cost of the code, `median` shows what the noise added in this run.
    Process CPU time counts every thread (OpenBLAS's too), not just wall time.
    """
    payloads, jitter_s = _chain_frames(frames)
    _chain_round(payloads[:200], jitter_s[:200])  # warm-up: imports, filter design, caches
    walls, cpus = zip(*(_chain_round(payloads, jitter_s) for _ in range(rounds)), strict=True)
    best = float(min(cpus))
    return {
        "description": "G711Decode(PCMU) -> JitterBuffer -> Resample(8k->24k) -> "
        "Resample(24k->8k) -> G711Encode(PCMU)",
        "frames_per_round": frames,
        "rounds": rounds,
        "cpu_us_per_20ms": round(best, 1),
        "cpu_us_per_20ms_median": round(float(np.median(cpus)), 1),
        "wall_us_per_20ms_median": round(float(np.median(walls)), 1),
        "core_pct_per_call": round(best / 20000 * 100, 3),
        "stages_us_per_20ms_best": _stage_costs(payloads, jitter_s),
        "target_cpu_us_per_20ms": 100.0,
    }


def _plot(results: dict[str, Any], timelines: dict[str, Any], out: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional; the JSON is the record
        return []
    written: list[str] = []
    from bench.bench_jitter import plot_jitter
    from bench.bench_resample import plot_resamplers

    written += plot_resamplers(results["resamplers"], out, plt)
    written += plot_jitter(results["jitter"], timelines, out, plt)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter traces and fewer repeats")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    results: dict[str, Any] = {
        "bench": "media_core",
        "resamplers": bench_resamplers(quick=args.quick),
        "jitter": bench_jitter(duration_s=30.0 if args.quick else 180.0),
        "chain": bench_chain(frames=1000 if args.quick else 3000, rounds=3 if args.quick else 7),
    }
    timelines = results["jitter"].pop("_timelines")
    results["plots"] = _plot(results, timelines, args.out)
    results["wall_s"] = round(time.time() - started, 1)
    text = json.dumps(results, indent=2, default=_json_default)
    (args.out / "media_core.json").write_text(text + "\n")
    print(text)
    return 0


def _json_default(o: object) -> object:
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


if __name__ == "__main__":
    sys.exit(main())

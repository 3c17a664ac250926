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
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_jitter import bench_jitter
from bench_resample import bench_resamplers

from jitter import JitterBuffer
from resample import Resampler
from resample.g711 import ulaw_decode, ulaw_encode


def bench_chain(frames: int = 3000, repeats: int = 5) -> dict[str, Any]:
    """One call's receive + send media path per 20 ms frame, in µs of CPU.

    decode(PCMU) -> JitterBuffer push/pop -> 8k->24k -> 24k->8k -> encode(PCMU):
    the agent sits between the two resamplers and is not counted here.
    """
    rng = np.random.default_rng(1)
    t = np.arange(160 * frames) / 8000.0
    speechish = (6000 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(
        np.int16
    )
    payloads = [ulaw_encode(speechish[i * 160 : (i + 1) * 160]).tobytes() for i in range(frames)]
    jitter_s = rng.uniform(0, 0.015, frames)
    per_stage: dict[str, list[float]] = {k: [] for k in ("decode", "jitter", "up", "down", "enc")}
    totals: list[float] = []
    for _ in range(repeats):
        jb = JitterBuffer()
        up = Resampler(8000, 24000)
        down = Resampler(24000, 8000)
        acc = dict.fromkeys(per_stage, 0.0)
        clock = time.perf_counter
        start = clock()
        for i in range(frames):
            now = i * 0.02
            t0 = clock()
            pcm = ulaw_decode(np.frombuffer(payloads[i], dtype=np.uint8))
            t1 = clock()
            jb.push(i & 0xFFFF, (i * 160) & 0xFFFFFFFF, pcm, now - 0.02 + jitter_s[i])
            frame = jb.pop(now)
            t2 = clock()
            wide = up.process(frame)
            t3 = clock()
            narrow = down.process(wide)
            t4 = clock()
            ulaw_encode(narrow)
            t5 = clock()
            acc["decode"] += t1 - t0
            acc["jitter"] += t2 - t1
            acc["up"] += t3 - t2
            acc["down"] += t4 - t3
            acc["enc"] += t5 - t4
        totals.append((clock() - start) / frames * 1e6)
        for k, v in acc.items():
            per_stage[k].append(v / frames * 1e6)
    total = float(np.median(totals))
    return {
        "description": "G711Decode(PCMU) -> JitterBuffer -> Resample(8k->24k) -> "
        "Resample(24k->8k) -> G711Encode(PCMU)",
        "cpu_us_per_20ms": round(total, 1),
        "core_pct_per_call": round(total / 20000 * 100, 3),
        "stages_us_per_20ms": {k: round(float(np.median(v)), 1) for k, v in per_stage.items()},
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
    from bench_jitter import plot_jitter
    from bench_resample import plot_resamplers

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
        "chain": bench_chain(frames=1000 if args.quick else 3000, repeats=3 if args.quick else 5),
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

"""Resamplers measured side by side: ours and soxr's streaming presets (part of media_core)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from resample import Resampler
from testkit.analysis import (
    ResamplerFactory,
    cpu_us_per_20ms,
    measure_delay_s,
    measure_holdback_s,
    measure_image_rejection_db,
    measure_passband_ripple_db,
)

PAIRS = [
    (8000, 16000),
    (16000, 8000),
    (8000, 24000),
    (24000, 8000),
    (22050, 8000),
    (8000, 22050),
    (8000, 48000),
    (48000, 8000),
]
SOXR_PRESETS = ["QQ", "LQ", "MQ", "HQ", "VHQ"]


class SoxrStream:
    """soxr.ResampleStream behind the same streaming interface as our Resampler."""

    def __init__(self, in_rate: int, out_rate: int, quality: str) -> None:
        self.in_rate, self.out_rate, self.quality = in_rate, out_rate, quality
        self._streams: dict[str, Any] = {}
        self._last = "float32"

    def _stream(self, dtype: str) -> Any:
        import soxr

        if dtype not in self._streams:
            self._streams[dtype] = soxr.ResampleStream(
                self.in_rate, self.out_rate, 1, dtype=dtype, quality=self.quality
            )
        return self._streams[dtype]

    def process(self, x: NDArray[Any]) -> NDArray[Any]:
        self._last = str(x.dtype)
        return np.asarray(self._stream(self._last).resample_chunk(x, last=False))

    def flush(self) -> NDArray[Any]:
        empty = np.zeros(0, dtype=self._last)
        out = np.asarray(self._stream(self._last).resample_chunk(empty, last=True))
        self.reset()
        return out

    def reset(self) -> None:
        self._streams.clear()


def _measure(factory: ResamplerFactory, fine: bool, quick: bool) -> dict[str, Any]:
    step = 25 if quick else 10
    # Phase-slope delay needs tones closer than 1/(2*delay) Hz to unwrap: soxr's 23-86 ms
    # of filter delay needs a finer grid than our 2 ms.
    delay_s = measure_delay_s(factory, step_hz=5 if fine else 50)
    holdback_s = measure_holdback_s(factory)
    return {
        "delay_ms": round(1000 * (delay_s + holdback_s), 3),
        "signal_delay_ms": round(1000 * delay_s, 3),
        "withheld_ms": round(1000 * holdback_s, 3),
        "image_rejection_db": round(measure_image_rejection_db(factory, step_hz=step * 5), 1),
        "passband_ripple_db": round(measure_passband_ripple_db(factory, step_hz=step * 10), 3),
        "cpu_us_per_20ms": round(cpu_us_per_20ms(factory(), n_chunks=200 if quick else 500), 1),
    }


def bench_resamplers(quick: bool = False) -> dict[str, Any]:
    """Per pair: ours, then each soxr preset. `delay_ms` is what a caller hears added."""
    try:
        import soxr  # noqa: F401

        presets = SOXR_PRESETS
    except ImportError:
        presets = []
    out: dict[str, Any] = {
        "targets": {
            "delay_ms_max_8k_16k_24k": 3.0,
            "image_rejection_db_min": 60.0,
            "passband_ripple_db_max": 0.5,
        },
        "pairs": {},
    }
    for a, b in PAIRS:
        entry: dict[str, Any] = {"ours": _measure(partial(Resampler, a, b), False, quick)}
        for q in presets:
            entry[f"soxr_{q}"] = _measure(partial(SoxrStream, a, b, q), True, quick)
        out["pairs"][f"{a}->{b}"] = entry
    return out


def plot_resamplers(res: dict[str, Any], out: Path, plt: Any) -> list[str]:
    pairs = list(res["pairs"])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in res["pairs"][pairs[0]]:
        delays = [res["pairs"][p][name]["delay_ms"] for p in pairs]
        rej = [res["pairs"][p][name]["image_rejection_db"] for p in pairs]
        style = {"lw": 2.5, "color": "k"} if name == "ours" else {"lw": 1}
        axes[0].plot(pairs, delays, marker="o", label=name, **style)
        axes[1].plot(pairs, rej, marker="o", label=name, **style)
    axes[0].set_ylabel("latency added, ms (signal delay + withheld)")
    axes[0].set_yscale("symlog", linthresh=1.0)
    axes[0].axhline(3.0, color="r", ls="--", lw=0.8)
    axes[1].set_ylabel("image/alias rejection above 4 kHz, dB")
    axes[1].axhline(60.0, color="r", ls="--", lw=0.8)
    for ax in axes:
        ax.tick_params(axis="x", rotation=35)
        ax.legend(fontsize=7)
    fig.suptitle("streaming resamplers: ours vs soxr presets")
    fig.tight_layout()
    path = out / "resamplers.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [str(path)]

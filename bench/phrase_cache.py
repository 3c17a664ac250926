"""TTS time of the phrases every call says: the demo's greeting and a fixed reply.

Loads the voice models and the demo profile as the bridge does (``prepare_agents``, then
``load_agent_models``' warm-up where it exists), waits for any background warming, then
times ``VoiceModels.speak`` for each phrase several times: the first call's cost and a later
call's. With the phrase cache, every call after start-up gets the cached audio.

    .venv/bin/python bench/phrase_cache.py [--repeats 3]

Prints JSON; writes bench/out/phrase_cache.json.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from sip_bridge.agents import load_agent_models, prepare_agents
from sip_bridge.config.loader import load_config

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
FIXED_REPLY = "Sure, I'm putting you through to a colleague. Please hold."


def _speak_ms(models: Any, text: str) -> tuple[float, float, int]:
    """(ms to the first piece's audio, ms for all of it, samples at 8 kHz)."""
    t0 = time.perf_counter()
    first = None
    n = 0
    for _, pcm in models.speak(text, threading.Event()):
        if pcm is None:
            continue
        if first is None:
            first = time.perf_counter() - t0
        n += pcm.size
    return round(1000 * (first or 0.0), 2), round(1000 * (time.perf_counter() - t0), 2), n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="times each phrase is spoken")
    args = ap.parse_args()
    config = load_config(ROOT / "config" / "bridge.toml")
    t0 = time.perf_counter()
    load_agent_models(config)  # what the bridge does before it listens (and on reload)
    load_s = time.perf_counter() - t0
    models, profile = prepare_agents(config)
    warming = getattr(models, "warming", None)
    t1 = time.perf_counter()
    if warming is not None:
        warming.result()  # the background warm-up: done before calls come in
    warm_s = time.perf_counter() - t1
    greeting = profile.greeting.render(dict(profile.variables))
    result: dict[str, Any] = {
        "load_and_warm_up_s": round(load_s, 2),
        "background_phrase_warming_s": round(warm_s, 2),
        "cache": getattr(models, "cache", None) and models.cache.stats()._asdict(),
    }
    for name, text in (("greeting", greeting), ("fixed_reply", FIXED_REPLY)):
        runs = [_speak_ms(models, text) for _ in range(args.repeats)]
        result[name] = {
            "text": text,
            "audio_s": round(runs[0][2] / 8000, 2),
            "first_audio_ms": [r[0] for r in runs],
            "total_ms": [r[1] for r in runs],
            "later_calls_total_ms_median": float(np.median([r[1] for r in runs[1:]] or [0])),
        }
    if getattr(models, "cache", None) is not None:
        result["cache_after"] = models.cache.stats()._asdict()
    models.close()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "phrase_cache.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

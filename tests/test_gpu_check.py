"""bench/gpu_check.py without a GPU: the inputs it makes run the project's real models on
the CPU, and asking for CUDA where there is none stops with the reason."""

from __future__ import annotations

import numpy as np
import onnxruntime  # type: ignore[import-untyped]
import pytest

from agent.voice import tts, vad
from bench.gpu_check import check, check_asr, feeds_for, timed
from model_runtime.sessions import CPU, ModelRuntimeError, create_session
from model_runtime.store import default_store


@pytest.mark.parametrize(
    ("model", "file", "shapes"),
    [
        (vad.MODEL, vad.MODEL_FILE, {"input": (1, 512), "state": (2, 1, 128), "sr": ()}),
        ("smart-turn-v3.2", "smart-turn-v3.2-cpu.onnx", {"input_features": (1, 80, 800)}),
        (tts.MODEL, tts.MODEL_FILE, {"input": (1, 100), "input_lengths": (1,),
                                             "scales": (3,)}),
    ],
)  # fmt: skip
def test_its_inputs_run_each_model_on_the_cpu(
    model: str, file: str, shapes: dict[str, tuple[int, ...]]
) -> None:
    session = create_session(default_store().path(model, file), device="cpu")
    feeds = feeds_for(session, np.random.default_rng(0))
    assert {k: v.shape for k, v in feeds.items()} == shapes
    report = timed(session, feeds, runs=2)
    assert report["provider"] == CPU and report["median_ms"] > 0


def test_without_cuda_it_stops_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: [CPU])  # (CPU build)
    path = default_store().path(vad.MODEL, vad.MODEL_FILE)
    with pytest.raises(ModelRuntimeError, match="no CUDA provider"):
        check(path, runs=1)


def test_the_asr_check_transcribes_the_speech_it_times() -> None:
    """The --asr part on the CPU alone: the agent's Moonshine hears beckett.wav's words."""
    store = default_store()
    wav = store.path("beckett", "beckett.wav")
    model_dir = store.path("moonshine-base-en", "tokenizer.json").parent
    report = check_asr(model_dir, wav, runs=1, devices=("cpu",), seconds=(2.5,), counts=(2,))
    (row,) = report["clips"]
    assert row["cpu"]["provider"] == CPU and row["cpu"]["median_ms"] > 0
    assert "ever tried" in row["cpu"]["text"].lower() and row["texts_agree"]
    two = row["cpu"]["streams"]["2"]  # two threads at once, two runs each
    assert two["runs_per_s"] > 0 and 0 < two["p50_ms"] <= two["p95_ms"]

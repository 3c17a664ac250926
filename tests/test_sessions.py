"""model_runtime.sessions: provider choice, the registry, real CPU sessions, the CUDA checks."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime  # type: ignore[import-untyped]
import pytest
from onnx import TensorProto, helper

from model_runtime.observe import set_inference_observer
from model_runtime.sessions import (
    CPU,
    CUDA,
    TENSORRT,
    Device,
    ModelRuntimeError,
    create_session,
    providers_in_use,
    select_providers,
    warm_up,
)

AZURE = "AzureExecutionProvider"
ROCM = "ROCMExecutionProvider"


@pytest.mark.parametrize(
    ("device", "available", "expected"),
    [
        ("auto", [AZURE, CPU], [CPU]),
        ("auto", [CUDA, CPU], [CUDA, CPU]),
        ("auto", [CPU, CUDA, TENSORRT], [CUDA, CPU]),  # our order, not ORT's; no TensorRT
        ("auto", [TENSORRT, CPU], [CPU]),
        ("auto", [ROCM, CPU], [CPU]),
        ("auto", [], [CPU]),
        ("cuda", [CUDA, CPU], [CUDA, CPU]),
        ("cuda", [TENSORRT, CUDA, CPU, AZURE], [CUDA, CPU]),
        ("cpu", [TENSORRT, CUDA, CPU], [CPU]),
        ("cpu", [AZURE, CPU], [CPU]),
    ],
)
def test_provider_table(device: Device, available: list[str], expected: list[str]) -> None:
    assert select_providers(device, available) == expected


@pytest.mark.parametrize("available", [[AZURE, CPU], [TENSORRT, CPU], []])
def test_cuda_without_cuda_provider_says_how_to_fix(available: list[str]) -> None:
    with pytest.raises(ModelRuntimeError) as err:
        select_providers("cuda", available)
    assert str(err.value) == (
        'device = "cuda" but this onnxruntime has no CUDA provider '
        "(install onnxruntime-gpu: see docs/models.md, GPU)"
    )


def test_unknown_device_is_refused() -> None:
    with pytest.raises(ModelRuntimeError, match="unknown device 'gpu'"):
        select_providers("gpu", [CPU])  # type: ignore[arg-type]


def test_default_available_is_this_build() -> None:
    # the CPU wheel in the venv: auto must come out as CPU only
    assert select_providers("auto")[-1] == CPU


def _affine_model(path: Path) -> Path:
    """y = 2 x + 1 on a float vector: small enough to check the numbers exactly."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "two"], ["t"]),
            helper.make_node("Add", ["t", "one"], ["y"]),
        ],
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
        initializer=[two, one],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def test_cpu_session_runs_and_is_registered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _affine_model(tmp_path / "affine.onnx")
    with caplog.at_level(logging.INFO, logger="model_runtime.sessions"):
        s = create_session(path, name="affine-test", device="cpu", threads=2)
        create_session(path, name="affine-test", device="cpu", threads=2)
    (y,) = s.run(None, {"x": np.array([0.0, 1.5, -3.0], np.float32)})
    np.testing.assert_array_equal(y, [1.0, 4.0, -5.0])
    assert s.get_providers()[0] == CPU
    assert providers_in_use()["affine-test"] == CPU
    lines = [r.getMessage() for r in caplog.records if "affine-test" in r.getMessage()]
    assert lines == ["model affine-test on CPUExecutionProvider (threads 2)"]  # once


def test_name_defaults_to_the_file_stem(tmp_path: Path) -> None:
    create_session(_affine_model(tmp_path / "stem-named.onnx"), device="auto")
    assert providers_in_use()["stem-named"] == CPU


def test_registry_is_a_copy(tmp_path: Path) -> None:
    create_session(_affine_model(tmp_path / "m.onnx"), name="copy-test", device="cpu")
    snapshot = providers_in_use()
    snapshot["copy-test"] = "nonsense"
    assert providers_in_use()["copy-test"] == CPU


def test_missing_model_file_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.onnx"
    with pytest.raises(ModelRuntimeError, match=r"model vad: file not found: .*nope\.onnx"):
        create_session(missing, name="vad", device="cpu")


def test_broken_model_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ModelRuntimeError, match="model bad: cannot load"):
        create_session(bad, device="cpu")


def test_bad_arguments(tmp_path: Path) -> None:
    path = _affine_model(tmp_path / "a.onnx")
    with pytest.raises(ValueError, match="threads"):
        create_session(path, threads=0)
    with pytest.raises(ValueError, match="optimization"):
        create_session(path, optimization="max")


def _pretend_cuda_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    """Like onnxruntime-gpu without the CUDA libraries: CUDA is offered, the session
    silently lands on CPU (this CPU build warns and runs on CPU, the same outcome)."""
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: [CUDA, CPU])


def test_cuda_falling_back_to_cpu_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend_cuda_exists(monkeypatch)
    path = _affine_model(tmp_path / "a.onnx")
    with pytest.raises(ModelRuntimeError, match="fell back to CPUExecutionProvider"):
        create_session(path, name="cuda-strict", device="cuda")


def test_auto_falling_back_to_cpu_warns_and_records_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _pretend_cuda_exists(monkeypatch)
    path = _affine_model(tmp_path / "a.onnx")
    with caplog.at_level(logging.WARNING, logger="model_runtime.sessions"):
        s = create_session(path, name="cuda-auto", device="auto")
    (y,) = s.run(None, {"x": np.array([1.0], np.float32)})
    assert y.tolist() == [3.0]
    assert providers_in_use()["cuda-auto"] == CPU
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "asked for CUDAExecutionProvider but onnxruntime fell back" in warnings[0].getMessage()


def test_cuda_is_asked_for_with_the_conv_search_that_suits_changing_shapes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cuDNN's exhaustive search per new shape made Piper 10x slower on a GPU: the CUDA
    provider gets ``cudnn_conv_algo_search = DEFAULT``; the others go by name."""
    _pretend_cuda_exists(monkeypatch)
    asked: list[object] = []
    real = onnxruntime.InferenceSession

    def recording(source: object, opts: object, providers: list[object]) -> object:
        asked.extend(providers)
        return real(source, opts, providers=[CPU])

    monkeypatch.setattr(onnxruntime, "InferenceSession", recording)
    create_session(_affine_model(tmp_path / "a.onnx"), name="cuda-opts", device="auto")
    assert asked == [(CUDA, {"cudnn_conv_algo_search": "DEFAULT"}), CPU]


def test_warm_up_returns_the_last_run_in_ms(tmp_path: Path) -> None:
    calls: list[dict[str, np.ndarray]] = []
    s = create_session(_affine_model(tmp_path / "a.onnx"), device="cpu")

    class Spy:
        def run(self, names: object, feeds: dict[str, np.ndarray]) -> object:
            calls.append(feeds)
            return s.run(names, feeds)

    ms = warm_up(Spy(), {"x": np.zeros(4, np.float32)}, runs=3)
    assert len(calls) == 3
    assert 0.0 < ms < 1000.0
    with pytest.raises(ValueError):
        warm_up(s, {"x": np.zeros(4, np.float32)}, runs=0)


def test_every_run_is_reported_to_the_observer_while_one_is_set(tmp_path: Path) -> None:
    s = create_session(_affine_model(tmp_path / "a.onnx"), name="timed", device="cpu")
    seen: list[tuple[str, str, float]] = []
    set_inference_observer(lambda *a: seen.append(a))
    try:
        x = {"x": np.array([1.0], np.float32)}
        assert s.run(None, x)[0].tolist() == [3.0]  # the same results, timed
        s.run(["y"], x)
    finally:
        set_inference_observer(None)
    s.run(None, x)  # not reported any more
    assert [(m, p) for m, p, _ in seen] == [("timed", CPU), ("timed", CPU)]
    assert all(0 < t < 1 for _, _, t in seen)

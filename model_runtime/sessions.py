"""The one place ONNX Runtime sessions are made: provider choice, threads, and what we got.

Why one place: the provider order (TensorRT, CUDA, CPU), the thread settings and the check
that a GPU session really landed on the GPU must be the same for every model. The check
matters because ``onnxruntime-gpu`` on a machine without the CUDA libraries does not fail:
it logs an error and quietly runs on CPU. So the provider a session *actually* uses
(``session.get_providers()[0]``) is logged and kept in a registry, exported as a metric.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import onnxruntime as ort  # type: ignore[import-untyped]

from model_runtime.observe import observers
from model_runtime.store import ModelError

__all__ = [
    "CPU",
    "CUDA",
    "TENSORRT",
    "Device",
    "ModelRuntimeError",
    "create_session",
    "providers_in_use",
    "select_providers",
    "warm_up",
]

log = logging.getLogger(__name__)

Device = Literal["auto", "cuda", "cpu"]

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
#: TensorRT is not asked for: it builds an engine per input shape (every Piper sentence is
#: one), and where its libraries are missing onnxruntime retries with bare provider names,
#: dropping CUDA_OPTIONS: Piper then took 745 ms a sentence on an H100, not 113.
_GPU_PROVIDERS = (CUDA,)
#: The CUDA provider's options. cuDNN's default search (EXHAUSTIVE) times every convolution
#: algorithm for each new input shape, and Piper's output length changes with every
#: sentence: on an H100 a 100-phoneme sentence took 911 ms (median of 15; 21 ms at best)
#: against 88-113 ms with DEFAULT and 326 ms on one CPU core (bench/gpu_check.py, 2026-11-26).
CUDA_OPTIONS = {"cudnn_conv_algo_search": "DEFAULT"}

_OPTIMIZATION = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}

_lock = threading.Lock()
_registry: dict[str, str] = {}  # model name -> provider actually used
_logged: set[tuple[str, str, int]] = set()


class ModelRuntimeError(ModelError, RuntimeError):
    """A model cannot run as configured (missing file, no CUDA provider, CPU fallback);
    a ModelError, so the command line reports it in one line like the store's."""


def select_providers(device: Device, available: Sequence[str] | None = None) -> list[str]:
    """The provider list to ask ONNX Runtime for, best first.

    ``available`` defaults to what this onnxruntime build offers; tests pass fake lists.
    ``auto`` takes whatever GPU providers exist and always ends with CPU; ``cuda`` refuses
    to start without a CUDA provider (a GPU machine silently running on CPU would miss
    the latency budget by 10x); ``cpu`` is CPU only.
    """
    avail = list(ort.get_available_providers() if available is None else available)
    if device == "cpu":
        return [CPU]
    if device == "auto":
        return [p for p in _GPU_PROVIDERS if p in avail] + [CPU]
    if device == "cuda":
        if CUDA not in avail:
            raise ModelRuntimeError(
                'device = "cuda" but this onnxruntime has no CUDA provider '
                "(install onnxruntime-gpu: see docs/models.md, GPU)"
            )
        return [p for p in _GPU_PROVIDERS if p in avail] + [CPU]
    raise ModelRuntimeError(
        f"unknown device {device!r}: expected one of {', '.join(get_args(Device))}"
    )


def create_session(
    path: Path,
    *,
    model: bytes | None = None,
    name: str = "",
    device: Device = "auto",
    threads: int = 1,
    inter_threads: int = 1,
    optimization: str = "all",
    spinning: bool = False,
) -> ort.InferenceSession:
    """Open ``path`` on the best provider for ``device`` and record which one it got.

    ``spinning`` is off by default: ORT's worker threads otherwise busy-wait between
    runs, and with many calls' sessions sharing a few cores that spinning steals CPU from
    the sessions doing real work. ``name`` (default: the file's stem) keys the registry.
    ``model``: the serialized model to load instead of reading ``path`` (a graph patched
    in memory); ``path`` then only names it in messages.
    """
    path = Path(path)
    name = name or path.stem
    if threads < 1 or inter_threads < 1:
        raise ValueError("threads and inter_threads must be >= 1")
    if optimization not in _OPTIMIZATION:
        raise ValueError(f"optimization must be one of {sorted(_OPTIMIZATION)}")
    if model is None and not path.is_file():
        raise ModelRuntimeError(f"model {name}: file not found: {path}")
    providers = select_providers(device)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = inter_threads
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = _OPTIMIZATION[optimization]
    opts.log_severity_level = 3  # errors only: ORT's own warnings are relayed below
    spin = "1" if spinning else "0"
    opts.add_session_config_entry("session.intra_op.allow_spinning", spin)
    opts.add_session_config_entry("session.inter_op.allow_spinning", spin)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            source = str(path) if model is None else model
            with_options = [(p, CUDA_OPTIONS) if p == CUDA else p for p in providers]
            session = ort.InferenceSession(source, opts, providers=with_options)
        except Exception as exc:  # ORT raises its own exception types
            raise ModelRuntimeError(f"model {name}: cannot load {path}: {exc}") from exc
    for w in caught:
        log.debug("model %s: onnxruntime: %s", name, w.message)
    used = session.get_providers()[0]
    with _lock:
        _registry[name] = used
        first = (name, used, threads) not in _logged
        _logged.add((name, used, threads))
    if first:
        log.info("model %s on %s (threads %d)", name, used, threads)
    _time_runs(session, name, used)
    asked_gpu = any(p in _GPU_PROVIDERS for p in providers)
    if asked_gpu and used not in _GPU_PROVIDERS:
        msg = (
            f"model {name}: asked for {providers[0]} but onnxruntime fell back to {used} "
            "(are the CUDA 13 / cuDNN 9 / cuBLAS libraries installed?)"
        )
        if device == "cuda":
            raise ModelRuntimeError(msg)
        log.warning("%s", msg)
    return session


def _time_runs(session: ort.InferenceSession, name: str, provider: str) -> None:
    run = session.run

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return run(*args, **kwargs)
        finally:
            for observe in observers:  # model_runtime.observe: the bridge's metrics
                observe(name, provider, time.perf_counter() - t0)

    setattr(session, "run", timed)  # noqa: B010 (an instance's method, replaced)


def providers_in_use() -> dict[str, str]:
    """Model name -> the provider its latest session actually runs on (a copy)."""
    with _lock:
        return dict(_registry)


def warm_up(session: ort.InferenceSession, feeds: Mapping[str, np.ndarray], runs: int = 2) -> float:
    """Run ``runs`` times so first-call costs (allocation, kernel choice, CUDA graphs) are
    paid before a caller is waiting; returns the last run's wall time in ms."""
    if runs < 1:
        raise ValueError("runs must be >= 1")
    ms = 0.0
    for _ in range(runs):
        t0 = time.perf_counter()
        session.run(None, dict(feeds))
        ms = (time.perf_counter() - t0) * 1000.0
    return ms

"""Who hears how long each model run took (the bridge's metrics), kept apart from
``sessions`` so that setting it does not import onnxruntime (a line-check bridge never
loads it)."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["InferenceObserver", "observers", "set_inference_observer"]

#: ``observe(model, provider, seconds)`` of every run, from whichever thread ran it.
InferenceObserver = Callable[[str, str, float], None]
observers: list[InferenceObserver] = []


def set_inference_observer(observe: InferenceObserver | None) -> None:
    """Report every session run's duration to ``observe`` (None: stop)."""
    observers[:] = [observe] if observe is not None else []

"""A native speech-to-speech model: audio frames in, audio frames out, state carried along.

For operators who have one (a streaming voice model exported to ONNX), the whole
VAD -> ASR -> dialogue -> TTS chain collapses to one graph run per frame. Models differ only
in names and sizes, so the config declares them (:class:`SpeechModelSpec`): which input
takes the audio, which output gives it back, the rate and frame size, and which outputs
feed which inputs on the next frame (recurrent state, KV caches). The spec is checked
against the graph at load, so a typo fails with the names the model really has.

Many calls share one session: :meth:`SpeechToSpeechModel.run` stacks one frame per call on
the batch axis, with each call's state, and splits the results back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from model_runtime.sessions import Device, create_session

__all__ = ["SpeechModelSpec", "SpeechToSpeechModel", "StreamState"]

_DTYPES: dict[str, Any] = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
}


@dataclass(frozen=True)
class SpeechModelSpec:
    """How to drive a streaming speech model (from the agent profile's config)."""

    path: Path
    input: str  # audio input, float32 in [-1, 1]
    output: str  # audio output, float32 in [-1, 1], same rate
    sample_rate: int
    frame_samples: int
    state: tuple[tuple[str, str], ...] = ()  # (state input name, state output name) pairs
    batch: bool = True  # leading batch axis on audio and states

    def __post_init__(self) -> None:
        if self.sample_rate <= 0 or self.frame_samples <= 0:
            raise ValueError("sample_rate and frame_samples must be positive")


@dataclass
class StreamState:
    """One call's recurrent tensors (without the batch axis), advanced in place by run()."""

    tensors: dict[str, NDArray[Any]] = field(default_factory=dict)
    frames: int = 0  # frames run so far


def _fixed(dim: object) -> int | None:
    return dim if isinstance(dim, int) and dim > 0 else None


class SpeechToSpeechModel:
    """An ONNX speech-to-speech model checked against its :class:`SpeechModelSpec`."""

    def __init__(self, spec: SpeechModelSpec, *, threads: int = 1, device: Device = "cpu") -> None:
        if not Path(spec.path).is_file():
            raise FileNotFoundError(f"speech model not found: {spec.path}")
        self.spec = spec
        name = f"speech-to-speech:{Path(spec.path).stem}"
        self._session = create_session(Path(spec.path), name=name, device=device, threads=threads)
        self.providers: list[str] = self._session.get_providers()
        inputs = {i.name: i for i in self._session.get_inputs()}
        outputs = {o.name: o for o in self._session.get_outputs()}
        lead = 1 if spec.batch else 0

        def need(names: dict[str, Any], name: str, what: str) -> Any:
            if name not in names:
                raise ValueError(
                    f"{spec.path}: the model has no {what} named {name!r} "
                    f"(it has: {', '.join(sorted(names))})"
                )
            return names[name]

        audio = need(inputs, spec.input, "input")
        need(outputs, spec.output, "output")
        if audio.type != "tensor(float)":
            raise ValueError(f"{spec.input!r} is {audio.type}; audio must be tensor(float)")
        if len(audio.shape) != lead + 1:
            raise ValueError(
                f"{spec.input!r} has shape {audio.shape}; expected "
                + ("(batch, frame_samples)" if spec.batch else "(frame_samples,)")
            )
        n = _fixed(audio.shape[lead])
        if n is not None and n != spec.frame_samples:
            raise ValueError(
                f"{spec.input!r} takes {n} samples; the spec says {spec.frame_samples}"
            )
        # A graph exported with batch 1 is run one call at a time.
        self.max_batch = _fixed(audio.shape[0]) if spec.batch else 1

        self._state_shapes: dict[str, tuple[tuple[int, ...], Any]] = {}
        for name_in, name_out in spec.state:
            arg = need(inputs, name_in, "state input")
            need(outputs, name_out, "state output")
            dims = [_fixed(d) for d in arg.shape[lead:]]
            if any(d is None for d in dims):
                raise ValueError(
                    f"state {name_in!r} has shape {arg.shape}: its non-batch dims must be fixed"
                )
            if arg.type not in _DTYPES:
                raise ValueError(f"state {name_in!r} has unsupported type {arg.type}")
            self._state_shapes[name_in] = (
                tuple(d for d in dims if d is not None),
                _DTYPES[arg.type],
            )
        fed = {spec.input, *self._state_shapes}
        missing = sorted(set(inputs) - fed)
        if missing:
            raise ValueError(f"{spec.path}: inputs {missing} are neither the audio nor a state")
        self._fetch = [spec.output, *(o for _, o in spec.state)]

    def new_state(self) -> StreamState:
        """A fresh call: every state tensor zero."""
        return StreamState(
            {k: np.zeros(shape, dt) for k, (shape, dt) in self._state_shapes.items()}
        )

    def run(self, frames: NDArray[np.float32], states: list[StreamState]) -> NDArray[np.float32]:
        """B calls' frames (B, frame_samples) at once; each call's state advanced in place.

        Returns (B, output samples). The states must be distinct (one frame per call)."""
        x = np.asarray(frames, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.spec.frame_samples or x.shape[0] != len(states):
            raise ValueError(
                f"need ({len(states)}, {self.spec.frame_samples}) frames, got {x.shape}"
            )
        if len({id(s) for s in states}) != len(states):
            raise ValueError("one frame per call per run: a state appears twice")
        if x.shape[0] == 0:
            return np.zeros((0, 0), np.float32)
        step = self.max_batch or x.shape[0]
        if not self.spec.batch:
            return np.stack([self._run_one(x[i], states[i]) for i in range(x.shape[0])])
        parts = [
            self._run_batch(x[i : i + step], states[i : i + step])
            for i in range(0, x.shape[0], step)
        ]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _run_batch(self, x: NDArray[np.float32], states: list[StreamState]) -> NDArray[np.float32]:
        feed: dict[str, NDArray[Any]] = {self.spec.input: x}
        for name in self._state_shapes:
            feed[name] = np.stack([s.tensors[name] for s in states])
        out = self._session.run(self._fetch, feed)
        for (name_in, _), value in zip(self.spec.state, out[1:], strict=True):
            v = np.asarray(value)
            self._check_state(name_in, v.shape[1:])
            for i, s in enumerate(states):
                s.tensors[name_in] = v[i].copy()
        for s in states:
            s.frames += 1
        y = np.asarray(out[0], dtype=np.float32)
        return y.reshape(x.shape[0], -1)

    def _run_one(self, x: NDArray[np.float32], state: StreamState) -> NDArray[np.float32]:
        feed: dict[str, NDArray[Any]] = {self.spec.input: x, **state.tensors}
        out = self._session.run(self._fetch, feed)
        for (name_in, _), value in zip(self.spec.state, out[1:], strict=True):
            v = np.asarray(value)
            self._check_state(name_in, v.shape)
            state.tensors[name_in] = v
        state.frames += 1
        return np.asarray(out[0], dtype=np.float32).reshape(-1)

    def _check_state(self, name_in: str, shape: tuple[int, ...]) -> None:
        want = self._state_shapes[name_in][0]
        if tuple(shape) != want:
            raise ValueError(f"state {name_in!r}: the model returned {shape}, expected {want}")

    def run_batch(
        self, items: Sequence[tuple[NDArray[np.float32], StreamState]]
    ) -> list[NDArray[np.float32]]:
        """The TickBatcher's ``run_batch``: (frame, state) items from many calls, in order.

        A call with several frames queued in one tick gets them in successive rounds, so a
        state is never used twice in one run and each call's frames stay in order."""
        results: list[NDArray[np.float32] | None] = [None] * len(items)
        round_of: dict[int, int] = {}
        rounds: list[list[int]] = []
        for i, (_, state) in enumerate(items):
            r = round_of.get(id(state), -1) + 1
            round_of[id(state)] = r
            if r == len(rounds):
                rounds.append([])
            rounds[r].append(i)
        for idx in rounds:
            frames = np.stack([np.asarray(items[i][0], np.float32) for i in idx])
            out = self.run(frames, [items[i][1] for i in idx])
            for k, i in enumerate(idx):
                results[i] = out[k]
        return [r for r in results if r is not None]

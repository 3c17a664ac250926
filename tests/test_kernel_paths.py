"""The models on the AVX2 kernel path, on whatever CPU runs the tests.

ONNX Runtime picks int8 and float kernels by CPU (AVX2, AVX-512, VNNI, AMX), so a model
can score the same audio differently on another server: smart-turn's shipped int8 graph
did (0.53 on an AVX-512 VNNI machine, 0.14 on AVX2, for one window). Debian's qemu-user
runs the same Python as a Haswell (AVX2, no AVX-512) whatever the host is, so one machine
checks both paths: ``kernel_path_probe.py`` runs natively and under
``qemu-x86_64 -cpu Haswell`` and the results are compared. Emulation is slow (~25 s per
smart-turn run): the probe scores two windows. ``make test-avx2`` runs the whole model
test files that way.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.serial  # emulated model runs: a core for a minute

PROBE = Path(__file__).with_name("kernel_path_probe.py")
QEMU = shutil.which("qemu-x86_64")


def _probe(*prefix: str) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [*prefix, sys.executable, str(PROBE)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result: dict[str, Any] = json.loads(run.stdout)
    return result


@cache
def _native() -> dict[str, Any]:
    return _probe()


@cache
def _avx2() -> dict[str, Any]:
    if QEMU is None:
        pytest.fail("qemu-x86_64 missing: make setup installs Debian's qemu-user")
    return _probe(QEMU, "-cpu", "Haswell")


@pytest.mark.slow
def test_emulation_runs_the_saturating_avx2_kernel() -> None:
    """The check has teeth: under qemu the shipped int8 products saturate (the toy is off
    by tens of percent), and the uint8-weight rewrite computes them exactly there too."""
    avx2 = _avx2()
    assert avx2["toy_int8_rel_err"] > 0.05, avx2
    assert avx2["toy_uint8_rel_err"] < 1e-5, avx2
    assert _native()["toy_uint8_rel_err"] < 1e-5


@pytest.mark.slow
def test_smart_turn_scores_the_same_on_the_avx2_path() -> None:
    native, avx2 = _native(), _avx2()
    assert avx2["smart_turn_graph"] == "smart-turn-v3.2-cpu-u8.onnx"  # it saw the saturation
    for window, p in native["smart_turn"].items():
        assert avx2["smart_turn"][window] == pytest.approx(p, abs=1e-5), (window, native, avx2)

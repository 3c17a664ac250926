"""The media path compiled to C with mypyc, beside its Python source.

Why: per call and 20 ms frame the receive chain (RTP parse, jitter buffer, RTCP figures),
the pacer and the send chain are ~50 us of interpreted Python, and 200 calls of it filled
a core. The same typed modules compiled with mypyc do it in ~20 us (bench/media_cpu.py),
with no second implementation to keep in step: the ``.py`` files stay the source of truth
and run as they are where no C compiler is at hand.

``python -m sip_bridge.native build`` compiles :data:`MODULES` in place (a ``.so`` next to
each ``.py``, which Python imports first) and records the sha256 of every source in
:data:`MANIFEST`. ``make setup`` runs it with ``--if-stale``. A compiled module whose source
has changed since is stale: :func:`check` names it, and the bridge refuses to start on it
(it would run the old code), where deleting the build (``clean``) gives pure Python.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.machinery
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MANIFEST",
    "MODULES",
    "NativeBuildError",
    "NativeStatus",
    "build",
    "check",
    "compile_hint",
    "main",
    "require_fresh",
]

ROOT = Path(__file__).resolve().parents[1]
#: What the build wrote: the source hashes its .so files were compiled from.
MANIFEST = ROOT / "build" / "native" / "manifest.json"

#: Everything a call's frame passes through, every 20 ms (and what those import at module
#: level from the same packages, so calls between them are C calls).
MODULES = (
    "jitter/cng.py",
    "jitter/delay.py",
    "jitter/jitter_ingest.py",
    "jitter/jitterbuffer.py",
    "jitter/playout.py",
    "jitter/plc.py",
    "jitter/ring.py",
    "jitter/seqnum.py",
    "sip_bridge/media/dtmf.py",
    "sip_bridge/media/call_media.py",
    "sip_bridge/media/media_clock.py",
    "sip_bridge/media/media_io.py",
    "sip_bridge/media/media_rtcp.py",
    "sip_bridge/media/pacer.py",
    "sip_bridge/media/rtcp.py",
    "sip_bridge/media/rtcp_session.py",
    "sip_bridge/media/rtp.py",
    "sip_bridge/media/rtp_receiver.py",
)

# The modules' shared library (mypyc's runtime and their code), inside the package so that
# it imports wherever the package does (at the top level it needed the tree on sys.path).
_GROUP = "sip_bridge.media_native"

# The type checker's view for the compiler: the project's own settings are stricter but
# are not needed to compile, and their unused sections would fail the build.
_MYPY_INI = "[mypy]\npython_version = 3.11\nignore_missing_imports = True\n"


def _suffix() -> str:
    return importlib.machinery.EXTENSION_SUFFIXES[0]


def _so(module: str) -> Path:
    return ROOT / (module.removesuffix(".py") + _suffix())


def _digest(module: str) -> str:
    return hashlib.sha256((ROOT / module).read_bytes()).hexdigest()


@dataclass(frozen=True)
class NativeStatus:
    compiled: tuple[str, ...]  # sources whose .so is in place and was built from them
    missing: tuple[str, ...]  # no .so: these run as Python
    stale: tuple[str, ...]  # a .so built from another version of the source

    @property
    def mode(self) -> str:
        """``compiled``, ``python`` or ``mixed`` (some modules compiled)."""
        if self.stale:
            return "stale"
        if not self.missing:
            return "compiled"
        return "python" if not self.compiled else "mixed"

    def problem(self) -> str | None:
        """One line for an operator when the build cannot be used, else None."""
        if not self.stale:
            return None
        names = ", ".join(self.stale[:3]) + (" ..." if len(self.stale) > 3 else "")
        return (
            f"the compiled media path is older than its source ({names}): run "
            "`make native` (or `python -m sip_bridge.native clean` to run it as Python)"
        )


class NativeBuildError(RuntimeError):
    """A compiled module is older than its source: starting would run the old code."""


def check() -> NativeStatus:
    """Which of :data:`MODULES` run compiled, which as Python, which from a stale build."""
    try:
        recorded: dict[str, str] = json.loads(MANIFEST.read_text())["sources"]
    except (OSError, ValueError, KeyError, TypeError):
        recorded = {}
    compiled: list[str] = []
    missing: list[str] = []
    stale: list[str] = []
    for m in MODULES:
        if not _so(m).exists():
            missing.append(m)
        elif recorded.get(m) == _digest(m):
            compiled.append(m)
        else:
            stale.append(m)
    return NativeStatus(tuple(compiled), tuple(missing), tuple(stale))


def compile_hint() -> str:
    """How to get the compiled media path where this runs: ``make native`` in a checkout;
    an installed wheel carries the media path as Python only (docs/deploy.md says why)."""
    if (ROOT / "pyproject.toml").is_file() and (ROOT / "Makefile").is_file():
        return "`make native`"
    return "an installed wheel runs it as Python (docs/deploy.md: the compiled media path)"


def require_fresh() -> NativeStatus:
    """:func:`check`, raising :class:`NativeBuildError` on a stale build (the bridge's start)."""
    status = check()
    problem = status.problem()
    if problem is not None:
        raise NativeBuildError(problem)
    return status


def clean() -> None:
    """Remove the compiled modules (and the shared library they load)."""
    for m in MODULES:
        _so(m).unlink(missing_ok=True)
    for lib in ROOT.glob(f"*__mypyc{_suffix()}"):  # builds before the group had its name
        lib.unlink()
    _so(_GROUP.replace(".", "/") + "__mypyc.py").unlink(missing_ok=True)
    MANIFEST.unlink(missing_ok=True)


def build(quiet: bool = True) -> None:
    """Compile :data:`MODULES` in place with mypyc and record their sources' hashes."""
    from mypyc.build import mypycify  # the build's own dependency, not the bridge's
    from setuptools import setup  # type: ignore[import-untyped]

    digests = {m: _digest(m) for m in MODULES}  # before: an edit during the build is stale
    clean()
    temp = ROOT / "build" / "native"
    temp.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".ini", dir=temp, delete=False) as ini:
        ini.write(_MYPY_INI)
    cwd = os.getcwd()
    os.chdir(ROOT)  # mypycify wants paths relative to the tree it builds in
    try:
        extensions = mypycify(
            ["--config-file", ini.name, *MODULES],
            opt_level="3",
            target_dir=str(temp / "c"),
            group_name=_GROUP,
        )
        setup(
            name="sip-bridge-native",
            ext_modules=extensions,
            script_args=[
                "-q" if quiet else "-v",
                "build_ext",
                "--inplace",
                "--build-temp",
                str(temp / "obj"),
                "--build-lib",
                str(temp / "lib"),
            ],
        )
    finally:
        os.chdir(cwd)
        Path(ini.name).unlink(missing_ok=True)
    MANIFEST.write_text(json.dumps({"sources": digests}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sip_bridge.native", description=__doc__)
    ap.add_argument("action", choices=["build", "check", "clean"])
    ap.add_argument("--if-stale", action="store_true", help="build only when not up to date")
    args = ap.parse_args(argv)
    if args.action == "clean":
        clean()
        return 0
    status = check()
    if args.action == "check":
        print(f"media path: {status.mode} ({len(status.compiled)}/{len(MODULES)} compiled)")
        if status.problem():
            print(status.problem())
        return 0 if status.mode == "compiled" else 1
    if args.if_stale and status.mode == "compiled":
        return 0
    print(f"compiling the media path ({len(MODULES)} modules, mypyc)", file=sys.stderr)
    log = ROOT / "build" / "native" / "build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        with _output_to(log):  # the compiler's chatter; shown when it fails
            build()
    except (Exception, SystemExit) as exc:  # no compiler, no headers: it runs as Python
        clean()
        tail = log.read_text(errors="replace").splitlines()[-15:]
        print("\n".join(tail), file=sys.stderr)
        print(f"media path stays Python (slower): compiling failed: {exc}", file=sys.stderr)
        return 0 if args.if_stale else 1
    return 0


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """stdout and stderr, of this process and the compilers it runs, into ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with path.open("w") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


if __name__ == "__main__":
    sys.exit(main())

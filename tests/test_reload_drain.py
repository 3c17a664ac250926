"""A running bridge reloads its config (SIGHUP, a changed file), drains on SIGTERM, and
records every call in SQLite."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sip_bridge.config.loader import BridgeConfig, load_config
from sip_bridge.ops.records import CallRecords
from sip_bridge.ops.records_cli import main as calls_main
from sip_bridge.ops.reload import ConfigWatcher, keep_bound, reload_bridge, watched_files
from sip_bridge.script.caller import CallOptions, place_call
from sip_bridge.server import BridgeServer
from testkit.http_probe import http_get, metric_sample
from testkit.sipp_media import tone, write_wav

ROOT = Path(__file__).resolve().parents[1]
BRIDGE = ROOT / ".venv" / "bin" / "sip-bridge"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _options(port: int, call_id: str = "opt-1") -> int:
    """Status code of an out-of-dialog OPTIONS sent to the bridge (what a dispatcher probes)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(2.0)
        me = s.getsockname()[1]
        msg = (
            f"OPTIONS sip:bridge@127.0.0.1:{port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:{me};branch=z9hG4bK-{call_id}\r\n"
            "Max-Forwards: 70\r\nFrom: <sip:probe@127.0.0.1>;tag=p1\r\n"
            f"To: <sip:bridge@127.0.0.1:{port}>\r\nCall-ID: {call_id}\r\nCSeq: 1 OPTIONS\r\n"
            "Content-Length: 0\r\n\r\n"
        )
        s.sendto(msg.encode(), ("127.0.0.1", port))
        return int(s.recv(4096).split(b" ", 2)[1])


CONFIG = """\
[sip]
listen = "127.0.0.1:{port}"
drain_s = 10
[rtp]
ports = "45000-45099"
[agent]
name = "{agent}"
[agent.echo]
delay_s = 0.1
[records]
enabled = true
db = "calls.sqlite"
[control]
socket = "ctl.sock"
[http]
listen = ""
"""


def test_keep_bound_keeps_what_needs_a_restart(tmp_path: Path) -> None:
    old = BridgeConfig.line_check()
    new = replace(
        old,
        sip=replace(old.sip, listen="127.0.0.1:5999", max_calls=7),
        rtp=replace(old.rtp, ports="30000-30099"),
        agent=replace(old.agent, name="tone"),
    )
    merged, kept = keep_bound(old, new)
    assert kept == ["sip.listen", "rtp.ports"]
    assert merged.sip.listen == old.sip.listen and merged.rtp.ports == old.rtp.ports
    assert merged.sip.max_calls == 7 and merged.agent.name == "tone"  # the rest is new


def test_watcher_sees_an_edit_and_a_rename_over(tmp_path: Path) -> None:
    f = tmp_path / "bridge.toml"
    f.write_text(CONFIG.format(port=5060, agent="echo"))
    cfg = load_config(f)
    assert watched_files(cfg) == [f]
    w = ConfigWatcher(watched_files(cfg))
    assert not w.changed()
    f.write_text(CONFIG.format(port=5060, agent="tone") + "\n")
    assert w.changed() and not w.changed()
    tmp = tmp_path / "new.toml"
    tmp.write_text(CONFIG.format(port=5060, agent="echo"))
    os.replace(tmp, f)  # how editors save
    assert w.changed()


def test_reload_applies_to_new_calls_and_refuses_a_broken_edit(tmp_path: Path) -> None:
    f = tmp_path / "bridge.toml"
    f.write_text(CONFIG.format(port=0, agent="echo"))
    play = write_wav(tmp_path / "a.wav", tone((440,), 1.0, 0.2))

    async def main() -> None:
        server = BridgeServer(load_config(f))
        await server.start()
        try:
            first = asyncio.ensure_future(place_call(CallOptions(
                f"sip:a@127.0.0.1:{server.port}", play, tmp_path / "1.wav",
                duration_s=2.5, rtp_ports=(45100, 45199),
            )))  # fmt: skip
            for _ in range(100):
                await asyncio.sleep(0.05)
                if any(c["state"] == "answered" for c in server.status()["calls"]):
                    break
            f.write_text(CONFIG.format(port=5999, agent="tone"))  # listen: needs a restart
            assert await reload_bridge(server, lambda: load_config(f))
            assert server.config.agent.name == "tone"
            assert server.config.sip.listen.endswith(":0")  # kept
            (up,) = server.status()["calls"]
            assert up["agent"] == "echo"  # the call in progress keeps its agent
            second = await place_call(CallOptions(
                f"sip:b@127.0.0.1:{server.port}", play, tmp_path / "2.wav",
                duration_s=0.8, rtp_ports=(45200, 45299),
            ))  # fmt: skip
            assert second.answered
            f.write_text(CONFIG.format(port=0, agent="tone") + "[agent.tone]\nfreq_hz = 9\n")
            assert not await reload_bridge(server, lambda: load_config(f))  # refused
            assert server.config.agent.tone_freq_hz == 1000.0  # the running config stays
            assert (await first).answered
        finally:
            await server.stop()
        records = CallRecords(tmp_path / "calls.sqlite", readonly=True)
        agents = [r["agent"] for r in reversed(records.list())]
        assert agents == ["echo", "tone"]
        records.close()

    asyncio.run(main())


def test_calls_are_recorded_and_counted(tmp_path: Path) -> None:
    f = tmp_path / "bridge.toml"
    f.write_text(CONFIG.format(port=0, agent="echo") + '[metrics]\nlisten = "127.0.0.1:0"\n')
    play = write_wav(tmp_path / "a.wav", tone((440,), 1.0, 0.2))

    async def main() -> str:
        server = BridgeServer(load_config(f))
        await server.start()
        assert server.telemetry.http is not None
        port = server.telemetry.http.port
        try:
            assert await http_get(port, "/healthz") == (200, "ok\n")
            result = await place_call(CallOptions(
                f"sip:+4420555@127.0.0.1:{server.port}", play, tmp_path / "heard.wav",
                duration_s=1.5, rtp_ports=(45300, 45399),
            ))  # fmt: skip
            assert result.answered
            for _ in range(50):
                if not server.calls:
                    break
                await asyncio.sleep(0.05)
            status, body = await http_get(port, "/metrics")
            assert status == 200
            assert metric_sample(body, "sipbridge_calls_total", outcome="answered") == 1
            assert metric_sample(body, "sipbridge_call_setup_seconds_count") == 1
            assert metric_sample(body, "sipbridge_active_calls") == 0
            assert metric_sample(body, "sipbridge_frames_sent_total") >= 50
            assert metric_sample(body, "sipbridge_media_path_info", mode=server.media_path) == 1
        finally:
            await server.stop()
        return str(tmp_path / "calls.sqlite")

    db = asyncio.run(main())
    records = CallRecords(db, readonly=True)
    (row,) = records.list()
    assert row["outcome"] == "answered" and row["agent"] == "echo" and row["codec"] == "PCMU"
    assert "+4420555" in row["callee"] and row["packets_in"] >= 50 and row["packets_out"] >= 50
    assert row["setup_ms"] is not None and 0 <= row["setup_ms"] < 1000
    assert 1.0 <= row["duration_s"] <= 4.0 and row["loss_pct"] == 0.0
    records.close()
    assert calls_main(["list", "--db", db]) == 0
    assert calls_main(["show", row["call_id"], "--db", db, "--json"]) == 0


@pytest.mark.timeout(90)
def test_sighup_reloads_and_sigterm_drains_a_running_bridge(tmp_path: Path) -> None:
    port = _free_port()
    f = tmp_path / "bridge.toml"
    f.write_text(CONFIG.format(port=port, agent="echo").replace("drain_s = 10", "drain_s = 20"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [str(BRIDGE), "run", "--config", str(f)], env=env, cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def status() -> dict[str, object]:
        out = subprocess.run(
            [str(BRIDGE), "status", "--socket", str(tmp_path / "ctl.sock"), "--json"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        result: dict[str, object] = json.loads(out.stdout)
        return result

    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ctl.sock").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.1)
        assert status()["agent"] == "echo" and _options(port) == 200
        text = f.read_text().replace('name = "echo"', 'name = "tone"')
        f.write_text(text)
        os.utime(f, (time.time() - 100, time.time() - 100))  # the watcher must not be first
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while status()["agent"] != "tone":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        # a call in progress, then SIGTERM: OPTIONS and new calls get 503, the call goes on
        play = write_wav(tmp_path / "a.wav", tone((440,), 1.0, 0.2))

        async def during_drain() -> tuple[bool, int, int]:
            call = asyncio.ensure_future(place_call(CallOptions(
                f"sip:x@127.0.0.1:{port}", play, tmp_path / "x.wav",
                duration_s=3.0, rtp_ports=(45400, 45499),
            )))  # fmt: skip
            await asyncio.sleep(1.0)
            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            probe = await asyncio.to_thread(_options, port, "opt-2")
            refused = await place_call(CallOptions(
                f"sip:y@127.0.0.1:{port}", play, tmp_path / "y.wav",
                duration_s=0.5, rtp_ports=(45500, 45599),
            ))  # fmt: skip
            first = await call
            return first.answered and first.recorded_s >= 2.5, probe, refused.status

        completed, probe, refused = asyncio.run(during_drain())
        assert probe == 503 and refused == 503
        assert completed  # the call in progress ran its full length
        assert proc.wait(timeout=15) == 0  # then the bridge left on its own
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read() if proc.stderr else ""
    assert "config reloaded" in err and "draining" in err
    records = CallRecords(tmp_path / "calls.sqlite", readonly=True)
    assert [r["outcome"] for r in records.list()] == ["answered"]
    records.close()


@pytest.mark.timeout(60)
def test_completed_calls_survive_kill_9_of_the_bridge(tmp_path: Path) -> None:
    port = _free_port()
    f = tmp_path / "bridge.toml"
    f.write_text(CONFIG.format(port=port, agent="echo"))
    proc = subprocess.Popen(
        [str(BRIDGE), "run", "--config", str(f)], cwd=tmp_path,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ctl.sock").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        play = write_wav(tmp_path / "a.wav", tone((440,), 0.5, 0.2))

        async def calls() -> None:
            done = await place_call(CallOptions(
                f"sip:done@127.0.0.1:{port}", play, tmp_path / "1.wav",
                duration_s=1.0, rtp_ports=(45100, 45199),
            ))  # fmt: skip
            assert done.answered
            await asyncio.sleep(0.3)  # its BYE is answered and recorded
            up = asyncio.ensure_future(place_call(CallOptions(
                f"sip:up@127.0.0.1:{port}", play, tmp_path / "2.wav",
                duration_s=3.0, rtp_ports=(45200, 45299), answer_timeout_s=5,
            )))  # fmt: skip
            await asyncio.sleep(1.0)
            proc.kill()  # SIGKILL mid-call: no clean shutdown, no last commit
            proc.wait()
            up.cancel()

        asyncio.run(calls())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    def rows() -> dict[str, dict[str, Any]]:
        records = CallRecords(tmp_path / "calls.sqlite", readonly=True)
        out = {r["callee"].split("@")[0].split(":")[-1]: r for r in records.list()}
        records.close()
        return out

    killed = rows()
    assert killed["done"]["outcome"] == "answered" and killed["done"]["packets_out"] > 20
    assert killed["up"]["answered_at"] is not None and killed["up"]["ended_at"] is None
    # the next start of the bridge says what happened to the call it was in
    server = BridgeServer(load_config(f))
    asyncio.run(_start_stop(server))
    after = rows()
    assert after["done"] == killed["done"]
    assert after["up"]["outcome"] == "interrupted" and after["up"]["ended_at"] is not None


async def _start_stop(server: BridgeServer) -> None:
    await server.start()
    await server.stop()

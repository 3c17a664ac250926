"""Trunks against sipp: a challenging registrar, digest-authenticated and refused INVITEs,
and ``sip-bridge status`` reading the live bridge through its control socket."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from sip_bridge.config.loader import BridgeConfig, ControlConfig
from sip_bridge.config.trunks import TrunkConfig
from sip_bridge.server import BridgeServer
from testkit.sipp_runner import finish, free_port, run_sipp, start_sipp


def _config(tmp_path: Path, *trunks: TrunkConfig) -> BridgeConfig:
    base = BridgeConfig.line_check()
    return replace(
        base,
        sip=replace(base.sip, listen="127.0.0.1:0"),
        rtp=replace(base.rtp, ports="42000-42199"),
        trunks=trunks,
        control=ControlConfig(str(tmp_path / "bridge.sock")),
    )


def _status_cli(sock: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "sip_bridge.cli", "status", "--socket", str(sock), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)


def test_bridge_registers_through_423_and_digest_then_unregisters(tmp_path: Path) -> None:
    registrar_port = free_port()
    trunk = TrunkConfig(
        "carrier",
        registrar=f"127.0.0.1:{registrar_port}",
        username="bridge",
        expires_s=120,
        password="s3cret-pass",
    )
    config = _config(tmp_path, trunk)

    async def main() -> tuple[dict[str, Any], str]:
        sipp = await start_sipp("uas_registrar_challenge.xml", None, "-p", str(registrar_port),
                                "-m", "1", timeout=40)  # fmt: skip
        await asyncio.sleep(0.3)  # sipp binds its port
        server = BridgeServer(config, control=True)
        await server.start()
        try:
            for _ in range(100):
                st = server.status()["registrations"][0]
                if st["state"] == "registered":
                    break
                await asyncio.sleep(0.1)
            cli = await asyncio.to_thread(_status_cli, tmp_path / "bridge.sock")
            assert cli.returncode == 0, cli.stderr
        finally:
            await server.stop()
        await finish(sipp, "uas_registrar_challenge.xml", 20)
        return st, cli.stdout

    status, shown = asyncio.run(main())
    assert status["state"] == "registered", status
    assert status["aor"] == "sip:bridge@127.0.0.1" and status["last_error"] is None
    assert 250 < float(status["expires_in_s"]) <= 300  # the registrar's Min-Expires, granted
    assert "carrier" in shown and "registered" in shown and "sip:bridge@127.0.0.1" in shown


def test_digest_trunk_call_and_an_unknown_source_is_forbidden(tmp_path: Path) -> None:
    # sipp reads only the first challenge and knows only MD5
    pbx = TrunkConfig(
        "pbx", inbound_auth=True, username="pbx", password="pbx-pass", auth_algorithms=("MD5",)
    )
    far = TrunkConfig("carrier", acl=("203.0.113.0/24",))

    async def main(config: BridgeConfig, scenario: str, *args: str) -> BridgeServer:
        server = BridgeServer(config)
        await server.start()
        try:
            await run_sipp(server.port, scenario, "-m", "1", *args)
            await asyncio.sleep(0.2)
        finally:
            await server.stop()
        return server

    authed = asyncio.run(
        main(_config(tmp_path, pbx, far), "uac_digest_auth.xml", "-au", "pbx", "-ap", "pbx-pass")
    )
    assert authed.stats["established"] == 1
    assert authed.policy is not None
    assert authed.policy.counts["challenged"] == 1 and authed.policy.counts["admitted"] == 1
    refused = asyncio.run(main(_config(tmp_path, far), "uac_403.xml"))
    assert refused.stats["offered"] == 0
    assert refused.policy is not None and refused.policy.counts["forbidden"] == 1


def test_status_of_a_call_in_progress_and_of_no_bridge(tmp_path: Path) -> None:
    config = _config(tmp_path)

    async def main() -> str:
        server = BridgeServer(config, control=True)
        await server.start()
        try:
            call = asyncio.create_task(run_sipp(server.port, "uac_basic.xml", "-m", "1"))
            for _ in range(50):
                if any(c.media is not None for c in server.calls.values()):
                    break
                await asyncio.sleep(0.05)
            cli = await asyncio.to_thread(_status_cli, tmp_path / "bridge.sock", "--json")
            await call
        finally:
            await server.stop()
        assert cli.returncode == 0, cli.stderr
        return cli.stdout

    import json

    status = json.loads(asyncio.run(main()))
    (call,) = status["calls"]
    assert call["state"] == "answered" and call["caller"].startswith("sip:sipp@127.0.0.1")
    assert call["codec"] == "PCMU" and status["counters"]["active"] == 1
    assert status["registrations"] == [] and status["agent"] == "echo"
    gone = _status_cli(tmp_path / "bridge.sock")  # the socket was removed on stop
    assert gone.returncode == 1 and "no bridge answers" in gone.stderr

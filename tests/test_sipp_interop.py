"""sipp (a real, widely used SIP test tool) calls the bridge over loopback.

Each scenario in tests/sipp/ checks what it receives (status codes, SDP lines,
headers) and sipp exits non-zero on any deviation; the bridge runs in this
process so the test can also look at its state afterwards.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from sip_bridge.config.loader import BridgeConfig, InboundConfig, SipConfig, TimersConfig
from sip_bridge.server import BridgeServer
from testkit.sipp_runner import run_sipp

# the floods send 500 INVITEs a second over UDP: a full collection of this pytest process's
# heap stalls the bridge long enough for the socket's buffer to overflow (4 and 22 of 1,000
# unanswered in two full runs; never alone)
pytestmark = pytest.mark.usefixtures("quiet_gc")  # tests/conftest.py


def _config(**sip: object) -> BridgeConfig:
    timers = sip.pop("timers", TimersConfig())
    base = BridgeConfig.line_check()
    sip_cfg = replace(base.sip, listen="127.0.0.1:0", timers=timers, **sip)  # type: ignore[arg-type]
    assert isinstance(sip_cfg, SipConfig)
    rtp = replace(base.rtp, ports="41000-41999")
    return replace(base, sip=sip_cfg, rtp=rtp)


async def _sipp(
    server: BridgeServer, scenario: str, *args: str, timeout: float = 40, log: Path | None = None
) -> str:
    return await run_sipp(server.port, scenario, *args, timeout=timeout, log=log)


def _run(config: BridgeConfig, scenario: str, *args: str, settle_s: float = 0.3) -> BridgeServer:
    async def main() -> BridgeServer:
        server = BridgeServer(config)
        await server.start()
        try:
            await _sipp(server, scenario, "-m", "1", *args)
            await asyncio.sleep(settle_s)
        finally:
            await server.stop()
        return server

    return asyncio.run(main())


@pytest.mark.parametrize(
    ("scenario", "sip"),
    [
        ("uac_basic.xml", {}),
        ("uac_delayed_offer.xml", {}),
        ("uac_cancel.xml", {"answer_after_s": 3.0}),
        ("uac_488.xml", {}),
        ("uac_503.xml", {"max_calls": 0}),
        ("uac_bye_from_bridge.xml", {"max_call_s": 1.0}),
        ("uac_retrans_invite.xml", {"answer_after_s": 1.0}),
    ],
)
def test_sipp_scenario(scenario: str, sip: dict[str, object]) -> None:
    server = _run(_config(**sip), scenario)
    assert server.calls == {}
    assert server.ua is not None and server.ua.active_calls == 0
    # Every call the UA offered ended exactly once; a retransmitted INVITE made no second call.
    offered = 0 if scenario in ("uac_488.xml", "uac_503.xml") else 1
    assert server.stats["offered"] == server.stats["ended"] == offered


def test_unacked_487_is_retransmitted_until_the_ack(tmp_path: Path) -> None:
    """sipp holds its ACK for 1.5 s: Timer G (T1 = 0.2 s) must repeat the 487 meanwhile."""
    log = tmp_path / "messages.log"

    async def main() -> None:
        server = BridgeServer(_config(answer_after_s=3.0, timers=TimersConfig(t1=0.2)))
        await server.start()
        try:
            await _sipp(server, "uac_lost_487.xml", "-m", "1", log=log)
            await asyncio.sleep(1.0)  # anything after the ACK would be a bug
        finally:
            await server.stop()

    asyncio.run(main())
    text = log.read_text(errors="replace")
    copies = text.count("SIP/2.0 487 Request Terminated")
    # at 0, 0.2, 0.6, 1.4 s -> 4 copies before the ACK at 1.5 s (timing slack: >= 3)
    assert 3 <= copies <= 5, text[-2000:]
    assert text.rfind("SIP/2.0 487") < text.rfind("ACK sip:")  # none after the ACK


def test_lost_ack_gets_200_retransmissions_then_bye() -> None:
    """No ACK for our 200: retransmitted, then BYE after 64*T1 (T1 = 0.1 s here)."""
    _run(_config(timers=TimersConfig(t1=0.1)), "uac_lost_ack.xml")


def test_a_thousand_unacked_rejections_leave_nothing_behind() -> None:
    """A scanner's INVITEs, rejected (503) and never ACKed: all state gone after Timer H.

    No rate limit here, so every INVITE gets the stateful 503 of a full bridge (a rate
    limit's refusals keep no state, and 200 of them silence the source: tests/test_flood.py).
    """
    t1 = 0.05

    async def main() -> None:
        config = _config(max_calls=0, timers=TimersConfig(t1=t1))
        server = BridgeServer(replace(config, inbound=InboundConfig(rate_per_s=0)))
        await server.start()
        try:
            await _sipp(server, "uac_flood_no_ack.xml", "-m", "1000", "-r", "500", "-l", "1000")
            assert server.ua is not None
            deadline = asyncio.get_running_loop().time() + 64 * t1 + 2.0
            while server.ua.transactions and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)
            assert server.ua.transactions == 0
            assert server.ua.active_calls == 0
            assert server.calls == {}
        finally:
            await server.stop()

    asyncio.run(main())


def test_session_timer_refresh_by_reinvite_is_answered(tmp_path: Path) -> None:
    """RFC 4028: sipp asks for 90 s, refresher=uac, refreshes by re-INVITE, hangs up."""
    log = tmp_path / "messages.log"

    async def main() -> BridgeServer:
        server = BridgeServer(_config())
        await server.start()
        try:
            await _sipp(server, "uac_session_timer.xml", "-m", "1", timeout=10, log=log)
            await asyncio.sleep(0.3)
        finally:
            await server.stop()
        return server

    server = asyncio.run(main())
    assert server.ua is not None and server.ua.active_calls == 0
    assert server.stats["offered"] == server.stats["ended"] == 1
    text = log.read_text(errors="replace")
    received = text.split("message received")[1:]
    oks = [m for m in received if "SIP/2.0 200" in m and " INVITE\n" in m.replace("\r", "")]
    assert len(oks) >= 2, text[-3000:]  # the INVITE's 200 and the refresh's 200
    for ok in oks:
        assert "Session-Expires: 90;refresher=uac" in ok and "Require: timer" in ok

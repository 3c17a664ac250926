"""Kamailio (pbx_examples/kamailio, the shipped cfg) dispatching calls to sip-bridge nodes.

Two BridgeServers (echo agent) run in this process on 127.0.0.1; Kamailio runs in front of
them with a 1 s OPTIONS probe, and sipp calls Kamailio. The scenario (testkit/kamailio_runner.py)
checks that the 200 carries the proxy's Record-Route and sends the ACK and BYE back through
the proxy with a Route header (loose routing): a call only ends cleanly, and only counts as
ended on its node, if the in-dialog requests found their way.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from agent.base import Agent
from sip_bridge.agents import make_agent
from sip_bridge.config.loader import BridgeConfig, LoadConfig
from sip_bridge.server import BridgeServer
from testkit.kamailio_runner import Kamailio, write_proxy_scenario
from testkit.sipp_media import sipp_counts
from testkit.sipp_runner import finish, free_port, start_sipp
from testkit.slow_turns import SlowTurnsAgent

pytestmark = pytest.mark.serial  # node-wide CPU figures decide a node's health

PROBE_S = 1  # ds_ping_interval in these tests
FR_TIMER_MS = 1000  # how long a silent node (or probe) is waited for


def _config(rtp_ports: str, max_calls: int = 20) -> BridgeConfig:
    base = BridgeConfig.line_check()
    return replace(
        base,
        sip=replace(base.sip, listen="127.0.0.1:0", max_calls=max_calls, transports=("udp",)),
        rtp=replace(base.rtp, ports=rtp_ports),
        agent=replace(base.agent, name="echo"),
    )


async def _nodes(*configs: BridgeConfig) -> list[BridgeServer]:
    servers = [BridgeServer(c) for c in configs]
    for s in servers:
        await s.start()
    return servers


async def _calls(
    proxy: Kamailio, scenario: Path, calls: int, hold_ms: int, timeout: float = 20
) -> str:
    """sipp places ``calls`` calls through the proxy and must see every one succeed."""
    proc = await start_sipp(
        str(scenario), f"127.0.0.1:{proxy.port}",
        "-m", str(calls), "-l", str(calls), "-r", "10", "-d", str(hold_ms),
        timeout=timeout,
    )  # fmt: skip
    screen = await finish(proc, scenario.name, timeout + 10)
    assert sipp_counts(screen) == (calls, 0), screen[-2000:]
    return screen


async def _settle(nodes: list[BridgeServer], ended: int, timeout: float = 3.0) -> None:
    """Wait until the nodes have torn down ``ended`` calls between them."""
    deadline = time.monotonic() + timeout
    while sum(n.stats["ended"] for n in nodes) < ended and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def test_calls_spread_over_nodes_and_a_dead_node_is_taken_out(tmp_path: Path) -> None:
    scenario = write_proxy_scenario(tmp_path)

    async def main() -> None:
        a, b = await _nodes(_config("42000-42199"), _config("42200-42399"))
        stopped: list[BridgeServer] = []
        try:
            async with Kamailio(
                tmp_path, free_port(), [a.port, b.port],
                ping_interval_s=PROBE_S, fr_timer_ms=FR_TIMER_MS,
            ) as proxy:  # fmt: skip
                # Round-robin: six calls, three on each node, every one set up and ended.
                await _calls(proxy, scenario, 6, hold_ms=300)
                await _settle([a, b], 6)
                for node in (a, b):
                    assert node.stats == {"offered": 3, "established": 3, "ended": 3}, node.stats
                    assert node.calls == {}
                assert len(proxy.lines(r"dispatch .* to sip:127\.0\.0\.1:")) == 6

                # A long call in progress on one node; the other node goes away.
                long_call = asyncio.ensure_future(_calls(proxy, scenario, 1, hold_ms=8000))
                deadline = time.monotonic() + 5
                while not (a.calls or b.calls) and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                survivor, victim = (a, b) if a.calls else (b, a)
                assert len(survivor.calls) == 1 and not victim.calls
                (long_id,) = survivor.calls
                victim_port = victim.port
                stopped.append(victim)
                await victim.stop()

                # The probe notices within one interval plus the probe's own timeout.
                down = rf"sip-bridge node down: sip:127\.0\.0\.1:{victim_port}\b"
                took = await proxy.wait_for_log(down, timeout=PROBE_S + FR_TIMER_MS / 1000 + 3)
                print(f"node marked down {took:.2f} s after it stopped")
                assert not proxy.lines(r"failover")  # found by the probe, not by a call
                listing = proxy.rpc("dispatcher.list")
                states = dict(re.findall(r"URI: (\S+)\s+FLAGS: (\w+)", listing))
                assert states == {
                    f"sip:127.0.0.1:{victim_port}": "IP",  # inactive, probed until it answers
                    f"sip:127.0.0.1:{survivor.port}": "AP",
                }, states

                # Every new call lands on the survivor directly (not by failing over).
                before = dict(survivor.stats)
                await _calls(proxy, scenario, 4, hold_ms=200)
                assert survivor.stats["offered"] == before["offered"] + 4
                assert survivor.stats["established"] == before["established"] + 4
                assert not proxy.lines(r"failover")
                assert long_id in survivor.calls and not long_call.done()  # still going

                # The call in progress on the survivor was untouched: sipp saw it through.
                await long_call
                await _settle([survivor], survivor.stats["offered"])
                assert survivor.stats["ended"] == survivor.stats["offered"] == 3 + 1 + 4
                assert survivor.calls == {}
                assert victim.stats == {"offered": 3, "established": 3, "ended": 3}
        finally:
            for node in (a, b):
                if node not in stopped:
                    await node.stop()

    asyncio.run(asyncio.wait_for(main(), 50))


def test_a_node_refusing_with_503_fails_over_and_comes_back(tmp_path: Path) -> None:
    """A node at max_calls answers 503: the call goes on to the next node (the caller never
    sees the 503), the refusing node is taken out and back in when its probe succeeds."""
    scenario = write_proxy_scenario(tmp_path)

    async def main() -> None:
        full, ok = await _nodes(_config("42400-42599", max_calls=0), _config("42600-42799"))
        try:
            async with Kamailio(
                tmp_path, free_port(), [full.port, ok.port],
                ping_interval_s=PROBE_S, fr_timer_ms=FR_TIMER_MS,
            ) as proxy:  # fmt: skip
                await _calls(proxy, scenario, 4, hold_ms=200)
                await _settle([ok], 4)
                assert ok.stats == {"offered": 4, "established": 4, "ended": 4}, ok.stats
                assert full.stats["offered"] == 0
                assert proxy.lines(rf"failover .* after 503: next node sip:127\.0\.0\.1:{ok.port}")
                # Marked down by the 503, back up as soon as its OPTIONS probe gets 200.
                up = rf"sip-bridge node up: sip:127\.0\.0\.1:{full.port}\b"
                await proxy.wait_for_log(up, timeout=PROBE_S + 3)
        finally:
            for node in (full, ok):
                await node.stop()

    asyncio.run(asyncio.wait_for(main(), 40))


def test_a_silent_node_times_out_and_the_call_fails_over(tmp_path: Path) -> None:
    """Nothing listens at one node and no probe has run yet (30 s interval): of two calls
    round-robin sends one there first; it waits FR_TIMER, then goes to the live node. The
    silent node is then out: later calls go to the live node directly."""
    scenario = write_proxy_scenario(tmp_path)

    async def timed_call(proxy: Kamailio) -> float:
        t0 = time.monotonic()
        await _calls(proxy, scenario, 1, hold_ms=100)
        return time.monotonic() - t0

    async def main() -> None:
        (live,) = await _nodes(_config("42800-42999"))
        dead = free_port()
        try:
            async with Kamailio(
                tmp_path, free_port(), [dead, live.port],
                ping_interval_s=30, fr_timer_ms=FR_TIMER_MS,
            ) as proxy:  # fmt: skip
                first = [await timed_call(proxy) for _ in range(2)]
                failovers = proxy.lines(r"failover .* after 408: next node sip:127\.0\.0\.1:")
                assert len(failovers) == 1, proxy.log()
                assert f":{live.port}" in failovers[0]
                assert len(proxy.lines(rf"dispatch .* to sip:127\.0\.0\.1:{dead}\b")) == 1
                assert max(first) >= FR_TIMER_MS / 1000 * 0.9, first  # waited for the silent one
                await _calls(proxy, scenario, 2, hold_ms=100)
                assert len(proxy.lines("failover")) == 1  # marked down: not tried again
                assert len(proxy.lines(rf"dispatch .* to sip:127\.0\.0\.1:{dead}\b")) == 1
                await _settle([live], 4)
                assert live.stats == {"offered": 4, "established": 4, "ended": 4}, live.stats
        finally:
            await live.stop()

    asyncio.run(asyncio.wait_for(main(), 40))


def test_a_draining_node_gets_no_new_calls_and_finishes_its_own(tmp_path: Path) -> None:
    """SIGTERM's drain: the node answers OPTIONS with 503, so the probe takes it out and new
    calls go to the other node; its call in progress runs to its end, then it stops."""
    scenario = write_proxy_scenario(tmp_path)

    async def main() -> None:
        a, b = await _nodes(_config("43000-43199"), _config("43200-43399"))
        drained: BridgeServer | None = None
        try:
            async with Kamailio(
                tmp_path, free_port(), [a.port, b.port],
                ping_interval_s=PROBE_S, fr_timer_ms=FR_TIMER_MS,
            ) as proxy:  # fmt: skip
                long_call = asyncio.ensure_future(_calls(proxy, scenario, 1, hold_ms=5000))
                deadline = time.monotonic() + 5
                while not (a.calls or b.calls) and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                drained, other = (a, b) if a.calls else (b, a)
                drain = asyncio.ensure_future(drained.drain(timeout_s=20))
                down = rf"sip-bridge node down: sip:127\.0\.0\.1:{drained.port}\b"
                await proxy.wait_for_log(down, timeout=PROBE_S + FR_TIMER_MS / 1000 + 3)
                before = dict(other.stats)
                await _calls(proxy, scenario, 4, hold_ms=200)
                assert other.stats["offered"] == before["offered"] + 4
                assert drained.stats["offered"] == 1  # only the call it had
                assert not drain.done()  # still finishing that call
                await long_call  # sipp saw it through, to its own BYE
                assert await asyncio.wait_for(drain, 10) == 0  # none left to hang up
                assert drained.stats == {"offered": 1, "established": 1, "ended": 1}
        finally:
            for node in (a, b):
                if node is not drained:
                    await node.stop()

    asyncio.run(asyncio.wait_for(main(), 50))


def test_an_overloaded_node_sheds_and_new_calls_go_to_the_other_node(tmp_path: Path) -> None:
    """[load] shed: node A's calls start taking 1.5 s a turn (over its 900 ms budget). A
    answers the dispatcher's next OPTIONS probe with 503, Kamailio takes it out within one
    probe interval, and every new call goes to node B, with no failover (no INVITE even
    reaches A). A's call in progress runs to its end. When the slow turns have left A's
    window, its probe gets 200 again and it takes calls."""
    scenario = write_proxy_scenario(tmp_path)
    load = LoadConfig(shed=True, turn_p95_ms=900, cpu_pct=100, window_s=5, min_turns=3,
                      hold_s=0)  # fmt: skip
    overloaded = False

    def node_a_agent(cfg: BridgeConfig) -> Agent:
        return SlowTurnsAgent(1500, 3) if overloaded else make_agent(cfg)

    async def main() -> None:
        nonlocal overloaded
        a = BridgeServer(replace(_config("43400-43599"), load=load), node_a_agent)
        b = BridgeServer(_config("43600-43799"))
        for node in (a, b):
            await node.start()
        try:
            async with Kamailio(
                tmp_path, free_port(), [a.port, b.port],
                ping_interval_s=PROBE_S, fr_timer_ms=FR_TIMER_MS,
            ) as proxy:  # fmt: skip
                await _calls(proxy, scenario, 4, hold_ms=200)
                await _settle([a, b], 4)
                assert a.stats["offered"] == b.stats["offered"] == 2
                assert a.load_status()["headroom_pct"] > 0 and not a.headroom.shedding

                # A gets slow: two long calls, round-robin puts one on each node.
                overloaded = True
                long_calls = asyncio.ensure_future(_calls(proxy, scenario, 2, hold_ms=6000))
                deadline = time.monotonic() + 5
                while not a.headroom.shedding and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                shed_at = time.monotonic()
                status = a.load_status()
                assert status["shedding"] and status["turns"] == 3, status
                assert "turn p95 1500 ms > 900 ms" in status["reason"]
                assert not b.headroom.shedding
                down = rf"sip-bridge node down: sip:127\.0\.0\.1:{a.port}\b"
                await proxy.wait_for_log(down, timeout=PROBE_S + 3)
                took = time.monotonic() - shed_at
                print(f"node A over budget -> taken out by the probe: {took:.2f} s")
                assert took <= PROBE_S + 1.0, took  # the next probe (slack: a loaded machine)

                # New calls: all on B, by the dispatcher's choice (no 503 seen by a call).
                before_a, before_b = dict(a.stats), dict(b.stats)
                await _calls(proxy, scenario, 4, hold_ms=200)
                assert b.stats["offered"] == before_b["offered"] + 4
                assert a.stats["offered"] == before_a["offered"]
                assert a.ua is not None and a.ua.shed_count == 0  # the probe, not a failover
                assert not proxy.lines("failover")
                assert len(a.calls) == 1 and not long_calls.done()  # A's call goes on

                await long_calls  # sipp saw both long calls through
                overloaded = False
                up = rf"sip-bridge node up: sip:127\.0\.0\.1:{a.port}\b"
                await proxy.wait_for_log(up, timeout=load.window_s + PROBE_S + 3)
                assert not a.headroom.shedding
                before_a = dict(a.stats)
                await _calls(proxy, scenario, 2, hold_ms=200)
                assert a.stats["offered"] == before_a["offered"] + 1  # round-robin again
        finally:
            for node in (a, b):
                await node.stop()

    asyncio.run(asyncio.wait_for(main(), 60))

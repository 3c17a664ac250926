"""A node over its [load] budget refuses new calls and says so everywhere an operator looks.

One bridge with ``[load] shed = true``; its agent (testkit/slow_turns.py) reports turns of
1.5 s, over the 900 ms budget. A real caller (`sip-bridge call`'s caller) is answered and
talked to to the end of its call; a second caller meanwhile gets 503 with Retry-After;
`/healthz`, `/metrics`, `sip-bridge status` and the console's `/api/calls` show the node
shedding, with its figures. The two-node case behind Kamailio is in
tests/test_kamailio_dispatch.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sip_bridge.config.loader import BridgeConfig, load_config
from sip_bridge.ops.control import format_status
from sip_bridge.script.caller import CallOptions, CallResult, place_call
from sip_bridge.server import BridgeServer
from testkit.http_probe import http_get, metric_sample
from testkit.sipp_media import tone, write_wav
from testkit.slow_turns import SlowTurnsAgent

pytestmark = pytest.mark.serial  # node-wide CPU figures decide what it sees

CONFIG = """\
[sip]
listen = "127.0.0.1:0"
retry_after_s = 9
[rtp]
ports = "45400-45499"
[agent]
name = "echo"
[records]
enabled = false
[metrics]
listen = "127.0.0.1:0"
[http]
listen = "127.0.0.1:0"
allow_anonymous_reads = true
[load]
shed = true
turn_p95_ms = 900
cpu_pct = 100
min_turns = 3
window_s = 60
"""


def test_a_node_over_budget_refuses_new_calls_and_shows_why(tmp_path: Path) -> None:
    f = tmp_path / "bridge.toml"
    f.write_text(CONFIG)
    play = write_wav(tmp_path / "a.wav", tone((440,), 1.0, 0.2))

    def agents(cfg: BridgeConfig) -> SlowTurnsAgent:
        return SlowTurnsAgent(1500, 3)

    async def main() -> None:
        server = BridgeServer(load_config(f), agents)
        await server.start()
        assert server.telemetry.http is not None and server.web is not None
        metrics_port = server.telemetry.http.port
        uri = f"sip:+4420555@127.0.0.1:{server.port}"
        try:
            assert await http_get(metrics_port, "/healthz") == (200, "ok\n")
            assert server.load_status()["shedding"] is False
            first = asyncio.ensure_future(place_call(CallOptions(
                uri, play, tmp_path / "first.wav", duration_s=3.0, rtp_ports=(45500, 45549),
            )))  # fmt: skip
            for _ in range(100):
                if server.headroom.shedding:
                    break
                await asyncio.sleep(0.05)
            assert server.headroom.shedding

            second: CallResult = await place_call(CallOptions(
                uri, play, tmp_path / "second.wav", duration_s=1.0, rtp_ports=(45550, 45599),
            ))  # fmt: skip
            assert not second.answered and second.status == 503, second
            assert server.ua is not None and server.ua.shed_count == 1

            code, text = await http_get(metrics_port, "/healthz")
            assert (code, text) == (503, "overloaded\n")
            code, body = await http_get(metrics_port, "/metrics")
            assert code == 200
            assert metric_sample(body, "sipbridge_load_shedding") == 1
            assert metric_sample(body, "sipbridge_calls_shed_total") == 1
            assert metric_sample(body, "sipbridge_turn_latency_window_p95_seconds") == 1.5
            assert metric_sample(body, "sipbridge_headroom_ratio") < 0
            assert metric_sample(body, "sipbridge_load_call_ceiling") == 0

            status = server.status()
            load = status["load"]
            assert load["shedding"] and load["shed_calls"] == 1 and load["turns"] == 3
            assert load["turn_p95_ms"] == 1500 and load["turn_p95_budget_ms"] == 900
            shown = format_status(json.loads(json.dumps(status)))
            # One call breached the budget: 90 % of it is none; the node takes no more.
            assert (
                "at most 0 calls; SHEDDING: new calls get 503 (turn p95 1500 ms > 900 ms;"
                " at its ceiling of 0 calls)" in shown
            )
            assert "refused 1" in shown

            code, text = await http_get(server.web.port, "/api/calls")
            api = json.loads(text)
            assert api["load"]["shedding"] is True and len(api["calls"]) == 1

            result = await first  # the call in progress was never touched
            assert result.answered and result.recorded_s >= 2.5, result
        finally:
            await server.stop()

    asyncio.run(asyncio.wait_for(main(), 40))

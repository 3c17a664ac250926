"""100 concurrent sipp calls, each streaming a tone for 20 s to the echo agent, then BYE.

Not a timing test: a sanity check that the bridge carries a realistic load end to end on a
busy 2-core machine. sipp (`tests/sipp/uac_rtp_load.xml`) places the calls at 50 calls/s;
the bridge runs in this process so every finished call's `MediaStats` can be read. Bounds
are loose (80 % of the expected packets, 5 % bad frames) so contention does not flake them.
Outbound pacing lateness and skipped frames are timing, so they are printed (run with -s),
not asserted beyond the 80 % of packets sent; the figures under load belong to
bench/calls.py. That the echo reached sipp is counted in the kernel: sipp never reads its
media socket, so once its buffer is full each arriving datagram shows up as a drop in
/proc/net/udp.

`rtp.symmetric = "off"`: the bridge must send to the SDP address. sipp streams every call
from its one media port and names that port in its SDP, so `wrong_source == 0` on every
call proves the bridge filtered on, and sent to, what the SDP said. (With "auto", loopback
counts as private and the bridge would latch, adopting any source silently.)
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sip_bridge.config.loader import BridgeConfig
from sip_bridge.media.call_media import MediaStats
from sip_bridge.server import BridgeServer
from testkit.sipp_media import (
    HOST,
    random_port_range,
    run_sipp_in,
    sipp_counts,
    tone,
    udp_socket_counters,
    write_ulaw,
)

pytestmark = pytest.mark.serial  # a hundred calls at once: the whole CPU

CALLS = 100
RATE_CPS = 50
CALL_S = 20
PPS = 50  # 20 ms packets
EXPECTED = CALL_S * PPS


def _config(rtp_ports: str) -> BridgeConfig:
    base = BridgeConfig.line_check()
    return replace(
        base,
        sip=replace(base.sip, listen=f"{HOST}:0", max_calls=CALLS + 10),
        rtp=replace(base.rtp, ports=rtp_ports, symmetric="off"),
        inbound=replace(base.inbound, rate_per_s=0),  # one source at 50 calls/s is the point
    )


def test_hundred_concurrent_calls_stream_rtp_both_ways(tmp_path: Path) -> None:
    write_ulaw(tmp_path / "tone.ulaw", tone((440.0, 1000.0), 4.0))
    low, high = random_port_range(4 * CALLS, 30000, 60000)
    peak = 0
    # (wall, this process's CPU, datagrams dropped at sipp's media socket) while all calls are up
    steady: list[tuple[float, float, int]] = []

    async def main() -> tuple[BridgeServer, str]:
        nonlocal peak
        sipp_media: int | None = None  # the port sipp streams from, as its SDP says
        server = BridgeServer(_config(f"{low}-{high}"))
        await server.start()
        try:
            assert server.port is not None
            run = asyncio.ensure_future(
                run_sipp_in(
                    tmp_path, server.port, "uac_rtp_load.xml",
                    "-m", str(CALLS), "-l", str(CALLS), "-r", str(RATE_CPS),
                    "-d", str(CALL_S * 1000),
                    timeout=CALL_S + 30,
                )
            )  # fmt: skip
            while not run.done():
                peak = max(peak, len(server.calls))
                media = next((c.media for c in server.calls.values() if c.media), None)
                if sipp_media is None and media is not None:
                    sipp_media = media.params.remote_port
                counters = udp_socket_counters(sipp_media) if sipp_media else None
                if len(server.calls) == CALLS and counters is not None:
                    steady.append((time.monotonic(), time.process_time(), counters[1]))
                await asyncio.wait([run], timeout=0.5)
            screen = run.result()
            deadline = asyncio.get_running_loop().time() + 5
            while server.calls and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)
        finally:
            await server.stop()
        return server, screen

    server, screen = asyncio.run(main())  # sipp passed: every call got its 200s
    assert sipp_counts(screen) == (CALLS, 0), screen[-3000:]
    counts = {k: server.stats[k] for k in ("offered", "established", "ended")}
    assert counts == {"offered": CALLS, "established": CALLS, "ended": CALLS}
    assert server.calls == {}
    assert peak >= 0.9 * CALLS, f"only {peak} calls were up at once"
    finished: list[MediaStats] = list(server.finished)
    assert len(finished) == CALLS
    assert len({s.local_port for s in finished}) == CALLS  # one RTP port per call
    assert len(steady) >= 10, f"all {CALLS} calls up together for only {len(steady)} samples"
    wall = steady[-1][0] - steady[0][0]
    cpu = 100 * (steady[-1][1] - steady[0][1]) / wall
    # The echo reached sipp: its media socket (never read, long full) dropped every arrival.
    arrived_pps = (steady[-1][2] - steady[0][2]) / wall
    summary = (
        f"{_summary(finished, peak)}; with all calls up: bridge CPU {cpu:.0f} % of a core,"
        f" {arrived_pps:.0f} packets/s reached sipp"
    )
    print(summary, f"(load avg {os.getloadavg()[0]:.1f})")
    assert arrived_pps >= 0.8 * CALLS * PPS, summary
    bad = [p for p in map(_problem, finished) if p]
    assert not bad, f"{len(bad)} of {CALLS} calls misbehaved ({summary}), e.g.:\n" + "\n".join(
        bad[:3]
    )


def _problem(s: MediaStats) -> str:
    """What is wrong with one finished call's media, or '' if it looks sane."""
    j = s.jitter
    checks = {
        "packets_in": EXPECTED * 0.8 <= s.packets_in <= EXPECTED * 1.2,
        "accepted": s.packets_accepted == s.packets_in,  # all from the SDP address
        # frames the pacer skipped after a stall are not sent: this bound covers them too
        "packets_out": EXPECTED * 0.8 <= s.packets_out <= EXPECTED * 1.2,
        "filters": s.wrong_source == s.wrong_payload_type == s.wrong_ssrc == s.malformed == 0,
        "errors": s.send_errors == s.agent_errors == 0,
        "jitter_late_lost": j.late + j.lost <= 0.05 * max(1, j.received),
        "jitter_concealed": j.concealed <= 0.05 * max(1, j.received),
    }
    failed = [name for name, good in checks.items() if not good]
    return f"{failed}: {s}" if failed else ""


def _summary(stats: list[MediaStats], peak: int) -> str:
    """One line of figures for the log: what the load looked like from the bridge."""
    rx = sum(s.jitter.received for s in stats)
    out = sum(s.packets_out for s in stats)
    late_rx = sum(s.jitter.late + s.jitter.lost for s in stats)
    late_tx = sum(s.pacer_late_frames for s in stats)
    p99 = np.percentile([s.pacing_jitter_p99_ms for s in stats], 99)
    return (
        f"load: peak {peak} calls, packets_in {sum(s.packets_in for s in stats)},"
        f" packets_out {out}, jitter late+lost {100 * late_rx / max(1, rx):.2f} %,"
        f" pacer late {100 * late_tx / max(1, out):.1f} %, pacing p99 of p99 {p99:.1f} ms,"
        f" skipped {sum(s.pacer_skipped_frames for s in stats)}"
    )

"""A peer that vanishes (no BYE, no RTP) is hung up after rtp.timeout_s; one that keeps
sending is not."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

from sip_bridge.config.loader import BridgeConfig
from sip_bridge.ops.records import CallRecords
from sip_bridge.server import BridgeServer
from testkit.wire_caller import WireCaller


def _config(db: Path) -> BridgeConfig:
    base = BridgeConfig.line_check()
    return replace(
        base,
        sip=replace(base.sip, listen="127.0.0.1:0"),
        rtp=replace(base.rtp, ports="46000-46099", timeout_s=1.5),
        records=replace(base.records, enabled=True, db=str(db)),
    )


def test_a_silent_peer_gets_a_bye_and_a_talking_one_does_not(tmp_path: Path) -> None:
    db = tmp_path / "calls.sqlite"

    async def main() -> tuple[float, bool]:
        server = BridgeServer(_config(db))
        await server.start()
        gone, alive = WireCaller(server.uri), WireCaller(server.uri)
        try:
            for caller in (gone, alive):
                await caller.connect(("127.0.0.1", server.port))
                assert caller.status == 200
            await asyncio.sleep(0.5)
            gone._tasks[-1].cancel()  # its RTP stops; its SIP side still answers the BYE
            stopped = time.monotonic()
            await asyncio.wait_for(gone.ended.wait(), 6)
            took = time.monotonic() - stopped
            await asyncio.sleep(1.0)  # the other call, still sending, is still up
            still_up = not alive.ended.is_set() and len(server.calls) == 1
            return took, still_up
        finally:
            await alive.hangup()
            await server.stop()

    took, still_up = asyncio.run(main())
    assert 1.5 <= took <= 3.5, took  # the timeout, checked once a second
    assert still_up
    records = CallRecords(db, readonly=True)
    reasons = sorted(r["end_reason"] for r in records.list())
    records.close()
    assert reasons[0] == "RTP timeout" and reasons[1] != "RTP timeout", reasons

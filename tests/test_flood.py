"""A short INVITE flood (bench/flood.py) while real calls are up, in make test.

The flood comes from one source, sipp at several hundred INVITEs a second, never ACKing
a rejection. What must hold whatever the machine's speed: the legitimate calls all
complete with their media whole, the flood gets only cheap answers (403 from a stranger,
503 past the per-source rate: each sent once, no transaction kept; 503 past max_calls)
and never more calls than max_calls allows, and once Timer H has passed no SIP
transaction is left. The late-frame and CPU
figures are the bench's business (`bench/flood.py`), not asserted here.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench import flood

pytestmark = pytest.mark.serial  # floods of hundreds of INVITEs: the whole CPU

CALLS = 4


@pytest.mark.parametrize("mode", ["trunk", "open"])
def test_flood_leaves_calls_in_progress_whole(mode: str, tmp_path: Path) -> None:
    runner = flood.run_flood(mode, CALLS, 300, flood_s=2.0, quiet_s=1.0, out=tmp_path, t1=0.05)
    run = asyncio.run(runner)
    assert run["legit_completed"] == CALLS and not run["legit_failed"], run
    assert run["legit_finished_on_bridge"] == CALLS
    # media whole: every packet the caller sent arrived and none was lost in the bridge
    assert run["rx_lost_pct"] == 0.0 and run["send_errors"] == 0 and run["agent_errors"] == 0
    assert run["packets_in"] >= CALLS * 50 * 3  # 50 packets/s each, for at least 3 s

    f = run["flood"]
    answered = f["answered"]
    # every INVITE answered, or dropped unread once the source was refused 200 times
    assert sum(answered.values()) + f["silenced"] == f["invites"] == f["sipp_completed"], f
    assert answered["rate_limited"] > 0  # one source at 300/s is over 50/s after its burst
    assert f["silenced"] > 0 and sum(answered.values()) - answered["admitted"] == 200
    if mode == "trunk":  # a source no trunk owns is never admitted
        assert answered["admitted"] == 0 and f["became_calls"] == 0
        assert answered["forbidden"] > 0
    else:  # the open default: what gets through is answered, up to max_calls
        assert answered["admitted"] > 0 and f["became_calls"] <= answered["admitted"]
    # refusals of a stranger keep no state (RFC 3261 26.3.2.4): no pile-up of transactions
    # (an admitted INVITE may hold two: its own and its BYE's, until Timer H/J)
    assert run["transactions"]["peak"] <= 2 * (CALLS + answered["admitted"]) + 10
    assert run["transactions"]["after_timer_h"] == 0

"""The shared media clock: one timer for every call, stopped when the last call leaves."""

from __future__ import annotations

import asyncio
import random

import numpy as np
from numpy.typing import NDArray

from agent import Agent, AgentOutput, CallInfo
from sip_bridge.media.call_media import CallMedia, MediaParams
from sip_bridge.media.media_clock import media_clock
from sip_bridge.media.rtp_ports import RtpPortPool


class Quiet(Agent):
    name = "quiet"

    def __init__(self) -> None:
        self.frames = 0

    async def start(self, call: CallInfo, output: AgentOutput) -> None:
        pass

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        self.frames += 1


def test_calls_share_one_clock_that_stops_with_the_last_call() -> None:
    async def main() -> None:
        low = random.Random().randrange(30000, 60000, 2)
        pool = RtpPortPool(low, low + 199)
        params = MediaParams("127.0.0.1", 9, local_host="127.0.0.1")  # discard port
        calls = [CallMedia(Quiet(), pool, params) for _ in range(3)]
        for c in calls:
            await c.start()
        clock = media_clock()
        assert len(clock.members) == 3 and clock._handle is not None
        await asyncio.sleep(0.3)
        for c in calls:  # every call got its 20 ms frames from the one timer
            assert isinstance(c.agent, Quiet) and 5 <= c.agent.frames <= 17
            assert 5 <= c.stats.packets_out <= 17
        assert clock.ticks <= 0.3 / clock.tick_s + 3  # one wake-up per 5 ms for all calls
        for c in calls:
            await c.close()
        assert not clock.members and clock._handle is None  # no idle ticking
        again = CallMedia(Quiet(), pool, params)
        await again.start()
        assert media_clock() is clock and clock._handle is not None
        await again.close()

    asyncio.run(main())

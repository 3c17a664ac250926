"""Blind transfer against sipp: the agent asks for it, sipp plays the transferee.

sipp calls the in-process bridge; half a second in, the test agent emits a
TransferRequest; sipp checks the REFER it gets (tests/sipp/uac_refer.xml), answers
202, sends NOTIFY 100 Trying and NOTIFY 200 OK (subscription terminated), then BYE.
The test checks the agent was told TransferResult(outcome="succeeded").
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from agent.base import (
    Agent,
    AgentEvent,
    AgentOutput,
    CallInfo,
    TransferRequest,
    TransferResult,
)
from sip_bridge.config.loader import BridgeConfig
from sip_bridge.server import BridgeServer
from testkit.sipp_runner import run_sipp


class TransferringAgent(Agent):
    """Says nothing; asks for a transfer to ``target`` once ``after_s`` of call has passed."""

    name = "transfer-test"
    sample_rate = 8000

    def __init__(self, target: str, after_s: float = 0.5) -> None:
        self.target = target
        self.after = int(after_s * self.sample_rate)
        self.heard = 0
        self.output: AgentOutput | None = None
        self.asked = False
        self.events: list[AgentEvent] = []

    async def start(self, call: CallInfo, output: AgentOutput) -> None:
        self.output = output

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        self.heard += int(pcm.size)
        if not self.asked and self.heard >= self.after and self.output is not None:
            self.asked = True
            self.output.emit(TransferRequest(self.target))

    def on_event(self, event: AgentEvent) -> None:
        self.events.append(event)


def test_agent_transfer_by_refer_succeeds_against_sipp(tmp_path: Path) -> None:
    base = BridgeConfig.line_check()
    config = replace(
        base,
        sip=replace(base.sip, listen="127.0.0.1:0"),
        rtp=replace(base.rtp, ports="41000-41999"),
    )
    agents: list[TransferringAgent] = []

    def factory(_: BridgeConfig) -> Agent:
        agents.append(TransferringAgent("1001"))
        return agents[-1]

    log = tmp_path / "messages.log"

    async def main() -> BridgeServer:
        server = BridgeServer(config, factory)
        await server.start()
        try:
            await run_sipp(server.port, "uac_refer.xml", "-m", "1", timeout=20, log=log)
            await asyncio.sleep(0.3)
        finally:
            await server.stop()
        return server

    server = asyncio.run(main())
    [agent] = agents
    results = [e for e in agent.events if isinstance(e, TransferResult)]
    assert len(results) == 1, agent.events
    [result] = results
    assert result.outcome == "succeeded" and result.status == 200
    assert result.target.startswith("sip:1001@127.0.0.1:")
    text = log.read_text(errors="replace")
    assert text.count("NOTIFY sip:") >= 2 and "SIP/2.0 202 Accepted" in text
    assert server.calls == {} and server.stats["offered"] == server.stats["ended"] == 1

"""Turn-taking and dialogue agents, behind one small interface (:mod:`agent.base`).

So far: the interface (:class:`Agent`, :class:`AgentOutput`, the call info and event
dataclasses) and the line-check agents: :class:`EchoAgent` (plays the caller back after a
fixed delay), :class:`ToneAgent` (a steady tone) and :class:`PlaybackAgent` (a WAV file,
then hang up or loop). VAD, end of turn, barge-in and the dialogue engine are not built
yet. Nothing here may import RTP or SIP code.
"""

from agent.base import (
    Agent,
    AgentEvent,
    AgentOutput,
    CallInfo,
    DtmfEvent,
    HangupEvent,
    TransferRequest,
)
from agent.echo import EchoAgent
from agent.playback import PlaybackAgent
from agent.tone import ToneAgent

__all__ = [
    "Agent",
    "AgentEvent",
    "AgentOutput",
    "CallInfo",
    "DtmfEvent",
    "EchoAgent",
    "HangupEvent",
    "PlaybackAgent",
    "ToneAgent",
    "TransferRequest",
]

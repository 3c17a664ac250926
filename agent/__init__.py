"""Turn-taking and dialogue agents, behind one small interface (:mod:`agent.base`).

Sub-packages by job, each saying what it may import (``tests/test_layout.py`` holds them
to it): :mod:`agent.voice` (the voice pipeline: VAD, end of turn, ASR, TTS, barge-in and
the agent that runs them, :mod:`agent.voice.voice_agent`), :mod:`agent.dialogue` (the
dialogue engine and the agent profiles it runs), :mod:`agent.lines` (the line-check agents
:class:`EchoAgent`, :class:`ToneAgent`, :class:`PlaybackAgent`, and the fallback prompt).
At the top: the interface, :class:`~agent.speech_to_speech.SpeechToSpeechAgent` for a
user's own model, and what several share (the 20 ms tick, word normalising, transcripts,
voice settings, redaction, the model guard). Nothing here may import RTP or SIP code.

The line-check agents load lazily: reading a config file imports
:mod:`agent.voice_settings`, and that must not pull in scipy (``sip-bridge status`` would
take seconds to start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agent.base import (
    Agent,
    AgentEvent,
    AgentOutput,
    CallInfo,
    DtmfEvent,
    HangupEvent,
    TransferRequest,
)

if TYPE_CHECKING:
    from agent.lines.echo import EchoAgent
    from agent.lines.playback import PlaybackAgent
    from agent.lines.tone import ToneAgent

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

_LAZY = {
    "EchoAgent": "agent.lines.echo",
    "PlaybackAgent": "agent.lines.playback",
    "ToneAgent": "agent.lines.tone",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agent' has no attribute {name!r}")

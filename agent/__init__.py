"""Turn-taking and dialogue agents, behind one small interface (:mod:`agent.base`).

The interface (:class:`Agent`, :class:`AgentOutput`, the call info and event dataclasses);
the voice agent (:mod:`agent.voice`: VAD, end of turn, ASR, dialogue, TTS, barge-in); the
line-check agents :class:`EchoAgent`, :class:`ToneAgent` and :class:`PlaybackAgent`; and
:class:`~agent.speech_to_speech.SpeechToSpeechAgent` for a user's own model. Nothing here
may import RTP or SIP code.

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

_LAZY = {"EchoAgent": "agent.echo", "PlaybackAgent": "agent.playback", "ToneAgent": "agent.tone"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agent' has no attribute {name!r}")

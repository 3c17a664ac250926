"""What a caller hears, frame by frame: ringback or not, and the silences in between.

Test and bench helpers over 20 ms frames of received 8 kHz audio (the wire caller's log).
Ringback is recognised the way ``sip-bridge script`` recognises it
(:class:`sip_bridge.script.heard_audio.HeardAudio`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from sip_bridge.script.heard_audio import FRAME_S, HeardAudio, ringback_like

__all__ = ["ringback_frames", "ringback_like"]


def ringback_frames(frames: list[NDArray[np.int16]]) -> list[bool]:
    """Which frames are ringback: runs of 200 ms or more of the 440 + 480 Hz pair (speech
    has moments near 440/480 Hz too), and two frames either side of such a run (a burst's
    first and last frames, part tone and part silence, may not look like it)."""
    heard = HeardAudio()
    for i, pcm in enumerate(frames):
        heard.add(i * FRAME_S, pcm)
    return heard.ringback

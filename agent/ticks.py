"""The voice agent's clock, defined once for every module in agent/ that counts in it: a
tick is one 20 ms frame of the call at 8 kHz, and our own voice may come back as line echo
for up to ``ECHO_S`` after we sent it. (The media clock's 5 ms wake-up grid is another
thing: :data:`sip_bridge.media.media_clock.GRID_S`.)"""

from __future__ import annotations

__all__ = ["ECHO_S", "FRAME", "FRAME_MS", "RATE", "TICK_S"]

RATE = 8000  # the call's side of the agent: G.711's rate
FRAME = 160  # samples per tick at 8 kHz
FRAME_MS = 20
TICK_S = FRAME / RATE  # 0.02
ECHO_S = 0.4  # how long after we sent it our own voice may come back as line echo

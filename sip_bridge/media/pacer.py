"""Clocks of a call's media: the paced send grid and the receive loop's next tick.

Both run on absolute deadlines of the event loop's monotonic clock (never
cumulative sleeps), so a late wake-up costs jitter, not drift.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

__all__ = ["Pacer", "next_tick"]


def next_tick(
    t: float,
    frame_s: float,
    due_s: float | None,
    max_nudge_s: float = 0.005,
    lag_s: float = 0.001,
) -> float:
    """The receive loop's next pop time: one frame on, moved at most ``max_nudge_s``
    toward ``due_s + lag_s`` (see ``JitterBuffer.due_s`` and docs/media.md).

    Why the lag: popping a hair *before* ``due_s`` reads as "delay below target", and on
    quiet frames the buffer then inserts a frame to grow the delay; the clock, following
    ``due_s``, would undo that at once, so every insert became an extra frame of silence
    handed to the agent (25 % too many frames in digital silence, measured). One ms late
    keeps the buffer in its dead band.
    """
    nxt = t + frame_s
    if due_s is not None:
        nxt += min(max_nudge_s, max(-max_nudge_s, due_s + lag_s - nxt))
    return nxt


class Pacer:
    """Frame deadlines on an absolute grid, with bounded catch-up. Pure: time is passed in."""

    def __init__(self, frame_s: float, max_burst: int = 3, history: int = 3000) -> None:
        if frame_s <= 0 or max_burst < 1:
            raise ValueError("frame_s must be > 0 and max_burst >= 1")
        self.frame_s = frame_s
        self.max_burst = max_burst
        self.t0 = 0.0
        self.k = 0  # index of the next frame to send
        self.sent = 0
        self.late_frames = 0  # sent more than half a frame after their deadline
        self.skipped_frames = 0
        self.rephased = 0
        self.followed = 0  # frames sent late because their producer was (see follow)
        self.waits: deque[float] = deque(maxlen=history)  # seconds, per followed frame
        self.lateness: deque[float] = deque(maxlen=history)  # seconds, per frame sent
        #: ``t0 + k * frame_s``, kept up to date by every method that moves t0 or k: the
        #: media clock reads it for every call on every tick.
        self.next_deadline = 0.0

    def start(self, now: float) -> None:
        self.t0 = now
        self.k = 0
        self.next_deadline = now + 0 * self.frame_s

    def poll(self, now: float) -> tuple[int, list[float]]:
        """(frames to skip, deadlines of the frames to send now, oldest first)."""
        if now < self.next_deadline:
            return 0, []  # nothing due yet (the formula below says the same, slower)
        t0, frame_s = self.t0, self.frame_s
        due = int((now - t0) // frame_s) + 1 - self.k
        if due <= 0:
            return 0, []
        skip = max(0, due - self.max_burst)
        k = self.k + skip
        self.skipped_frames += skip
        out = []
        half = frame_s / 2
        for _ in range(due - skip):
            deadline = t0 + k * frame_s
            late = now - deadline
            self.lateness.append(late)
            if late > half:
                self.late_frames += 1
            out.append(deadline)
            k += 1
        self.k = k
        self.next_deadline = t0 + k * frame_s
        self.sent += len(out)
        return skip, out

    def rephase(self, now: float) -> None:
        """Send the next frame at ``now`` and continue the grid from there (talkspurt start)."""
        self.t0 = now
        self.k = 0
        self.next_deadline = now + 0 * self.frame_s
        self.rephased += 1

    def follow(self, t: float, now: float) -> float:
        """Send the due frame at ``now`` and go on with the grid from grid point ``t``: the
        frame waited for its producer (not written at its deadline), which is counted
        apart (:attr:`waits`), not as pacing lateness: the pacer did not make it late."""
        deadline = self.next_deadline
        self.waits.append(now - deadline)
        self.followed += 1
        self.t0, self.k = t, 1
        self.next_deadline = t + 1 * self.frame_s
        self.sent += 1
        return deadline

    def figures(self) -> dict[str, Any]:
        """The pacer's part of :class:`~sip_bridge.media.call_media.MediaStats`."""
        p50, p99, pmax = self.jitter_ms()
        return {
            "pacer_late_frames": self.late_frames,
            "pacer_skipped_frames": self.skipped_frames,
            "pacing_jitter_p50_ms": p50,
            "pacing_jitter_p99_ms": p99,
            "pacing_jitter_max_ms": pmax,
            "held_frames": self.followed,
            "held_wait_max_ms": 1000.0 * max(self.waits, default=0.0),
        }

    def jitter_ms(self) -> tuple[float, float, float]:
        """(p50, p99, max) of the departure lateness, milliseconds."""
        if not self.lateness:
            return 0.0, 0.0, 0.0
        a = 1000.0 * np.asarray(self.lateness)
        p50, p99 = np.percentile(a, [50, 99])
        return float(p50), float(p99), float(a.max())

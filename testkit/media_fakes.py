"""What the media clock needs of an event loop, driven by hand: tests move its time."""

from __future__ import annotations

from types import SimpleNamespace


class FakeLoop:
    """Just what the clock and the call read from a loop: its time, and timers (unused)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: object, *, context: object = None) -> object:
        return SimpleNamespace(cancel=lambda: None)

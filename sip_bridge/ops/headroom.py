"""A node's own headroom, and whether it sheds new calls ([load]).

Why: a dispatcher spreads calls by whether a node answers its OPTIONS probe, and a carrier
retries elsewhere on a 503. A node that knows it is past what it can carry says so before
its callers notice: its turns get slow (the caller waits), or its CPUs have nothing left
(the next call's turns will). It refuses *new* calls only; calls in progress go on.

:class:`Headroom` is sans-I/O: turns and CPU readings come in with the clock, and
:meth:`Headroom.update` decides. Over budget is either of

- the p95 of the turns of the last ``window_s`` above ``turn_p95_ms`` (with at least
  ``min_turns`` turns: a few slow first turns decide nothing),
- the node's CPUs, averaged over ``cpu_window_s``, busier than ``cpu_pct``,
- or busier than that with one more call: what the CPUs cost per call in progress over
  the same window, times the calls in progress now and the next one. Why: the average
  lags the calls it was measured with; 24 callers arriving over 20 s were all admitted
  before the 10 s average passed 90 %, and then none of them completed.

Shedding on the first two starts when over budget and ends only when both figures are
under ``resume_at`` of their budgets and ``hold_s`` has passed (hysteresis: a node at its
budget does not flap in and out of the dispatcher's set every probe). The third is a
node at capacity, judged afresh at every new call and every second: one call ending
makes room for one more. It once held too (the CPUs with one more call under
``resume_at``), and at twice the calls a node could carry that drained it: the cost per
call, measured with fewer and fewer calls, stayed over the band until almost none were
left (76 s, 2 cores, 48 callers), then a dozen callers got in within 1.4 s, their turns
all at once (11.5 calls in progress on average, turn p95 1090 ms).

:class:`CpuMeter` is the I/O part: the busy share of the CPUs this process may run on,
from ``/proc/stat`` (the node's, so model workers and other processes count), or this
process's own CPU time where there is no ``/proc/stat``.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sip_bridge.config.config_types import LoadConfig

__all__ = ["CpuMeter", "Headroom", "HeadroomFigures"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HeadroomFigures:
    """What the node measured of itself, for status, the console and metrics."""

    shedding: bool  # new calls get 503 now
    over_budget: bool  # past a budget, or at capacity (sheds only with [load] shed = true)
    reason: str  # why over budget ("" when not)
    turns: int  # turns in the window
    turn_p95_ms: float | None  # None: fewer than min_turns
    cpu_busy_pct: float | None  # None: no reading yet
    cpu_next_call_pct: float | None  # the CPUs with one more call (None: no calls measured)
    headroom_pct: float  # 100 = idle; 0 = at the nearer budget; negative = past it

    def as_dict(self) -> dict[str, Any]:
        return {
            "shedding": self.shedding,
            "over_budget": self.over_budget,
            "reason": self.reason,
            "turns": self.turns,
            "turn_p95_ms": self.turn_p95_ms,
            "cpu_busy_pct": self.cpu_busy_pct,
            "cpu_next_call_pct": self.cpu_next_call_pct,
            "headroom_pct": self.headroom_pct,
        }


def p95(values: list[float]) -> float:
    """Nearest-rank 95th percentile of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


class Headroom:
    """Turn latency and CPU in, the shed decision out; see the module docstring."""

    def __init__(self, config: LoadConfig) -> None:
        self.config = config
        self._turns: deque[tuple[float, float]] = deque()  # (when, total ms)
        # (when, busy %, seconds, calls in progress)
        self._cpu: deque[tuple[float, float, float, int]] = deque()
        self.calls_now = 0  # calls in progress, as the node last said (calls_in_progress)
        self.over_budget = False  # past the turn or CPU budget: held (see the docstring)
        self.at_capacity = False  # one more call would take the CPUs past cpu_pct
        self._since = -math.inf  # when shedding last started
        self.reason = ""  # why new calls are refused ("" when they are not)
        self._budget_reason = ""  # the held part of it
        self.latest = self._figures(None, None)  # as the last update() found them

    @property
    def shedding(self) -> bool:
        return self.config.shed and (self.over_budget or self.at_capacity)

    def turn(self, total_ms: float, now: float) -> None:
        """A turn answered: the caller's stop -> our reply on the wire."""
        self._turns.append((now, total_ms))

    def cpu(self, busy_pct: float, seconds: float, now: float, calls: int = 0) -> None:
        """The CPUs were ``busy_pct`` busy over the last ``seconds``, with ``calls`` in
        progress."""
        self._cpu.append((now, busy_pct, seconds, calls))

    def calls_in_progress(self, calls: int) -> None:
        """The node has ``calls`` now (it tells at each new call, before the next reading)."""
        self.calls_now = calls

    def _expire(self, now: float) -> None:
        while self._turns and self._turns[0][0] < now - self.config.window_s:
            self._turns.popleft()
        while self._cpu and self._cpu[0][0] < now - self.config.cpu_window_s:
            self._cpu.popleft()

    def _turn_p95(self) -> float | None:
        if len(self._turns) < self.config.min_turns:
            return None
        return p95([ms for _, ms in self._turns])

    def _cpu_busy(self) -> float | None:
        seconds = sum(s for _, _, s, _ in self._cpu)
        if seconds <= 0:
            return None
        return sum(pct * s for _, pct, s, _ in self._cpu) / seconds

    def _cpu_next_call(self, busy: float | None) -> float | None:
        """The CPUs' busy share with the calls now and one more: ``busy`` per call in
        progress over the window (what else runs on the host counted in, so it errs high),
        times ``calls_now + 1``. None before a window with at least one call on average."""
        seconds = sum(s for _, _, s, _ in self._cpu)
        if busy is None or seconds <= 0:
            return None
        calls = sum(n * s for _, _, s, n in self._cpu) / seconds
        if calls < 1.0:
            return None
        return busy / calls * (self.calls_now + 1)

    def update(self, now: float) -> bool:
        """Decide; True when the shed decision changed (the caller logs and tells the UA)."""
        self._expire(now)
        c = self.config
        turn_p95, busy = self._turn_p95(), self._cpu_busy()
        after = self._cpu_next_call(busy)
        was, held = self.shedding, self.over_budget
        if not self.over_budget:
            why = []
            if turn_p95 is not None and turn_p95 > c.turn_p95_ms:
                why.append(f"turn p95 {turn_p95:.0f} ms > {c.turn_p95_ms:g} ms")
            if busy is not None and busy > c.cpu_pct:
                why.append(f"CPU {busy:.0f} % > {c.cpu_pct:g} %")
            if why:
                self.over_budget, self._since, self._budget_reason = True, now, "; ".join(why)
        else:
            turns_ok = turn_p95 is None or turn_p95 <= c.resume_at * c.turn_p95_ms
            cpu_ok = busy is None or busy <= c.resume_at * c.cpu_pct
            if turns_ok and cpu_ok and now - self._since >= c.hold_s:
                self.over_budget, self._budget_reason = False, ""
        self.at_capacity = busy is not None and after is not None and after > c.cpu_pct
        full = ""
        if self.at_capacity:
            full = f"CPU {busy:.0f} %, with one more call {after:.0f} % > {c.cpu_pct:g} %"
        self.reason = "; ".join(r for r in (self._budget_reason, full) if r)
        if c.shed and self.over_budget != held:
            if self.over_budget:
                log.warning("load: over budget (%s): new calls get 503", self._budget_reason)
            else:
                log.warning("load: back under budget: taking new calls")
        elif self.shedding != was:  # at capacity or not: it changes with every call
            log.debug("load: %s", "at capacity: new calls get 503" if self.shedding else
                      "room for a call")  # fmt: skip
        self.latest = self._figures(turn_p95, busy, after)
        return self.shedding != was

    def figures(self, now: float) -> HeadroomFigures:
        """The figures now (:attr:`latest` is those of the last decision)."""
        self._expire(now)
        busy = self._cpu_busy()
        return self._figures(self._turn_p95(), busy, self._cpu_next_call(busy))

    def _figures(
        self, turn_p95: float | None, busy: float | None, after: float | None = None
    ) -> HeadroomFigures:
        c = self.config
        used = max(
            (turn_p95 or 0.0) / c.turn_p95_ms,
            (busy or 0.0) / c.cpu_pct,
        )
        return HeadroomFigures(
            shedding=self.shedding,
            over_budget=self.over_budget or self.at_capacity,
            reason=self.reason,
            turns=len(self._turns),
            turn_p95_ms=None if turn_p95 is None else round(turn_p95, 1),
            cpu_busy_pct=None if busy is None else round(busy, 1),
            cpu_next_call_pct=None if after is None else round(after, 1),
            headroom_pct=round(100.0 * (1.0 - used), 1),
        )


class CpuMeter:
    """The busy share (%) of the CPUs this process may run on, between two reads.

    From ``/proc/stat``'s per-CPU lines: busy is everything but idle and iowait. Without
    it (not Linux), this process's own CPU time over the wall time and its CPUs."""

    def __init__(self, stat: Path = Path("/proc/stat"), cpus: set[int] | None = None) -> None:
        self.stat = stat
        self.cpus = cpus if cpus is not None else _allowed_cpus()
        self._last: tuple[float, float] | None = None  # (busy, total) in ticks or seconds

    def _counters(self) -> tuple[float, float]:
        try:
            text = self.stat.read_text()
        except OSError:
            wall = time.monotonic() * max(1, len(self.cpus))
            return time.process_time(), wall
        busy = total = 0.0
        for line in text.splitlines():
            name, _, rest = line.partition(" ")
            if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in self.cpus):
                continue
            ticks = [float(x) for x in rest.split()[:8]]  # guest time is in user already
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0.0)
            total += sum(ticks)
            busy += sum(ticks) - idle
        return busy, total

    def read(self) -> float | None:
        """% busy since the last read; None on the first."""
        busy, total = self._counters()
        last, self._last = self._last, (busy, total)
        if last is None or total <= last[1]:
            return None
        return max(0.0, min(100.0, 100.0 * (busy - last[0]) / (total - last[1])))


def _allowed_cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))

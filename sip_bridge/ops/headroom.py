"""A node's own headroom, and whether it sheds new calls ([load]).

Why: a dispatcher spreads calls by whether a node answers its OPTIONS probe, and a carrier
retries elsewhere on a 503. A node that knows it is past what it can carry says so before
its callers notice: its turns get slow (the caller waits), or its CPUs have nothing left
(the next call's turns will). It refuses *new* calls only; calls in progress go on.

:class:`Headroom` is sans-I/O: turns (with the calls in progress when each was answered)
and CPU readings come in with the clock, and :meth:`Headroom.update` decides. Over budget
is either of

- the p95 of the turns of the last ``window_s`` above ``turn_p95_ms`` (with at least
  ``min_turns`` turns: a few slow first turns decide nothing),
- the node's CPUs, averaged over ``cpu_window_s``, busier than ``cpu_pct``.

A breach does not shut the node: it sets a *ceiling*, the calls the node carries, at
``SHRINK`` (90 %) of the calls in progress that breached it, and new calls get 503 while
the calls in progress are at the ceiling; each call that ends lets one in. A move at most
every ``hold_s``, judged only by what came after the last one (turns taken with no more
calls than the ceiling): still breached, it shrinks again; the figures under ``resume_at``
of both budgets with the calls at the ceiling, it rises by one. Why: shedding everything
until the figures were back under the band (it once did) drained a node at twice the
calls it could carry to almost none (73-76 s at 2 cores and 48 callers), then let in a
crowd that talked at once (turn p95 2.9 s, a third of the calls never heard their
goodbye). ``over_budget`` (entered on a breach, left under the band after ``hold_s``)
says so to the operator; it refuses nothing by itself.

Before any breach, and for what comes faster than the averages move, a node is also *at
capacity* when the CPUs would pass ``cpu_pct`` with one more call: what they cost per call
in progress over the CPU window (the last such cost where the window had less than one
call on average), times the calls now and the next. Judged afresh at every new call and
every second; it holds nothing.

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

#: A breached budget: the ceiling becomes this share of the calls that breached it.
SHRINK = 0.9


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
    ceiling: int | None  # the calls it was measured to carry (None: no budget breached yet)
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
            "ceiling": self.ceiling,
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
        # (when, total ms, calls in progress when it was answered)
        self._turns: deque[tuple[float, float, int]] = deque()
        # (when, busy %, seconds, calls in progress)
        self._cpu: deque[tuple[float, float, float, int]] = deque()
        self.calls_now = 0  # calls in progress, as the node last said (calls_in_progress)
        self.over_budget = False  # past the turn or CPU budget: held (see the docstring)
        self.at_capacity = False  # one more call would take the CPUs past cpu_pct
        self.ceiling: int | None = None  # the calls it was measured to carry; None: not yet
        self._answered: deque[float] = deque()  # when each call of the last cpu_window_s came
        self._calls_seen = 0
        self._moved = -math.inf  # when the ceiling last moved; what came after decides
        self._cost: float | None = None  # CPU % per call, from the last window with calls
        self._since = -math.inf  # when the node went over budget last
        self.reason = ""  # why it is over budget, full, at capacity or starting ("": none)
        self._budget_reason = ""  # the over-budget part of it
        self.latest = self._figures(None, None)  # as the last update() found them

    @property
    def full(self) -> bool:
        """At the learned ceiling: one more call is one more than it was measured to carry."""
        return self.ceiling is not None and self.calls_now >= self.ceiling

    @property
    def young(self) -> int:
        """Calls that came in the last ``cpu_window_s``: not yet in the CPU figures at their
        full cost (a call costs little while its greeting plays)."""
        return min(len(self._answered), self.calls_now)

    @property
    def starting(self) -> bool:
        """Slow start: the young calls are as many as the limit and as the older ones."""
        n = self.config.slow_start_calls
        return n > 0 and self.young >= max(n, self.calls_now - self.young)

    @property
    def shedding(self) -> bool:
        return self.config.shed and (self.full or self.at_capacity or self.starting)

    def turn(self, total_ms: float, now: float, calls: int | None = None) -> None:
        """A turn answered: the caller's stop -> our reply on the wire, with ``calls`` in
        progress (default: as last told)."""
        self._turns.append((now, total_ms, self.calls_now if calls is None else calls))

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
        while self._answered and self._answered[0] < now - self.config.cpu_window_s:
            self._answered.popleft()

    def _turn_p95(self) -> float | None:
        if len(self._turns) < self.config.min_turns:
            return None
        return p95([ms for _, ms, _ in self._turns])

    def _judged_turns(self) -> list[tuple[float, float, int]]:
        """The turns that judge the ceiling: since it last moved, and taken with no more
        calls than it (those of a crowd it is still shedding judge nothing)."""
        cap = math.inf if self.ceiling is None else self.ceiling
        return [t for t in self._turns if t[0] >= self._moved and t[2] <= cap]

    def _cpu_busy(self) -> float | None:
        seconds = sum(s for _, _, s, _ in self._cpu)
        if seconds <= 0:
            return None
        return sum(pct * s for _, pct, s, _ in self._cpu) / seconds

    def _cpu_calls(self) -> float:
        """Calls in progress over the CPU window, on average (0 with no readings)."""
        seconds = sum(s for _, _, s, _ in self._cpu)
        return sum(n * s for _, _, s, n in self._cpu) / seconds if seconds > 0 else 0.0

    def _cpu_next_call(self, busy: float | None) -> float | None:
        """The CPUs' busy share with the calls now and one more: ``busy`` per call in
        progress over the window (what else runs on the host counted in, so it errs high),
        times ``calls_now + 1``. A window with less than one call on average (the node
        just emptied, or started) uses the last cost measured; None before any."""
        calls = self._cpu_calls()
        if busy is not None and calls >= 1.0:
            self._cost = busy / calls
        if busy is None or self._cost is None:
            return None
        return self._cost * (self.calls_now + 1)

    def _move_ceiling(self, now: float, busy: float | None, under_band: bool) -> None:
        """Multiplicative decrease, additive increase: a budget breached by what the
        ceiling let in takes it to ``SHRINK`` of the calls that breached it; figures under
        the band with the calls at the ceiling raise it by one; a move at most each
        ``hold_s``, and only what came after it decides the next."""
        c = self.config
        if now - self._moved < c.hold_s:
            return
        judged = self._judged_turns()
        judged_p95 = p95([ms for _, ms, _ in judged]) if len(judged) >= c.min_turns else None
        turn_over = judged_p95 is not None and judged_p95 > c.turn_p95_ms
        cpu_calls = self._cpu_calls()
        cpu_over = busy is not None and busy > c.cpu_pct
        cpu_over = cpu_over and (self.ceiling is None or cpu_calls <= self.ceiling)
        if turn_over or cpu_over:
            if turn_over:
                calls = sum(n for _, _, n in judged) / len(judged)
                what = f"turn p95 {judged_p95:.0f} ms"
            else:
                calls, what = cpu_calls, f"CPU {busy:.0f} %"
            if self.ceiling is not None:
                calls = min(calls, self.ceiling)
            self.ceiling, self._moved = int(SHRINK * calls), now
            log.warning("load: at most %d calls from now on (%s with %.1f in progress)",
                        self.ceiling, what, calls)  # fmt: skip
        elif under_band and self.full and not self.over_budget and self.ceiling is not None:
            self.ceiling, self._moved = self.ceiling + 1, now
            log.info("load: under the band at %d calls: at most %d", self.calls_now, self.ceiling)

    def update(self, now: float) -> bool:
        """Decide; True when the shed decision changed (the caller logs and tells the UA)."""
        self._expire(now)
        self._answered.extend([now] * max(0, self.calls_now - self._calls_seen))
        self._calls_seen = self.calls_now
        c = self.config
        turn_p95, busy = self._turn_p95(), self._cpu_busy()
        after = self._cpu_next_call(busy)
        was, held = self.shedding, self.over_budget
        why = []
        if turn_p95 is not None and turn_p95 > c.turn_p95_ms:
            why.append(f"turn p95 {turn_p95:.0f} ms > {c.turn_p95_ms:g} ms")
        if busy is not None and busy > c.cpu_pct:
            why.append(f"CPU {busy:.0f} % > {c.cpu_pct:g} %")
        turns_ok = turn_p95 is None or turn_p95 <= c.resume_at * c.turn_p95_ms
        cpu_ok = busy is None or busy <= c.resume_at * c.cpu_pct
        if not self.over_budget and why:
            self.over_budget, self._since, self._budget_reason = True, now, "; ".join(why)
        elif self.over_budget and turns_ok and cpu_ok and now - self._since >= c.hold_s:
            self.over_budget, self._budget_reason = False, ""
        self._move_ceiling(now, busy, turns_ok and cpu_ok)
        self.at_capacity = busy is not None and after is not None and after > c.cpu_pct
        reasons = []
        if self.full:
            reasons.append(f"at its ceiling of {self.ceiling} calls")
        if self.at_capacity:
            reasons.append(f"CPU {busy:.0f} %, with one more call {after:.0f} % > {c.cpu_pct:g} %")
        if self.starting:
            reasons.append(f"slow start: {self.young} calls in {c.cpu_window_s:g} s")
        self.reason = "; ".join(r for r in (self._budget_reason, *reasons) if r)
        if self.over_budget != held:
            if self.over_budget:
                log.warning("load: over budget (%s)", self._budget_reason)
            else:
                log.warning("load: back under budget")
        if c.shed and self.shedding != was:
            log.info("load: %s", "new calls get 503" if self.shedding else "taking new calls")
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
            over_budget=self.over_budget or self.at_capacity or self.full,
            reason=self.reason,
            turns=len(self._turns),
            turn_p95_ms=None if turn_p95 is None else round(turn_p95, 1),
            cpu_busy_pct=None if busy is None else round(busy, 1),
            cpu_next_call_pct=None if after is None else round(after, 1),
            ceiling=self.ceiling,
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

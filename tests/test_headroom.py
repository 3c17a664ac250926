"""The node's own headroom ([load], sip_bridge.ops.headroom): when it sheds, when it takes
calls again, and how it reads the CPUs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sip_bridge.config.config_types import LoadConfig
from sip_bridge.ops.headroom import CpuMeter, Headroom, p95

ON = LoadConfig(shed=True, turn_p95_ms=900, cpu_pct=90, window_s=60, cpu_window_s=10,
                min_turns=10, resume_at=0.8, hold_s=5)  # fmt: skip


def turns(h: Headroom, ms: float, n: int, start: float, every: float = 1.0) -> float:
    for i in range(n):
        h.turn(ms, start + i * every)
    return start + (n - 1) * every


def test_p95_is_the_nearest_rank() -> None:
    assert p95([100.0] * 19 + [2000.0]) == 100.0  # 1 slow turn in 20 is the 5 % allowed
    assert p95([100.0] * 18 + [2000.0] * 2) == 2000.0
    assert p95([7.0]) == 7.0


def test_slow_turns_shed_only_with_enough_of_them_and_resume_under_the_band() -> None:
    h = Headroom(ON)
    now = turns(h, 1500, ON.min_turns - 1, 0.0)
    assert not h.update(now) and not h.shedding  # 9 slow turns: too few to decide
    assert h.figures(now).turn_p95_ms is None
    h.turn(1500, now + 1)
    assert h.update(now + 1) and h.shedding
    f = h.figures(now + 1)
    assert f.over_budget and f.turns == 10 and f.turn_p95_ms == 1500.0
    assert "turn p95 1500 ms > 900 ms" in f.reason and f.headroom_pct < 0
    # Turns at 800 ms: under the budget but over the band (0.8 x 900 = 720): still shedding.
    later = turns(h, 800, 40, now + 61)  # the slow ones have left the 60 s window
    assert not h.update(later) and h.shedding
    # At 700 ms, under the band, it takes calls again.
    end = turns(h, 700, 60, later + 1)
    assert h.update(end) and not h.shedding
    assert h.figures(end).reason == "" and h.figures(end).headroom_pct > 0


def test_a_busy_cpu_sheds_and_the_hold_keeps_it_shedding() -> None:
    h = Headroom(ON)
    for t in range(10):
        h.cpu(95.0, 1.0, float(t))
    assert h.update(9.0) and h.shedding and "CPU 95 % > 90 %" in h.reason
    for t in range(10, 14):  # idle from here on
        h.cpu(5.0, 1.0, float(t))
    # At 13 s the 10 s average, (7 x 95 + 4 x 5) / 11 = 62 %, is under the band (72 %),
    # but shedding began only 4 s ago (hold_s 5).
    assert not h.update(13.0) and h.shedding
    assert h.figures(13.0).cpu_busy_pct == pytest.approx(62.3, abs=0.1)
    for t in range(14, 20):
        h.cpu(5.0, 1.0, float(t))
    assert h.update(19.0) and not h.shedding


def test_cpu_is_averaged_over_its_window_weighted_by_time() -> None:
    h = Headroom(ON)
    h.cpu(100.0, 3.0, 3.0)
    h.cpu(50.0, 1.0, 4.0)
    assert h.figures(4.0).cpu_busy_pct == pytest.approx(87.5)
    assert not h.update(4.0)  # 87.5 <= 90
    assert h.figures(20.0).cpu_busy_pct is None  # both readings older than 10 s


def test_shed_off_measures_and_says_over_budget_but_refuses_nothing() -> None:
    h = Headroom(replace(ON, shed=False))
    turns(h, 2000, 20, 0.0)
    assert not h.update(19.0)  # the decision (shed or not) did not change
    f = h.figures(19.0)
    assert f.over_budget and not f.shedding and not h.shedding
    h.config = ON  # a reload turns it on: over budget already, so shedding now
    assert h.shedding


def test_calls_arriving_faster_than_the_cpu_average_moves_are_judged_by_their_cost() -> None:
    """8 calls cost 56 % (7 % each); the average has not moved past 90 %, but 12 calls in
    progress and the next one would: at capacity, shed. One call ending makes room for one
    more at once (no band, no hold: a node at capacity is not over a budget)."""
    h = Headroom(ON)
    for t in range(10):
        h.cpu(56.0, 1.0, float(t), calls=8)
    h.calls_in_progress(10)
    assert not h.update(9.0)  # 11 calls: 77 %
    assert h.figures(9.0).cpu_next_call_pct == pytest.approx(77.0)
    h.calls_in_progress(12)
    assert h.update(9.2) and h.shedding  # 13 calls: 91 %
    assert h.reason == "CPU 56 %, with one more call 91 % > 90 %"
    assert h.figures(9.2).over_budget and not h.over_budget  # nothing held
    h.calls_in_progress(11)  # one hung up: 12 calls, 84 %
    assert h.update(9.5) and not h.shedding and h.reason == ""
    h.calls_in_progress(12)  # and the next caller took its place
    assert h.update(9.6) and h.shedding


def test_a_node_at_capacity_is_not_drained_before_it_takes_calls_again() -> None:
    """At twice the calls a node carries, callers retry as soon as they are refused. Each
    call that ends lets one in: the calls in progress stay at capacity instead of falling
    to almost none and then letting a crowd in at once (a held band on the projection did
    that: 76 s shedding, then a dozen calls within 1.4 s)."""
    h = Headroom(replace(ON, cpu_pct=70))
    calls, refused = 0, 0
    for t in range(600):  # 60 s in 0.1 s steps; a call costs 3 %, lasts 20 s
        now = t / 10
        if t % 10 == 0:
            h.cpu(3.0 * calls, 1.0, now, calls=calls)
        if t >= 200 and t % 10 == 5:  # calls admitted in the first 2 s end 20 s later
            calls = max(0, calls - 1)
        h.calls_in_progress(calls)
        h.update(now)
        for _ in range(2):  # two callers knock every 100 ms
            if h.shedding:
                refused += 1
                continue
            calls += 1
            h.calls_in_progress(calls)
            h.update(now)
        if t >= 300:
            assert calls in (22, 23), (now, calls)  # 23 x 3 % = 69 %: at capacity, not below
    assert refused > 0 and not h.over_budget


def test_no_call_measured_projects_nothing() -> None:
    h = Headroom(ON)
    for t in range(10):
        h.cpu(30.0, 1.0, float(t), calls=0)  # another process's load, no calls yet
    h.calls_in_progress(40)
    assert not h.update(9.0) and h.figures(9.0).cpu_next_call_pct is None


def test_barely_any_load_leaves_most_headroom() -> None:
    h = Headroom(ON)
    turns(h, 450, 20, 0.0)
    h.cpu(45.0, 1.0, 19.0)
    f = h.figures(19.0)
    assert f.headroom_pct == pytest.approx(50.0)  # the nearer budget: both at half
    assert f.as_dict()["shedding"] is False


STAT = """cpu  {u} 0 {s} {i} 0 0 0 0 0 0
cpu0 {u0} 0 {s0} {i0} {w0} 0 0 0 0 0
cpu1 {u1} 0 0 {i1} 0 0 0 0 0 0
intr 12345
"""


def test_cpu_meter_reads_the_allowed_cpus_of_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"

    def write(u0: int, s0: int, i0: int, w0: int, u1: int, i1: int) -> None:
        stat.write_text(STAT.format(u=u0 + u1, s=s0, i=i0 + i1, u0=u0, s0=s0, i0=i0, w0=w0,
                                    u1=u1, i1=i1))  # fmt: skip

    both, first = CpuMeter(stat, {0, 1}), CpuMeter(stat, {0})
    write(100, 0, 900, 0, 0, 1000)
    assert both.read() is None and first.read() is None  # no interval yet
    # cpu0: 60 busy (50 user + 10 system) of 100, 20 of them iowait counted idle; cpu1 idle
    write(150, 10, 920, 20, 0, 1100)
    assert first.read() == pytest.approx(100 * 60 / 100)
    assert both.read() == pytest.approx(100 * 60 / 200)


def test_cpu_meter_without_proc_stat_uses_this_process(tmp_path: Path) -> None:
    meter = CpuMeter(tmp_path / "missing", {0})
    assert meter.read() is None
    x = 0
    for i in range(300_000):  # some CPU time of our own
        x += i * i
    busy = meter.read()
    assert busy is not None and 0.0 < busy <= 100.0

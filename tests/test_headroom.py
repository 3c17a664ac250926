"""The node's own headroom ([load], sip_bridge.ops.headroom): when it sheds, when it takes
calls again, and how it reads the CPUs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sip_bridge.config.config_types import LoadConfig
from sip_bridge.ops.headroom import CpuMeter, Headroom, p95

ON = LoadConfig(shed=True, turn_p95_ms=900, cpu_pct=90, window_s=60, cpu_window_s=10,
                min_turns=10, resume_at=0.8, hold_s=5, slow_start_calls=0)  # fmt: skip


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


def crowd(h: Headroom, seconds: int, callers: int = 48) -> list[tuple[float, int, float]]:
    """``callers`` retrying every 100 ms while refused, against a node whose turns take
    400 ms up to 16 calls and 25 ms more for each call past that (900 ms at 36), and whose
    calls cost 0.5 % CPU while their greeting plays (8 s) and 3 % after (90 % at 30). A
    call lasts 30-50 s and has a turn every 5 s. Returns every turn: (when, calls in
    progress, ms)."""
    calls: list[tuple[float, float]] = []  # (came, ends) of each call in progress
    taken: list[tuple[float, int, float]] = []
    placed = 0
    for step in range(seconds * 10):
        now = step / 10
        calls = [(came, end) for came, end in calls if end > now]
        n = len(calls)
        h.calls_in_progress(n)
        if step % 10 == 0:
            busy = sum(0.5 if now - came < 8 else 3.0 for came, _ in calls)
            h.cpu(busy, 1.0, now, calls=n)
        for i, (came, _) in enumerate(calls):
            if round((now - came) * 10) % 50 == i % 50 and now - came > 8:
                ms = 400.0 + 25.0 * max(0, n - 16)
                h.turn(ms, now, n)
                taken.append((now, n, ms))
        h.update(now)
        for _ in range(callers - len(calls)):
            if h.shedding:
                break
            placed += 1
            calls.append((now, now + 30.0 + placed * 7 % 21))  # 30-50 s
            h.calls_in_progress(len(calls))
            h.update(now)
    return taken


def test_a_crowd_is_cut_to_a_ceiling_the_turns_hold_and_never_drained() -> None:
    """48 callers at once at a node whose CPUs pass 90 % past 30 calls and its turns the
    900 ms budget past 36. All get in at first (no slow start; nothing measured yet says
    no); the breaches set a ceiling under the calls that breached it, one call is let in
    for each that ends, so the calls never drain and then crowd in again, and the ceiling
    settles where the figures meet the budgets, moving by one under the band."""
    h = Headroom(ON)
    taken = crowd(h, 600)
    assert max(n for _, n, _ in taken) == 48
    assert h.ceiling is not None and 24 <= h.ceiling <= 30, h.ceiling
    late = [(t, n, ms) for t, n, ms in taken if t >= 200]
    assert max(n for _, n, _ in late) <= 30
    assert min(n for _, n, _ in late) >= 20  # never drained
    assert p95([ms for _, _, ms in late]) <= ON.turn_p95_ms
    assert "at its ceiling of" in h.reason or not h.shedding


def test_slow_start_lets_the_calls_at_most_double_in_a_cpu_window() -> None:
    """A call costs little while its greeting plays, so a rush of new calls looks cheap to
    the CPU figures. Calls that came in the last cpu_window_s may number slow_start_calls
    or as many as the older ones."""
    h = Headroom(replace(ON, slow_start_calls=8))
    calls = 0

    def knock(now: float) -> bool:
        nonlocal calls
        h.update(now)
        if h.shedding:
            return False
        calls += 1
        h.calls_in_progress(calls)
        h.update(now)
        return True

    assert sum(knock(0.1 * i) for i in range(50)) == 8  # the first 5 s: 8 calls
    assert h.shedding and h.reason == "slow start: 8 calls in 10 s"
    assert not h.figures(5.0).over_budget  # a pace, not a budget
    assert sum(knock(10.2 + 0.1 * i) for i in range(50)) == 8  # the 8 are older now
    assert sum(knock(20.4 + 0.1 * i) for i in range(50)) == 16
    assert calls == 32
    # A node in its steady state: 8 of 25 calls came in the last 10 s; room for more.
    h = Headroom(replace(ON, slow_start_calls=8))
    h.calls_in_progress(17)
    h.update(0.0)
    h.calls_in_progress(25)
    assert not h.update(20.0) and h.young == 8 and not h.shedding


def test_the_ceiling_rises_by_one_under_the_band_and_shows_in_the_figures() -> None:
    h = Headroom(ON)
    for t in range(10):
        h.cpu(95.0, 1.0, float(t), calls=20)
    h.calls_in_progress(20)
    h.update(9.0)
    assert h.ceiling == 18 and h.shedding  # 0.9 x 20 calls
    f = h.figures(9.0)
    assert f.ceiling == 18 and "at its ceiling of 18 calls" in f.reason
    h.calls_in_progress(18)
    for t in range(10, 40):  # 18 calls at 50 %: under the band (72 %)
        h.cpu(50.0, 1.0, float(t), calls=18)
        h.update(float(t))
    assert h.ceiling == 19 and not h.over_budget  # raised once the hold had passed
    h.calls_in_progress(19)
    for t in range(40, 51):
        h.cpu(52.0, 1.0, float(t), calls=19)
        h.update(float(t))
    assert h.ceiling == 20


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

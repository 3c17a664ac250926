"""bench/long_call.py's verdicts on made-up series: a flat call passes, growth of latency,
memory, a queue or the task count is caught. No models, no sockets (the long run is the
bench itself)."""

from __future__ import annotations

from typing import Any

from bench import long_call
from bench.long_call import summarize

LIMITS: dict[str, float | None] = {"playout_ms": 60_000.0, "model_jobs_queued": None}


def _series(
    minutes: float = 30.0,
    *,
    rss_mb_per_h: float = 0.0,
    latency_growth: float = 0.0,
    playout_ms: float = 400.0,
    jobs_growth: float = 0.0,
    tasks_growth: float = 0.0,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Samples every 10 s and a turn every 9 s; growth terms are per minute (latency: a
    fraction of the base per minute), with a fixed wobble so flat is not perfectly flat."""
    samples: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for i in range(int(minutes * 6) + 1):
        t = i / 6
        wobble = (-1) ** i
        samples.append(
            {
                "t_min": t,
                "rss_mb": 850.0 + 1.5 * wobble + rss_mb_per_h * t / 60,
                "tasks": 12 + (i % 3) + int(tasks_growth * t),
                "queues": {
                    "playout_ms": playout_ms * (i % 2),
                    "model_jobs_queued": float(i % 3) + jobs_growth * t,
                },
            }
        )
    for k in range(int(minutes * 60 / 9)):
        t = k * 9 / 60
        base = 560.0 + 40.0 * (k % 5)  # 560..720 ms, the spread of a real call
        turns.append({"t_min": t, "latency_ms": base * (1 + latency_growth * t)})
    turns.append({"t_min": minutes, "latency_ms": None})  # one unanswered turn
    return samples, turns


def test_a_flat_call_passes_every_criterion() -> None:
    samples, turns = _series()
    s = summarize(samples, turns, LIMITS)
    assert s["verdict"] == {
        "latency_no_growth": True,
        "rss_no_growth": True,
        "queues_bounded": True,
        "tasks_no_growth": True,
    }
    lat = s["turn_latency_ms"]
    assert lat["unanswered"] == 1 and lat["answered"] == lat["turns"] - 1
    assert 0.9 <= lat["ratio_p50"] <= 1.1
    assert s["window_min"] == 5.0 and s["minutes"] == 30.0
    assert abs(s["rss"]["slope_mb_per_h"]) < 2.0
    assert s["queues"]["playout_ms"]["max"] == 400.0
    assert s["queues"]["playout_ms"]["limit"] == 60_000.0


def test_latency_growth_is_caught() -> None:
    samples, turns = _series(latency_growth=0.02)  # +2 % of the base per minute
    s = summarize(samples, turns, LIMITS)
    assert s["turn_latency_ms"]["ratio_p50"] > 1.2
    assert s["verdict"]["latency_no_growth"] is False
    assert s["verdict"]["rss_no_growth"] is True


def test_memory_growth_is_caught_by_the_slope() -> None:
    samples, turns = _series(rss_mb_per_h=30.0)
    s = summarize(samples, turns, LIMITS)
    assert 25.0 < s["rss"]["slope_mb_per_h"] < 35.0
    assert 10.0 < s["rss"]["growth_mb"] < 15.0  # 25 minutes at 30 MB/h, +- the wobble
    assert s["verdict"]["rss_no_growth"] is False
    assert s["verdict"]["latency_no_growth"] is True


def test_a_queue_over_its_limit_or_growing_without_one_is_caught() -> None:
    over = summarize(*_series(playout_ms=70_000.0), LIMITS)
    assert over["queues"]["playout_ms"]["bounded"] is False
    assert over["verdict"]["queues_bounded"] is False
    growing = summarize(*_series(jobs_growth=0.5), LIMITS)  # 0..2 early, ~17 late
    assert growing["queues"]["model_jobs_queued"]["bounded"] is False
    assert growing["queues"]["playout_ms"]["bounded"] is True
    assert growing["verdict"]["queues_bounded"] is False


def test_task_growth_is_caught() -> None:
    s = summarize(*_series(tasks_growth=1.0), LIMITS)
    assert s["tasks"]["last"] > s["tasks"]["first"] + 20
    assert s["verdict"]["tasks_no_growth"] is False


def test_a_short_run_compares_thirds_that_do_not_overlap() -> None:
    assert long_call.windows(3.0) == (1.0, 2.0)
    assert long_call.windows(30.0) == (5.0, 25.0)
    s = summarize(*_series(minutes=3.0), LIMITS)
    assert s["window_min"] == 1.0
    first, last = s["turn_latency_ms"]["first_window"], s["turn_latency_ms"]["last_window"]
    assert first["n"] > 0 and last["n"] > 0
    assert first["n"] + last["n"] < s["turn_latency_ms"]["answered"]


def test_empty_series_give_no_verdict_of_success() -> None:
    s = summarize([], [], LIMITS)
    assert s["verdict"]["latency_no_growth"] is False
    assert s["verdict"]["rss_no_growth"] is False

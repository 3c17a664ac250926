"""The model workers' queue (agent/voice/deadline_executor.py): earliest deadline first."""

from __future__ import annotations

import threading
import time

import pytest

from agent.voice.deadline_executor import DeadlineExecutor


def hold(running: threading.Event, gate: threading.Event) -> bool:
    """A job that takes its worker until ``gate`` opens; ``running`` says it started."""
    running.set()
    return gate.wait(5)


def test_the_job_due_first_runs_first_and_equal_deadlines_keep_their_order() -> None:
    ex = DeadlineExecutor(1)
    gate, running = threading.Event(), threading.Event()
    order: list[str] = []
    busy = ex.submit(hold, running, gate)  # the only worker is taken
    assert running.wait(5)
    now = time.monotonic()
    jobs = [
        ex.submit_by(now + 5.0, order.append, "a later sentence"),
        ex.submit_by(now + 1.0, order.append, "the next sentence"),
        ex.submit(order.append, "a caller waiting now"),
        ex.submit_by(now + 1.0, order.append, "another next sentence"),
    ]
    assert ex.queued() == 4
    gate.set()
    assert busy.result(5) is True
    for job in jobs:
        job.result(5)
    assert order == ["a caller waiting now", "the next sentence", "another next sentence",
                     "a later sentence"]  # fmt: skip
    ex.shutdown()


def test_a_job_due_later_starts_at_once_when_nothing_waits() -> None:
    ex = DeadlineExecutor(2)
    t0 = time.monotonic()
    started = ex.submit_by(t0 + 60, time.monotonic).result(5)
    assert started - t0 < 1.0  # a deadline orders the queue; it is no start time
    ex.shutdown()


def test_workers_run_side_by_side() -> None:
    ex = DeadlineExecutor(2)
    both = threading.Barrier(2, timeout=5)
    a, b = ex.submit(both.wait), ex.submit(both.wait)
    assert {a.result(5), b.result(5)} == {0, 1}  # each reached the barrier with the other
    ex.shutdown()


def test_errors_reach_the_future_and_the_worker_goes_on() -> None:
    ex = DeadlineExecutor(1)

    def fail() -> None:
        raise ValueError("the model raised")

    with pytest.raises(ValueError, match="the model raised"):
        ex.submit(fail).result(5)
    assert ex.submit(lambda: 42).result(5) == 42
    ex.shutdown()


def test_shutdown_cancels_what_waits_and_refuses_more() -> None:
    ex = DeadlineExecutor(1)
    gate, running = threading.Event(), threading.Event()
    busy = ex.submit(hold, running, gate)
    assert running.wait(5)
    waiting = ex.submit(lambda: "never")
    ex.shutdown(wait=False, cancel_futures=True)
    assert waiting.cancelled()
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(lambda: None)
    gate.set()
    assert busy.result(5) is True  # what was running finishes
    ex.shutdown(wait=True)


def test_at_least_one_worker() -> None:
    with pytest.raises(ValueError):
        DeadlineExecutor(0)

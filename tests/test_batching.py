"""model_runtime.batching.TickBatcher: one run per loop turn, order, chunks, failures."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from model_runtime.batching import TickBatcher


class Doubler:
    """A run_batch that records the batches it saw."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        return [2 * i for i in items]


def test_one_loop_turn_is_one_batch_in_submit_order() -> None:
    async def main() -> tuple[Doubler, list[tuple[int, int | Exception]], int]:
        run = Doubler()
        b: TickBatcher[int, int] = TickBatcher(run)
        got: list[tuple[int, int | Exception]] = []
        # what the media clock does: every call's agent in one callback

        def record(call: int) -> Callable[[int | Exception], None]:
            return lambda r: got.append((call, r))

        for call in range(7):
            b.submit(call, record(call))
        pending_before = b.pending
        await asyncio.sleep(0)  # one loop turn
        return run, got, pending_before

    run, got, pending_before = asyncio.run(main())
    assert pending_before == 7
    assert run.batches == [[0, 1, 2, 3, 4, 5, 6]]
    assert got == [(c, 2 * c) for c in range(7)]


def test_successive_ticks_are_separate_batches_and_stats_add_up() -> None:
    async def main() -> tuple[Doubler, TickBatcher[int, int]]:
        run = Doubler()
        b: TickBatcher[int, int] = TickBatcher(run)
        for size in (3, 1, 5):
            for i in range(size):
                b.submit(i, lambda r: None)
            await asyncio.sleep(0)
        return run, b

    run, b = asyncio.run(main())
    assert [len(x) for x in run.batches] == [3, 1, 5]
    assert (b.stats.batches, b.stats.items, b.stats.largest, b.stats.failed) == (3, 9, 5, 0)
    assert b.stats.mean_batch == 3.0


def test_max_batch_chunks_keep_order() -> None:
    async def main() -> tuple[Doubler, list[int | Exception]]:
        run = Doubler()
        b: TickBatcher[int, int] = TickBatcher(run, max_batch=4)
        got: list[int | Exception] = []
        for i in range(10):
            b.submit(i, got.append)
        await asyncio.sleep(0)
        return run, got

    run, got = asyncio.run(main())
    assert run.batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert got == [2 * i for i in range(10)]


def test_explicit_loop_and_manual_flush_without_a_running_loop() -> None:
    loop = asyncio.new_event_loop()
    try:
        run = Doubler()
        b: TickBatcher[int, int] = TickBatcher(run, loop=loop)
        got: list[int | Exception] = []
        b.submit(5, got.append)
        b.flush()  # by hand, before the loop ever runs
        assert got == [10]
        loop.run_until_complete(asyncio.sleep(0))  # the scheduled flush finds nothing
        assert run.batches == [[5]]
    finally:
        loop.close()


def test_submit_without_a_loop_is_an_error() -> None:
    b: TickBatcher[int, int] = TickBatcher(Doubler())
    with pytest.raises(RuntimeError):
        b.submit(1, lambda r: None)


def test_submit_from_a_result_callback_goes_to_the_next_batch() -> None:
    async def main() -> tuple[Doubler, list[int | Exception]]:
        run = Doubler()
        b: TickBatcher[int, int] = TickBatcher(run)
        got: list[int | Exception] = []

        def chain(r: int | Exception) -> None:
            got.append(r)
            if isinstance(r, int) and r < 16:
                b.submit(r, chain)

        b.submit(1, chain)
        for _ in range(10):
            await asyncio.sleep(0)
        return run, got

    run, got = asyncio.run(main())
    assert got == [2, 4, 8, 16]
    assert run.batches == [[1], [2], [4], [8]]


def test_a_failing_batch_reaches_every_caller_and_the_next_batch_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    boom = RuntimeError("model exploded")
    fail_next = [True, True, False]

    def flaky(items: list[int]) -> list[int]:
        if fail_next.pop(0):
            raise boom
        return [i + 100 for i in items]

    async def main() -> tuple[list[list[int | Exception]], TickBatcher[int, int]]:
        b: TickBatcher[int, int] = TickBatcher(flaky)
        ticks: list[list[int | Exception]] = []
        for _ in range(3):
            got: list[int | Exception] = []
            for i in range(4):
                b.submit(i, got.append)
            await asyncio.sleep(0)
            ticks.append(got)
        return ticks, b

    with caplog.at_level(logging.INFO, logger="model_runtime.batching"):
        ticks, b = asyncio.run(main())
    assert ticks[0] == [boom] * 4
    assert ticks[1] == [boom] * 4
    assert ticks[2] == [100, 101, 102, 103]
    assert b.stats.failed == 8 and b.stats.batches == 3
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1  # two failing ticks, logged once
    assert any("run again" in r.getMessage() for r in caplog.records)


def test_wrong_result_count_is_a_failure_for_everyone() -> None:
    async def main() -> list[int | Exception]:
        b: TickBatcher[int, int] = TickBatcher(lambda items: [0])
        got: list[int | Exception] = []
        for i in range(3):
            b.submit(i, got.append)
        await asyncio.sleep(0)
        return got

    got = asyncio.run(main())
    assert len(got) == 3
    assert all(isinstance(r, ValueError) and "1 results for 3 items" in str(r) for r in got)


def test_a_raising_callback_does_not_starve_the_others_or_the_loop() -> None:
    async def main() -> tuple[list[int | Exception], list[object]]:
        loop_errors: list[object] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: loop_errors.append(ctx))
        b: TickBatcher[int, int] = TickBatcher(Doubler())
        got: list[int | Exception] = []

        def bad(r: int | Exception) -> None:
            raise KeyError("caller bug")

        b.submit(1, got.append)
        b.submit(2, bad)
        b.submit(3, got.append)
        await asyncio.sleep(0)
        b.submit(4, got.append)  # the batcher still works afterwards
        await asyncio.sleep(0)
        return got, loop_errors

    got, loop_errors = asyncio.run(main())
    assert got == [2, 6, 8]
    assert loop_errors == []


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError):
        TickBatcher(Doubler(), max_batch=0)


def test_a_flush_left_on_a_closed_loop_does_not_stall_the_next_loop() -> None:
    """Items submitted just before their loop ended must not wedge the batcher: the next
    loop (a new asyncio.run, a restarted bridge) gets its batches run."""
    batcher: TickBatcher[int, int] = TickBatcher(lambda xs: [x * 2 for x in xs])
    got: list[int | Exception] = []

    loop = asyncio.new_event_loop()

    def submit_and_stop() -> None:
        batcher.submit(1, got.append)  # its flush is scheduled, never runs: the loop ends
        loop.stop()

    loop.call_soon(submit_and_stop)
    loop.run_forever()
    loop.close()
    assert got == []

    async def next_loop() -> None:
        batcher.submit(2, got.append)
        await asyncio.sleep(0)

    asyncio.run(next_loop())
    assert got == [2, 4]

"""Cross-call micro-batching: one model run per event-loop turn instead of one per call.

Why: a small model (Silero VAD) costs mostly fixed per-run overhead, so 200 calls each
running it every 32 ms waste most of a core on overhead. The bridge's media clock ticks
every call's agent in one callback; whatever those agents :meth:`TickBatcher.submit`
during that callback is run as a single batch by a ``loop.call_soon`` callback: right
after the tick (the loop's next iteration polls I/O with a zero timeout), with no timer.

Failures: if ``run_batch`` raises (or returns the wrong number of results), every caller
waiting in that chunk gets the exception object through its ``done`` callback instead of
a result (the ``asyncio.gather(return_exceptions=True)`` idiom); the batcher logs it (once
per run of failures, not every tick) and the next batch runs normally. A ``done``
callback that raises is logged and does not stop the others. So nothing waits forever
and nothing escapes into the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["BatchStats", "TickBatcher"]

log = logging.getLogger(__name__)

In = TypeVar("In")
Out = TypeVar("Out")


@dataclass(slots=True)
class BatchStats:
    """Counters since creation: runs of ``run_batch``, items through them, the largest
    run, and items that got an exception instead of a result."""

    batches: int = 0
    items: int = 0
    largest: int = 0
    failed: int = 0

    @property
    def mean_batch(self) -> float:
        return self.items / self.batches if self.batches else 0.0


class TickBatcher(Generic[In, Out]):
    """Collects requests from many calls within one event-loop turn and runs them as one batch.

    ``run_batch`` gets a list of items and must return one result per item, in order. It
    runs on the loop's thread (fine for sub-millisecond models such as VAD; heavy models
    should wrap an executor around it). Results reach ``done`` in submit order.
    Submitting from inside a ``done`` callback is allowed: it lands in the next batch.
    """

    def __init__(
        self,
        run_batch: Callable[[list[In]], list[Out]],
        *,
        max_batch: int = 256,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.run_batch = run_batch
        self.max_batch = max_batch
        self._loop = loop
        self._pending: list[tuple[In, Callable[[Out | Exception], None]]] = []
        self._scheduled: asyncio.AbstractEventLoop | None = None  # where a flush waits
        self._failing = False
        self.stats = BatchStats()

    @property
    def pending(self) -> int:
        """Items submitted but not yet run."""
        return len(self._pending)

    def submit(self, item: In, done: Callable[[Out | Exception], None]) -> None:
        """Queue ``item``; ``done`` gets its result, or the exception that failed its batch.

        The first submit of a loop turn schedules :meth:`flush` with ``call_soon``; with
        no ``loop`` given that is the running loop (so submit outside a loop raises
        ``RuntimeError``, unless the caller flushes by hand: see :meth:`flush`).
        """
        self._pending.append((item, done))
        loop = self._loop or asyncio.get_running_loop()
        if self._scheduled is not loop:  # also when a flush was left on a loop now gone
            loop.call_soon(self.flush)
            self._scheduled = loop

    def flush(self) -> None:
        """Run everything pending now, in chunks of ``max_batch``; safe to call any time
        (a scheduled flush that finds nothing pending does nothing)."""
        self._scheduled = None
        # swap first: items submitted by done callbacks wait for their own turn (call_soon)
        pending, self._pending = self._pending, []
        for start in range(0, len(pending), self.max_batch):
            self._run_chunk(pending[start : start + self.max_batch])

    def _run_chunk(self, chunk: list[tuple[In, Callable[[Out | Exception], None]]]) -> None:
        items = [item for item, _ in chunk]
        results: list[Out | Exception]
        try:
            out = self.run_batch(items)
            if len(out) != len(items):
                raise ValueError(f"run_batch returned {len(out)} results for {len(items)} items")
            results = [*out]
        except Exception as exc:
            if not self._failing:  # a model that fails every tick must not flood the log
                log.exception("batch of %d failed; its callers get the exception", len(items))
            self._failing = True
            self.stats.failed += len(items)
            results = [exc] * len(items)
        else:
            if self._failing:
                log.info("batches run again after %d failed items", self.stats.failed)
            self._failing = False
        self.stats.batches += 1
        self.stats.items += len(items)
        self.stats.largest = max(self.stats.largest, len(items))
        for (_, done), result in zip(chunk, results, strict=True):
            try:
                done(result)
            except Exception:
                log.exception("a batch result callback raised; the others still run")

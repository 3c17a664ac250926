"""Model faults: an inference that raises or hangs is a fault of its call, not a wedge.

Why: agents hand model work (ASR, end of turn, TTS) to executor threads and pick the
results up later; an exception there used to be logged or swallowed and the call went on
half alive, and a run that never returned left the call waiting forever. One
:class:`ModelGuard` per call wraps the executor its agent uses (and any model run the agent
times itself with :meth:`ModelGuard.watch`): a run that raises, or that is still running
``timeout_s`` after it *started* (time queued behind other calls' work does not count),
is reported once, as a :class:`~agent.base.ModelFault`, on the event loop.

A hung thread cannot be killed in Python: the guard stops the call waiting for it (the
bridge then takes the call over) and the thread keeps its executor slot until the run
returns. The loop and every other call go on, since nothing on the loop waits for it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from agent.base import ModelFault

__all__ = ["GuardedExecutor", "ModelGuard"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class ModelGuard:
    """Times and watches one call's model runs; reports the first fault to ``on_fault``.

    ``timeout_s`` <= 0 means no time limit (exceptions are still faults). Until
    :meth:`bind` gives it a loop and a callback, faults are remembered in :attr:`fault`
    only. Thread-safe: runs report from their worker threads, the loop gets the call.
    """

    def __init__(self, executor: concurrent.futures.Executor, timeout_s: float = 10.0) -> None:
        self.base = executor
        self.timeout_s = timeout_s
        self.fault: ModelFault | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_fault: Callable[[ModelFault], None] | None = None
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._next = 0
        self._lock = threading.Lock()
        self._closed = False

    def bind(self, loop: asyncio.AbstractEventLoop, on_fault: Callable[[ModelFault], None]) -> None:
        """Deliver faults to ``on_fault`` on ``loop`` (the agent's start)."""
        self._loop, self._on_fault = loop, on_fault

    def executor(self, stage: str) -> GuardedExecutor:
        """The shared executor, with every job submitted through it watched as ``stage``."""
        return GuardedExecutor(self, stage)

    def submit(
        self, stage: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        def job() -> T:
            with self.watch(stage):
                return fn(*args, **kwargs)

        return self.base.submit(job)

    @contextlib.contextmanager
    def watch(self, stage: str) -> Iterator[None]:
        """Time the block (on a worker thread) as one model run: an exception out of it, or
        its still running after ``timeout_s``, is a fault (the exception goes on up)."""
        with self._lock:
            self._next += 1
            token = self._next
        self._threadsafe(self._arm, token, stage)
        try:
            yield
        except Exception as exc:
            self._threadsafe(self.report, f"{type(exc).__name__}: {exc}", stage)
            raise
        finally:
            self._threadsafe(self._disarm, token)

    def report(self, reason: str, stage: str) -> None:
        """A fault (on the loop's thread); only the first one of the call counts."""
        if self.fault is not None or self._closed:
            return
        self.fault = ModelFault(reason, stage)
        log.error("model fault in %s: %s", stage, reason)
        if self._on_fault is not None:
            self._on_fault(self.fault)

    def close(self) -> None:
        """The call is over: nothing more is reported, pending time limits are dropped."""
        self._closed = True
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    def _threadsafe(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or self._closed:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the call is long gone
            loop.call_soon_threadsafe(fn, *args)

    def _arm(self, token: int, stage: str) -> None:
        if self.timeout_s > 0 and not self._closed and self._loop is not None:
            self._timers[token] = self._loop.call_later(self.timeout_s, self._expired, token, stage)

    def _disarm(self, token: int) -> None:
        handle = self._timers.pop(token, None)
        if handle is not None:
            handle.cancel()

    def _expired(self, token: int, stage: str) -> None:
        self._timers.pop(token, None)
        self.report(f"no result after {self.timeout_s:g} s", stage)


class GuardedExecutor(concurrent.futures.Executor):
    """An :class:`~concurrent.futures.Executor` view of a guard for one stage, to hand to
    code that only knows executors (the transcriber, end of turn, a speculation)."""

    def __init__(self, guard: ModelGuard, stage: str) -> None:
        self.guard = guard
        self.stage = stage

    def submit(
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        return self.guard.submit(self.stage, fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """The shared executor is not ours to stop."""

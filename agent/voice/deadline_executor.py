"""The model workers, earliest deadline first.

Why: every call's model work (VAD batches aside) shares a few worker threads. With a
first-in-first-out queue, a long reply synthesised sentence after sentence holds a worker
for seconds, and another caller's end-of-turn score, transcript or first sentence of TTS,
the very things that decide when that caller next hears us, wait behind it. Here each job
carries a deadline: work a caller is waiting for now is due now (:meth:`submit`); a reply's
next sentence is due only shortly before the audio already queued for that caller runs
out (:meth:`DeadlineExecutor.submit_by`). Workers always take the job due first, so later
sentences fill the gaps between urgent work instead of standing in front of it.

With nothing else queued a job starts at once, whatever its deadline: one call alone is
served exactly as before.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

__all__ = ["DeadlineExecutor"]

T = TypeVar("T")

_Job = tuple[float, int, "Future[Any]", Callable[..., Any], tuple[Any, ...], dict[str, Any]]

# Workers are daemon threads (an idle one must not keep the process alive), so at exit
# every executor still open finishes its running jobs first: a thread stopped inside an
# ONNX Runtime run takes the process down with it ("terminate called ...").
_LIVE: weakref.WeakSet[DeadlineExecutor] = weakref.WeakSet()


@atexit.register
def _finish_at_exit() -> None:
    for executor in list(_LIVE):
        executor.shutdown(wait=True, cancel_futures=True)


class DeadlineExecutor(Executor):
    """``workers`` threads that run the queued job with the earliest deadline (monotonic
    seconds) first; jobs due at the same moment run in the order they came."""

    def __init__(self, workers: int, thread_name_prefix: str = "worker") -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.workers = workers
        self.prefix = thread_name_prefix
        self._heap: list[_Job] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._closed = False
        _LIVE.add(self)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Due now: someone is waiting for it."""
        return self.submit_by(time.monotonic(), fn, *args, **kwargs)

    def submit_by(
        self, deadline: float, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> Future[T]:
        """Due at ``deadline`` (``time.monotonic()`` seconds): runs after every job due
        earlier, and at once when no job waits."""
        future: Future[T] = Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            heapq.heappush(self._heap, (deadline, next(self._order), future, fn, args, kwargs))
            if self._idle:
                self._ready.notify()
            elif len(self._threads) < self.workers:
                name = f"{self.prefix}_{len(self._threads)}"
                thread = threading.Thread(target=self._work, name=name, daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

    def queued(self) -> int:
        """Jobs waiting for a worker."""
        with self._ready:
            return len(self._heap)

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._heap and not self._closed:
                    self._idle += 1
                    self._ready.wait()
                    self._idle -= 1
                if not self._heap:  # closed and nothing left
                    return
                _, _, future, fn, args, kwargs = heapq.heappop(self._heap)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
            del future, fn, args, kwargs  # no references held while waiting

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._ready:
            self._closed = True
            if cancel_futures:
                for job in self._heap:
                    job[2].cancel()
                self._heap.clear()
            self._ready.notify_all()
            threads = list(self._threads)
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

"""Fixtures shared by test files that ask for them by name (none is autouse here), and the
lock that lets a ``serial`` test run alone when pytest-xdist runs the suite in several
processes (``make test``: 3 by default), with the files that hold one run last."""

from __future__ import annotations

import fcntl
import gc
import os
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def quiet_gc() -> Iterator[None]:
    """A bridge and its callers sharing this pytest process, whose heap holds every earlier
    test's leftovers: a full garbage collection then stalls both for 100 ms or more, which
    no real bridge (its own process, ``gc.freeze()`` after start) suffers. Freeze them for
    the module (``pytestmark = pytest.mark.usefixtures("quiet_gc")``)."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


class _RunLock:
    """A readers-writer lock over the xdist workers of one run (two ``flock`` files): any
    number of ordinary tests at once, a ``serial`` one alone. The gate keeps it fair: once a
    serial test waits, no new test starts until it has run."""

    def __init__(self, run_id: str) -> None:
        base = Path(tempfile.gettempdir()) / f"sip-bridge-tests-{run_id}"
        self._gate = os.open(f"{base}.gate", os.O_CREAT | os.O_RDWR, 0o600)
        self._tests = os.open(f"{base}.tests", os.O_CREAT | os.O_RDWR, 0o600)

    def hold(self, alone: bool) -> None:
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        fcntl.flock(self._tests, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(self._gate, fcntl.LOCK_UN)

    def release(self, alone: bool) -> None:
        fcntl.flock(self._tests, fcntl.LOCK_UN)
        if alone:
            fcntl.flock(self._gate, fcntl.LOCK_UN)


_run_lock: _RunLock | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _run_lock
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id and os.environ.get("PYTEST_XDIST_WORKER"):
        _run_lock = _RunLock(run_id)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files that hold a ``serial`` test go last, in their order (``make test`` hands
    files out in this order: ``--no-loadscope-reorder``). Interleaved, each serial test
    first waits for every test running elsewhere to finish, and the other workers idle
    meanwhile; last, they run one after another once the rest is done, as in one process."""
    serial_files = {i.path for i in items if i.get_closest_marker("serial") is not None}
    items.sort(key=lambda i: i.path in serial_files)  # stable: the order within each part


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    """Setup, call and teardown of ``item`` under the run lock (a no-op without xdist):
    a ``serial`` test (heavy load, or figures that other tests' load would move) runs
    alone."""
    lock = _run_lock
    if lock is None:
        return (yield)
    alone = item.get_closest_marker("serial") is not None
    lock.hold(alone)
    try:
        return (yield)
    finally:
        lock.release(alone)

"""Fixtures shared by test files that ask for them by name (none is autouse here)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

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

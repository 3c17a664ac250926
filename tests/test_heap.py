"""The heap trimmer: when it trims (rarely, or at once when idle), and that trimming does
return freed memory on this (glibc) machine."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sip_bridge.ops.heap import HeapTrimmer


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_trims_after_enough_calls_and_time_or_when_idle() -> None:
    calls: list[int] = []

    def trim(pad: int) -> int:
        calls.append(pad)
        return 1

    h = HeapTrimmer(min_calls=3, min_interval_s=60.0, trim=trim)
    assert not h.maybe_trim(0.0, calls_up=0)  # nothing ended yet
    for _ in range(2):
        h.call_ended()
    assert not h.maybe_trim(100.0, calls_up=5)  # two calls: not yet
    h.call_ended()
    assert h.maybe_trim(100.0, calls_up=5) and calls == [0] and h.ended == 0
    for _ in range(3):
        h.call_ended()
    assert not h.maybe_trim(130.0, calls_up=5)  # 30 s since the last: too soon
    assert h.maybe_trim(130.0, calls_up=0)  # but nobody is up: a free moment
    assert h.trims == 2 and not HeapTrimmer(trim=None).maybe_trim(0.0, 0)


def test_trimming_gives_freed_memory_back() -> None:
    h = HeapTrimmer(min_calls=1)
    assert h._trim is not None  # glibc: the project's only platform
    keep = []
    for i in range(3000):  # call-sized buffers, every 10th kept: a fragmented heap
        a = np.ones(20_000, np.int16)
        if i % 10 == 0:
            keep.append(a)
        del a
    big = [np.ones(60_000, np.uint8) for _ in range(1500)]  # ~90 MB below the top of heap
    keep.append(np.ones(10, np.int16))
    del big
    before = _rss_kb()
    h.call_ended()
    assert h.maybe_trim(0.0, calls_up=0)
    assert _rss_kb() <= before  # never more; on glibc usually much less

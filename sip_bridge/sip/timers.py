"""RFC 3261 transaction timer values and a deadline queue, both clock-free.

:class:`TimerConfig` derives timers A..K (and RFC 6026's L and M) from T1/T2/T4 so an
operator tunes three numbers; any derived value can still be overridden.
:class:`TimerQueue` is the heap the transaction layer schedules on: time is always passed
in, so tests drive it with a fake clock and the asyncio layer only needs
:meth:`TimerQueue.next_deadline`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable
from dataclasses import dataclass

__all__ = ["RELIABLE_TRANSPORTS", "TimerConfig", "TimerQueue", "is_reliable"]

#: Transports that deliver in order and retransmit themselves (RFC 3261 17.1.1.2 etc.).
RELIABLE_TRANSPORTS = frozenset({"TCP", "TLS", "SCTP", "TLS-SCTP", "WS", "WSS"})


def is_reliable(transport: str) -> bool:
    """True when ``transport`` retransmits on its own, so SIP must not."""
    return transport.upper() in RELIABLE_TRANSPORTS


@dataclass(frozen=True, slots=True)
class TimerConfig:
    """T1/T2/T4 and the timers derived from them (RFC 3261 Table 4, RFC 6026).

    ``None`` overrides mean "derive from T1/T4". Timers that are zero on reliable
    transports (D, I, J, K) take a ``reliable`` flag.
    """

    t1: float = 0.5
    t2: float = 4.0
    t4: float = 5.0
    d: float = 32.0
    c: float = 180.0  # RFC 3261 16.6: > 3 min; bounds an INVITE stuck after a 1xx
    b: float | None = None
    f: float | None = None
    h: float | None = None
    j: float | None = None
    l: float | None = None  # noqa: E741 - the RFC's name
    m: float | None = None

    def __post_init__(self) -> None:
        if not (0 < self.t1 <= self.t2) or self.t4 <= 0 or self.d < 0:
            raise ValueError("need 0 < t1 <= t2, t4 > 0 and d >= 0")

    @property
    def a(self) -> float:
        """Initial INVITE retransmit interval (doubles each time, no cap)."""
        return self.t1

    @property
    def e(self) -> float:
        """Initial non-INVITE retransmit interval (doubles, capped at T2)."""
        return self.t1

    @property
    def g(self) -> float:
        """Initial INVITE final-response retransmit interval (doubles, capped at T2)."""
        return self.t1

    @property
    def timer_b(self) -> float:
        """INVITE client transaction timeout."""
        return 64 * self.t1 if self.b is None else self.b

    @property
    def timer_f(self) -> float:
        """Non-INVITE client transaction timeout."""
        return 64 * self.t1 if self.f is None else self.f

    @property
    def timer_h(self) -> float:
        """Wait time for the ACK to a non-2xx final response."""
        return 64 * self.t1 if self.h is None else self.h

    @property
    def timer_l(self) -> float:
        """RFC 6026 Accepted state of the INVITE server transaction (and 2xx ACK wait)."""
        return 64 * self.t1 if self.l is None else self.l

    @property
    def timer_m(self) -> float:
        """RFC 6026 Accepted state of the INVITE client transaction."""
        return 64 * self.t1 if self.m is None else self.m

    def timer_d(self, reliable: bool) -> float:
        """Wait time for response retransmissions after a non-2xx (client INVITE)."""
        return 0.0 if reliable else self.d

    def timer_i(self, reliable: bool) -> float:
        """Wait time for ACK retransmissions (server INVITE, Confirmed)."""
        return 0.0 if reliable else self.t4

    def timer_j(self, reliable: bool) -> float:
        """Wait time for request retransmissions (server non-INVITE, Completed)."""
        if reliable:
            return 0.0
        return 64 * self.t1 if self.j is None else self.j

    def timer_k(self, reliable: bool) -> float:
        """Wait time for response retransmissions (client non-INVITE, Completed)."""
        return 0.0 if reliable else self.t4

    def backoff(self, interval: float, cap: bool = True) -> float:
        """The next retransmit interval: doubled, capped at T2 unless ``cap`` is False."""
        return min(2 * interval, self.t2) if cap else 2 * interval


class TimerQueue:
    """Deadlines keyed by ``(owner, name)``; re-arming or cancelling is O(1) (lazy delete).

    Stale heap entries are dropped when they reach the top, so after every armed timer
    has fired or been cancelled and its deadline has passed, the queue holds nothing.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Hashable, str]] = []
        self._armed: dict[tuple[Hashable, str], int] = {}
        self._seq = itertools.count()
        self._used = False

    def __len__(self) -> int:
        """Armed (live) timers."""
        return len(self._armed)

    @property
    def heap_size(self) -> int:
        """Heap entries including stale ones (for bounded-memory checks)."""
        return len(self._heap)

    def arm(self, owner: Hashable, name: str, deadline: float) -> None:
        """Set (or move) timer ``name`` of ``owner`` to ``deadline``."""
        seq = next(self._seq)
        self._used = True
        self._armed[(owner, name)] = seq
        heapq.heappush(self._heap, (deadline, seq, owner, name))
        if len(self._heap) > 64 and len(self._heap) > 4 * len(self._armed):
            self._compact()

    def _compact(self) -> None:
        armed = self._armed
        self._heap = [e for e in self._heap if armed.get((e[2], e[3])) == e[1]]
        heapq.heapify(self._heap)

    def cancel(self, owner: Hashable, name: str) -> None:
        self._armed.pop((owner, name), None)

    def cancel_all(self, owner: Hashable, names: tuple[str, ...]) -> None:
        for name in names:
            self._armed.pop((owner, name), None)

    def is_armed(self, owner: Hashable, name: str) -> bool:
        return (owner, name) in self._armed

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap and self._armed.get((heap[0][2], heap[0][3])) != heap[0][1]:
            heapq.heappop(heap)
        if self._used and not self._armed:
            # CPython dicts never give capacity back: start afresh whenever idle
            self._armed, self._heap, self._used = {}, [], False

    def next_deadline(self) -> float | None:
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> tuple[Hashable, str, float] | None:
        """The earliest timer due at ``now`` (disarmed), or None."""
        self._drop_stale()
        if not self._heap or self._heap[0][0] > now:
            return None
        deadline, _seq, owner, name = heapq.heappop(self._heap)
        del self._armed[(owner, name)]
        return owner, name, deadline

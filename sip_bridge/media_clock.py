"""One media clock per event loop: every call's receive pops and paced sends on one timer.

Why: with a task per call and direction, 200 calls meant ~600 timer wake-ups per 20 ms, an
asyncio wake-up per datagram, and each call's DSP alone, dominated by numpy call overhead.
The clock wakes every 5 ms on an absolute grid of the loop's monotonic clock (no drift:
sleeps never accumulate) and, per wake-up, in this order:

1. send: what agents wrote is downsampled in one batch, every due call's frame is G.711
   encoded in one batch and sent; then RTCP reports that are due. Pacer grids sit on the
   clock's grid, so a frame's lateness is the wake-up's lateness. A talkspurt does not
   wait for the clock: its first frame goes out in the agent's write, and its call's grid
   restarts on the grid (:meth:`grid_after_write`). A frame written by a receive pop (an
   echo answers each pop) goes out on the next tick's send phase: a call's send phase
   follows its pops later (``CallMedia._holds``) and, early in a talkspurt, earlier
   (``CallMedia._after_pop``), so a stream written frame by frame does not underrun.
2. read: one ``epoll_wait`` over every call's RTP socket, then the queued datagrams, with
   their kernel arrival stamps (:class:`~sip_bridge.media_io.PolledSocket`).
3. receive: each call's jitter buffer is popped at the call's own tick time, which follows
   ``JitterBuffer.due_s`` (:func:`~sip_bridge.pacer.next_tick`) rounded up to the grid, so
   a pop waits no more than the grid's step past due_s and the buffer is told the time it
   really pops at. Frames are upsampled in batches (:func:`resample.batch.process_many`)
   and handed to the agents.

Reading and receiving share a time budget per wake-up, so that a burst of arrivals (a peer
sending every call's packet at once) cannot make the next wake-up's sends late: the rest
waits a tick (see :meth:`MediaClock._serve`). The clock stops ticking when its last call
leaves, and starts again with the next one.
"""

from __future__ import annotations

import asyncio
import logging
import math
import select
import time
import weakref
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from resample.batch import process_many
from sip_bridge.logs import neutral_context
from sip_bridge.media_io import realtime_offset

if TYPE_CHECKING:
    from sip_bridge.media import CallMedia, TxFrame

__all__ = ["MediaClock", "media_clock"]

log = logging.getLogger(__name__)

TICK_S = 0.005
_EPS = 1e-6  # float slack when comparing deadlines that sit on the grid
_MAX_CATCH_UP = 3  # receive pops per call and wake-up after a stall
_READ_ROUNDS = 64  # socket reads per call and tick at most (a flood waits in the kernel)
_RX_CHUNK = 8  # datagrams read between two checks of the budget
# Calls per receive batch (the budget is checked between batches): the upsampler's batch
# has a fixed cost (~25 us), so batches of 8 cost more per call; 16 calls' pops take
# ~0.5 ms, so a batch overruns the budget by little (sends of the next tick stay on time).
_RX_BATCH = 16

_clocks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, MediaClock] = (
    weakref.WeakKeyDictionary()
)


def media_clock() -> MediaClock:
    """The running loop's clock (created on first use)."""
    loop = asyncio.get_running_loop()
    clock = _clocks.get(loop)
    if clock is None:
        clock = _clocks[loop] = MediaClock(loop)
    return clock


class MediaClock:
    """The shared tick. Calls join with :meth:`add` and leave with :meth:`remove`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tick_s: float = TICK_S) -> None:
        self.loop = loop
        self.tick_s = tick_s
        self.members: dict[int, CallMedia] = {}  # id -> call, in join order
        self._origin = 0.0
        self._j = 0  # index of the next grid point
        self._handle: asyncio.TimerHandle | None = None
        self.ticks = 0
        self.errors = 0
        self.rx_budget_s = 0.6 * tick_s  # receive work per tick, after the sends
        # Calls' RTP sockets, polled once per tick for all calls (one epoll_wait instead of
        # an empty read per call); without epoll each call drains its own socket.
        self.poller = select.epoll() if hasattr(select, "epoll") else None
        self._by_fd: dict[int, CallMedia] = {}
        self.rx_deferred = 0  # ticks that left receive work to the next one
        self.receiving = False  # inside a tick's receive pops
        self._reads_cut = 0  # ticks in a row whose reads ran out of budget (2: no budget)

    # -- grid -------------------------------------------------------------------------------

    def grid_at_or_after(self, t: float) -> float:
        """The first grid point >= t (pacers start there, so they sit on the grid)."""
        if self._handle is None:
            return t
        k = math.ceil((t - self._origin) / self.tick_s - _EPS)
        return self._origin + k * self.tick_s

    def grid_after_write(self, t: float, burst: bool) -> float:
        """Where a talkspurt written at t restarts its call's grid (its first frame has gone
        out already). One frame written in a receive pop (an agent answering each frame it
        hears): the next grid point, the first send phase after the pop, where the frames
        the next pops write will find their slot. Otherwise (a burst, or written between
        ticks) the nearest grid point, at most half a tick off the first frame."""
        if self._handle is None:
            return t
        x = (t - self._origin) / self.tick_s
        k = math.floor(x + _EPS) + 1 if self.receiving and not burst else round(x)
        return self._origin + k * self.tick_s

    # -- membership -------------------------------------------------------------------------

    def add(self, media: CallMedia) -> float:
        """Join; returns the grid time the call's clocks start from."""
        if self._handle is None:
            self._origin = self.loop.time()
            self._j = 0
            # every call's tick: not in the context (call id) of the call that started it
            self._handle = self.loop.call_at(self._origin, self._tick, context=neutral_context())
        self.members[id(media)] = media
        if self.poller is not None and media._sock is not None:
            fd = media._sock.fileno()
            self.poller.register(fd, select.EPOLLIN)
            self._by_fd[fd] = media
        return self.grid_at_or_after(self.loop.time())

    def remove(self, media: CallMedia) -> None:
        self.members.pop(id(media), None)
        if self.poller is not None and media._sock is not None:
            fd = media._sock.fileno()
            if self._by_fd.pop(fd, None) is not None:
                self.poller.unregister(fd)
        if not self.members and self._handle is not None:
            self._handle.cancel()
            self._handle = None

    # -- the tick ---------------------------------------------------------------------------

    def _tick(self) -> None:
        t = self._origin + self._j * self.tick_s
        now = self.loop.time()
        self.ticks += 1
        try:
            self._serve(t, max(now, t))
        except Exception:  # one broken call must not stop every call's media
            self.errors += 1
            if self.errors <= 3:
                log.exception("media clock tick failed")
        if not self.members:
            self._handle = None
            return
        # Behind: go on from the latest grid point, not through every missed one (a tick
        # serves everything due up to its start, so replaying them would only cost).
        behind = math.floor((self.loop.time() - self._origin) / self.tick_s)
        self._j = max(self._j + 1, behind)
        self._handle = self.loop.call_at(self._origin + self._j * self.tick_s, self._tick)

    def _serve(self, t: float, now: float) -> None:
        """Sends first (their deadlines are what pacing is measured on), then receives."""
        calls = list(self.members.values())
        g = t + math.floor((now - t) / self.tick_s + _EPS) * self.tick_s  # latest grid <= now
        edge = now + _EPS
        sending = [
            m for m in calls if (m.pacer.next_deadline <= edge or m._wake_pending) and not m._closed
        ]
        if sending:
            _send(sending, g, now)
            for m in sending:
                m._rtcp_tick(now)
        self.receiving = True  # a talkspurt an agent starts in a pop: see grid_after_write
        try:
            self._receive_all(calls, now, g, time.perf_counter() + self.rx_budget_s)
        finally:
            self.receiving = False

    def _receive_all(self, calls: list[CallMedia], now: float, g: float, end: float) -> None:
        # Receiving has a time budget per tick: its sends must not be late behind a burst of
        # arrivals (one peer often sends every call's packet at once). What is left waits
        # for the next tick: unread datagrams keep their kernel arrival stamps, and a later
        # pop is still made at the call's own tick time, so the jitter buffer's figures do
        # not change; only that call's audio reaches its agent a tick later.
        if not self._read_ready(now, end if self._reads_cut < 2 else math.inf):
            self._reads_cut += 1
            self.rx_deferred += 1
            return  # a due call's packet may still be unread: no pops before it is read
        self._reads_cut = 0
        for _ in range(_MAX_CATCH_UP):
            due = [m for m in calls if m._rx_t <= now + _EPS and not m._closed]
            if not due:
                break
            due.sort(key=_rx_time)  # the longest waiting first
            for i in range(0, len(due), _RX_BATCH):
                chunk = due[i : i + _RX_BATCH]
                _receive(chunk)
                for m in chunk:
                    m._after_pop(g)
                if time.perf_counter() > end:
                    self.rx_deferred += 1
                    return
            # Only a call just popped can be due again (catch-up after a stall): scan all
            # calls again only then.
            if not any(m._rx_t <= now + _EPS for m in due):
                break

    def _read_ready(self, now: float, end: float) -> bool:
        """Datagrams queued on the calls' sockets, one per ready socket and round
        (level-triggered: a socket with more stays ready), until none is left (True) or the
        perf_counter passes ``end`` (False). A flooded socket is bounded by the rounds."""
        if self.poller is None:
            return True
        offset = realtime_offset()
        by_fd = self._by_fd
        for _ in range(_READ_ROUNDS):
            events = self.poller.poll(0)
            if not events:
                return True
            for i, (fd, _) in enumerate(events, 1):
                m = by_fd.get(fd)
                if m is not None and m._sock is not None and not m._closed:
                    d = m._sock.read(now, offset)
                    if d is not None:
                        m._on_datagram(*d)
                if not i % _RX_CHUNK and time.perf_counter() > end:
                    return False
        return True


def _rows(frames: list[NDArray[np.int16]]) -> NDArray[np.int16]:
    """Equal-length 1-D frames as the rows of one array: ``np.stack`` for this case, at a
    third of its cost (its per-array Python work was a visible share of a tick)."""
    return np.concatenate(frames).reshape(len(frames), -1)


def _rx_time(m: CallMedia) -> float:
    return m._rx_t


def _receive(due: list[CallMedia]) -> None:
    """Pop every due call's jitter buffer, upsample in batches, feed the agents."""
    frames = [m._rx_pop() for m in due]
    pcm: list[NDArray[np.int16]] = list(frames)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, m in enumerate(due):
        up = m._up
        if up is not None:
            groups.setdefault((up.out_rate, frames[i].size), []).append(i)
    for idx in groups.values():
        rs = [due[i]._up for i in idx]
        x = _rows([frames[i] for i in idx])
        out = process_many(rs, x)  # type: ignore[arg-type]
        for i, row in zip(idx, out, strict=True):
            pcm[i] = row
    for m, p in zip(due, pcm, strict=True):
        m._rx_deliver(p)


def _send(calls: list[CallMedia], g: float, now: float) -> None:
    """Send every call's due frames (grid time ``g``), encoded in one batch."""
    _drain_writes(calls)
    batch: list[TxFrame] = []
    for m in calls:
        m._tx_tick(g, now, batch)
    if batch:
        _send_batch(batch, now)


def _drain_writes(calls: list[CallMedia]) -> None:
    """Downsample what the agents wrote into each call's playout buffer, batched when the
    call wrote exactly one frame (an echo or a steady TTS stream), one by one otherwise."""
    groups: dict[tuple[int, int], list[CallMedia]] = {}
    for m in calls:
        pending = m._pending
        if not pending:
            continue
        down = m._down
        if down is None:
            m._drain_one()
        elif len(pending) == 1 and pending[0].size == m._agent_step:
            groups.setdefault((down.in_rate, m._agent_step), []).append(m)
        else:
            m._drain_one()
    for group in groups.values():
        if len(group) == 1:
            group[0]._drain_one()
            continue
        x = _rows([m._pending[0] for m in group])
        out = process_many([m._down for m in group], x)  # type: ignore[misc]
        for m, row in zip(group, out, strict=True):
            m._pending.clear()
            m._pending_samples = 0
            m.playout.write(row, copy=False)  # a row of a fresh array: ours alone


def _send_batch(batch: list[TxFrame], now: float) -> None:
    """G.711-encode every call's due frame in one table lookup per codec, then send each."""
    m0, frame0, _ = batch[0]
    table, size = m0.codec.enc_table, frame0.size
    if all(m.codec.enc_table is table and f.size == size for m, f, _ in batch):
        groups = [list(range(len(batch)))]  # the usual tick: one codec, one frame size
    else:
        by: dict[tuple[int, int], list[int]] = {}
        for i, (m, frame, _) in enumerate(batch):
            by.setdefault((id(m.codec.enc_table), frame.size), []).append(i)
        groups = list(by.values())
    for idx in groups:
        m0, f0, _ = batch[idx[0]]
        n = f0.size
        pcm = _rows([batch[i][1] for i in idx])
        codes = m0.codec.enc_table.take(pcm.view(np.uint16)).tobytes()  # encode(pcm)
        for k, i in enumerate(idx):
            m, _, dest = batch[i]
            m._send_audio(codes[k * n : (k + 1) * n], dest, now)

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
   (``CallMedia.after_pop``), so a stream written frame by frame does not underrun.
2. read: one ``epoll_wait`` over every call's RTP socket, then the queued datagrams, with
   their kernel arrival stamps (:class:`~sip_bridge.media.media_io.PolledSocket`).
3. receive: each call's jitter buffer is popped at the call's own tick time, which follows
   ``JitterBuffer.due_s`` (:func:`~sip_bridge.media.pacer.next_tick`) rounded up to the grid, so
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

import numpy as np
from numpy.typing import NDArray

from resample import Resampler
from resample.batch import process_many
from resample.g711 import G711Codec
from sip_bridge.logs import neutral_context
from sip_bridge.media.media_io import MediaSocket, realtime_offset
from sip_bridge.media.pacer import Pacer

__all__ = ["ClockedCall", "MediaClock", "TxFrame", "media_clock"]

log = logging.getLogger(__name__)

GRID_S = 0.005
_EPS = 1e-6  # float slack when comparing deadlines that sit on the grid
_MAX_CATCH_UP = 3  # receive pops per call and wake-up after a stall
_READ_ROUNDS = 64  # socket reads per call and tick at most (a flood waits in the kernel)
_RX_CHUNK = 8  # datagrams read between two checks of the budget
# Calls per receive batch at most (the budget is checked between batches): the upsampler's
# batch has a fixed cost (~25 us), so batches of 8 cost more per call; 16 line-check calls'
# pops take ~0.5 ms. A voice agent's tick (echo canceller, VAD) costs ~0.5 ms on its own,
# so batches are sized to what is left of the budget at the measured cost per call.
_RX_BATCH = 16
_RX_COST_S = 0.0001  # a first guess of a call's receive cost (pop and its agent's tick)


class ClockedCall:
    """What the clock drives in each call, and all it may touch of one:
    :class:`sip_bridge.media.call_media.CallMedia` implements it. A base class rather than a
    ``Protocol``: the compiled media path calls these through a native vtable.

    Per wake-up the clock sends (:meth:`drain_pending` or, batched across calls,
    :meth:`pending_frame` and :meth:`take_downsampled`; then :meth:`tx_tick`, whose audio
    frames it encodes in one batch and hands back to :meth:`send_audio`; then
    :meth:`rtcp_tick`), reads (:meth:`on_datagram` for each datagram on :attr:`sock`) and
    receives (:meth:`rx_pop` when :attr:`rx_due` has come, upsampled by :attr:`up` in a
    batch, :meth:`rx_deliver`, :meth:`after_pop`)."""

    pacer: Pacer  # its send deadlines (next_deadline)
    codec: G711Codec  # what its frames are encoded with
    sock: MediaSocket | None  # its RTP socket, read by the clock
    closed: bool
    wake_pending: bool  # a talkspurt waits for the clock
    rx_due: float  # when its jitter buffer is next popped (on the clock's grid)
    up: Resampler | None  # 8 kHz -> the agent's rate (None: the agent runs at 8 kHz)
    down: Resampler | None  # the agent's rate -> 8 kHz

    def on_datagram(self, data: bytes, addr: tuple[str, int], now: float | None = None) -> None:
        """A datagram read from :attr:`sock`, with its arrival time."""
        raise NotImplementedError

    def rx_pop(self) -> NDArray[np.int16]:
        """The jitter buffer's frame for the tick at :attr:`rx_due` (8 kHz)."""
        raise NotImplementedError

    def rx_deliver(self, pcm: NDArray[np.int16]) -> None:
        """That frame at the agent's rate, to the agent."""
        raise NotImplementedError

    def after_pop(self, t: float) -> None:
        """After the pop at grid time ``t``: the send phase may follow it."""
        raise NotImplementedError

    def pending_frame(self) -> NDArray[np.int16] | None:
        """The agent's audio waiting to be downsampled when it is exactly one frame (the
        clock downsamples those for every call in one batch); None: anything else."""
        raise NotImplementedError

    def take_downsampled(self, frame: NDArray[np.int16]) -> None:
        """:meth:`pending_frame`, downsampled by the clock's batch: queue it to send."""
        raise NotImplementedError

    def drain_pending(self) -> None:
        """Downsample whatever the agent wrote, here, frame by frame."""
        raise NotImplementedError

    def tx_tick(self, t: float, now: float, batch: list[TxFrame] | None = None) -> bool:
        """Send what is due at grid time ``t``; audio frames go into ``batch``."""
        raise NotImplementedError

    def send_audio(self, payload: bytes, dest: tuple[str, int], now: float) -> None:
        """A frame of ``batch``, encoded: packetise and send it."""
        raise NotImplementedError

    def rtcp_tick(self, now: float) -> None:
        """Send an RTCP report if one is due."""
        raise NotImplementedError


#: An audio frame a call's send tick left for the clock to encode: (call, frame, dest).
TxFrame = tuple[ClockedCall, NDArray[np.int16], tuple[str, int]]

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

    def __init__(self, loop: asyncio.AbstractEventLoop, tick_s: float = GRID_S) -> None:
        self.loop = loop
        self.tick_s = tick_s
        self.members: dict[int, ClockedCall] = {}  # id -> call, in join order
        self._origin = 0.0
        self._j = 0  # index of the next grid point
        self._handle: asyncio.TimerHandle | None = None
        self.ticks = 0
        self.errors = 0
        self.rx_budget_s = 0.6 * tick_s  # receive work per tick, after the sends
        # Calls' RTP sockets, polled once per tick for all calls (one epoll_wait instead of
        # an empty read per call); without epoll each call drains its own socket.
        self.poller = select.epoll() if hasattr(select, "epoll") else None
        self._by_fd: dict[int, ClockedCall] = {}
        self.rx_deferred = 0  # ticks that left receive work to the next one
        self.rx_cost_s = _RX_COST_S  # one call's receive (pop, its agent's tick), smoothed
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

    def add(self, media: ClockedCall) -> float:
        """Join; returns the grid time the call's clocks start from."""
        if self._handle is None:
            self._origin = self.loop.time()
            self._j = 0
            # every call's tick: not in the context (call id) of the call that started it
            self._handle = self.loop.call_at(self._origin, self._tick, context=neutral_context())
        self.members[id(media)] = media
        if self.poller is not None and media.sock is not None:
            fd = media.sock.fileno()
            self.poller.register(fd, select.EPOLLIN)
            self._by_fd[fd] = media
        return self.grid_at_or_after(self.loop.time())

    def remove(self, media: ClockedCall) -> None:
        self.members.pop(id(media), None)
        if self.poller is not None and media.sock is not None:
            fd = media.sock.fileno()
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
            m for m in calls if (m.pacer.next_deadline <= edge or m.wake_pending) and not m.closed
        ]
        if sending:
            _send(sending, g, now)
            for m in sending:
                m.rtcp_tick(now)
        self.receiving = True  # a talkspurt an agent starts in a pop: see grid_after_write
        try:
            self._receive_all(calls, now, g, time.perf_counter() + self.rx_budget_s)
        finally:
            self.receiving = False

    def _receive_all(self, calls: list[ClockedCall], now: float, g: float, end: float) -> None:
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
            due = [m for m in calls if m.rx_due <= now + _EPS and not m.closed]
            if not due:
                break
            due.sort(key=_rx_time)  # the longest waiting first
            i = 0
            while i < len(due):
                # as many calls as the budget has room for (at least one: progress)
                t0 = time.perf_counter()
                n = max(1, min(_RX_BATCH, int((end - t0) / self.rx_cost_s)))
                chunk = due[i : i + n]
                _receive(chunk)
                for m in chunk:
                    m.after_pop(g)
                t1 = time.perf_counter()
                self.rx_cost_s += 0.2 * ((t1 - t0) / len(chunk) - self.rx_cost_s)
                i += n
                if t1 > end:
                    self.rx_deferred += 1
                    return
            # Only a call just popped can be due again (catch-up after a stall): scan all
            # calls again only then.
            if not any(m.rx_due <= now + _EPS for m in due):
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
                if m is not None and m.sock is not None and not m.closed:
                    d = m.sock.read(now, offset)
                    if d is not None:
                        m.on_datagram(*d)
                if not i % _RX_CHUNK and time.perf_counter() > end:
                    return False
        return True


def _rows(frames: list[NDArray[np.int16]]) -> NDArray[np.int16]:
    """Equal-length 1-D frames as the rows of one array: ``np.stack`` for this case, at a
    third of its cost (its per-array Python work was a visible share of a tick)."""
    return np.concatenate(frames).reshape(len(frames), -1)


def _rx_time(m: ClockedCall) -> float:
    return m.rx_due


def _receive(due: list[ClockedCall]) -> None:
    """Pop every due call's jitter buffer, upsample in batches, feed the agents."""
    frames = [m.rx_pop() for m in due]
    pcm: list[NDArray[np.int16]] = list(frames)
    groups: dict[tuple[int, int], list[tuple[int, Resampler]]] = {}
    for i, m in enumerate(due):
        up = m.up
        if up is not None:
            groups.setdefault((up.out_rate, frames[i].size), []).append((i, up))
    for group in groups.values():
        x = _rows([frames[i] for i, _ in group])
        out = process_many([up for _, up in group], x)
        for (i, _), row in zip(group, out, strict=True):
            pcm[i] = row
    for m, p in zip(due, pcm, strict=True):
        m.rx_deliver(p)


def _send(calls: list[ClockedCall], g: float, now: float) -> None:
    """Send every call's due frames (grid time ``g``), encoded in one batch."""
    _drain_writes(calls)
    batch: list[TxFrame] = []
    for m in calls:
        m.tx_tick(g, now, batch)
    if batch:
        _send_batch(batch, now)


def _drain_writes(calls: list[ClockedCall]) -> None:
    """Downsample what the agents wrote into each call's playout buffer, batched when the
    call wrote exactly one frame (an echo or a steady TTS stream), one by one otherwise."""
    groups: dict[tuple[int, int], list[tuple[ClockedCall, Resampler, NDArray[np.int16]]]] = {}
    for m in calls:
        frame = m.pending_frame()
        down = m.down
        if frame is None or down is None:
            m.drain_pending()
            continue
        groups.setdefault((down.in_rate, frame.size), []).append((m, down, frame))
    for group in groups.values():
        if len(group) == 1:
            group[0][0].drain_pending()
            continue
        x = _rows([f for _, _, f in group])
        out = process_many([d for _, d, _ in group], x)
        for (m, _, _), row in zip(group, out, strict=True):
            m.take_downsampled(row)


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
            m.send_audio(codes[k * n : (k + 1) * n], dest, now)

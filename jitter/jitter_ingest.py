"""The storing half of the receive jitter buffer: packets in, onto a sample timeline.

Split from :mod:`jitter.jitterbuffer` (which pops frames off the timeline) to keep each
file readable: this half owns the state both share, and the push path: duplicate and loss
bookkeeping by sequence number, timestamp unwrapping, stream re-anchoring (resync) and the
delay estimator's samples. See :mod:`jitter.jitterbuffer` for the design.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from jitter.cng import ComfortNoise
from jitter.delay import DelayEstimator
from jitter.plc import Concealer
from jitter.ring import SampleRing
from jitter.seqnum import SEQ_BITS, TS_BITS, Unwrapper, wrapped_diff

__all__ = ["JitterIngest", "JitterStats"]

_SEEN = 4096  # sequence-number window for duplicate detection
_SEEN_MASK = _SEEN - 1
_MAX_SEQ_JUMP = 1000
_MAX_TS_INCONSISTENCY_S = 1.0


@dataclass(frozen=True)
class JitterStats:
    """A snapshot of the buffer's counters (see `JitterBuffer.stats`)."""

    received: int = 0  # packets pushed (audio and CN, duplicates and late ones included)
    duplicates: int = 0
    lost: int = 0  # sequence numbers never received (a late arrival moves one to `late`)
    late: int = 0  # arrived after their playout time, discarded
    concealed: int = 0  # frames with PLC audio because of a real loss
    comfort_noise: int = 0  # frames filled during DTX / silence
    dropped_frames: int = 0  # frames skipped to shrink the delay
    inserted_frames: int = 0  # PLC frames inserted to grow the delay
    resyncs: int = 0
    target_delay_ms: float = 0.0
    current_delay_ms: float = 0.0
    jitter_ms: float = 0.0  # RFC 3550 interarrival jitter estimate


_MAX_TIME_S = 1e9  # ~31 years: anything beyond is garbage


def _finite(x: float, default: float) -> float:
    if type(x) is float and -_MAX_TIME_S < x < _MAX_TIME_S:  # the common case, fast
        return x
    try:
        v = float(x)
    except (TypeError, ValueError, OverflowError):
        return default
    return v if math.isfinite(v) and abs(v) < _MAX_TIME_S else default


class JitterIngest:
    """Storage, sequence state and the push side of :class:`~jitter.JitterBuffer`."""

    def __init__(
        self,
        clock_rate: int = 8000,
        frame_ms: int = 20,
        min_delay_ms: float = 20,
        max_delay_ms: float = 200,
        *,
        capacity_s: float = 2.0,
        quantile: float = 0.99,
        follows_due: bool = False,
    ) -> None:
        if clock_rate <= 0 or frame_ms <= 0:
            raise ValueError("clock_rate and frame_ms must be positive")
        if (clock_rate * frame_ms) % 1000:
            raise ValueError("frame_ms must be a whole number of samples")
        if not 0 <= min_delay_ms <= max_delay_ms:
            raise ValueError("need 0 <= min_delay_ms <= max_delay_ms")
        self.clock_rate = clock_rate
        self.frame_ms = frame_ms
        # True when the caller pops on a clock that follows `due_s` (see there): then the
        # clock, not dropped or inserted frames, keeps the delay on target.
        self.follows_due = follows_due
        self.frame_samples = clock_rate * frame_ms // 1000
        f = self.frame_samples
        cap = max(int(capacity_s * clock_rate), 8 * f, int(4 * max_delay_ms * clock_rate / 1000))
        self.capacity = cap
        self._max_pkt = cap // 4
        self._ring = SampleRing(cap)
        self._est = DelayEstimator(min_delay_ms / 1000.0, max_delay_ms / 1000.0, quantile=quantile)
        self._plc = Concealer(clock_rate)
        self._xfade = max(1, round(0.003 * clock_rate))
        self._cng = ComfortNoise(clock_rate)
        # stream / sequence state
        self._have_stream = False
        self._ssrc: int | None = None
        self._seq_uw = Unwrapper(SEQ_BITS)
        self._ts_uw = Unwrapper(TS_BITS)
        self._seq_off = 0
        self._ts_off = 0
        self._hi_useq = -1
        self._hi_seq_raw = 0
        self._hi_ts_raw = 0
        self._hi_t = 0  # timeline position of the highest-seq packet
        self._hi_arrival = 0.0
        self._seen: list[int] = [-1] * _SEEN  # a list: scalar access is per packet
        self._pushes = 0  # packets recorded in _seen: invalidates the hole memo
        self._hole_memo: tuple[tuple[int, int, int], bool] | None = None
        self._missing: set[int] = set()
        # timeline
        self._started = False
        self._cursor = 0
        self._floor = 0
        self._start_t: int | None = None
        self._max_end = 0
        self._markers: set[int] = set()
        self._cn_events: deque[tuple[int, int]] = deque()
        self._last_played_seq: int | None = None
        self._mode = "silence"  # what the last output sample was: audio | loss | silence
        self._tail_left = 0
        self._tail_len = 0  # samples of the concealed tail that fades into a silence
        self._announced = False  # a CN packet said the sender went quiet (RFC 3389)
        self._energy_ema = 0.0
        self._frames_seen = 0
        self._last_now = 0.0
        self._last_arrival = 0.0
        self._cur_delay = 0.0
        self._pts: int | None = None
        # counters
        self._received = 0
        self._duplicates = 0
        self._lost = 0
        self._late = 0
        self._concealed = 0
        self._comfort = 0
        self._dropped = 0
        self._inserted = 0
        self._resyncs = 0

    # -- public properties -----------------------------------------------------------------

    def _next_valid(self, p: int) -> int | None:
        return self._ring.first_valid(p, self._max_end)

    # -- push ------------------------------------------------------------------------------

    @staticmethod
    def _check_pcm(pcm: NDArray[np.int16]) -> NDArray[np.int16]:
        a = np.asarray(pcm)
        if a.dtype != np.int16 or a.ndim != 1 or a.size == 0:
            raise ValueError("pcm must be a non-empty 1-D int16 array")
        return a

    def push(
        self,
        seq: int,
        timestamp: int,
        pcm: NDArray[np.int16],
        arrival_s: float,
        marker: bool = False,
        ssrc: int | None = None,
    ) -> None:
        """Add one packet's decoded PCM that arrived at `arrival_s` (seconds, playout clock)."""
        a = self._check_pcm(pcm)
        if a.size > self._max_pkt:
            a = a[: self._max_pkt]
        self._ingest(int(seq), int(timestamp), a, arrival_s, bool(marker), ssrc, None)

    def push_comfort_noise(
        self,
        seq: int,
        timestamp: int,
        level_dbov: int,
        arrival_s: float,
        ssrc: int | None = None,
    ) -> None:
        """An RFC 3389 comfort-noise packet: no audio, sets the level of the following gap."""
        self._ingest(int(seq), int(timestamp), None, arrival_s, False, ssrc, int(level_dbov))

    def skip_sequence(self, seq: int, ssrc: int | None = None) -> None:
        """A packet of this stream that carries nothing for the buffer (an RFC 4733 event,
        which takes the audio's sequence numbers) used ``seq``: it is not a loss, and the
        audio gap it leaves is a pause to fill with silence, not speech to conceal.

        Why: without this a caller's key presses counted as 1-2 % packet loss in the call
        record, and each key's gap was filled with the last syllable's PLC."""
        seq &= 0xFFFF
        if not self._have_stream or (
            ssrc is not None and self._ssrc is not None and (ssrc & 0xFFFFFFFF) != self._ssrc
        ):
            return  # no numbering to place it in yet, or another stream's number
        dseq = wrapped_diff(seq, self._hi_seq_raw, SEQ_BITS)
        if abs(dseq) > _MAX_SEQ_JUMP:
            return
        if self._count_sequence(self._seq_uw.unwrap(seq) + self._seq_off) > 0:
            self._hi_seq_raw = seq  # the timestamp stays the last audio packet's

    def _count_sequence(self, useq: int) -> int:
        """Record unwrapped sequence number ``useq`` as received: -1 a duplicate (nothing
        changed), 1 the new highest (a gap before it counted lost), 0 one that fills a
        counted loss (or an old one)."""
        k = useq & _SEEN_MASK
        if self._seen[k] == useq:
            return -1
        self._seen[k] = useq
        self._pushes += 1
        if useq > self._hi_useq:
            gap = useq - self._hi_useq - 1
            if gap > 0:
                self._lost += gap
                self._missing.update(range(self._hi_useq + 1, useq))
                if len(self._missing) > 2 * _SEEN:
                    lo = useq - _SEEN
                    self._missing = {s for s in self._missing if s >= lo}
            self._hi_useq = useq
            return 1
        if useq in self._missing:
            self._missing.discard(useq)
            self._lost -= 1
        return 0

    def _ingest(
        self,
        seq: int,
        ts: int,
        pcm: NDArray[np.int16] | None,
        arrival_s: float,
        marker: bool,
        ssrc: int | None,
        cn_level: int | None,
    ) -> None:
        seq &= 0xFFFF
        ts &= 0xFFFFFFFF
        arrival = _finite(arrival_s, self._last_arrival)
        self._last_arrival = arrival
        self._received += 1
        if ssrc is not None:
            ssrc = int(ssrc) & 0xFFFFFFFF
        n = 0 if pcm is None else pcm.size
        cap = self.capacity
        if (
            pcm is not None
            and self._have_stream
            and seq == (self._hi_seq_raw + 1) & 0xFFFF
            and (ssrc is None or self._ssrc is None or ssrc == self._ssrc)
            and self._ingest_next(seq, ts, pcm, arrival, marker, ssrc)
        ):
            return
        if not self._have_stream:
            self._new_stream(seq, ts, arrival, ssrc, first=True)
        else:
            resync = ssrc is not None and self._ssrc is not None and ssrc != self._ssrc
            if not resync:
                dseq = wrapped_diff(seq, self._hi_seq_raw, SEQ_BITS)
                dts = wrapped_diff(ts, self._hi_ts_raw, TS_BITS)
                if abs(dseq) > _MAX_SEQ_JUMP:
                    resync = True
                elif dseq > 0:
                    elapsed = arrival - self._hi_arrival
                    if abs(dts / self.clock_rate - elapsed) > _MAX_TS_INCONSISTENCY_S:
                        resync = True
                    else:
                        ref = self._cursor if self._started else self._floor
                        t_new = self._ts_uw.peek(ts) + self._ts_off
                        if t_new + n > ref + cap:
                            resync = True
            if resync:
                self._resyncs += 1
                self._new_stream(seq, ts, arrival, ssrc, first=False)
        if ssrc is not None:
            self._ssrc = ssrc
        useq = self._seq_uw.unwrap(seq) + self._seq_off
        t = self._ts_uw.unwrap(ts) + self._ts_off
        counted = self._count_sequence(useq)
        if counted < 0:
            self._duplicates += 1
            return
        if counted > 0:
            self._hi_seq_raw = seq
            self._hi_ts_raw = ts
            self._hi_t = t
            self._hi_arrival = arrival
        started = self._started
        ref = self._cursor if started else self._floor
        rate = self.clock_rate
        phase = ((t - self._cursor) % self.frame_samples) / rate if started else 0.0
        self._est.update(arrival, arrival - t / rate, phase)
        if pcm is None:
            self._cng.set_level_dbov(127 if cn_level is None else cn_level)
            if t >= ref:
                self._cn_events.append((t, useq))
                if len(self._cn_events) > 256:
                    self._cn_events.popleft()
            return
        if t < ref:
            self._late += 1  # a late packet that filled a counted loss moved lost -> late
            return
        if t + n > ref + cap:
            return  # cannot be stored (only reachable for garbage)
        self._store(t, pcm, useq, marker, ref)

    def _store(self, t: int, pcm: NDArray[np.int16], useq: int, marker: bool, ref: int) -> None:
        self._ring.write(t, pcm, useq)
        if marker:
            self._markers.add(t)
            if len(self._markers) > 256:
                self._markers = {m for m in self._markers if m >= ref}
        end = t + pcm.size
        if end > self._max_end:
            self._max_end = end
        if not self._started and (self._start_t is None or t < self._start_t):
            self._start_t = t

    def source_changed(self) -> None:
        """The packets now come from another address (symmetric RTP latched, or went back
        to the signalled one): the old sender's numbering says nothing of the new one's, so
        the next packet re-anchors the stream (a resync), whatever its SSRC."""
        if self._have_stream:
            self._ssrc = -1  # no packet's SSRC: the next one differs, and resyncs

    def push_packet(
        self,
        seq: int,
        timestamp: int,
        pcm: NDArray[np.int16],
        arrival_s: float,
        marker: bool,
        ssrc: int,
    ) -> None:
        """:meth:`push` for a caller that already holds a parsed RTP header (ints in range)
        and a decoded payload (1-D int16, non-empty): the same effect, without re-checking
        what the receiver knows. Why: it runs for every packet of every call."""
        if (
            self._have_stream
            and seq == (self._hi_seq_raw + 1) & 0xFFFF
            and (self._ssrc is None or ssrc == self._ssrc)
            and type(arrival_s) is float
            and -_MAX_TIME_S < arrival_s < _MAX_TIME_S
            and pcm.size <= self._max_pkt
            and self._ingest_next(seq, timestamp, pcm, arrival_s, marker, ssrc)
        ):
            self._last_arrival = arrival_s
            self._received += 1
            return
        self.push(seq, timestamp, pcm, arrival_s, marker, ssrc)

    def _ingest_next(
        self,
        seq: int,
        ts: int,
        pcm: NDArray[np.int16],
        arrival: float,
        marker: bool,
        ssrc: int | None,
    ) -> bool:
        """The common case, cheaply: the next packet of the stream, in order, on time.

        Returns False (having changed nothing) when it is not that case, and
        `_ingest`'s general path decides. What `_store` and the unwrappers' `note` do is
        written out here: this runs for every packet.
        """
        rate = self.clock_rate
        dts = (ts - self._hi_ts_raw) & 0xFFFFFFFF
        if dts >= 0x80000000 or abs(dts / rate - (arrival - self._hi_arrival)) > 1.0:
            return False
        t = self._hi_t + dts
        n = pcm.size
        started = self._started
        cursor = self._cursor
        ref = cursor if started else self._floor
        cap = self.capacity
        if t < ref or t + n > ref + cap:
            return False
        useq = self._hi_useq + 1
        self._seq_uw.note(useq - self._seq_off)
        self._ts_uw.note(t - self._ts_off)
        self._seen[useq & _SEEN_MASK] = useq
        self._pushes += 1
        self._hi_useq = useq
        self._hi_seq_raw = seq
        self._hi_ts_raw = ts
        self._hi_t = t
        self._hi_arrival = arrival
        if ssrc is not None:
            self._ssrc = ssrc
        phase = ((t - cursor) % self.frame_samples) / rate if started else 0.0
        self._est.update(arrival, arrival - t / rate, phase)
        ring = self._ring
        i = t % cap
        j = i + n
        if j <= cap:
            ring.pcm[i:j] = pcm
            ring.valid[i:j] = True
            ring.seq[i:j] = useq
        else:
            ring.write(t, pcm, useq)
        if marker:
            self._markers.add(t)
            if len(self._markers) > 256:
                self._markers = {m for m in self._markers if m >= ref}
        end = t + n
        if end > self._max_end:
            self._max_end = end
        if not started and (self._start_t is None or t < self._start_t):
            self._start_t = t
        return True

    def _new_stream(self, seq: int, ts: int, arrival: float, ssrc: int | None, first: bool) -> None:
        self._seq_uw.reset()
        self._ts_uw.reset()
        cap = self.capacity
        if first:
            self._ts_off = 0
            self._seq_off = 0
            self._hi_useq = seq - 1
            self._floor = ts - cap // 4
        else:
            ref = self._cursor if self._started else self._floor
            lo = max(self._max_end, ref)
            if lo + self._max_pkt > ref + cap - self.frame_samples:
                # Nowhere to put the new stream: forget what is buffered.
                self._ring.valid[:] = False
                self._max_end = ref
                self._start_t = None
                lo = ref
            t_new = lo
            if self._est.has_data:
                base = self._est.base_at(arrival)
                want = (arrival - base - self._est.typical_jitter_s()) * self.clock_rate
                if math.isfinite(want):
                    t_new = round(want)
            t_new = min(max(t_new, lo), lo + cap // 4)
            self._ts_off = t_new - ts
            self._seq_off = self._hi_useq + 1 - seq
            self._missing.clear()
        self._hi_seq_raw = seq
        self._hi_ts_raw = ts
        self._hi_arrival = arrival
        self._ssrc = ssrc
        self._have_stream = True

    # -- pop -------------------------------------------------------------------------------

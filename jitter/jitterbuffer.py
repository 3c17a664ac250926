"""Adaptive receive jitter buffer for one RTP audio stream (pure, no I/O).

Design
------
* **Storage** is a sample-indexed ring (2 s at the clock rate) with a validity
  mask and the sequence number of the packet that wrote each sample, indexed
  by an internal unwrapped *timeline* timestamp T. A packet's PCM is written at
  its T; `pop()` reads one frame from the cursor. Any ptime, partial overlaps
  and duplicates fall out of this for free.
* **Unwrapping**: 16-bit seq and 32-bit ts are unwrapped relative to the
  highest seen; each new stream (SSRC change, or a seq/ts jump inconsistent
  with the arrival clock) is re-anchored on the timeline so that it continues
  at the current target delay (a *resync*).
* **Delay estimation** (`DelayEstimator`): relative transit r = arrival - T/rate.
  The base is the minimum of r over a sliding window (4 s), de-trended by the
  slope of r's per-second minima over the last 60 s (sender clock drift,
  clamped to +-1 %). Each packet's jitter sample is r - base plus its phase
  inside the playout frame grid (a packet whose first sample falls in the
  middle of a frame is needed that much earlier). The target is the 0.99
  quantile of the last 500 samples plus a 4 ms margin, clamped to
  [min_delay, max_delay], with instant attack and a 2 s exponential release.
* **Playout**: current delay = now - (cursor/rate + base). Playout starts
  when the oldest buffered packet would be played at >= target. Through holes
  (DTX silence or losses) the cursor moves freely: it jumps to the frame-grid
  position that puts the next buffered packet at >= target, and in silence it
  may hold (play comfort noise without advancing). During continuous speech
  the delay is adapted a frame at a time: drop a frame (3 ms cross-fade) when
  the delay exceeds the target by more than a frame, insert a pitch-repeated
  PLC frame when it falls below the target, preferring low-energy frames,
  with thresholds that widen the further off the delay is.
* **Holes** are classified by sequence numbers: if the packet after the last
  one played is missing although something newer arrived, the hole is a
  loss (PLC, counted `concealed`); otherwise it is DTX silence (<= 1 frame of
  faded PLC tail, then comfort noise at the last RFC 3389 level, counted
  `comfort_noise`).
"""

from __future__ import annotations

import itertools
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


class JitterBuffer:
    """Adaptive jitter buffer: push decoded packets, pop exactly one frame per tick."""

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

    @property
    def playout_timestamp(self) -> int | None:
        """RTP timestamp (unwrapped, current stream) of the first sample of the last frame."""
        return self._pts

    @property
    def due_s(self) -> float | None:
        """When the next frame should be popped to play it exactly at the target delay.

        A receive loop with no sound card behind it (the bridge feeds an agent) may
        nudge its pop clock toward this instead of a fixed 20 ms grid: that removes
        up to a frame of waiting that a fixed tick phase adds to every packet.
        None while nothing is playing (before the start and in silence).
        """
        if not self._started or self._mode == "silence":
            return None
        return (
            self._cursor / self.clock_rate + self._est.base_at(self._last_now) + self._est.target_s
        )

    @property
    def target_delay_ms(self) -> float:
        return 1000.0 * self._est.target_s

    @property
    def stats(self) -> JitterStats:
        return JitterStats(
            received=self._received,
            duplicates=self._duplicates,
            lost=self._lost,
            late=self._late,
            concealed=self._concealed,
            comfort_noise=self._comfort,
            dropped_frames=self._dropped,
            inserted_frames=self._inserted,
            resyncs=self._resyncs,
            target_delay_ms=1000.0 * self._est.target_s,
            current_delay_ms=1000.0 * self._cur_delay,
            jitter_ms=1000.0 * self._est.jitter_s,
        )

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
        k = useq & _SEEN_MASK
        if self._seen[k] == useq:
            self._duplicates += 1
            return
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
            self._hi_seq_raw = seq
            self._hi_ts_raw = ts
            self._hi_t = t
            self._hi_arrival = arrival
        elif useq in self._missing:
            self._missing.discard(useq)
            self._lost -= 1
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
        `_ingest`'s general path decides.
        """
        rate = self.clock_rate
        dts = (ts - self._hi_ts_raw) & 0xFFFFFFFF
        if dts >= 0x80000000 or abs(dts / rate - (arrival - self._hi_arrival)) > 1.0:
            return False
        t = self._hi_t + dts
        n = pcm.size
        started = self._started
        ref = self._cursor if started else self._floor
        if t < ref or t + n > ref + self.capacity:
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
        phase = ((t - self._cursor) % self.frame_samples) / rate if started else 0.0
        self._est.update(arrival, arrival - t / rate, phase)
        self._store(t, pcm, useq, marker, ref)
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

    def _silence_fill(self, n: int) -> NDArray[np.int16]:
        cn = self._cng.generate(n)
        if self._mode != "silence":
            self._tail_left = self.frame_samples if self._mode == "audio" else 0
            if self._tail_left == 0:
                self._plc.end_erasure()
        self._mode = "silence"
        k = min(n, self._tail_left)
        if k > 0:
            syn = self._plc.conceal(k).astype(np.float64)
            f = self.frame_samples
            pos = f - self._tail_left
            fade = 1.0 - (pos + np.arange(k) + 0.5) / f
            cn[:k] = syn * fade + cn[:k] * (1.0 - fade)
            self._tail_left -= k
            if self._tail_left == 0:
                self._plc.end_erasure()
        out = np.clip(np.rint(cn), -32768, 32767).astype(np.int16)
        if k < n:
            self._plc.good(out[k:], blend=False)
        return out

    def _hole_is_loss(self, nxt: int | None) -> bool:
        lp = self._last_played_seq
        if lp is None:
            return False
        upper = int(self._ring.seq[nxt % self.capacity]) if nxt is not None else self._hi_useq + 1
        upper = min(upper, lp + 64)
        key = (lp, upper, self._pushes)
        if self._hole_memo is not None and self._hole_memo[0] == key:
            return self._hole_memo[1]  # nothing arrived since: same answer, no rescan
        seen = self._seen
        loss = any(seen[s & _SEEN_MASK] != s for s in range(lp + 1, upper))
        self._hole_memo = (key, loss)
        return loss

    def _energy(self, x: NDArray[np.int16]) -> float:
        y = x.astype(np.float32)
        return float(np.dot(y, y)) / max(1, y.size)

    def pop(self, now_s: float) -> NDArray[np.int16]:
        """One frame (exactly frame_samples int16) for the playout tick at `now_s`."""
        now = _finite(now_s, self._last_now)
        self._last_now = now
        f = self.frame_samples
        rate = self.clock_rate
        est = self._est
        target = est.target_s
        if not self._started:
            st = self._start_t
            if st is None or now - (st / rate + est.base_at(now)) < target:
                self._pts = None
                self._cur_delay = 0.0
                return np.zeros(f, dtype=np.int16)
            self._started = True
            self._cursor = st
        c = self._cursor
        if self._cn_events:
            ev = self._cn_events
            while ev and ev[0][0] <= c:
                _, s = ev.popleft()
                lp = self._last_played_seq
                self._last_played_seq = s if lp is None else max(lp, s)
        if len(self._markers) > 64:
            self._markers = {m for m in self._markers if m >= c}
        base = est.base_at(now)
        cur = now - (c / rate + base)
        self._cur_delay = cur
        hi = cur - target
        frame_s = f / rate
        if hi > 0.3 + frame_s and self._max_end > c + f:
            # Far behind (e.g. the clock stalled): skip ahead in one go.
            want = math.floor((now - base - target) * rate)
            new_c = max(c, min(want, self._max_end - f))
            skipped = new_c - c
            if skipped > 0:
                self._ring.clear(c, skipped)
                self._dropped += skipped // f
                c = self._cursor = new_c
                cur = now - (c / rate + base)
                hi = cur - target
        i = c % self.capacity
        valid = self._ring.valid
        if not valid[i]:
            nxt = self._next_valid(c)
            loss = self._hole_is_loss(nxt)
            want = math.floor((now - base - target) * rate)
            if nxt is None:
                if loss:
                    return self._produce(c)
                # Silence with nothing buffered: keep the (virtual) cursor one frame
                # behind the target position so a slightly late talkspurt start still fits.
                if want - f > c:
                    self._ring.clear(c, want - f - c)
                    self._cursor = want - f
                self._comfort += 1
                self._pts = None
                return self._silence_fill(f)
            start = nxt if want >= nxt else nxt - f * math.ceil((nxt - want) / f)
            if start < c:
                if not loss:
                    self._comfort += 1
                    self._pts = None
                    return self._silence_fill(f)
                start = c
            if start > c:
                self._ring.clear(c, start - c)
                self._cursor = start
            return self._produce(start)
        if i + f <= self.capacity:
            full = bool(valid[i : i + f].all())
        else:
            full = bool(self._ring.view(valid, c, f).all())
        if not full:
            return self._produce(c)
        # continuous speech at the cursor
        frame = self._ring.view(self._ring.pcm, c, f)
        low = below_avg = False
        self._frames_seen += 1
        if self.follows_due:
            # The pop clock tracks the target itself: only a gross error (a stalled or
            # jumping clock) is worth a dropped or inserted frame.
            lo_gate, hi_gate = -2 * frame_s, 3 * frame_s
        else:
            lo_gate, hi_gate = 0.0, frame_s + 0.002
        if hi > hi_gate or hi < lo_gate or not self._frames_seen & 3:
            # Energy only matters when the delay may be adapted; the running
            # average is refreshed every 4th frame in between (it is cheap, not free).
            e = self._energy(frame)
            ema = self._energy_ema
            self._energy_ema = e if ema <= 0.0 else 0.8 * ema + 0.2 * e
            low = e <= 0.5 * ema
            below_avg = e <= ema
        if c in self._markers and hi < -0.002:
            self._markers.discard(c)
            self._comfort += 1
            self._pts = None
            return self._silence_fill(f)
        if (hi > hi_gate and low) or (hi > hi_gate + 0.008 and below_avg) or hi > 3 * frame_s:
            c2 = c + f
            j = c2 % self.capacity
            if j + f <= self.capacity:
                full2 = bool(valid[j : j + f].all())
            else:
                full2 = bool(self._ring.view(valid, c2, f).all())
            if full2:
                b = self._ring.view(self._ring.pcm, c2, f).astype(np.float64)
                x = self._xfade
                w = (np.arange(x) + 0.5) / x
                b[:x] = frame[:x] * (1.0 - w) + b[:x] * w
                out = self._plc.good(np.clip(np.rint(b), -32768, 32767).astype(np.int16))
                self._ring.clear(c, 2 * f)
                self._cursor = c + 2 * f
                self._last_played_seq = int(self._ring.seq[(c + 2 * f - 1) % self.capacity])
                self._pts = c2 - self._ts_off
                self._dropped += 1
                self._mode = "audio"
                return out
        if (hi < lo_gate and low) or (hi < lo_gate - 0.004 and below_avg) or hi < lo_gate - 0.010:
            self._inserted += 1
            self._pts = None
            self._mode = "audio"
            return self._plc.stretch(f)
        blend = self._mode != "silence"
        if not blend:
            self._plc.end_erasure()
        out = self._plc.good(frame.copy(), blend=blend)
        self._ring.clear(c, f)
        self._cursor = c + f
        self._last_played_seq = int(self._ring.seq[(c + f - 1) % self.capacity])
        self._pts = c - self._ts_off
        self._mode = "audio"
        return out

    def _produce(self, p: int) -> NDArray[np.int16]:
        """General frame at p: runs of buffered audio, concealment and silence."""
        f = self.frame_samples
        mask = self._ring.view(self._ring.valid, p, f).copy()
        data = self._ring.view(self._ring.pcm, p, f).copy()
        seqs = self._ring.view(self._ring.seq, p, f).copy()
        out = np.empty(f, dtype=np.int16)
        edges = [0, *(np.flatnonzero(mask[1:] != mask[:-1]) + 1).tolist(), f]
        any_loss = any_sil = False
        for a, b in itertools.pairwise(edges):
            if mask[a]:
                blend = self._mode != "silence"
                if not blend:
                    self._plc.end_erasure()
                out[a:b] = self._plc.good(data[a:b], blend=blend)
                self._last_played_seq = int(seqs[b - 1])
                self._mode = "audio"
            else:
                nxt = p + b if b < f else self._next_valid(p + b)
                if self._hole_is_loss(nxt):
                    out[a:b] = self._plc.conceal(b - a)
                    self._mode = "loss"
                    any_loss = True
                else:
                    out[a:b] = self._silence_fill(b - a)
                    any_sil = True
        self._ring.clear(p, f)
        self._cursor = p + f
        self._pts = p - self._ts_off
        if any_loss:
            self._concealed += 1
        elif any_sil:
            self._comfort += 1
        return out

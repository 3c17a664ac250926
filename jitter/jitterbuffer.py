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
  loss (PLC, counted `concealed`); otherwise it is DTX silence (a faded PLC
  tail, then comfort noise at the last RFC 3389 level, counted
  `comfort_noise`). The tail is 1 frame after a CN packet, which says the
  sender went quiet, and `UNANNOUNCED_TAIL_FRAMES` otherwise: with nothing
  newer buffered yet (a 20 ms target), a burst of loss mid-word is not known
  for one until the packet after it arrives, and playing it as silence put
  holes of digital zero into the caller's words, which the VAD and the
  recogniser took for pauses (a G.711 stream without DTX goes quiet this way
  only when it is lost).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from numpy.typing import NDArray

from jitter.jitter_ingest import _MAX_TIME_S, _SEEN_MASK, JitterIngest, JitterStats, _finite

__all__ = ["JitterBuffer", "JitterStats"]

#: Frames of fading concealment when the stream stops with no CN packet (as G.711
#: Appendix I, it reaches silence 60 ms into an erasure).
UNANNOUNCED_TAIL_FRAMES = 3


class JitterBuffer(JitterIngest):
    """Adaptive jitter buffer: push decoded packets, pop exactly one frame per tick.

    Construction and the push side are :class:`~jitter.jitter_ingest.JitterIngest`'s.
    """

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
        est = self._est
        return self._cursor / self.clock_rate + est.base_at(self._last_now) + est.target_s

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

    def _silence_fill(self, n: int) -> NDArray[np.int16]:
        cn = self._cng.generate(n)
        if self._mode != "silence":
            frames = 1 if self._announced else UNANNOUNCED_TAIL_FRAMES
            self._tail_len = self.frame_samples * frames if self._mode == "audio" else 0
            self._tail_left = self._tail_len
            if self._tail_left == 0:
                self._plc.end_erasure()
        self._mode = "silence"
        k = min(n, self._tail_left)
        if k > 0:
            syn = self._plc.conceal(k).astype(np.float64)
            t = self._tail_len
            pos = t - self._tail_left
            fade = 1.0 - (pos + np.arange(k) + 0.5) / t
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
        now = now_s
        if not (type(now) is float and -_MAX_TIME_S < now < _MAX_TIME_S):
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
                self._announced = True
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
        cap = self.capacity
        ring = self._ring
        i = c % cap
        valid = ring.valid
        j = i + f - 1
        if j < cap and valid[i] and valid[j] and ring.seq[i] == ring.seq[j]:
            # One packet wrote both ends, so all between: a write is one contiguous run,
            # and clears only ever end at the cursor (the usual frame: no scan needed).
            full = True
        else:
            run = valid[i : i + f] if j < cap else ring.view(valid, c, f)
            full = bool(run.all())
        if not full and not valid[i]:
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
        if not full:
            return self._produce(c)
        # continuous speech at the cursor
        frame = ring.pcm[i : i + f] if i + f <= cap else ring.view(ring.pcm, c, f)
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
                self._announced = False
                return out
        if (hi < lo_gate and low) or (hi < lo_gate - 0.004 and below_avg) or hi < lo_gate - 0.010:
            self._inserted += 1
            self._pts = None
            self._mode = "audio"
            return self._plc.stretch(f)
        blend = self._mode != "silence" or self._tail_left > 0  # into a fading tail
        if not blend:
            self._plc.end_erasure()
        out = self._plc.good(frame.copy(), blend=blend)
        if i + f <= cap:
            valid[i : i + f] = False
        else:
            ring.clear(c, f)
        self._cursor = c + f
        self._last_played_seq = int(ring.seq[(c + f - 1) % cap])
        self._pts = c - self._ts_off
        self._mode = "audio"
        self._announced = False
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
                blend = self._mode != "silence" or self._tail_left > 0  # into a fading tail
                if not blend:
                    self._plc.end_erasure()
                out[a:b] = self._plc.good(data[a:b], blend=blend)
                self._last_played_seq = int(seqs[b - 1])
                self._mode = "audio"
                self._announced = False
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

# size: one canceller whose parts (the two filters, the locator, the delay follower) share
#       the same spectra, history and window every block; split, each would reach into the rest
"""Line echo canceller: our own voice, as the line sends it back, taken out of what we hear.

A 2-wire line (a hybrid, a cheap handset, a speakerphone) returns the agent's voice 6-20 dB
down and 10-200 ms late, coloured by the line. Comparing loudness with our own voice
cannot tell that echo from a quiet caller; subtracting the echo can. We know exactly what
we sent (the reference), so an adaptive filter learns the echo path (delay, gain,
colouring) and subtracts its estimate; what is left, the residual, is the caller plus a
little residual echo and noise.

The filter is a partitioned-block frequency-domain adaptive filter (PBFDAF, the "MDF" of
Soo and Pang, 1990; Speex's canceller is one): one 20 ms tick is one block, the echo
tail is covered by ``tail_ms / 20`` partitions, every partition is updated per bin with
a normalised step, and the steps are proportionate to each partition's share of the
filter (IPNLMS), because a line echo path is sparse: a bulk delay, then a short response.
It costs a few FFTs of 320 points per tick, and nothing at all while no reference is in
the tail (the residual is then the input, bit for bit).

Double talk (the caller and our echo at once) makes any adaptive filter wander. We use
two filters (Ochiai's two-path canceller): a background filter that always adapts, and a
foreground filter that makes the output and only takes the background's coefficients
when those cancel clearly better. A wandering background is reset from the foreground.

The echo path's delay jumps over a call: the caller's phone plays our packets by RTP
timestamp and sends its frames on its own clock, our jitter buffer hands the agent one of
them per tick, and the agent counts its reference in those ticks; the jitter buffers on
both ends grow and shrink by frames as they adapt, and at a talkspurt's start our send grid
restarts, moving our send clock against the agent's tick by a fraction of a frame
(measured over loopback SIP calls with the wire caller's line echo: 180, 160, 140, 200 ms
from one reply to the next, 340 then 180 ms when our jitter buffer released after the
greeting, 210 then 187 ms from a reply to the ringback after it). A filter converged on
one delay then cancels nothing, and relearning with the small steps of a converged filter
took seconds, its residual echo meanwhile loud enough to pass for the caller. So while the
foreground leaves much of what comes back, its echo response is also tried at every other
delay in the tail, to the sample (one FFT convolution of the tail's reference, then a
correlation with what came back): a delay that cancels far better, and takes out at least
half of what came back, is the echo moved (the caller's speech, the same in every trial,
cannot make one better), and both filters move there, converged at once (:attr:`shifts`).
During such a spell neither filter learns for a few blocks: the background would learn the
echo's absence at the old delay, and the foreground, the one that moves, would take it. Nor
while what comes back is a hole, 10 dB or more under the echo expected (a phone muted, its
jitter buffer growing, an echo suppressor clamping): learning that absence forgot the echo,
and learning it again took 1-2.5 s once it was back (2-7 dB taken out in the first second
after a 1 s hole, against 30 dB before it). The filters wait through up to 2 s of a hole
unchanged. Nor do they learn, or promote, for a tail's length after the caller barges in
(:meth:`caller_talking`): our last words then fade under their speech, and no block is echo
alone. Nor while the echo's partitions hold a tone (ringback, a pip: ``learn=False`` in
:meth:`process`), which teaches a filter its own frequencies only.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["EchoCanceller"]

_F64 = NDArray[np.float64]
_ERL_BOUND = 0.25  # a line returns our voice at least 6 dB down (G.168)
_LEAK_SMOOTH = 0.05  # per block: the error and estimate spectra's means, ~0.4 s
_MIN_LEAK = 0.005
_LOCATE_SMOOTH = 0.05  # per block: the spectra behind the coherence, ~0.4 s
_LOCATE_BLOCKS = 20  # blocks of our voice before the coherence is trusted (0.4 s)
_LOCATE_MIN = 0.3  # coherence (energy-weighted, 0..1) that counts as an echo found
_LOCATE_RATIO = 2.0  # ... and by how much it must beat every partition away from it
_C128 = NDArray[np.complex128]
_SHIFT_TRIGGER = 0.1  # the foreground leaves over this share of what came back: try places
_SHIFT_BETTER = 0.25  # a place is taken when it leaves a quarter (6 dB) of the error or less
_SHIFT_BLOCKS = 2  # ... over this many blocks in a row (one block can be chance)
_SHIFT_HOLD = 8  # blocks of a spell of poor cancelling with no background promoted
_HOLE = 0.1  # what came back is under this share of the echo expected: the echo is missing
_HOLE_HOLD = 100  # blocks (2 s) of missing echo the filters wait through unchanged
_SHIFT_FLOOR = 1e-6 * 32768.0**2  # per sample: what came back (or was expected) >= -60 dBFS
_IDLE, _TRYING, _MOVED = 0, 1, 2
_WIDEST = 5  # partitions: the locator's window (4), and one more once moved by a fraction
_QUIET_REF = 1e-6 * 32768.0**2  # per sample: reference under -60 dBFS teaches nothing
_EVIDENT_ECHO = 10 ** (-65 / 10) * 32768.0**2  # per sample: an echo expected under -65 dBFS
_NO_EVIDENCE = 1e-3  # the filters' estimates differ 30 dB under the error: compare nothing


class EchoCanceller:
    """One call's canceller: :meth:`process` a block of what came back and the block of the
    reference that went out on the same tick; returns the residual (pure: no clock, no I/O).

    ``block``: samples per call (one tick); ``tail_ms``: the longest echo path delay
    (plus its spread) it can cancel; ``step``: the background filter's normalised step.
    """

    def __init__(
        self, *, rate: int = 8000, block: int = 160, tail_ms: float = 480.0, step: float = 1.0
    ) -> None:
        if block <= 0 or rate <= 0 or tail_ms <= 0:
            raise ValueError("rate, block and tail_ms must be positive")
        if not 0.0 < step <= 2.0:
            raise ValueError("step must be in (0, 2]")
        self.rate = rate
        self.block = block
        self.partitions = max(1, -(-round(tail_ms * rate / 1000) // block))
        self.step = step
        bins = block + 1
        p = self.partitions
        self._x: _C128 = np.zeros((p, bins), np.complex128)  # reference spectra, newest first
        self._x_pow: _F64 = np.zeros((p, bins))  # ... and their power, shifted with them
        # the foreground filter (the output) and the background (adapts), side by side so
        # that both estimates take one product and one inverse FFT
        self._filters: _C128 = np.zeros((2, p, bins), np.complex128)
        self._fg: _C128 = self._filters[0]
        self._bg: _C128 = self._filters[1]
        # the partitions each filter may hold anything in (the rest are zero, and the
        # estimates skip them): none yet
        self._fg_live = (0, 0)
        self._bg_live = (0, 0)
        # overlap-save input: the previous block and this one, of the reference (row 0) and
        # of what came back (row 1)
        self._frames: _F64 = np.zeros((2, 2 * block))
        # where the echo is: the coherence of what comes back with each partition's
        # reference, from smoothed cross- and auto-spectra (see _locate)
        self._cross: _C128 = np.zeros((p, bins), np.complex128)
        self._ref_pow: _F64 = np.zeros((p, bins))
        self._product: _C128 = np.zeros((p, bins), np.complex128)
        self._mic_pow: _F64 = np.zeros(bins)
        self.coherence: _F64 = np.zeros(p)
        self._heard_ours = 0  # blocks with our voice in the tail so far
        # which of the last blocks (newest first) carried our voice: a partition's
        # coherence counts once its reference held our voice over half the locator's horizon
        self._voiced: NDArray[np.bool_] = np.zeros(p + _LOCATE_BLOCKS, bool)
        # which of the tail's blocks (newest first) were given with learn=False: a tone
        self._tones: NDArray[np.bool_] = np.zeros(p, bool)
        #: The last block was learnt from (False while a tone is in the echo's partitions).
        self.learning = True
        #: The partitions that hold the echo (bulk delay found); None: not known yet, the
        #: whole tail adapts.
        self.window: tuple[int, int] | None = None
        self._idle = p  # blocks since the last non-silent reference block
        self._constrain = 0  # the partition whose gradient constraint is applied next
        self._ref_energy: _F64 = np.zeros(p)  # reference energy of the blocks in the tail
        self._adapted = 0.0  # steps taken before the filter counts as adapted
        self._e_mean: _F64 = np.zeros(bins)  # smoothed error and estimate power spectra
        self._y_mean: _F64 = np.zeros(bins)
        self._pey = self._pyy = 1.0  # their smoothed covariance and variance: the leak
        self.leak = 1.0  # the share of the echo estimate still found in the residual
        # the foreground test's smoothed statistics (see _compare)
        self._avg1 = self._avg2 = self._var1 = self._var2 = 0.0
        #: The echo estimate of the last block (what was subtracted), for the caller's
        #: residual-echo bookkeeping; zeros while idle.
        self.echo: _F64 = np.zeros(block)
        #: The energy of the last block's estimate when it was not subtracted because it
        #: fitted nothing that came back (0 otherwise, and in a hole: the echo missing).
        #: The filters are lost; the caller's bookkeeping must know (see EchoGate.confused).
        self.unfitted = 0.0
        self.copies = 0  # background -> foreground copies (convergence steps taken)
        self.resets = 0  # foreground -> background resets (the background wandered off)
        self.shifts = 0  # the echo's delay jumped and the filters followed (see _follow)
        # at the last move: the blocks before it cancelled at the old delay (their residual
        # was our echo, left where the filters no longer looked)
        self.moved_late = 0
        # per start (in samples) the echo's response may move to
        self._shift_err: _F64 = np.zeros(p * block + 1)
        # the reference's last samples: the tail and two blocks more (oldest first)
        self._history: _F64 = np.zeros((p + 2) * block)
        self._shift_blocks = 0  # blocks of the current spell of poor cancelling
        self._shift_evidence = 0  # ... in which something came back
        self._shift_mic = 0.0  # what came back in them (smoothed as _shift_err)
        self._shift_from = (0, 0)  # the echo's partitions when the spell began
        self._hole_blocks = 0  # blocks in a row in which our echo was missing (see _follow)
        self._frozen = 0  # blocks left in which nothing is learnt (see caller_talking)

    @property
    def _span(self) -> tuple[int, int]:
        """The partitions that work: the echo's, once found; all of them before."""
        return self.window if self.window is not None else (0, self.partitions)

    @property
    def adapted(self) -> bool:
        """The filter has had about as many full steps as it has partitions."""
        return self._adapted >= self.partitions

    @property
    def active(self) -> bool:
        """Some reference is still inside the tail: the residual differs from the input."""
        return self._idle < self.partitions

    def caller_talking(self) -> None:
        """The caller talks over us (a barge-in): our voice stops, its last words leave the
        tail under their speech. Until they have (one tail's length of blocks), neither
        filter learns and none is promoted: there is no echo-only block left to learn from,
        and each block is the caller's speech over a fading echo, which is what makes the
        background wander and the foreground test take it (measured over a SIP call with
        human speech: a filter cancelling 25 dB, promoted from a wandered background in the
        300 ms after a barge-in, cancelled the next reply's echo by 7-10 dB, loud enough to
        pass for the caller going on)."""
        self._frozen = self.partitions

    def process(
        self, mic: NDArray[np.generic], ref: NDArray[np.generic], *, learn: bool = True
    ) -> _F64:
        """``mic``: the block heard; ``ref``: the block we sent on the same tick (zeros
        when silent). Returns the residual, float64 on the input's scale.

        ``learn`` False: ``ref`` is a tone (ringback, a pip) or hold audio. Its echo is
        cancelled with what the filters know, but until it has left the echo's partitions
        nothing is learnt, compared, followed or located: a tone pair teaches the filter its
        two frequencies only, and excites every place of the tail alike (measured over a
        call with echo: a filter adapted and promoted on 300 ms of ringback whose delay had
        moved cancelled none of the apology after it, which was taken for the caller)."""
        n = self.block
        d = np.asarray(mic, dtype=np.float64)
        x = np.asarray(ref, dtype=np.float64)
        if d.shape != (n,) or x.shape != (n,):
            raise ValueError(f"mic and ref must be ({n},) blocks")
        silent = not x.any()
        if silent and self._idle >= self.partitions:
            self.echo = np.zeros(n)
            self.unfitted = 0.0
            return d.copy()  # nothing of ours in the tail: the input is untouched
        self._idle = self._idle + 1 if silent else 0
        # the newest reference spectrum (overlap-save: previous block, this block)
        # (and what came back: one FFT call for both)
        frames = self._frames
        frames[:, :n] = frames[:, n:]
        frames[0, n:] = x
        frames[1, n:] = d
        spectra = np.fft.rfft(frames)
        self._x[1:] = self._x[:-1]
        self._x[0] = spectra[0]
        self._x_pow[1:] = self._x_pow[:-1]
        self._x_pow[0] = spectra[0].real ** 2 + spectra[0].imag ** 2
        self._history[:-n] = self._history[n:]
        self._history[-n:] = x
        self._voiced[1:] = self._voiced[:-1]
        self._voiced[0] = not silent
        self._tones[1:] = self._tones[:-1]
        self._tones[0] = not learn and not silent
        if not self._tones.any():
            self._locate(spectra[1])
        estimates = self._estimates()
        y_fg: _F64 = estimates[0]
        y_bg: _F64 = estimates[1]
        e_fg = d - y_fg
        e_bg = d - y_bg
        # (a moved echo is still followed while frozen: a reply that starts then must not
        # leave its echo where the filters no longer look)
        lo, hi = self._span
        self.learning = not self._tones[lo:hi].any()
        if not self.learning:
            follow = _TRYING  # (as while a move is tried: nothing learnt or compared)
        else:
            follow = _IDLE if self.window is None else self._follow(d, e_fg)
        frozen, self._frozen = self._frozen > 0, max(0, self._frozen - 1)
        if follow == _MOVED:
            y_fg = self._estimates()[0]  # the filters moved with the echo
            e_fg = e_bg = d - y_fg
            y_bg = y_fg
        elif (
            follow == _IDLE
            and not frozen
            and _echo_evident(y_fg, y_bg)
            and self._compare(e_fg, e_bg)
        ):
            e_bg, y_bg = e_fg, y_fg  # reset: the background starts again from the foreground
        if follow != _TRYING and not frozen:  # (what comes back may not be where we look)
            self._adapt(e_bg, y_bg, float(np.dot(x, x)))
        elif frozen or not self.learning:
            self._note_reference(float(np.dot(x, x)))
        s_dd = float(np.dot(d, d))
        self.unfitted = 0.0
        if np.dot(e_fg, e_fg) > s_dd:
            # taking the estimate out adds to what came back: the echo it expects is not
            # there (a hole in the line, a path just moved). The residual would be our own
            # voice, negated; what came back is the better guess at the caller.
            s_yy = float(np.dot(y_fg, y_fg))
            if s_dd >= _HOLE * s_yy:  # something came back, and the filters fit none of it
                self.unfitted = s_yy
            self.echo = np.zeros(n)
            return d.copy()
        self.echo = y_fg
        return e_fg

    def _follow(self, mic: _F64, err: _F64) -> int:
        """While the foreground leaves much of what comes back, try its echo partitions at
        every other place in the tail; when one place leaves a quarter of the error or
        less (smoothed over the last blocks, _SHIFT_BLOCKS at least), and cancels half of
        what came back, move the filters (and the locator's statistics) there. Returns
        _MOVED, _TRYING (the first blocks of such a spell: the background, learning the
        echo's absence at the old delay, must not replace the foreground, the one to move;
        and any block of a hole, up to _HOLE_HOLD in a row) or _IDLE."""
        s_dd = float(np.dot(mic, mic))
        s_ee = float(np.dot(err, err))
        floor = _SHIFT_FLOOR * self.block
        if max(s_dd, s_ee) < floor or not self.adapted:  # nothing expected, nothing came
            self._shift_blocks = 0
            return _IDLE
        estimate = mic - err
        missing = s_dd < _HOLE * float(np.dot(estimate, estimate))
        if s_ee <= _SHIFT_TRIGGER * s_dd:  # (never so in a hole)
            self._hole_blocks = 0
            self._shift_blocks = 0
            return _IDLE
        lo, hi = self._span
        if self._shift_blocks == 0 or self._shift_from != (lo, hi):
            self._shift_err[:] = 0.0
            self._shift_mic = 0.0
            self._shift_evidence = 0
            self._shift_from = (lo, hi)
        self._shift_blocks += 1
        # a hole: what came back is far under the echo expected; the filters wait (only
        # that: what little came back is still evidence of where the echo went)
        self._hole_blocks = self._hole_blocks + 1 if missing else 0
        hold = _TRYING if self._hole_blocks and self._hole_blocks <= _HOLE_HOLD else _IDLE
        if s_dd < floor:  # nothing came back: no evidence of where
            return _TRYING if self._shift_blocks <= _SHIFT_HOLD else hold
        self._shift_evidence += 1
        taps = self._taps()
        reach = self.partitions * self.block - taps.size  # the latest start it can take
        errs = self._shift_err[: reach + 1]
        errs *= 0.5
        errs += self._trial(taps, mic)
        self._shift_mic = 0.5 * self._shift_mic + s_dd
        best = int(np.argmin(errs))
        now = lo * self.block
        if (
            self._shift_evidence >= _SHIFT_BLOCKS
            and best != now
            and errs[best] <= _SHIFT_BETTER * errs[now]
            and errs[best] <= 0.5 * self._shift_mic  # it cancels what came back
        ):
            self.moved_late = self._shift_blocks - 1  # (this block is cancelled at the new)
            self._move_to(best, taps)
            return _MOVED
        return _TRYING if self._shift_blocks <= _SHIFT_HOLD else hold

    def _taps(self) -> _F64:
        """The foreground's echo response over the echo's partitions, in samples: it starts
        ``window[0] * block`` samples late (each partition's first ``block`` taps: the
        gradient constraint keeps the rest near zero)."""
        lo, hi = self._span
        taps: _F64 = np.fft.irfft(self._fg[lo:hi], 2 * self.block, axis=1)[:, : self.block]
        return taps.ravel()

    def _trial(self, taps: _F64, mic: _F64) -> _F64:
        """What ``taps`` leave of ``mic`` (its energy) started at each delay 0 .. tail -
        taps, in samples, at once: the echo estimate for a start of D samples is the
        reference convolved with them, D samples back (one FFT convolution of the tail's
        reference, then a correlation with what came back and a running energy)."""
        n = self.block
        hist = self._history
        reach = self.partitions * n - taps.size
        size = 1 << int(hist.size + taps.size - 1).bit_length()
        full = np.fft.irfft(np.fft.rfft(hist, size) * np.fft.rfft(taps, size), size)
        # v[m: m + n]: this block's estimate for a start of reach - m samples
        v = full[hist.size - n - reach : hist.size]
        cross = np.correlate(v, mic, "valid")
        sq = np.concatenate([[0.0], np.cumsum(v * v)])
        energy = sq[n:] - sq[:-n]
        left: _F64 = (float(np.dot(mic, mic)) - 2.0 * cross + energy)[::-1]
        return np.maximum(left, 0.0)

    def _move_to(self, start: int, taps: _F64) -> None:
        """The echo now starts ``start`` samples late: the filters take ``taps`` there
        (a whole number of blocks away: the partitions as they are)."""
        n, p = self.block, self.partitions
        lo = self._span[0]
        k, part = divmod(start - lo * n, n)
        if part == 0:
            self._move(k)
            return
        response = np.zeros(p * n)
        response[start : start + taps.size] = taps
        first, last = start // n, min(p, -(-(start + taps.size) // n))
        blocks = np.zeros((last - first, 2 * n))
        blocks[:, :n] = response[first * n : last * n].reshape(-1, n)
        spectra = np.fft.rfft(blocks, axis=1)
        if last - first > _WIDEST:  # one partition more than the echo had: the weaker end
            ends = _energies(spectra[[0, -1]])
            if ends[0] < ends[1]:
                first, spectra = first + 1, spectra[1:]
            else:
                last, spectra = last - 1, spectra[:-1]
        self._place(spectra, first)
        self._roll_statistics(round((start - lo * n) / n))

    def _move(self, k: int) -> None:
        """The echo now comes ``k`` blocks later (earlier, if negative): so do the filters
        (the echo's partitions, as tried: nothing else) and the locator's statistics."""
        self._move_filters(k)
        self._roll_statistics(k)

    def _roll_statistics(self, k: int) -> None:
        """The locator's statistics, ``k`` blocks later (the echo moved)."""
        p = self.partitions
        if k == 0:
            return
        self._cross[:] = np.roll(self._cross, k, axis=0)
        if k > 0:
            self._cross[:k] = 0.0
        else:
            self._cross[p + k :] = 0.0
        self._ref_pow[:] = np.roll(self._ref_pow, k, axis=0)  # (its ends: old, decaying)

    def _move_filters(self, k: int) -> None:
        """Both filters' echo partitions (the window's), ``k`` blocks later, and the window
        with them: the foreground is the same echo path, only later."""
        lo, hi = self._span
        self._place(self._fg[lo:hi].copy(), lo + k)

    def _place(self, echo: _C128, first: int) -> None:
        """Both filters become ``echo`` (partitions) from partition ``first`` on, nothing
        elsewhere; the window is there. A move (:attr:`shifts`): the test starts over."""
        self._fg[:] = 0.0
        self._fg[first : first + len(echo)] = echo
        self._bg[:] = self._fg
        self.window = (first, first + len(echo))
        self._fg_live = self._bg_live = self.window
        self._avg1 = self._avg2 = self._var1 = self._var2 = 0.0
        self._shift_blocks = 0
        self.shifts += 1

    def _locate(self, mic: _C128) -> None:
        """Find the echo's bulk delay: the partition whose reference is most coherent with
        what comes back. Why: an adaptive filter over the whole tail learns a delayed echo
        slowly (speech correlates with its own recent past, so early steps also grow the
        partitions in front of the echo); told where the echo is, it adapts only there and
        converges as fast as for an echo with no delay (measured: ~20 dB in 1 s, against
        ~3 s over the whole tail)."""
        a = _LOCATE_SMOOTH
        xs = self._x
        product = self._product  # (a scratch array: no allocation per block)
        np.conjugate(xs, out=product)
        product *= a * mic[None, :]
        self._cross *= 1.0 - a
        self._cross += product
        self._ref_pow += a * (self._x_pow - self._ref_pow)
        self._mic_pow += a * (mic.real**2 + mic.imag**2 - self._mic_pow)
        num = _energies(self._cross)  # |cross|^2, per partition
        den = self._ref_pow @ self._mic_pow + 1.0
        self.coherence = num / den
        self._heard_ours += 1
        if self._heard_ours < _LOCATE_BLOCKS:  # few averages: every coherence looks high
            return
        coherence = self.coherence
        best = int(np.argmax(coherence))
        before, after = coherence[: max(0, best - 1)], coherence[best + 2 :]
        rest = max(float(before.max()) if before.size else 0.0,
                   float(after.max()) if after.size else 0.0)  # fmt: skip
        clear = coherence[best] > _LOCATE_MIN and coherence[best] > _LOCATE_RATIO * rest
        # (a partition whose reference was silent until a block or two ago looks coherent
        # with anything new that comes back: the caller starting to talk as our reply
        # starts. Measured: the window thrown to 20-100 ms, the echo at 190 ms)
        heard = int(self._voiced[best : best + _LOCATE_BLOCKS].sum())
        if not clear or heard < _LOCATE_BLOCKS // 2:
            return
        if self.window is not None and self.window[0] <= best - 1 and best + 1 < self.window[1]:
            return  # the echo's partitions are inside the window already
        window = (max(0, best - 1), min(self.partitions, best + 3))
        if window == self.window:
            return
        if self.adapted and self.window is not None and not self._holds_echo(window):
            # the filters know the echo path: where it moved, they move with it (left where
            # they were, the window would hold little of the foreground's echo, and _follow,
            # which tries the window's partitions elsewhere, could never find it again).
            # Only while they cancel poorly (a foreground that cancels is where the echo
            # is), and by as many blocks as lay the foreground's partitions over the
            # coherence best: an echo between two partitions moves the coherence's peak from
            # one to the other and back, and must not move the filters
            if self._shift_blocks:
                k = self._offset_to(coherence)
                if k:
                    self._move_filters(k)
            return
        self.window = window
        outside = np.ones(self.partitions, bool)
        outside[window[0] : window[1]] = False
        self._bg[outside] = 0.0  # what the background grew in front of the echo
        self._bg_live = window

    def _holds_echo(self, window: tuple[int, int]) -> bool:
        """``window`` holds nine tenths of the foreground's energy, or more."""
        size = _energies(self._fg)
        return float(size[window[0] : window[1]].sum()) >= 0.9 * float(size.sum())

    def _offset_to(self, coherence: _F64) -> int:
        """How many blocks later (earlier, if negative) the foreground's echo partitions lie
        best over ``coherence``: 0 unless a move fits it clearly better (_LOCATE_RATIO)."""
        lo, hi = self._span
        size = _energies(self._fg[lo:hi])
        moves = range(-lo, self.partitions - hi + 1)
        fits = np.array([float(size @ coherence[lo + k : hi + k]) for k in moves])
        best = int(np.argmax(fits))
        if fits[best] <= _LOCATE_RATIO * fits[lo]:  # (moves[lo] is no move)
            return 0
        return moves[best]

    def _estimates(self) -> _F64:
        """The echo each filter predicts for the newest block (the last half of the
        circular convolution: overlap-save): row 0 the foreground's, row 1 the background's.
        Over the partitions either filter holds anything in."""
        lo = min(self._fg_live[0], self._bg_live[0])
        hi = max(self._fg_live[1], self._bg_live[1])
        if lo >= hi:
            return np.zeros((2, self.block))
        spectra = np.einsum("fpk,pk->fk", self._filters[:, lo:hi], self._x[lo:hi])
        out: _F64 = np.fft.irfft(spectra, 2 * self.block, axis=1)[:, self.block :]
        return out

    def _adapt(self, err: _F64, echo: _F64, ref_energy: float) -> None:
        """One normalised, proportionate step of the background filter towards ``err``,
        each bin's step scaled by how much of its error is echo (see :meth:`_rates`)."""
        n = self.block
        padded = np.zeros((2, 2 * n))
        padded[0, n:] = err
        padded[1, n:] = echo
        e, y = np.fft.rfft(padded)
        rate = self._rates(e, y, float(np.dot(err, err)), float(np.dot(echo, echo)), ref_energy)
        if rate is None:
            return
        # IPNLMS: half the step shared evenly, half in proportion to each partition's size,
        # normalised per bin by the reference power the filter sees, weighted the same way;
        # once the echo is found, over its partitions only (the others stay zero)
        lo, hi = self._span
        bg, xs = self._bg[lo:hi], self._x[lo:hi]
        size = np.sqrt(_energies(bg))
        total = float(size.sum())
        m = hi - lo
        if total <= 0.0:
            share = np.full(m, 1.0 / m)
        else:  # (the even half as over the whole tail: the echo's partitions lead)
            share = 0.5 / self.partitions + 0.5 * size / total
            share /= share.sum()
        power = share @ self._x_pow[lo:hi]
        gain = self.step * rate / (power + 1e-2 * float(power.mean()) + 1.0)  # quiet bins
        bg += share[:, None] * (np.conj(xs) * (e * gain)[None, :])
        live = self._bg_live
        self._bg_live = (min(live[0], lo), max(live[1], hi)) if live[0] < live[1] else (lo, hi)
        # the gradient constraint (the filter is N taps per partition, not 2N), applied to
        # one partition per block in turn (Speex's "AUMDF"): cheap, and stable. In turn
        # over the partitions that adapt (the others are zero): over the whole tail, each
        # of the echo's went unconstrained for 24 blocks and its wrapped half grew (seen:
        # a filter 10x too large within three blocks of a loud reply start)
        j = self._constrain if lo <= self._constrain < hi else lo
        taps = np.fft.irfft(self._bg[j], 2 * n)
        taps[n:] = 0.0
        self._bg[j] = np.fft.rfft(taps)
        self._constrain = j + 1

    def _note_reference(self, s_xx: float) -> None:
        self._ref_energy[1:] = self._ref_energy[:-1]
        self._ref_energy[0] = s_xx

    def _rates(
        self, e: _C128, y: _C128, s_ee: float, s_yy: float, s_xx: float
    ) -> NDArray[np.float64] | float | None:
        """The step per bin, 0..1: the share of the error that is echo the filter has yet
        to learn (the optimal NLMS step). Near-end speech in the error lowers it, so the
        caller talking over us does not teach the filter their voice.

        Until the filter has adapted, that share is bounded by the echo a line can return
        (at least 6 dB down, G.168) of our recent voice. After, it is the leak (the part of
        the echo estimate still found in the error, learnt by regression of the error's
        power on the estimate's, which near-end speech does not bias) times the estimate.
        None: nothing to learn from (no reference energy in the tail)."""
        self._note_reference(s_xx)
        loudest = float(self._ref_energy.max())
        if loudest <= 0.0:
            return None
        s_ee += 1.0
        if not self.adapted:
            rate = min(1.0, _ERL_BOUND * loudest / s_ee)
            self._adapted += rate * min(1.0, 2.0 * s_yy / s_ee)  # counts once it explains
            return rate  # some of what comes back
        # what the filter's own partitions see: at a talkspurt's start the newest blocks
        # are loud while the echo's (a delay back) still hold the silence before it, and
        # steps normalised by that silence fit the line's noise (measured: a filter
        # converged to 25 dB, wrecked in the 180 ms before a reply's echo came back)
        lo, hi = self._span
        near = float(self._ref_energy[lo:hi].max())
        if near < _QUIET_REF * self.block:
            return None
        e_pow = e.real**2 + e.imag**2
        y_pow = y.real**2 + y.imag**2
        self._e_mean += _LEAK_SMOOTH * (e_pow - self._e_mean)
        self._y_mean += _LEAK_SMOOTH * (y_pow - self._y_mean)
        de, dy = e_pow - self._e_mean, y_pow - self._y_mean
        pey, pyy = float(np.dot(de, dy)), float(np.dot(dy, dy))
        if pyy > 0.0:
            pyy = pyy**0.5
            w = min(0.5 * s_yy, 0.2 * s_ee) / s_ee  # echo-dominated blocks teach fastest
            self._pey += w * (pey / pyy - self._pey)
            self._pyy += w * (pyy - self._pyy)
        self._pyy = max(self._pyy, 1.0)
        self._pey = min(max(self._pey, _MIN_LEAK * self._pyy), self._pyy)
        self.leak = self._pey / self._pyy
        echo_share = min(0.5, (1e-4 * near + 3.0 * self.leak * s_yy) / s_ee)
        # (the echo left per bin is at most half the error, as Speex's MDF bounds it: a
        # wrong estimate, large in a bin, must not earn itself a large step there)
        r = 0.7 * np.minimum(self.leak * y_pow, 0.5 * e_pow) + 0.3 * echo_share * e_pow
        rates: NDArray[np.float64] = r / (e_pow + 1.0)
        return rates

    def _compare(self, fg: _F64, bg: _F64) -> bool:
        """Promote a background that cancels significantly better; reset one that went off
        course. Returns whether the background was reset (its error is then the foreground's).

        Why the test has this shape: with near-end speech ``n`` in the input, the two error
        energies differ by the echo each filter leaves plus a cross term ``2 n . (y_b - y_f)``
        whose spread is about ``sqrt(S_ff * D_bf)`` (D_bf: the energy of the difference of
        the two estimates). A difference well beyond that spread is the filters' doing, not
        the caller's; one within it may be the caller's speech fitted by the background
        (the test of Speex's MDF, which runs it over one block and two smoothed horizons).
        """
        s_ff = float(np.dot(fg, fg))
        s_bb = float(np.dot(bg, bg))
        diff = fg - bg
        d_bf = float(np.dot(diff, diff)) + 1.0
        if d_bf < _NO_EVIDENCE * s_ff:
            # the two estimates differ by next to nothing against what came back (our voice
            # has left the tail, the caller talks on): the block cannot tell the filters
            # apart, only the caller's speech can tip the test. Measured: a background that
            # wandered in the caller's speech over our last words was promoted on such a
            # block (its estimate 34 dB under what came back), and the next reply's echo
            # was cancelled 10 dB instead of 25 and taken for the caller
            return False
        gain = s_ff - s_bb
        self._avg1 = 0.6 * self._avg1 + 0.4 * gain
        self._var1 = 0.36 * self._var1 + 0.16 * s_ff * d_bf
        self._avg2 = 0.85 * self._avg2 + 0.15 * gain
        self._var2 = 0.7225 * self._var2 + 0.0225 * s_ff * d_bf
        if (
            gain * abs(gain) > s_ff * d_bf
            or self._avg1 * abs(self._avg1) > 0.5 * self._var1
            or self._avg2 * abs(self._avg2) > 0.25 * self._var2
        ):
            self._fg[:] = self._bg
            self._fg_live = self._bg_live
            self.copies += 1
            self._avg1 = self._avg2 = self._var1 = self._var2 = 0.0
            return False
        if (
            -gain * abs(gain) > 4.0 * s_ff * d_bf
            or -self._avg1 * abs(self._avg1) > 4.0 * self._var1
            or -self._avg2 * abs(self._avg2) > 4.0 * self._var2
        ):
            self._bg[:] = self._fg
            self._bg_live = self._fg_live
            self.resets += 1
            self._avg1 = self._avg2 = self._var1 = self._var2 = 0.0
            return True
        return False


def _energies(partitions: _C128) -> _F64:
    """Each partition's energy (the sum of its bins' squared magnitudes), as (re, im) pairs
    in one product."""
    parts = np.ascontiguousarray(partitions).view(np.float64)
    out: _F64 = np.einsum("pk,pk->p", parts, parts)
    return out


def _echo_evident(fg: _F64, bg: _F64) -> bool:
    """Either filter expects an echo over the line's noise: a block with less cannot tell
    them apart (what came back there is noise, or the caller)."""
    return max(float(np.dot(fg, fg)), float(np.dot(bg, bg))) >= _EVIDENT_ECHO * fg.size

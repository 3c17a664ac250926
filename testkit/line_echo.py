"""A phone line's echo of what it is sent, and callers at real line levels, for tests and bench.

A 2-wire hybrid returns part of the far end's voice: late (network and line delay), down
by the echo return loss (ERL, 6-20 dB; G.168 requires at least 6), and coloured by the
hybrid's mismatch, a band-pass with a few milliseconds of ringing. :class:`LineEcho` is
that path, streaming and exact in samples (delay, ERL, colouring, G.711 both ways);
:func:`at_level` scales speech to an active-speech level (dBFS over its voiced frames,
as P.56 measures it, roughly); :func:`line_noise` is the hiss under it all.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy.signal import butter, lfilter, sosfilt

from resample.g711 import ulaw_decode, ulaw_encode

__all__ = [
    "HYBRID",
    "LineEcho",
    "active_level_dbfs",
    "at_level",
    "hybrid_response",
    "line_noise",
]

RATE = 8000


def hybrid_response(rate: int = RATE) -> NDArray[np.float64]:
    """The colouring of a mismatched hybrid: 300-3400 Hz band-pass, a little ringing and a
    weak second reflection 3 ms later; unit energy (the ERL sets the level)."""
    sos = butter(2, [300, 3400], btype="bandpass", fs=rate, output="sos")
    impulse = np.zeros(round(0.016 * rate))
    impulse[0] = 1.0
    impulse[round(0.003 * rate)] = -0.3
    h: NDArray[np.float64] = sosfilt(sos, impulse)
    out: NDArray[np.float64] = h / np.sqrt(np.sum(h**2))
    return out


HYBRID = hybrid_response()


class LineEcho:
    """What comes back from the line for what we send: delayed, attenuated, coloured.

    ``erl_db``: echo return loss (None: no echo at all); ``delay_ms``: the bulk delay,
    any number of samples; ``colour``: the hybrid's response (None: a flat path).
    :meth:`process` takes any block of what we sent and returns the echo of the same
    length (float64), so it streams: block boundaries do not change the output.
    """

    def __init__(
        self,
        erl_db: float | None,
        delay_ms: float,
        *,
        colour: NDArray[np.float64] | None = HYBRID,
        rate: int = RATE,
    ) -> None:
        self.gain = 0.0 if erl_db is None else 10 ** (-erl_db / 20)
        self.delay = round(delay_ms * rate / 1000)
        self.colour = np.array([1.0]) if colour is None else np.asarray(colour, np.float64)
        self._line = np.zeros(self.delay)
        self._zi = np.zeros(self.colour.size - 1)

    def process(self, sent: NDArray[np.generic]) -> NDArray[np.float64]:
        x = np.asarray(sent, dtype=np.float64)
        line = np.concatenate((self._line, x))
        out, self._line = line[: x.size], line[x.size :]
        shaped, self._zi = lfilter(self.colour, [1.0], out, zi=self._zi)
        result: NDArray[np.float64] = shaped * self.gain
        return result


def g711(pcm: NDArray[np.generic]) -> NDArray[np.int16]:
    """Through a PCMU encoder and decoder (what a line does to every sample)."""
    a = np.clip(np.rint(np.asarray(pcm, dtype=np.float64)), -32768, 32767).astype(np.int16)
    out: NDArray[np.int16] = ulaw_decode(ulaw_encode(a))
    return out


def active_level_dbfs(pcm: NDArray[np.generic], frame: int = 160) -> float:
    """Active speech level in dBFS, in the manner of ITU-T P.56: the mean power of the
    frames no more than 15.9 dB under that level (found by iterating from the mean), so
    pauses and a recording's room noise do not pull it down."""
    x = np.asarray(pcm, dtype=np.float64)
    fr = x[: x.size // frame * frame].reshape(-1, frame)
    p = np.mean(fr**2, axis=1)
    level = float(np.mean(p))
    for _ in range(20):
        active = p[p >= level * 10 ** (-15.9 / 10)]
        new = float(np.mean(active))
        if abs(new - level) <= 1e-6 * level:
            break
        level = new
    return float(10 * np.log10(level / 32768**2))


def at_level(pcm: NDArray[np.generic], dbfs: float) -> NDArray[np.float64]:
    """``pcm`` scaled so that its active speech level is ``dbfs`` (float64, unclipped)."""
    x = np.asarray(pcm, dtype=np.float64)
    out: NDArray[np.float64] = x * 10 ** ((dbfs - active_level_dbfs(x)) / 20)
    return out


def line_noise(samples: int, dbfs: float = -60.0, seed: int = 0) -> NDArray[np.float64]:
    """Telephone-band hiss at ``dbfs`` RMS."""
    rng = np.random.default_rng(seed)
    sos = butter(2, [200, 3500], btype="bandpass", fs=RATE, output="sos")
    n = sosfilt(sos, rng.standard_normal(samples + 400))[400:]
    out: NDArray[np.float64] = n / np.sqrt(np.mean(n**2)) * 32768 * 10 ** (dbfs / 20)
    return out

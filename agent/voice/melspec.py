"""Whisper-style log-mel features in plain numpy, for smart-turn v3.

smart-turn v3 was trained on the features of Hugging Face's ``WhisperFeatureExtractor``
(``chunk_length=8``, ``do_normalize=True``); torch and transformers are not runtime
dependencies, so the same numbers are computed here: zero-mean / unit-variance waveform,
centred (reflect-padded) STFT with a periodic Hann window (n_fft 400, hop 160), power
spectrum, 80 Slaney-normalised Slaney-scale mel filters over 0..8 kHz, log10 with a 1e-10
floor, dynamic range clamped to 8 (max - 8), then ``(x + 4) / 4``. The last STFT frame is
dropped so 8 s (128,000 samples) give exactly 800 frames.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "HOP",
    "N_FFT",
    "N_MELS",
    "SAMPLE_RATE",
    "hann_periodic",
    "log_mel",
    "mel_filters",
    "power_spectrogram",
]

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
N_MELS = 80
_MEL_FLOOR = 1e-10
_NORM_EPS = 1e-7  # added to the variance, as transformers does

# Slaney mel scale: linear below 1 kHz (3 mel per 200 Hz), logarithmic above.
_F_SP = 200.0 / 3.0
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP  # 15
_LOGSTEP = np.log(6.4) / 27.0


def _hz_to_mel(hz: NDArray[np.float64]) -> NDArray[np.float64]:
    hz = np.asarray(hz, dtype=np.float64)
    lin = hz / _F_SP
    with np.errstate(divide="ignore"):
        log = _MIN_LOG_MEL + np.log(np.maximum(hz, 1e-12) / _MIN_LOG_HZ) / _LOGSTEP
    return np.where(hz >= _MIN_LOG_HZ, log, lin)


def _mel_to_hz(mel: NDArray[np.float64]) -> NDArray[np.float64]:
    mel = np.asarray(mel, dtype=np.float64)
    lin = mel * _F_SP
    log = _MIN_LOG_HZ * np.exp(_LOGSTEP * (mel - _MIN_LOG_MEL))
    return np.where(mel >= _MIN_LOG_MEL, log, lin)


@lru_cache(maxsize=4)
def mel_filters(
    n_mels: int = N_MELS, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE
) -> NDArray[np.float64]:
    """Triangular filters, shape (n_mels, n_fft // 2 + 1), each scaled to unit area
    (Slaney "norm"), so a white spectrum gives the same level in every band."""
    fft_hz = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges_mel = np.linspace(
        _hz_to_mel(np.array(0.0)), _hz_to_mel(np.array(sample_rate / 2)), n_mels + 2
    )
    edges = _mel_to_hz(edges_mel)
    lo, centre, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (fft_hz[None, :] - lo) / (centre - lo)
    falling = (hi - fft_hz[None, :]) / (hi - centre)
    tri = np.maximum(0.0, np.minimum(rising, falling))
    out: NDArray[np.float64] = tri * (2.0 / (hi - lo))
    out.setflags(write=False)
    return out


def hann_periodic(n: int = N_FFT) -> NDArray[np.float64]:
    """Periodic Hann (torch.hann_window's default): the DFT-even window STFTs use."""
    k = np.arange(n, dtype=np.float64)
    out: NDArray[np.float64] = 0.5 - 0.5 * np.cos(2.0 * np.pi * k / n)
    return out


def power_spectrogram(
    x: NDArray[np.floating], n_fft: int = N_FFT, hop: int = HOP
) -> NDArray[np.float64]:
    """|STFT|^2, centred: reflect-padded by n_fft/2 each side; shape (n_fft//2+1, frames)."""
    xp = np.pad(np.asarray(x, dtype=np.float64), n_fft // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(xp, n_fft)[::hop]
    spec = np.fft.rfft(frames * hann_periodic(n_fft), axis=-1)
    out: NDArray[np.float64] = (spec.real**2 + spec.imag**2).T
    return out


def log_mel(audio: NDArray[np.floating], n_frames: int = 800) -> NDArray[np.float32]:
    """Features of exactly ``n_frames * HOP`` samples of 16 kHz audio in [-1, 1] (any scale
    works: the waveform is normalised first); shape (N_MELS, n_frames), float32."""
    x = np.asarray(audio, dtype=np.float32)
    if x.ndim != 1 or x.size != n_frames * HOP:
        raise ValueError(f"need {n_frames * HOP} mono samples, got shape {x.shape}")
    # Normalised in float32, as the reference does, before the float64 STFT.
    x = (x - x.mean()) / np.sqrt(x.var() + np.float32(_NORM_EPS))
    power = power_spectrogram(x)[:, :n_frames]  # the centred STFT has one frame extra
    mel = np.log10(np.maximum(_MEL_FLOOR, mel_filters() @ power))
    mel = np.maximum(mel, mel.max() - 8.0)
    out: NDArray[np.float32] = ((mel + 4.0) / 4.0).astype(np.float32)
    return out

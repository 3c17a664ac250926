"""G.711 Appendix I style packet-loss concealment."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from jitter import Concealer


def vowel(f0: float, n: int, rate: int = 8000, phase: float = 0.0) -> NDArray[np.int16]:
    """A vowel-like harmonic series with a formant-ish spectral tilt."""
    t = np.arange(n) / rate
    x = np.zeros(n)
    for k in range(1, 12):
        if k * f0 > rate / 2 * 0.9:
            break
        amp = 1.0 / k * (1.8 if 500 < k * f0 < 900 else 1.0)
        x += amp * np.sin(2 * np.pi * k * f0 * t + phase * k)
    x *= 9000 / np.max(np.abs(x))
    return x.astype(np.int16)


def snr_db(ref: NDArray[np.int16], est: NDArray[np.int16]) -> float:
    r = ref.astype(np.float64)
    e = r - est.astype(np.float64)
    return float(10 * np.log10(np.sum(r * r) / max(np.sum(e * e), 1e-9)))


def run_with_loss(
    sig: NDArray[np.int16], lost: range, frame: int, plc: Concealer | None
) -> NDArray[np.int16]:
    out = []
    for i in range(0, sig.size, frame):
        k = i // frame
        if k in lost:
            out.append(plc.conceal(frame) if plc else np.zeros(frame, np.int16))
        else:
            out.append(plc.good(sig[i : i + frame]) if plc else sig[i : i + frame])
    return np.concatenate(out)


@pytest.mark.parametrize("f0", [120.0, 150.0, 173.0, 200.0])
def test_concealment_beats_silence_by_10db(f0: float) -> None:
    sig = vowel(f0, 160 * 20)
    lost = range(10, 11)
    sl = slice(10 * 160, 11 * 160)
    plc_out = run_with_loss(sig, lost, 160, Concealer(8000))
    sil_out = run_with_loss(sig, lost, 160, None)
    assert snr_db(sig[sl], plc_out[sl]) >= snr_db(sig[sl], sil_out[sl]) + 10.0
    # the frames around the hole stay close to the original (the blend is smooth)
    around = slice(9 * 160, 12 * 160)
    assert snr_db(sig[around], plc_out[around]) > 10.0


@pytest.mark.parametrize("f0", [120.0, 160.0, 200.0])
def test_no_discontinuity_at_boundaries(f0: float) -> None:
    sig = vowel(f0, 160 * 20)
    out = run_with_loss(sig, range(8, 10), 160, Concealer(8000)).astype(np.int64)
    max_natural = int(np.max(np.abs(np.diff(sig.astype(np.int64)))))
    for b in (8 * 160, 10 * 160):
        jumps = np.abs(np.diff(out[b - 4 : b + 4]))
        assert int(jumps.max()) <= 1.5 * max_natural


def test_energy_decays_to_silence_by_60ms() -> None:
    sig = vowel(150.0, 160 * 10)
    plc = Concealer(8000)
    for i in range(0, sig.size, 160):
        plc.good(sig[i : i + 160])
    syn = plc.conceal(8 * 80).astype(np.float64)  # 80 ms in 10 ms steps below
    rms = [float(np.sqrt(np.mean(syn[i : i + 80] ** 2))) for i in range(0, syn.size, 80)]
    ref = float(np.sqrt(np.mean(sig.astype(np.float64) ** 2)))
    assert rms[0] > 0.5 * ref  # first 10 ms unattenuated
    assert rms[2] < rms[1] < rms[0] * 1.1
    assert rms[5] < 0.15 * ref  # 50-60 ms: nearly silent
    assert max(rms[6:]) < 1.0  # from 60 ms on: silence


@pytest.mark.parametrize("rate", [8000, 16000])
@pytest.mark.parametrize("f0", [70.0, 120.0, 150.0, 200.0, 250.0, 380.0])
def test_pitch_estimate_within_2_samples(rate: int, f0: float) -> None:
    plc = Concealer(rate)
    sig = vowel(f0, rate // 10, rate)
    plc.good(sig)
    truth = rate / f0
    assert abs(plc.estimate_pitch() - truth) <= 2 * rate / 8000


def test_after_long_erasure_the_good_frame_fades_in() -> None:
    sig = vowel(150.0, 160 * 12)
    plc = Concealer(8000)
    for i in range(0, 160 * 5, 160):
        plc.good(sig[i : i + 160])
    for _ in range(5):  # 100 ms: synthesis is silent by now
        plc.conceal(160)
    nxt = sig[160 * 10 : 160 * 11]
    out = plc.good(nxt)
    assert abs(int(out[0])) < 0.2 * np.max(np.abs(nxt))  # ramps in, no click
    np.testing.assert_array_equal(out[80:], nxt[80:])  # blend <= 10 ms


def test_stretch_is_pitch_repetition_without_fade() -> None:
    sig = vowel(160.0, 160 * 6)
    plc = Concealer(8000)
    for i in range(0, sig.size, 160):
        plc.good(sig[i : i + 160])
    ext = plc.stretch(320).astype(np.float64)
    ref = float(np.sqrt(np.mean(sig.astype(np.float64) ** 2)))
    assert float(np.sqrt(np.mean(ext[-80:] ** 2))) > 0.6 * ref
    assert plc.pitch == pytest.approx(50, abs=2)


def test_concealment_of_silence_is_silent_and_24k_works() -> None:
    plc = Concealer(24000)
    out = plc.conceal(480)
    assert out.dtype == np.int16 and out.size == 480 and not out.any()
    plc.good(np.zeros(480, np.int16))
    assert plc.conceal(0).size == 0

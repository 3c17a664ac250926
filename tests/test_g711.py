"""G.711 codecs: bit-exact against CPython's audioop over every code and every int16."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from resample import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    # Stdlib on 3.11/3.12; on Python >= 3.13 the `audioop-lts` package provides this module.
    import audioop

ALL_CODES = np.arange(256, dtype=np.uint8)
ALL_PCM = np.arange(-32768, 32768, dtype=np.int32).astype(np.int16)


def test_ulaw_encode_all_int16_matches_audioop() -> None:
    assert ulaw_encode(ALL_PCM).tobytes() == audioop.lin2ulaw(ALL_PCM.tobytes(), 2)


def test_alaw_encode_all_int16_matches_audioop() -> None:
    assert alaw_encode(ALL_PCM).tobytes() == audioop.lin2alaw(ALL_PCM.tobytes(), 2)


def test_ulaw_decode_all_codes_matches_audioop() -> None:
    assert ulaw_decode(ALL_CODES).tobytes() == audioop.ulaw2lin(ALL_CODES.tobytes(), 2)


def test_alaw_decode_all_codes_matches_audioop() -> None:
    assert alaw_decode(ALL_CODES).tobytes() == audioop.alaw2lin(ALL_CODES.tobytes(), 2)


def test_dtypes_and_shapes() -> None:
    x = np.array([0, 1, -1, 32767, -32768], dtype=np.int16)
    for enc, dec in ((ulaw_encode, ulaw_decode), (alaw_encode, alaw_decode)):
        codes = enc(x)
        assert codes.dtype == np.uint8 and codes.shape == x.shape
        out = dec(codes)
        assert out.dtype == np.int16 and out.shape == x.shape
        assert enc(np.empty(0, dtype=np.int16)).shape == (0,)


def test_decode_accepts_rtp_payload_bytes() -> None:
    payload = bytes(range(256))
    assert np.array_equal(ulaw_decode(payload), ulaw_decode(ALL_CODES))
    assert np.array_equal(alaw_decode(payload), alaw_decode(ALL_CODES))


def test_encode_rejects_non_int16() -> None:
    with pytest.raises(TypeError):
        ulaw_encode(np.zeros(4, dtype=np.float32))


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
def test_decode_encode_round_trip_is_identity_on_levels(law: str) -> None:
    enc, dec = (ulaw_encode, ulaw_decode) if law == "ulaw" else (alaw_encode, alaw_decode)
    levels = dec(ALL_CODES)
    assert np.array_equal(dec(enc(levels)), levels)


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
def test_sine_snr(law: str) -> None:
    """G.711 is ~38 dB SNR for a loud tone; far below means a broken segment table."""
    enc, dec = (ulaw_encode, ulaw_decode) if law == "ulaw" else (alaw_encode, alaw_decode)
    t = np.arange(8000) / 8000
    x = np.rint(16000 * np.sin(2 * np.pi * 1004 * t)).astype(np.int16)
    err = dec(enc(x)).astype(np.float64) - x
    snr = 10 * np.log10(np.sum(x.astype(np.float64) ** 2) / np.sum(err**2))
    assert snr > 35.0


def test_monotonic_decode_order() -> None:
    """Larger magnitude codes decode to larger magnitudes within each sign half."""
    for dec in (ulaw_decode, alaw_decode):
        levels = np.sort(dec(ALL_CODES).astype(np.int32))
        assert levels[0] < 0 < levels[-1]
        assert len(np.unique(levels)) >= 255

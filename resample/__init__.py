"""Pure media DSP for the bridge: G.711 codecs and streaming telephone-band resamplers."""

from resample.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from resample.resampler import SUPPORTED_RATES, FilterDesign, Resampler, design_filter

__all__ = [
    "SUPPORTED_RATES",
    "FilterDesign",
    "Resampler",
    "alaw_decode",
    "alaw_encode",
    "design_filter",
    "ulaw_decode",
    "ulaw_encode",
]

"""Receive jitter buffer, packet-loss concealment and outbound playout pacing (pure, no I/O)."""

from jitter.delay import DelayEstimator
from jitter.jitterbuffer import JitterBuffer, JitterStats
from jitter.playout import PlayoutBuffer
from jitter.plc import Concealer
from jitter.seqnum import Unwrapper, unwrap_near, wrapped_diff

__all__ = [
    "Concealer",
    "DelayEstimator",
    "JitterBuffer",
    "JitterStats",
    "PlayoutBuffer",
    "Unwrapper",
    "unwrap_near",
    "wrapped_diff",
]

"""Unwrapping of RTP's 16-bit sequence numbers and 32-bit timestamps.

Pure helpers: the value is mapped to the integer congruent to it modulo
2**bits that lies nearest to a reference (the highest value seen so far), so
the result is exact across the wrap as long as consecutive packets are less
than half the number space apart.
"""

from __future__ import annotations

SEQ_BITS = 16
TS_BITS = 32


def wrapped_diff(a: int, b: int, bits: int) -> int:
    """Signed distance a - b in a 2**bits space, in [-2**(bits-1), 2**(bits-1))."""
    mod = 1 << bits
    half = mod >> 1
    return ((a - b + half) % mod) - half


def unwrap_near(value: int, reference: int, bits: int) -> int:
    """The integer congruent to `value` mod 2**bits nearest to `reference`."""
    return reference + wrapped_diff(value, reference, bits)


class Unwrapper:
    """Extends wrapped counters to unbounded integers relative to the highest seen."""

    __slots__ = ("_bits", "_highest", "_mask")

    def __init__(self, bits: int) -> None:
        if bits <= 0:
            raise ValueError("bits must be positive")
        self._bits = bits
        self._mask = (1 << bits) - 1
        self._highest: int | None = None

    @property
    def highest(self) -> int | None:
        """The highest unwrapped value seen, None before the first."""
        return self._highest

    def peek(self, value: int) -> int:
        """Unwrap without updating the reference."""
        v = value & self._mask
        if self._highest is None:
            return v
        return unwrap_near(v, self._highest, self._bits)

    def unwrap(self, value: int) -> int:
        """Unwrap and move the reference forward if this is the new highest."""
        hi = self._highest
        mask = self._mask
        if hi is None:
            self._highest = u = value & mask
            return u
        half = (mask >> 1) + 1
        u = hi + (((value & mask) - hi + half) & mask) - half  # inline unwrap_near: hot path
        if u > hi:
            self._highest = u
        return u

    def note(self, unwrapped: int) -> None:
        """Record a value the caller unwrapped itself (a fast path), keeping the reference."""
        if self._highest is None or unwrapped > self._highest:
            self._highest = unwrapped

    def reset(self) -> None:
        self._highest = None

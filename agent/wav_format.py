"""A WAV file's sample format in words, read from its header.

Python's :mod:`wave` reads 16-bit (and 8/24/32-bit integer) PCM only, and for anything else
says ``unknown format: 65534``: a number an operator cannot act on. This reads the ``fmt ``
chunk itself so a message can say "32-bit float WAV (WAVE_FORMAT_EXTENSIBLE)" instead.
"""

from __future__ import annotations

import struct
from pathlib import Path

__all__ = ["CONVERT", "describe_wav", "unsupported_wav"]

#: How to make a file the bridge reads (sox is in Debian, like the rest of the tools).
CONVERT = "use 16-bit PCM (e.g. `sox in.wav -b 16 -e signed-integer out.wav`)"

_EXTENSIBLE = 0xFFFE
_TAGS = {
    0x0001: "PCM",
    0x0002: "Microsoft ADPCM",
    0x0003: "float",
    0x0006: "A-law",
    0x0007: "mu-law",
    0x0011: "IMA ADPCM",
    0x0031: "GSM 6.10",
    0x0055: "MP3",
}


def describe_wav(path: str | Path) -> str:
    """``"32-bit float WAV (WAVE_FORMAT_EXTENSIBLE)"``, ``"8-bit mu-law WAV"``, ``"16-bit
    PCM WAV"``; ``"not a WAV file (...)"`` when the header says otherwise; "" unreadable."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return ""
    if len(head) < 12 or head[:4] not in (b"RIFF", b"RIFX", b"RF64") or head[8:12] != b"WAVE":
        return "not a WAV file (no RIFF/WAVE header)"
    pos = 12
    while pos + 8 <= len(head):
        chunk, size = head[pos : pos + 4], struct.unpack_from("<I", head, pos + 4)[0]
        if chunk == b"fmt " and size >= 16 and pos + 8 + 16 <= len(head):
            tag, _channels, _rate, _rate_bytes, _align, bits = struct.unpack_from(
                "<HHIIHH", head, pos + 8
            )
            extensible = tag == _EXTENSIBLE
            if extensible and size >= 40 and pos + 8 + 26 <= len(head):
                tag = struct.unpack_from("<H", head, pos + 8 + 24)[0]  # the subformat GUID
            kind = _TAGS.get(tag, f"format 0x{tag:04X}")
            words = f"{bits}-bit {kind} WAV" if bits else f"{kind} WAV"
            return words + (" (WAVE_FORMAT_EXTENSIBLE)" if extensible else "")
        pos += 8 + size + (size & 1)
    return "WAV without a format chunk"


def unsupported_wav(path: str | Path) -> str:
    """The one-line reason a file is not 16-bit PCM, for an error message."""
    what = describe_wav(path)
    if not what or what.startswith(("not a WAV", "WAV without")):
        return f"{what or 'unreadable'}: {CONVERT}"
    return f"{what} is not supported: {CONVERT}"

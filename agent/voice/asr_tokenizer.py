"""Moonshine's token ids -> text: a decoder for Hugging Face ``tokenizer.json`` files, our
own (no ``tokenizers`` package: decoding is all the recogniser needs)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

__all__ = ["Tokenizer"]

_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class Tokenizer:
    """Token ids -> text from a Hugging Face ``tokenizer.json`` (SentencePiece-style BPE).

    Decoding is all we need: "▁" marks a space, ``<0xNN>`` tokens are raw UTF-8 bytes,
    special tokens (<s>, </s>, <unk>, Moonshine's <<ST_n>>) are dropped.
    """

    def __init__(self, path: Path) -> None:
        spec = json.loads(Path(path).read_text(encoding="utf-8"))
        vocab: dict[str, int] = spec["model"]["vocab"]
        size = max(vocab.values()) + 1
        for added in spec.get("added_tokens", []):
            size = max(size, int(added["id"]) + 1)
        self._pieces: list[bytes | None] = [None] * size
        for piece, idx in vocab.items():
            byte = _BYTE.match(piece)
            self._pieces[idx] = (
                bytes([int(byte.group(1), 16)])
                if byte
                else piece.replace("\u2581", " ").encode("utf-8")
            )
        for added in spec.get("added_tokens", []):
            idx = int(added["id"])
            self._pieces[idx] = None if added.get("special") else added["content"].encode()

    def has_word(self, idx: int) -> bool:
        """Whether token ``idx`` holds a letter or a digit (not only punctuation, a space
        or a special token): a recogniser unsure between "." and "," is not unsure of
        what was said."""
        piece = self._pieces[idx] if 0 <= idx < len(self._pieces) else None
        return piece is not None and any(chr(b).isalnum() for b in piece if b < 128)

    def decode(self, ids: Sequence[int]) -> str:
        """Join the pieces; bytes are fused first so multi-byte characters survive."""
        out = b"".join(
            p for i in ids if 0 <= i < len(self._pieces) and (p := self._pieces[i]) is not None
        )
        text = out.decode("utf-8", errors="replace")
        return text[1:] if text.startswith(" ") else text

"""A string value as the operator wrote it in a TOML file, for error messages.

``repr()`` shows Python's escaping (``'\\\\d+'`` for a ``'\\d+'`` the file holds as a literal
string), which is not what the operator sees in their editor and cannot be searched for.
"""

from __future__ import annotations

__all__ = ["as_written"]


def _basic(value: str) -> str:
    """``value`` as a TOML basic (double-quoted) string."""
    out = value.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + out.replace("\n", "\\n").replace("\t", "\\t") + '"'


def as_written(text: str, value: str) -> str:
    """How ``value`` appears in the file ``text``: its literal (``'...'``) or basic
    (``"..."``) spelling, whichever is there; else the literal spelling, or the basic one
    when the value holds a quote or a newline that a literal string cannot."""
    literal = f"'{value}'"
    if literal in text:
        return literal
    basic = _basic(value)
    if basic in text or "'" in value or "\n" in value:
        return basic
    return literal

"""Whether a string can be a transfer target, checked when a file loads.

A profile's ``transfer``/``escalate_transfer`` and the bridge's ``fault_transfer_to`` are
checked here, so that a target the bridge would refuse mid-call (the caller hearing
``transfer_failed``) is refused at ``config check`` instead. The shapes are those the
bridge's REFER accepts (``sip_bridge.sip.transfer.refer_target``; a test keeps the two in step):
a ``sip:``/``sips:`` URI, a ``tel:`` URI, or a number (``+15551234``, ``1001``; the
separators ``-.() `` allowed).
"""

from __future__ import annotations

import re

__all__ = ["target_problem"]

_URI = re.compile(
    r"sips?:(?:[^\s@<>\"]+@)?(?:[\w.-]+|\[[0-9A-Fa-f:.]+\])(?::(\d{1,5}))?(?:[;?][^\s<>\"]*)?",
    re.I,
)
_TEL = re.compile(r"tel:[^\s<>\"]+", re.I)
_NUMBER = re.compile(r"\+?[0-9*#]+")
_SEPARATORS = re.compile(r"[-.() ]")
EXAMPLES = "a SIP URI (sip:desk@pbx.example.com), a tel: URI or a number (+15551234)"


def target_problem(target: str) -> str | None:
    """None for a target the bridge can REFER to; else why not, in words."""
    text = target.strip()
    if not text:
        return f"is empty: name {EXAMPLES}"
    uri = _URI.fullmatch(text)
    if (uri and int(uri.group(1) or 0) <= 65535) or (_TEL.fullmatch(text) and len(text) > 4):
        return None
    if _NUMBER.fullmatch(_SEPARATORS.sub("", text)):
        return None
    return f"{text[:60]!r} is not {EXAMPLES}"

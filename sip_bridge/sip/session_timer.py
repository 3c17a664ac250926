"""SIP session timers (RFC 4028), the UAS side's negotiation: pure functions, no clock.

A call whose BYE got lost would otherwise hold an RTP port and a model slot forever; the
session timer lets the bridge notice that nobody refreshes the dialog and hang up.  The UA
keeps the deadlines; this module only reads requests and writes the header values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sip_bridge.sip.message import SipMessage

__all__ = [
    "DEFAULT_MIN_SE",
    "IntervalTooSmall",
    "SessionTimer",
    "flip",
    "negotiate",
    "parse_session_expires",
    "supports_timer",
]

DEFAULT_MIN_SE = 90  # RFC 4028 4: the smallest Min-SE anyone may require
Refresher = Literal["uac", "uas"]


def flip(refresher: Refresher) -> Refresher:
    """The same party named from the other side of a transaction (uac <-> uas).

    ``refresher`` in Session-Expires names a role *in that transaction*: when the original
    callee sends the refresh, it is the transaction's "uac"."""
    return "uas" if refresher == "uac" else "uac"


class IntervalTooSmall(ValueError):
    """The request asks for a Session-Expires below our Min-SE: answer 422 with Min-SE."""

    status = 422

    def __init__(self, interval: int, min_se: int) -> None:
        super().__init__(f"Session-Expires {interval} below Min-SE {min_se}")
        self.min_se = min_se


@dataclass(frozen=True, slots=True)
class SessionTimer:
    """A negotiated session timer; ``require`` says whether our 2xx carries Require: timer."""

    interval: int
    refresher: Refresher
    require: bool

    @property
    def header(self) -> str:
        return f"{self.interval};refresher={self.refresher}"

    @property
    def refresh_after(self) -> float:
        """When the refresher sends its refresh (RFC 4028 7.4/10: half the interval)."""
        return self.interval / 2

    @property
    def expire_after(self) -> float:
        """When the other side gives up: SE minus min(32, SE/3) (RFC 4028 10)."""
        return self.interval - min(32.0, self.interval / 3)


def parse_session_expires(value: str) -> tuple[int, Refresher | None]:
    """``1800;refresher=uac`` -> (1800, "uac"); ValueError for anything malformed."""
    parts = [p.strip() for p in value.split(";")]
    if not parts[0].isdigit():
        raise ValueError(f"bad Session-Expires {value!r}")
    refresher: Refresher | None = None
    for param in parts[1:]:
        name, _, arg = param.partition("=")
        if name.strip().lower() == "refresher":
            arg = arg.strip().lower()
            if arg not in ("uac", "uas"):
                raise ValueError(f"bad refresher {arg!r}")
            refresher = "uac" if arg == "uac" else "uas"
    return int(parts[0]), refresher


def supports_timer(msg: SipMessage) -> bool:
    """True when the peer lists ``timer`` in Supported or Require (compact ``k`` too)."""
    tags = msg.headers.get_all("Supported") + msg.headers.get_all("Require")
    return any(t.strip().lower() == "timer" for t in tags)


def negotiate(req: SipMessage, min_se: int) -> SessionTimer | None:
    """The timer our 2xx to ``req`` sets up, None when the request asks for none.

    The caller's refresher choice is kept; without one a caller that supports timers
    refreshes (uac), and one that does not cannot, so we do (uas).  ValueError for a
    malformed header (400), :class:`IntervalTooSmall` below ``min_se`` or the request's
    own Min-SE (422).
    """
    value = req.headers.get("Session-Expires")
    if value is None:
        return None
    interval, refresher = parse_session_expires(value)
    their_min = req.headers.get("Min-SE")
    floor = max(min_se, int(their_min.split(";")[0]) if their_min else 0)
    if interval < floor:
        raise IntervalTooSmall(interval, floor)
    capable = supports_timer(req)
    if not capable:
        refresher = "uas"  # a caller without the extension will not refresh for us
    elif refresher is None:
        refresher = "uac"
    return SessionTimer(interval, refresher, require=capable)

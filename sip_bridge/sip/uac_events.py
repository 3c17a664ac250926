"""What an outbound call (:mod:`sip_bridge.sip.uac`) tells its runner, and the call's states.

Kept apart so that :mod:`sip_bridge.sip.uac_session` (re-INVITE/UPDATE, session timers) and
:mod:`sip_bridge.sip.uac` can both produce them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sip_bridge.sip.message import SipResponse
from sip_bridge.sip.offer_answer import NegotiatedMedia
from sip_bridge.sip.transaction import SendMessage

__all__ = [
    "CallAnswered",
    "CallEnded",
    "CallFailed",
    "CallProgress",
    "MediaChanged",
    "ReferReceived",
    "UacEvent",
    "UacState",
]


@dataclass(frozen=True, slots=True)
class CallProgress:
    """A provisional response (180 Ringing, 183 Session Progress...)."""

    status: int
    reason: str


@dataclass(frozen=True, slots=True)
class CallAnswered:
    """The 2xx arrived, its SDP answer is acceptable and the ACK is on its way."""

    media: NegotiatedMedia
    response: SipResponse


@dataclass(frozen=True, slots=True)
class CallFailed:
    """The call never got established; ``status`` is the final SIP status (408: timeout)."""

    status: int
    reason: str


@dataclass(frozen=True, slots=True)
class CallEnded:
    """An established call is over (our BYE answered, or the peer's BYE)."""

    reason: str


@dataclass(frozen=True, slots=True)
class MediaChanged:
    """A re-INVITE/UPDATE (or the answer to our refresh) changed the media: hold, unhold,
    a new remote address or codec.  The runner applies it to the running RTP leg."""

    media: NegotiatedMedia


@dataclass(frozen=True, slots=True)
class ReferReceived:
    """The peer asks us to call ``target`` (a blind transfer, RFC 3515); we answered 202.
    Report how that call goes with :meth:`~sip_bridge.sip.uac.OutboundCall.notify_refer`."""

    target: str
    referred_by: str


UacEvent = (
    SendMessage
    | CallProgress
    | CallAnswered
    | CallFailed
    | CallEnded
    | MediaChanged
    | ReferReceived
)


class UacState(StrEnum):
    IDLE = "idle"
    CALLING = "calling"  # INVITE sent, no final response
    CANCELLING = "cancelling"  # CANCEL sent or queued, waiting for the INVITE's final
    CONFIRMED = "confirmed"  # 2xx ACKed: media flows
    TERMINATING = "terminating"  # our BYE sent
    ENDED = "ended"

"""What :class:`~sip_bridge.sip.ua.BridgeUA` tells the app: bytes to send and call events.

Kept apart so the UA's pieces (:mod:`sip_bridge.sip.ua_core`, :mod:`sip_bridge.sip.ua_session`,
:mod:`sip_bridge.sip.ua_transfer`) share one vocabulary; :mod:`sip_bridge.sip.ua` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sip_bridge.sip.offer_answer import NegotiatedMedia
from sip_bridge.sip.sdp import SessionDescription
from sip_bridge.sip.transaction import SendMessage
from sip_bridge.sip.transfer import TransferProgress

__all__ = [
    "Address",
    "CallEnded",
    "CallEstablished",
    "CallOffered",
    "DtmfInfo",
    "MediaUpdated",
    "Send",
    "TransferProgress",
    "UaEvent",
]

Address = tuple[str, int]

# Bytes the transport must send: the transaction layer's event, passed through as is.
Send = SendMessage


@dataclass(frozen=True, slots=True)
class CallOffered:
    """A new call: allocate an RTP port, then ``answer()`` or ``reject()``."""

    call_id: str
    from_uri: str
    to_uri: str
    request_uri: str
    offer: SessionDescription | None  # None: delayed offer (our 200 will offer)
    source: Address
    trunk: str | None = None  # the trunk the admission policy matched, if any
    headers: tuple[tuple[str, str], ...] = ()  # the INVITE's, for routes on a header


@dataclass(frozen=True, slots=True)
class CallEstablished:
    call_id: str
    media: NegotiatedMedia


@dataclass(frozen=True, slots=True)
class MediaUpdated:
    """A re-INVITE/UPDATE changed the media (hold, new address, new port...)."""

    call_id: str
    media: NegotiatedMedia


@dataclass(frozen=True, slots=True)
class CallEnded:
    call_id: str
    reason: str
    by: Literal["remote", "local", "timeout"]


@dataclass(frozen=True, slots=True)
class DtmfInfo:
    """A digit from a SIP INFO (application/dtmf-relay or application/dtmf)."""

    call_id: str
    digit: str


UaEvent = (
    Send | CallOffered | CallEstablished | MediaUpdated | CallEnded | DtmfInfo | TransferProgress
)

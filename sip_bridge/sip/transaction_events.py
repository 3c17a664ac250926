"""What the transaction layer emits and raises: the TU's side of its interface.

Apart from :mod:`sip_bridge.sip.transaction` so the layer's own file stays about state
machines; import these from either module.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sip_bridge.sip.message import SipRequest, SipResponse

__all__ = [
    "AckReceived",
    "AckTimeout",
    "Event",
    "RequestReceived",
    "ResponseReceived",
    "SendMessage",
    "StrayResponse",
    "TransactionError",
    "TransactionTimeout",
    "TxState",
]

Address = tuple[str, int]


class TransactionError(ValueError):
    """The TU asked for something the transaction's state does not allow."""


class TxState(StrEnum):
    CALLING = "calling"
    TRYING = "trying"
    PROCEEDING = "proceeding"
    COMPLETED = "completed"
    CONFIRMED = "confirmed"
    ACCEPTED = "accepted"


@dataclass(frozen=True, slots=True)
class SendMessage:
    """Bytes the transport must send to ``destination`` over ``transport``."""

    data: bytes
    destination: Address
    transport: str


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """A new request (never a retransmission) for the TU to answer with ``send_response``.

    For a CANCEL, ``invite_tx_id`` names the INVITE server transaction it matches (RFC
    3261 9.2), or is None when there is none (the TU answers 481).
    """

    tx_id: str
    request: SipRequest
    source: Address
    invite_tx_id: str | None = None


@dataclass(frozen=True, slots=True)
class ResponseReceived:
    """A response for the client transaction ``tx_id`` (retransmissions absorbed, except
    2xx to an INVITE, which the UA must re-ACK)."""

    tx_id: str
    response: SipResponse


@dataclass(frozen=True, slots=True)
class StrayResponse:
    """A response that matches no client transaction (e.g. a 2xx after Timer M)."""

    response: SipResponse
    source: Address


@dataclass(frozen=True, slots=True)
class AckReceived:
    """An ACK for a 2xx: ``tx_id`` is the Accepted INVITE server transaction it stopped,
    or None when it matched none (late or stray; the UA's dialog layer decides)."""

    tx_id: str | None
    request: SipRequest
    source: Address


@dataclass(frozen=True, slots=True)
class AckTimeout:
    """No ACK for the 2xx ``response`` within Timer L: the UA should send BYE."""

    tx_id: str
    response: SipResponse


@dataclass(frozen=True, slots=True)
class TransactionTimeout:
    """Timer ``timer`` (B, C, F or H) expired; the transaction is gone."""

    tx_id: str
    timer: str
    reason: str


Event = (
    SendMessage
    | RequestReceived
    | ResponseReceived
    | StrayResponse
    | AckReceived
    | AckTimeout
    | TransactionTimeout
)

"""The bridge UA's call record and the plumbing every part of it shares.

:class:`UaCore` holds what :class:`~sip_bridge.sip.ua.BridgeUA` and its mixins
(:mod:`sip_bridge.sip.ua_session`, :mod:`sip_bridge.sip.ua_transfer`) all need: building and
sending responses, sending in-dialog requests, ending and forgetting calls.  It declares
the state BridgeUA's ``__init__`` sets up and does no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from sip_bridge.config.loader import SipConfig
from sip_bridge.sip.dialog import Dialog
from sip_bridge.sip.fields import TOKEN
from sip_bridge.sip.message import (
    Headers,
    SipRequest,
    SipResponse,
    canonical_name,
    make_response,
    new_tag,
    reason_phrase,
)
from sip_bridge.sip.offer_answer import MediaConfig
from sip_bridge.sip.sdp import NoCommonCodec, SdpError, SessionDescription
from sip_bridge.sip.session_timer import SessionTimer
from sip_bridge.sip.timers import TimerQueue
from sip_bridge.sip.transaction import Event, RequestReceived, TransactionError, TransactionLayer
from sip_bridge.sip.transfer import Refer
from sip_bridge.sip.ua_events import Address, CallEnded, UaEvent
from sip_bridge.sip.uas_invite import in_dialog_destination, stateless_error

__all__ = ["ACCEPT", "ALLOW", "CALL_TIMERS", "SUPPORTED", "UaCall", "UaCore", "malformed_reply"]

# NOTIFY: the reports of a transfer we started (REFER).  REFER itself is not allowed: the
# bridge transfers callers, nobody transfers the bridge.
ALLOW = ("INVITE", "ACK", "BYE", "CANCEL", "OPTIONS", "UPDATE", "INFO", "NOTIFY")
SUPPORTED: tuple[str, ...] = ("timer",)  # option tags we implement (no 100rel yet)
ACCEPT = "application/sdp, application/dtmf-relay, message/sipfrag"
# Per-call timers, all cancelled when the call ends for the app.
CALL_TIMERS = ("answer", "st-refresh", "st-expire", "xfer-expire", "xfer-bye")


_ECHOED = ("Via", "From", "To", "Call-ID", "CSeq")
# A Via of any version: a SIP/7.0 request (RFC 4475 3.1.2.16) still gets its 505.
_ANY_VIA = re.compile(r"SIP[ \t]*/[ \t]*[0-9]+\.[0-9]+[ \t]*/[ \t]*[!-~]+[ \t]+[!-~]")


def malformed_reply(data: bytes, exc: ValueError, host: str, server: str) -> SipResponse | None:
    """The 400/505 for a request the parser refused, None when it names no transaction.

    :func:`~sip_bridge.sip.uas_invite.stateless_error` first; when it cannot read the request
    back (LWS inside the Request-URI, a CSeq over 2**31, an unterminated quote in To:
    RFC 4475 3.1.2.4/6/8) the raw Via, From, To, Call-ID and CSeq lines are echoed as
    received: the sender matches its transaction by the top Via and the CSeq alone.
    Without all five lines (RFC 4475 3.3.1) there is nothing to answer with.
    """
    resp = stateless_error(data, exc, host, server)
    if resp is not None:
        return resp
    head = re.split(rb"\r?\n\r?\n", data.lstrip(b"\r\n"), maxsplit=1)[0]
    lines = head.decode("utf-8", "replace").splitlines()
    first = lines[0].split() if lines else []
    if len(first) < 3 or first[0] == "ACK" or not TOKEN.fullmatch(first[0]):
        return None  # a response, an ACK, or no request line at all
    found: dict[str, list[str]] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        canon = canonical_name(name.strip(" \t")) if colon else ""
        if canon in _ECHOED and value.strip(" \t") and "\x00" not in value:
            found.setdefault(canon, []).append(value.strip(" \t"))
    if len(found) < len(_ECHOED):
        return None
    if not _ANY_VIA.match(found["Via"][0]):
        return None
    try:
        status = getattr(exc, "status", 400)
        resp = SipResponse(status if 400 <= status < 600 else 400, "", Headers())
        resp.reason = reason_phrase(resp.status)
        for name in _ECHOED:
            for value in found[name] if name == "Via" else found[name][:1]:
                tagged = name == "To" and ";tag=" not in value.lower().replace(" ", "")
                resp.headers.add(name, f"{value};tag={new_tag()}" if tagged else value)
        text = str(exc).replace('"', "'").replace("\\", "/")[:100]
        resp.headers.add("Warning", f'399 {host} "{text}"')
        resp.headers.add("Server", server)
    except (ValueError, IndexError):
        return None
    return resp


@dataclass(eq=False)
class UaCall:
    call_id: str
    invite: SipRequest
    invite_tx: str
    source: Address
    transport: str
    dialog: Dialog
    offer: SessionDescription | None
    state: str = "offered"  # offered -> answered (2xx sent) -> confirmed (ACKed)
    local_sdp: SessionDescription | None = None
    media: MediaConfig | None = None
    reoffer_tx: str | None = None  # re-INVITE without SDP: the ACK carries the answer
    bye_tx: str | None = None
    bye_after_ack: bool = False
    txs: set[str] = field(default_factory=set)
    timer: SessionTimer | None = None  # RFC 4028 session timer, once negotiated
    peer_allows_update: bool = False
    refresh_tx: str | None = None  # our pending session refresh (UPDATE or re-INVITE)
    refresh_ack: tuple[str, SipRequest] | None = None  # re-INVITE tx and the ACK of its 2xx
    transfer: Refer | None = None  # our latest REFER and its subscription
    refer_tx: str | None = None  # that REFER's client transaction, while it runs
    pending_transfer: str | None = None  # asked for before the caller's ACK: sent on it
    srtp: str = "optional"  # SDES-SRTP mode of the call: its trunk's, else [sip] srtp


class UaCore:
    """State and helpers shared by the UA's parts; BridgeUA's ``__init__`` fills them in."""

    config: SipConfig
    host: str
    _layer: TransactionLayer
    _timers: TimerQueue
    _calls: dict[str, UaCall]  # live, as the app sees them
    _ending: dict[str, UaCall]  # ended for the app, BYE still to finish
    _by_tx: dict[str, UaCall]

    def _process(self, events: list[Event], transport: str, now: float) -> list[UaEvent]:
        raise NotImplementedError  # BridgeUA dispatches transaction events

    # ------------------------------------------------------------------ responses
    def _response(self, req: SipRequest, status: int, to_tag: str | None = None) -> SipResponse:
        resp = make_response(req, status, to_tag=to_tag or new_tag())
        resp.headers.add("Server", self.config.user_agent)
        return resp

    def _describe(self, resp: SipResponse) -> None:
        """Capabilities (RFC 3261 11.2): what we allow, accept and support."""
        resp.headers.add("Allow", ", ".join(ALLOW))
        resp.headers.add("Accept", ACCEPT)
        resp.headers.add("Supported", ", ".join(SUPPORTED))

    def _send_response(self, tx_id: str, resp: SipResponse, now: float) -> list[UaEvent]:
        try:
            return self._process(self._layer.send_response(tx_id, resp, now), "", now)
        except TransactionError:
            return []  # the transaction is gone (timed out): nothing left to answer

    def _reply(self, ev: RequestReceived, status: int, now: float, **headers: str) -> list[UaEvent]:
        resp = self._response(ev.request, status)
        for name, value in headers.items():
            resp.headers.add(name.replace("_", "-"), value)
        return self._send_response(ev.tx_id, resp, now)

    def _final(
        self, call: UaCall, status: int, now: float, warning: SdpError | None = None
    ) -> list[UaEvent]:
        """A non-2xx final response to the call's INVITE."""
        resp = self._response(call.invite, status, call.dialog.local_tag)
        if status == 503:
            resp.headers.add("Retry-After", str(self.config.retry_after_s))
        if isinstance(warning, NoCommonCodec):
            resp.headers.add("Warning", warning.warning(self.host))
        return self._send_response(call.invite_tx, resp, now)

    # ------------------------------------------------------------------ our requests
    def _send_in_dialog(
        self, call: UaCall, req: SipRequest, now: float
    ) -> tuple[str, list[UaEvent]]:
        """Start a client transaction for ``req`` in the call's dialog; TransactionError or
        ValueError when it cannot be sent."""
        dest, transport = in_dialog_destination(call.dialog, call.source, call.transport)
        tx_id, events = self._layer.send_request(req, dest, transport, now)
        self._track(call, tx_id)
        return tx_id, self._process(events, transport, now)

    def _send_bye(self, call: UaCall, now: float) -> list[UaEvent]:
        if call.bye_tx is not None:
            return []
        call.bye_after_ack = False
        self._ending[call.call_id] = call
        try:
            call.bye_tx, out = self._send_in_dialog(call, call.dialog.create_request("BYE"), now)
        except (TransactionError, ValueError):
            self._forget(call)
            return []
        return out

    def _hang(
        self, call: UaCall, now: float, reason: str, by: Literal["local", "timeout"]
    ) -> list[UaEvent]:
        """End an answered call: BYE now, or once the ACK of our 2xx is in."""
        out = [*self._transfer_abandoned(call), self._end(call, reason, by, keep=True)]
        if call.state == "answered":
            call.bye_after_ack = True
            return out
        return out + self._send_bye(call, now)

    def _transfer_abandoned(self, call: UaCall) -> list[UaEvent]:
        """A transfer still open as the call ends: its final report (TransferMixin's)."""
        return []

    # ------------------------------------------------------------------ call records
    def _end(
        self,
        call: UaCall,
        reason: str,
        by: Literal["remote", "local", "timeout"],
        keep: bool = False,
    ) -> CallEnded:
        """Remove the call from the app's view; ``keep`` it while a BYE is still to run."""
        self._calls.pop(call.call_id, None)
        self._timers.cancel_all(call.call_id, CALL_TIMERS)
        if keep:
            self._ending[call.call_id] = call
        else:
            self._forget(call)
        return CallEnded(call.call_id, reason, by)

    def _forget(self, call: UaCall) -> None:
        self._calls.pop(call.call_id, None)
        self._ending.pop(call.call_id, None)
        for tx in call.txs:
            if self._by_tx.get(tx) is call:
                del self._by_tx[tx]

    def _track(self, call: UaCall, tx_id: str) -> None:
        call.txs.add(tx_id)
        self._by_tx[tx_id] = call

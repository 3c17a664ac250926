"""One outbound call (the UAC side of RFC 3261 13), sans-I/O.

Bytes and an explicit ``now`` go in; :class:`~sip_bridge.sip.transaction.SendMessage` and call
events come out, so the asyncio runner (:mod:`sip_bridge.script.caller`) only moves datagrams.
The INVITE carries our SDP offer; the 2xx's answer is checked with
:func:`~sip_bridge.sip.offer_answer.accept_answer`.  The transaction layer ACKs non-2xx finals;
the ACK for a 2xx is ours (13.2.2.4), built once from the dialog and sent again for every
retransmitted 2xx the layer surfaces until Timer M.  A call not answered within
``answer_timeout_s`` is CANCELled; the peer's 487 then ends it as :class:`CallFailed`.
Digest authentication (401/407) is not attempted: such a final is reported as failure.
Session timers (RFC 4028) and the peer's re-INVITE/UPDATE live in :mod:`sip_bridge.sip.uac_session`:
the INVITE asks for ``session_expires`` seconds and retries once after a 422. A REFER (being
transferred) is :mod:`sip_bridge.sip.uac_refer`'s.
"""

from __future__ import annotations

import secrets

from sip_bridge.sip.dialog import Dialog, DialogError
from sip_bridge.sip.message import (
    Headers,
    NameAddr,
    SipParseError,
    SipRequest,
    SipResponse,
    Via,
    make_response,
    new_branch,
    new_tag,
    parse_message,
)
from sip_bridge.sip.offer_answer import MediaConfig, NegotiatedMedia, accept_answer, make_offer
from sip_bridge.sip.sdp import SdpError, parse_sdp
from sip_bridge.sip.session_timer import DEFAULT_MIN_SE
from sip_bridge.sip.transaction import (
    AckReceived,
    AckTimeout,
    Event,
    RequestReceived,
    ResponseReceived,
    SendMessage,
    StrayResponse,
    TransactionLayer,
    TransactionTimeout,
)
from sip_bridge.sip.uac_events import (
    CallAnswered,
    CallEnded,
    CallFailed,
    CallProgress,
    MediaChanged,
    ReferReceived,
    UacEvent,
    UacState,
)
from sip_bridge.sip.uac_refer import UacTransferee
from sip_bridge.sip.uac_session import ALLOW, sends, timer_from_2xx

__all__ = [
    "CallAnswered",
    "CallEnded",
    "CallFailed",
    "CallProgress",
    "MediaChanged",
    "OutboundCall",
    "ReferReceived",
    "UacEvent",
    "UacState",
]

Address = tuple[str, int]


class OutboundCall(UacTransferee):
    """INVITE ``target`` from ``local`` (our SIP host:port) and follow the call to its end.

    ``destination`` is where requests go (an IP address: resolving names is the runner's
    job).  ``layer`` may be shared; by default the call owns one.  ``session_expires``
    is the session interval our INVITE asks for (RFC 4028; 0: none), ``min_se`` our floor.
    """

    def __init__(
        self,
        target: str,
        local: Address,
        destination: Address,
        media: MediaConfig,
        *,
        transport: str = "udp",
        user: str = "sip-bridge",
        answer_timeout_s: float = 60.0,
        layer: TransactionLayer | None = None,
        session_expires: int = 1800,
        min_se: int = DEFAULT_MIN_SE,
    ) -> None:
        self.target = target
        self.local = local
        self.destination = destination
        self.transport = transport
        self.user = user
        self.answer_timeout_s = answer_timeout_s
        self.layer = layer or TransactionLayer()
        self.media_config = media
        self.offer = make_offer(media, secrets.randbelow(2**31))
        self.local_sdp = self.offer
        self.session_expires = session_expires
        self._init_session(min_se)
        self._init_transferee()
        self.state = UacState.IDLE
        self.dialog: Dialog | None = None
        self.invite: SipRequest | None = None
        self.media: NegotiatedMedia | None = None
        self.acks_sent = 0
        self._invite_tx: str | None = None
        self._bye_tx: str | None = None
        self._ack: bytes | None = None
        self._cancel_at: float | None = None
        self._end_reason: str | None = None
        self._retried_422 = False

    @property
    def sent_by(self) -> str:
        host, port = self.local
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    # ------------------------------------------------------------------ commands
    def start(self, now: float) -> list[UacEvent]:
        """Send the INVITE with our offer."""
        if self.state is not UacState.IDLE:
            raise RuntimeError("call already started")
        from_ = f"<sip:{self.user}@{self.sent_by}>;tag={new_tag()}"
        call_id = f"{secrets.token_hex(12)}@{self.local[0]}"
        events = self._send_invite(from_, call_id, secrets.randbelow(2**16) + 1, now)
        self.state = UacState.CALLING
        self._cancel_at = now + self.answer_timeout_s
        return events

    def _send_invite(self, from_: str, call_id: str, cseq: int, now: float) -> list[UacEvent]:
        """The (initial or 422-retried) INVITE; it asks for a session timer (RFC 4028 7.1)."""
        host, port = self.local
        headers = Headers()
        via = Via(self.transport.upper(), host, port, {"branch": new_branch(), "rport": None})
        headers.add("Via", via.to_str())
        headers.add("Max-Forwards", "70")
        headers.add("From", from_)
        headers.add("To", f"<{self.target}>")
        headers.add("Call-ID", call_id)
        headers.add("CSeq", f"{cseq} INVITE")
        headers.add("Contact", f"<sip:{self.user}@{self.sent_by}>")
        headers.add("Allow", ALLOW)
        headers.add("Supported", "timer")
        if self.session_expires > 0:
            headers.add("Session-Expires", str(self.session_expires))
            headers.add("Min-SE", str(self.min_se))
        headers.add("Content-Type", "application/sdp")
        self.invite = SipRequest("INVITE", self.target, headers, self.offer.to_bytes())
        self._invite_tx, events = self.layer.send_request(
            self.invite, self.destination, self.transport, now
        )
        return sends(events)

    def _retry_422(self, resp: SipResponse, now: float) -> list[UacEvent] | None:
        """422 Session Interval Too Small: once more with their Min-SE (RFC 4028 7.4)."""
        value = (resp.headers.get("Min-SE") or "").split(";")[0].strip()
        invite = self.invite
        if self._retried_422 or not value.isdigit() or invite is None or self.session_expires <= 0:
            return None
        self._retried_422 = True
        self.session_expires = max(self.session_expires, int(value))
        self.min_se = max(self.min_se, int(value))
        from_ = invite.headers.get("From") or ""
        return self._send_invite(from_, invite.call_id, invite.cseq[0] + 1, now)

    def hangup(self, now: float) -> list[UacEvent]:
        """CANCEL an unanswered call, BYE an answered one; a no-op once it is ending."""
        if self.state is UacState.CALLING:
            return self._cancel(now)
        if self.state is UacState.CONFIRMED:
            return self._bye(now)
        return []

    def send_dtmf_info(self, digit: str, now: float, duration_ms: int = 160) -> list[UacEvent]:
        """One key press as SIP INFO ``application/dtmf-relay`` (what many PBXs accept)."""
        if self.state is not UacState.CONFIRMED or self.dialog is None:
            raise RuntimeError("DTMF needs an established call")
        if len(digit) != 1 or digit.upper() not in "0123456789*#ABCD":
            raise ValueError(f"not a DTMF digit: {digit!r}")
        body = f"Signal={digit.upper()}\r\nDuration={duration_ms}\r\n".encode()
        req = self.dialog.create_request("INFO", body, "application/dtmf-relay")
        _, events = self.layer.send_request(req, self._hop(), self.transport, now)
        return sends(events)

    # ------------------------------------------------------------------ input
    def receive(self, data: bytes, source: Address, now: float) -> list[UacEvent]:
        """A datagram from the network; garbage is dropped."""
        try:
            msg = parse_message(data)
        except SipParseError:
            return []
        try:
            layer_events = self.layer.receive(msg, source, self.transport, now)
        except ValueError:
            return []
        return self._handle(layer_events, now)

    def next_deadline(self) -> float | None:
        """When :meth:`tick` must next run (transaction timers and the answer timeout)."""
        times = [t for t in (self.layer.next_deadline(), self._cancel_at) if t is not None]
        times += self._session_deadlines()
        return min(times) if times else None

    def tick(self, now: float) -> list[UacEvent]:
        events: list[UacEvent] = []
        if self._cancel_at is not None and now >= self._cancel_at:
            events += self._cancel(now)
        events += self._session_tick(now)
        return events + self._handle(self.layer.tick(now), now)

    # ------------------------------------------------------------------ internals
    def _hop(self) -> Address:
        assert self.dialog is not None
        uri = self.dialog.next_hop()
        return (uri.host.strip("[]"), uri.port or 5060)

    def _cancel(self, now: float) -> list[UacEvent]:
        self._cancel_at = None
        if self.state is not UacState.CALLING or self._invite_tx is None:
            return []
        self.state = UacState.CANCELLING
        _, events = self.layer.cancel(self._invite_tx, now)
        return sends(events)

    def _bye(self, now: float, reason: str | None = None) -> list[UacEvent]:
        """BYE the dialog; ``reason`` is what :class:`CallEnded` reports once it is answered."""
        assert self.dialog is not None
        if self.state is UacState.TERMINATING or self.state is UacState.ENDED:
            return []
        self._end_reason = reason
        self._stop_timer()
        bye = self.dialog.create_request("BYE")
        self._bye_tx, events = self.layer.send_request(bye, self._hop(), self.transport, now)
        self.state = UacState.TERMINATING
        return sends(events)

    def _handle(self, layer_events: list[Event], now: float) -> list[UacEvent]:
        out: list[UacEvent] = []
        for ev in layer_events:
            if isinstance(ev, SendMessage):
                out.append(ev)
            elif isinstance(ev, ResponseReceived):
                out += self._on_response(ev, now)
            elif isinstance(ev, RequestReceived):
                out += self._on_request(ev, now)
            elif isinstance(ev, StrayResponse):
                out += self._reack(ev.response)
            elif isinstance(ev, TransactionTimeout):
                out += self._on_timeout(ev, now)
            elif isinstance(ev, AckReceived):
                out += self._on_ack(ev, now)
            elif isinstance(ev, AckTimeout):
                out += self._on_ack_timeout(ev, now)
        return out

    def _on_response(self, ev: ResponseReceived, now: float) -> list[UacEvent]:
        resp = ev.response
        if ev.tx_id == self._bye_tx and resp.status >= 200:
            self.state = UacState.ENDED
            return [CallEnded(self._end_reason or f"BYE answered {resp.status}")]
        if self._is_refresh_tx(ev.tx_id):
            return self._on_refresh_response(ev, now)
        if ev.tx_id != self._invite_tx:
            return []  # INFO and CANCEL answers: nothing to do
        if resp.status < 200:
            return [CallProgress(resp.status, resp.reason)] if resp.status > 100 else []
        if resp.status == 422 and self.state is UacState.CALLING:
            retry = self._retry_422(resp, now)
            if retry is not None:
                return retry
        if resp.status >= 300:
            self.state = UacState.ENDED
            self._cancel_at = None
            return [CallFailed(resp.status, resp.reason)]
        if self.dialog is not None:
            return self._reack(resp)
        return self._on_2xx(resp, now)

    def _on_2xx(self, resp: SipResponse, now: float) -> list[UacEvent]:
        assert self.invite is not None
        self._cancel_at = None
        try:
            self.dialog = Dialog.from_uac(self.invite, resp, self.transport, self.sent_by)
        except DialogError as exc:
            self.state = UacState.ENDED
            return [CallFailed(502, f"unusable 2xx: {exc}")]
        ack = self.dialog.create_ack(self.invite.cseq[0])
        self._ack = ack.to_bytes()
        events: list[UacEvent] = [self._send_ack()]
        failure: str | None = None
        try:
            self.media = accept_answer(self.offer, parse_sdp(resp.body))
        except (SdpError, ValueError) as exc:
            failure = f"bad SDP answer: {exc}"
        if self.state is UacState.CANCELLING:
            failure = "answered after CANCEL"
        if failure is not None:  # ACK first (13.2.2.4), then end the dialog at once
            events += self._bye(now)
            return [*events, CallFailed(488 if "SDP" in failure else 487, failure)]
        self.state = UacState.CONFIRMED
        self.peer_allows_update = "UPDATE" in (m.upper() for m in resp.headers.get_all("Allow"))
        self._start_timer(timer_from_2xx(resp), now)
        assert self.media is not None
        return [*events, CallAnswered(self.media, resp)]

    def _send_ack(self) -> SendMessage:
        assert self._ack is not None and self.dialog is not None
        self.acks_sent += 1
        return SendMessage(self._ack, self._hop(), self.transport)

    def _reack(self, resp: SipResponse) -> list[UacEvent]:
        """A retransmitted 2xx means our ACK was lost: send the same ACK again."""
        if self.dialog is None or self._ack is None or not 200 <= resp.status < 300:
            return []
        try:
            to_tag = NameAddr.parse(resp.headers.get("To") or "").tag
        except ValueError:
            return []
        same = resp.call_id == self.dialog.call_id and to_tag == self.dialog.remote_tag
        ours = self.invite is not None and resp.cseq == self.invite.cseq
        return [self._send_ack()] if same and ours else []

    def _on_request(self, ev: RequestReceived, now: float) -> list[UacEvent]:
        req = ev.request
        dialog = self.dialog
        if dialog is None or not dialog.matches(req) or req.method == "CANCEL":
            return sends(self.layer.send_response(ev.tx_id, make_response(req, 481), now))
        if not dialog.accept_remote_cseq(req):
            return sends(self.layer.send_response(ev.tx_id, make_response(req, 500), now))
        if req.method == "BYE":
            events = sends(self.layer.send_response(ev.tx_id, make_response(req, 200), now))
            ended = self.state is not UacState.ENDED
            self.state = UacState.ENDED
            self._stop_timer()
            return [*events, CallEnded("remote hung up")] if ended else events
        if req.method in ("INVITE", "UPDATE"):
            return self._on_peer_refresh(ev, now)
        if req.method == "REFER":
            return self._on_refer(ev, now)
        status = 200 if req.method in ("INFO", "OPTIONS") else 501
        return sends(self.layer.send_response(ev.tx_id, make_response(req, status), now))

    def _on_timeout(self, ev: TransactionTimeout, now: float) -> list[UacEvent]:
        if ev.tx_id == self._invite_tx and self.state in (UacState.CALLING, UacState.CANCELLING):
            self.state = UacState.ENDED
            return [CallFailed(408, f"no final response (Timer {ev.timer})")]
        if ev.tx_id == self._bye_tx and self.state is UacState.TERMINATING:
            self.state = UacState.ENDED
            return [CallEnded(self._end_reason or "BYE timed out")]
        return self._on_refresh_timeout(ev, now)

# size: the SIP user agent: dialogs and transactions of every call meet here (transfer and outbound
#       calls are already split out)
"""The bridge's SIP user agent (UAS side of calls), sans-I/O.

Bytes (or parsed messages), a source address and ``now`` go in; :class:`Send` actions and
call events come out.  Transactions (retransmissions, timers A..M) are the
:class:`~sip_bridge.sip.transaction.TransactionLayer`'s job; dialogs are
:class:`~sip_bridge.sip.dialog.Dialog`'s; offer/answer is :mod:`sip_bridge.sip.offer_answer`'s.
The app sees only calls: :class:`CallOffered` -> ``answer()``/``reject()`` ->
:class:`CallEstablished` ... :class:`CallEnded`.  Every :class:`CallOffered` ends in exactly
one :class:`CallEnded`; app commands on a call that has ended are no-ops (a CANCEL may
race the app's ``answer``).

Choices made here:

- An INVITE whose SDP we cannot parse (400), cannot serve (488 + Warning) or whose body
  is not SDP (415) is refused at once, before any :class:`CallOffered`: the app never
  allocates an RTP port for a call that cannot work.
- An offered call the app does not answer within ``answer_timeout_s`` gets 480 and
  ``CallEnded(by="timeout")``: server transactions have no timer of their own, so this
  bounds state against callers (or scanners) nobody answers.
- ``hangup()`` reports ``CallEnded(by="local")`` at once (media can stop now); the BYE
  transaction finishes in the background.  Before the ACK of our 2xx the BYE waits for
  that ACK or Timer L (RFC 3261 section 15).  Hanging up an unanswered call answers 480.
- In-dialog requests go to the next hop's address when it is an IP literal; over TCP,
  for host names (no DNS in a sans-I/O core) and for a private Contact behind NAT
  (Contact private, source elsewhere) they reuse the address the INVITE came from
  (:func:`~sip_bridge.sip.uas_invite.in_dialog_destination`).
- Any final response to our BYE (401/407 included: we hold no credentials) or its
  timeout closes the dialog.
- Incoming requests get ``received``/``rport`` stamped on their top Via (RFC 3261
  18.2.1, RFC 3581) before the transaction layer sees them; the message is modified.
- Session timers (RFC 4028, :mod:`sip_bridge.sip.session_timer`): an INVITE below ``min_se``
  gets 422; otherwise the 2xx echoes Session-Expires and the timer starts.  Any refresh
  (re-INVITE/UPDATE) restarts it; one that drops Session-Expires keeps the negotiated
  timer (lenient: the call stays guarded).  As refresher we send UPDATE (re-INVITE with
  our SDP when the peer does not allow UPDATE) at half the interval; with no refresh by
  SE - min(32, SE/3) we send BYE and end the call ``by="timeout"``
  (:mod:`sip_bridge.sip.ua_session`).
- Blind transfer (RFC 3515): ``transfer()`` sends REFER; the NOTIFYs' sipfrag become
  :class:`TransferProgress` events (:mod:`sip_bridge.sip.ua_transfer`,
  :mod:`sip_bridge.sip.transfer`).
  NOTIFY is allowed (in-dialog only); REFER to us is not (405).
- Hostile and odd requests (RFC 4475, tests/data/rfc4475/README.md): a method we know but
  do not serve gets 405, one we have never heard of 501 (both with Allow); a Request-URI
  scheme other than sip/sips/tel 416; an INVITE whose Accept excludes SDP 406; an RFC 2543
  INVITE without Contact is answered as RFC 2543 says (the From URI is the remote target).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

from sip_bridge.config.loader import SipConfig
from sip_bridge.sip.dialog import Dialog, DialogError
from sip_bridge.sip.message import NameAddr, SipRequest, SipResponse, SipUri, new_tag, parse_message
from sip_bridge.sip.offer_answer import (
    MediaConfig,
    NegotiatedMedia,
    accept_answer,
    answer,
    answered_media,
    make_offer,
)
from sip_bridge.sip.sdp import NoCommonCodec, SdpError, parse_sdp
from sip_bridge.sip.session_timer import DEFAULT_MIN_SE, IntervalTooSmall, negotiate
from sip_bridge.sip.timers import TimerConfig, TimerQueue
from sip_bridge.sip.transaction import (
    AckReceived,
    AckTimeout,
    Event,
    RequestReceived,
    ResponseReceived,
    SendMessage,
    TransactionLayer,
    TransactionTimeout,
)
from sip_bridge.sip.ua_core import ACCEPT, ALLOW, SUPPORTED, UaCall, malformed_reply
from sip_bridge.sip.ua_events import (
    Address,
    CallEnded,
    CallEstablished,
    CallOffered,
    DtmfInfo,
    MediaUpdated,
    Send,
    TransferProgress,
    UaEvent,
)
from sip_bridge.sip.ua_session import SessionMixin
from sip_bridge.sip.ua_transfer import TransferMixin
from sip_bridge.sip.uas_invite import (
    UnsupportedBody,
    dtmf_digit,
    sdp_offer,
    stamp_via,
)

__all__ = [
    "ACCEPT",
    "ALLOW",
    "SUPPORTED",
    "Address",
    "Admission",
    "AdmitPolicy",
    "BridgeUA",
    "CallEnded",
    "CallEstablished",
    "CallOffered",
    "DtmfInfo",
    "MediaUpdated",
    "Send",
    "TransferProgress",
    "UaEvent",
]


@dataclass(frozen=True, slots=True)
class Admission:
    """What the admission policy says of a new INVITE: ``status`` 0 lets it in."""

    status: int = 0
    headers: tuple[tuple[str, str], ...] = ()  # e.g. WWW-Authenticate on a 401
    trunk: str | None = None
    srtp: str | None = None  # the trunk's SRTP mode; None: [sip] srtp


# Methods other SIP extensions define that we do not serve (405); the rest are unknown (501).
KNOWN_METHODS = frozenset(("REGISTER", "REFER", "SUBSCRIBE", "MESSAGE", "PRACK", "PUBLISH"))
URI_SCHEMES = ("sip", "sips", "tel")  # what a Request-URI to us may be (else 416)


def _accepts_sdp(req: SipRequest) -> bool:
    """No Accept means SDP (RFC 3261 20.1); otherwise SDP or a wildcard must be listed."""
    if "Accept" not in req.headers:
        return True
    types = {v.split(";", 1)[0].strip(" \t").lower() for v in req.headers.get_all("Accept")}
    return bool(types & {"application/sdp", "application/*", "*/*"})


# The app's say on who may call: the INVITE, its source and ``now`` in, an Admission out.
AdmitPolicy = Callable[[SipRequest, Address, float], Admission]


class BridgeUA(SessionMixin, TransferMixin):
    """All SIP calls of one bridge listener; ``active_calls`` counts the app's live calls."""

    def __init__(
        self,
        config: SipConfig,
        local_port: int,
        media_address: str,
        now: float,
        *,
        answer_timeout_s: float = 30.0,
        min_se: int = DEFAULT_MIN_SE,
        tls_port: int | None = None,
        admit: AdmitPolicy | None = None,
        transfer_timeout_s: float = 20.0,
        transfer_bye_s: float = 4.0,
    ) -> None:
        MediaConfig(media_address, 9)  # raises for 0.0.0.0/:: : never advertise a wildcard
        self.config = config
        self.local_port = local_port
        self.tls_port = tls_port  # the TLS listener's port, when it differs (Contact, Via)
        self.media_address = media_address
        host = config.advertised_host
        self.host = media_address if host in ("0.0.0.0", "::", "") else host
        self.answer_timeout_s = answer_timeout_s
        self.min_se = min_se
        self.admit = admit  # None: every source may call
        # Sources the admission policy gave up on (a flood): their datagrams go unread.
        self.silenced: Callable[[str, float], bool] | None = None
        # Draining: new calls and out-of-dialog OPTIONS get 503, so a dispatcher probing
        # with OPTIONS moves traffic elsewhere; calls in progress go on.
        self.draining = False
        # Shedding ([load], set by the app from its headroom): the same 503 to new calls
        # and to the dispatcher's probe while the node is past its budget.
        self.shedding = False
        self.shed_count = 0  # INVITEs refused for load
        self.transfer_timeout_s = transfer_timeout_s  # REFER sent -> final NOTIFY, at most
        self.transfer_bye_s = transfer_bye_s  # transfer succeeded -> our BYE if none came
        t = config.timers
        self._layer = TransactionLayer(TimerConfig(t1=t.t1, t2=t.t2, t4=t.t4))
        self._timers = TimerQueue()
        self._calls: dict[str, UaCall] = {}  # live, as the app sees them
        self._ending: dict[str, UaCall] = {}  # ended for the app, BYE still to finish
        self._by_tx: dict[str, UaCall] = {}
        self.created_at = now

    # ------------------------------------------------------------------ inspection
    @property
    def active_calls(self) -> int:
        return len(self._calls)

    @property
    def transactions(self) -> int:
        return len(self._layer)

    @property
    def ending_calls(self) -> int:
        """Calls ended for the app whose BYE (or the ACK before it) is still pending."""
        return len(self._ending)

    def next_deadline(self) -> float | None:
        pending = (self._layer.next_deadline(), self._timers.next_deadline())
        deadlines = [d for d in pending if d is not None]
        return min(deadlines) if deadlines else None

    # ------------------------------------------------------------------ inputs
    def receive_bytes(
        self, data: bytes, source: Address, transport: str, now: float
    ) -> list[UaEvent]:
        """One datagram (UDP); malformed requests get a stateless 400 when answerable."""
        if self.silenced is not None and self.silenced(source[0], now):
            return []
        try:
            msg = parse_message(data)
        except ValueError as exc:
            resp = malformed_reply(data, exc, self.host, self.config.user_agent)
            return [Send(resp.to_bytes(), source, transport)] if resp is not None else []
        return self.receive_message(msg, source, transport, now)

    def receive_message(
        self, msg: SipRequest | SipResponse, source: Address, transport: str, now: float
    ) -> list[UaEvent]:
        """One parsed message (the TCP path, after framing)."""
        if isinstance(msg, SipRequest):
            try:
                stamp_via(msg, source)
            except (ValueError, IndexError):
                return []
        return self._process(self._layer.receive(msg, source, transport, now), transport, now)

    def tick(self, now: float) -> list[UaEvent]:
        out = self._process(self._layer.tick(now), "", now)
        while (due := self._timers.pop_due(now)) is not None:
            call = self._calls.get(str(due[0]))
            if call is None:
                continue
            if due[1] == "answer" and call.state == "offered":
                out += self._final(call, 480, now)
                out.append(self._end(call, "not answered", "timeout"))
            elif due[1] == "st-refresh":
                out += self._send_refresh(call, now)
            elif due[1] == "st-expire":
                out += self._hang(call, now, "session timer expired", "timeout")
            elif due[1] in ("xfer-expire", "xfer-bye"):
                out += self._transfer_timer(call, due[1], now)
        return out

    # ------------------------------------------------------------------ app commands
    def answer(self, call_id: str, local_rtp_port: int, now: float) -> list[UaEvent]:
        """200 OK with our SDP: an answer to the INVITE's offer, or our offer (delayed)."""
        call = self._calls.get(call_id)
        if call is None or call.state != "offered":
            return []
        media = MediaConfig(self.media_address, local_rtp_port, srtp=call.srtp)
        negotiated: NegotiatedMedia | None = None
        try:
            if call.offer is not None:
                sdp = answer(call.offer, media)
                negotiated = answered_media(call.offer, sdp)
            else:
                sdp = make_offer(media, secrets.randbits(31))
        except SdpError as exc:
            out = self._final(call, exc.status, now, warning=exc)
            return [*out, self._end(call, f"{exc.status} {exc}", "local")]
        call.local_sdp, call.media, call.state = sdp, media, "answered"
        self._timers.cancel(call_id, "answer")
        resp = self._response(call.invite, 200, call.dialog.local_tag)
        for value in call.invite.headers.get_all("Record-Route"):
            resp.headers.add("Record-Route", value)
        resp.headers.add("Contact", call.dialog.local_contact)
        self._describe(resp)
        self._session_headers(resp, call, now)
        resp.headers.add("Content-Type", "application/sdp")
        resp.body = sdp.to_bytes()
        out = self._send_response(call.invite_tx, resp, now)
        if negotiated is not None:
            out.append(CallEstablished(call_id, negotiated))
        return out

    def ring(self, call_id: str, now: float) -> list[UaEvent]:
        """180 Ringing for an offered call (the caller hears ringback until `answer`)."""
        call = self._calls.get(call_id)
        if call is None or call.state != "offered":
            return []
        resp = self._response(call.invite, 180, call.dialog.local_tag)
        resp.headers.add("Contact", call.dialog.local_contact)
        return self._send_response(call.invite_tx, resp, now)

    def reject(self, call_id: str, status: int, now: float) -> list[UaEvent]:
        """Refuse an offered call with a 3xx-6xx (503 gets Retry-After)."""
        if not 300 <= status <= 699:
            raise ValueError(f"reject needs a 3xx-6xx status, got {status}")
        call = self._calls.get(call_id)
        if call is None or call.state != "offered":
            return []
        out = self._final(call, status, now)
        return [*out, self._end(call, f"rejected with {status}", "local")]

    def hangup(self, call_id: str, now: float, reason: str = "hangup") -> list[UaEvent]:
        """End a call from our side: BYE (or 480 before answer); CallEnded at once."""
        call = self._calls.get(call_id)
        if call is None:
            return []
        if call.state == "offered":
            return [*self._final(call, 480, now), self._end(call, reason, "local")]
        return self._hang(call, now, reason, "local")

    # ------------------------------------------------------------------ plumbing
    def _process(self, events: list[Event], transport: str, now: float) -> list[UaEvent]:
        out: list[UaEvent] = []
        for ev in events:
            if isinstance(ev, SendMessage):
                out.append(ev)
            elif isinstance(ev, RequestReceived):
                out += self._on_request(ev, transport, now)
            elif isinstance(ev, AckReceived):
                out += self._on_ack(ev, now)
            elif isinstance(ev, AckTimeout):
                out += self._on_ack_timeout(ev, now)
            elif isinstance(ev, ResponseReceived | TransactionTimeout):
                out += self._on_client_result(ev, now)
        return out

    # ------------------------------------------------------------------ requests
    def _on_request(self, ev: RequestReceived, transport: str, now: float) -> list[UaEvent]:
        req = ev.request
        method = req.method
        if method not in ALLOW:
            status = 405 if method in KNOWN_METHODS else 501
            return self._reply(ev, status, now, Allow=", ".join(ALLOW))
        if req.uri.partition(":")[0].lower() not in URI_SCHEMES:
            return self._reply(ev, 416, now)
        if method == "CANCEL":
            return self._on_cancel(ev, now)
        unsupported = [t for t in req.headers.get_all("Require") if t.lower() not in SUPPORTED]
        if unsupported:
            return self._reply(ev, 420, now, Unsupported=", ".join(unsupported))
        try:
            to_tag = NameAddr.parse(req.headers.get("To") or "").tag
        except ValueError:
            return self._reply(ev, 400, now)
        if to_tag is None:
            if method == "INVITE":
                return self._on_invite(ev, transport, now)
            if method == "OPTIONS":
                if self.draining or self.shedding:
                    return self._reply(ev, 503, now, Retry_After=str(self.config.retry_after_s))
                return self._options(ev, now)
            return self._reply(ev, 481, now)
        call = self._calls.get(req.call_id) or self._ending.get(req.call_id)
        if call is None or not call.dialog.matches(req):
            return self._reply(ev, 481, now)
        if not call.dialog.accept_remote_cseq(req):
            return self._reply(ev, 500, now)
        if call.call_id in self._ending:  # ended for the app; let the peer close cleanly
            return self._reply(ev, 200 if method == "BYE" else 481, now)
        if method == "BYE":
            out = self._reply(ev, 200, now) + self._transfer_abandoned(call)
            return [*out, self._end(call, "caller hung up", "remote")]
        if method == "NOTIFY":
            return self._on_notify(call, ev, now)
        if method == "OPTIONS":
            return self._options(ev, now)
        if method == "INFO":
            out = self._reply(ev, 200, now)
            digit = dtmf_digit(req)
            return out + ([DtmfInfo(call.call_id, digit)] if digit else [])
        return self._on_refresh(call, ev, now)  # re-INVITE or UPDATE

    def _options(self, ev: RequestReceived, now: float) -> list[UaEvent]:
        resp = self._response(ev.request, 200)
        self._describe(resp)
        return self._send_response(ev.tx_id, resp, now)

    def _on_invite(self, ev: RequestReceived, transport: str, now: float) -> list[UaEvent]:
        req = ev.request
        call_id = req.call_id
        if call_id in self._calls or call_id in self._ending:
            return self._reply(ev, 482, now)  # merged/looped request (RFC 3261 8.2.2.2)
        if self.draining:
            return self._reply(ev, 503, now, Retry_After=str(self.config.retry_after_s))
        if self.shedding:
            self.shed_count += 1
            return self._reply(ev, 503, now, Retry_After=str(self.config.retry_after_s))
        admission = self.admit(req, ev.source, now) if self.admit is not None else Admission()
        if admission.status:  # a refusal of an unproven source: no state kept for it
            resp = self._response(req, admission.status)
            for name, value in admission.headers:
                resp.headers.add(name, value)
            return self._process(self._layer.refuse_once(ev.tx_id, resp), "", now)
        if len(self._calls) >= self.config.max_calls:
            return self._reply(ev, 503, now, Retry_After=str(self.config.retry_after_s))
        if not _accepts_sdp(req):
            return self._reply(ev, 406, now, Accept="application/sdp")
        if "Contact" not in req.headers:  # RFC 2543: the caller is reached at its From URI
            req.headers.add("Contact", f"<{NameAddr.parse(req.headers.get('From') or '').uri}>")
        srtp = admission.srtp or self.config.srtp
        try:
            offer = sdp_offer(req)
            if offer is not None:  # can we serve it at all?
                answer(offer, MediaConfig(self.media_address, 9, srtp=srtp))
        except SdpError as exc:
            if isinstance(exc, UnsupportedBody):
                return self._reply(ev, 415, now, Accept="application/sdp")
            if isinstance(exc, NoCommonCodec):
                return self._reply(ev, 488, now, Warning=exc.warning(self.host))
            return self._reply(ev, 400, now, Warning=f'399 {self.host} "bad SDP"')
        try:
            timer = negotiate(req, self.min_se)
        except IntervalTooSmall as exc:
            return self._reply(ev, 422, now, Min_SE=str(exc.min_se))
        except ValueError:
            return self._reply(ev, 400, now, Warning=f'399 {self.host} "bad Session-Expires"')
        tag = new_tag()
        port = self.tls_port if transport.lower() == "tls" and self.tls_port else self.local_port
        contact_uri = SipUri("sip", "bridge", self.host, port, {"transport": transport})
        sent_by = f"[{self.host}]" if ":" in self.host else self.host
        sent_by = f"{sent_by}:{port}"
        try:
            dialog = Dialog.from_uas(
                req, tag, f"<{contact_uri.to_str()}>", transport, sent_by, self.config.user_agent
            )
            from_uri = NameAddr.parse(req.headers.get("From") or "").uri
            to_uri = NameAddr.parse(req.headers.get("To") or "").uri
        except (DialogError, ValueError) as exc:
            return self._reply(ev, getattr(exc, "status", 400), now)
        call = UaCall(
            call_id, req, ev.tx_id, ev.source, transport, dialog, offer, timer=timer, srtp=srtp
        )
        call.peer_allows_update = "UPDATE" in (m.upper() for m in req.headers.get_all("Allow"))
        self._calls[call_id] = call
        self._track(call, ev.tx_id)
        self._timers.arm(call_id, "answer", now + self.answer_timeout_s)
        offered = CallOffered(
            call_id, from_uri, to_uri, req.uri, offer, ev.source, admission.trunk,
            headers=tuple(req.headers.items()),
        )  # fmt: skip
        return [offered]

    def _on_cancel(self, ev: RequestReceived, now: float) -> list[UaEvent]:
        if ev.invite_tx_id is None:
            return self._reply(ev, 481, now)
        out = self._reply(ev, 200, now)
        call = self._by_tx.get(ev.invite_tx_id)
        if call is None or call.state != "offered" or call.call_id not in self._calls:
            return out  # already answered: the CANCEL has no effect (RFC 3261 9.2)
        out += self._final(call, 487, now)
        return [*out, self._end(call, "cancelled", "remote")]

    # ------------------------------------------------------------------ ACK, BYE results
    def _on_ack(self, ev: AckReceived, now: float) -> list[UaEvent]:
        call = self._by_tx.get(ev.tx_id) if ev.tx_id is not None else None
        if call is None:
            return []  # stray/late ACK: nothing to confirm
        if call.bye_after_ack:
            return self._send_bye(call, now)
        if call.call_id not in self._calls:
            return []
        if ev.tx_id == call.reoffer_tx:
            call.reoffer_tx = None
            try:
                assert call.local_sdp is not None
                media = accept_answer(call.local_sdp, parse_sdp(ev.request.body))
            except (SdpError, ValueError):
                return []  # keep the old media: the answer did not change anything we use
            return [MediaUpdated(call.call_id, media)]
        if call.state != "answered":
            return []
        call.state = "confirmed"
        if call.offer is not None:  # CallEstablished went out with the 200
            return self._pending_transfer(call, now)
        try:
            assert call.local_sdp is not None
            if not ev.request.body.strip():
                raise SdpError("the ACK carries no SDP answer")
            media = accept_answer(call.local_sdp, parse_sdp(ev.request.body))
        except (SdpError, ValueError) as exc:
            ended = self._end(call, f"no usable SDP answer in the ACK: {exc}", "local", keep=True)
            return [*self._send_bye(call, now), ended]
        return [CallEstablished(call.call_id, media), *self._pending_transfer(call, now)]

    def _on_ack_timeout(self, ev: AckTimeout, now: float) -> list[UaEvent]:
        call = self._by_tx.get(ev.tx_id)
        if call is None:
            return []
        if call.call_id in self._calls:
            abandoned = self._transfer_abandoned(call)
            ended = self._end(call, "no ACK", "timeout", keep=True)
            return [*self._send_bye(call, now), *abandoned, ended]
        return self._send_bye(call, now) if call.bye_after_ack else []

    def _on_client_result(
        self, ev: ResponseReceived | TransactionTimeout, now: float
    ) -> list[UaEvent]:
        call = self._by_tx.get(ev.tx_id)
        if call is None:
            return []
        if isinstance(ev, ResponseReceived) and ev.response.status < 200:
            return []
        if ev.tx_id == call.bye_tx:
            self._forget(call)  # BYE answered (any final) or timed out: the dialog is over
            return []
        if ev.tx_id == call.refer_tx:
            return self._on_refer_result(call, ev, now)
        return self._on_refresh_result(call, ev, now)

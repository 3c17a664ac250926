"""RFC 4028 session timers and in-dialog re-INVITE/UPDATE for our outbound calls.

A mixin of :class:`~sip_bridge.sip.uac.OutboundCall` (sans-I/O, explicit clock).  Without a
session timer a call whose BYE got lost holds its RTP port forever; with it, the refresher
re-sends the session at half the interval and the other side hangs up when none came by
SE - min(32, SE/3).  Timer roles are kept in the terms of our initial INVITE: ``"uac"``
means we refresh.  The peer's re-INVITE/UPDATE (its refresh, hold, a new address) is
answered here with :func:`~sip_bridge.sip.offer_answer.answer` and reported as
:class:`~sip_bridge.sip.uac_events.MediaChanged`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sip_bridge.sip.dialog import Dialog, DialogError
from sip_bridge.sip.message import NameAddr, SipResponse, SipUri, make_response
from sip_bridge.sip.offer_answer import (
    MediaConfig,
    NegotiatedMedia,
    accept_answer,
    answer,
    answered_media,
    make_offer,
)
from sip_bridge.sip.sdp import NoCommonCodec, SdpError, SessionDescription, parse_sdp
from sip_bridge.sip.session_timer import (
    IntervalTooSmall,
    SessionTimer,
    flip,
    negotiate,
    parse_session_expires,
    supports_timer,
)
from sip_bridge.sip.transaction import (
    AckReceived,
    AckTimeout,
    Event,
    RequestReceived,
    ResponseReceived,
    SendMessage,
    TransactionError,
    TransactionLayer,
    TransactionTimeout,
)
from sip_bridge.sip.uac_events import MediaChanged, UacEvent, UacState
from sip_bridge.sip.uas_invite import sdp_offer

__all__ = ["ALLOW", "UacSession", "sends", "timer_from_2xx"]

Address = tuple[str, int]
ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS, INFO, UPDATE, REFER"
GLARE_RETRY_S = (2.1, 4.0)  # RFC 3261 14.1: we own the Call-ID
BUSY_RETRY_S = 1.0  # our refresh waits this long while another INVITE transaction is open


def timer_from_2xx(resp: SipResponse) -> SessionTimer | None:
    """The timer a 2xx to our INVITE/UPDATE sets up (RFC 4028 7.2), None without one.

    A 2xx with Session-Expires but no refresher (a proxy added it for a UAS without the
    extension) leaves the refreshing to us; a malformed value counts as no timer.
    """
    value = resp.headers.get("Session-Expires")
    if value is None:
        return None
    try:
        interval, refresher = parse_session_expires(value)
    except ValueError:
        return None
    if interval <= 0:
        return None
    return SessionTimer(interval, refresher or "uac", supports_timer(resp))


@dataclass(slots=True)
class _Refresh:
    """Our pending refresh (UPDATE or re-INVITE) and what its retry would need."""

    tx_id: str
    method: str
    interval: int
    offer: SessionDescription | None  # re-INVITE only
    retried_422: bool = False


@dataclass(slots=True)
class _PeerReinvite:
    """The peer's re-INVITE whose 2xx we sent and whose ACK we wait for."""

    tx_id: str
    offer: SessionDescription | None  # our offer in the 2xx when theirs had no SDP


class UacSession:
    """The session-timer and re-INVITE half of an outbound call."""

    # Provided by OutboundCall.
    layer: TransactionLayer
    transport: str
    state: UacState
    dialog: Dialog | None
    media: NegotiatedMedia | None
    media_config: MediaConfig
    local_sdp: SessionDescription  # the last SDP we sent in this dialog
    min_se: int

    def _init_session(self, min_se: int) -> None:
        self.min_se = min_se
        self.timer: SessionTimer | None = None
        self.peer_allows_update = False
        self._refresh_at: float | None = None
        self._expire_at: float | None = None
        self._refresh: _Refresh | None = None
        self._refresh_ack: tuple[str, bytes] | None = None  # re-INVITE tx, its 2xx's ACK
        self._peer_reinvite: _PeerReinvite | None = None

    def _hop(self) -> Address:
        raise NotImplementedError

    def _bye(self, now: float, reason: str | None = None) -> list[UacEvent]:
        raise NotImplementedError

    # ------------------------------------------------------------------ timers
    def _start_timer(self, timer: SessionTimer | None, now: float) -> None:
        """(Re)start the session timer: any accepted refresh restarts it (RFC 4028 10)."""
        self.timer = timer
        self._refresh_at = self._expire_at = None
        if timer is None:
            return
        if timer.refresher == "uac":  # ours: refresh at SE/2, give up when it expires (10)
            self._refresh_at = now + timer.refresh_after
            self._expire_at = now + timer.interval
        else:
            self._expire_at = now + timer.expire_after

    def _stop_timer(self) -> None:
        self._refresh_at = self._expire_at = None

    @property
    def session_deadline(self) -> float | None:
        """When the session timer next acts (our refresh or the expiry BYE), None if off."""
        times = self._session_deadlines()
        return min(times) if times else None

    def _session_deadlines(self) -> list[float]:
        return [t for t in (self._refresh_at, self._expire_at) if t is not None]

    def _session_tick(self, now: float) -> list[UacEvent]:
        if self.state is not UacState.CONFIRMED:
            return []
        if self._expire_at is not None and now >= self._expire_at:
            self._stop_timer()
            return self._bye(now, "session expired")
        if self._refresh_at is not None and now >= self._refresh_at:
            self._refresh_at = None
            return self._send_refresh(now)
        return []

    # ------------------------------------------------------------------ our refresh
    def _send_refresh(
        self, now: float, method: str | None = None, interval: int | None = None
    ) -> list[UacEvent]:
        """UPDATE when the peer allows it, else re-INVITE with our offer (RFC 4028 7.4)."""
        timer, dialog = self.timer, self.dialog
        if timer is None or dialog is None or self.state is not UacState.CONFIRMED:
            return []
        method = method or ("UPDATE" if self.peer_allows_update else "INVITE")
        if self._refresh is not None or (method == "INVITE" and self._peer_reinvite):
            self._refresh_at = now + BUSY_RETRY_S  # one INVITE transaction at a time (14.1)
            return []
        interval = interval or timer.interval
        offer = None
        try:
            if method == "INVITE":
                sdp = self.local_sdp
                offer = make_offer(
                    self.media_config, int(sdp.origin.session_id), sdp.origin.version + 1
                )
                req = dialog.create_request("INVITE", offer.to_bytes())
            else:
                req = dialog.create_request("UPDATE")
        except (DialogError, ValueError):
            return self._bye(now, "session refresh impossible")
        req.headers.add("Session-Expires", f"{interval};refresher=uac")
        req.headers.add("Min-SE", str(self.min_se))
        req.headers.add("Supported", "timer")
        req.headers.add("Allow", ALLOW)
        try:
            tx_id, events = self.layer.send_request(req, self._hop(), self.transport, now)
        except TransactionError:
            return self._bye(now, "session refresh impossible")
        self._refresh = _Refresh(tx_id, method, interval, offer)
        if method == "INVITE":
            self._refresh_ack = (tx_id, dialog.create_ack(req.cseq[0]).to_bytes())
        return sends(events)

    def _is_refresh_tx(self, tx_id: str) -> bool:
        pending = self._refresh is not None and self._refresh.tx_id == tx_id
        return pending or (self._refresh_ack is not None and self._refresh_ack[0] == tx_id)

    def _on_refresh_response(self, ev: ResponseReceived, now: float) -> list[UacEvent]:
        """Our refresh's answer: ACK a re-INVITE's 2xx, restart the timer or retry/end."""
        resp, refresh = ev.response, self._refresh
        if resp.status < 200:
            return []
        out: list[UacEvent] = []
        if resp.status < 300 and self._refresh_ack and self._refresh_ack[0] == ev.tx_id:
            out.append(SendMessage(self._refresh_ack[1], self._hop(), self.transport))
        if refresh is None or refresh.tx_id != ev.tx_id:
            return out  # a retransmitted 2xx: ACKed again, counted once
        self._refresh = None
        if resp.status < 300:
            return out + self._on_refreshed(refresh, resp, now)
        status = resp.status
        min_se = _min_se(resp)
        if status == 422 and min_se is not None and not refresh.retried_422:
            self.min_se = max(self.min_se, min_se)  # RFC 4028 7.4: retry with their floor
            out += self._send_refresh(now, refresh.method, max(refresh.interval, min_se))
            if self._refresh is not None:
                self._refresh.retried_422 = True
            return out
        if status == 491:
            self._refresh_at = now + random.uniform(*GLARE_RETRY_S)
            return out
        if status in (405, 501) and refresh.method == "UPDATE":
            self.peer_allows_update = False  # fall back to re-INVITE (RFC 4028 7.4)
            return out + self._send_refresh(now, "INVITE", refresh.interval)
        return out + self._bye(now, f"session refresh failed: {status} {resp.reason}")

    def _on_refreshed(self, refresh: _Refresh, resp: SipResponse, now: float) -> list[UacEvent]:
        out: list[UacEvent] = []
        self._take_target(resp)
        if refresh.offer is not None and resp.body.strip():
            try:
                media = accept_answer(refresh.offer, parse_sdp(resp.body))
            except (SdpError, ValueError):
                media = None  # a bad answer: the old session stays (RFC 3261 14.1)
            if media is not None:
                self.local_sdp = refresh.offer
                out += self._media_event(media)
        timer = timer_from_2xx(resp)  # without Session-Expires, no more timer (RFC 4028 7.2)
        self._start_timer(timer, now)
        return out

    def _take_target(self, resp: SipResponse) -> None:
        """A target-refresh 2xx may carry a new Contact (RFC 3261 12.2.1.2)."""
        contact = resp.headers.get("Contact")
        if self.dialog is None or not contact:
            return
        try:
            uri = NameAddr.parse(contact).uri
            SipUri.parse(uri)
        except ValueError:
            return
        self.dialog.remote_target = uri

    def _on_refresh_timeout(self, ev: TransactionTimeout, now: float) -> list[UacEvent]:
        if self._refresh is None or self._refresh.tx_id != ev.tx_id:
            return []
        self._refresh = None
        return self._bye(now, "session refresh timed out")  # RFC 4028 10, RFC 3261 12.2.1.2

    # ------------------------------------------------------------------ the peer's requests
    def _reply(self, ev: RequestReceived, status: int, now: float, **hdrs: str) -> list[UacEvent]:
        resp = make_response(ev.request, status)
        for name, value in hdrs.items():
            resp.headers.add(name.replace("_", "-"), value)
        return sends(self.layer.send_response(ev.tx_id, resp, now))

    def _on_peer_refresh(self, ev: RequestReceived, now: float) -> list[UacEvent]:
        """The peer's re-INVITE or UPDATE: session refresh, hold/unhold, new address."""
        req, dialog = ev.request, self.dialog
        if dialog is None or self.state is not UacState.CONFIRMED:
            return self._reply(ev, 500, now, Retry_After="1")
        has_sdp = bool(req.body.strip())
        our_invite = self._refresh is not None and self._refresh.method == "INVITE"
        if req.method == "INVITE" and self._peer_reinvite is not None:
            return self._reply(ev, 500, now, Retry_After="1")  # RFC 3261 14.2
        if our_invite and (req.method == "INVITE" or has_sdp):
            return self._reply(ev, 491, now)  # glare with our re-INVITE's offer
        try:
            asked = negotiate(req, self.min_se)
        except IntervalTooSmall as exc:  # the session goes on unchanged (RFC 4028 9)
            return self._reply(ev, 422, now, Min_SE=str(exc.min_se))
        except ValueError:
            return self._reply(ev, 400, now)
        try:
            offer = sdp_offer(req)
            sdp, media = self.local_sdp, None
            if offer is not None:
                sdp = answer(offer, self.media_config, previous=self.local_sdp)
                media = answered_media(offer, sdp)
            dialog.refresh_target(req)  # only once the request is accepted (12.2.2)
        except (DialogError, SdpError) as exc:  # the old session stays as it was (14.2)
            warn = {"Warning": exc.warning()} if isinstance(exc, NoCommonCodec) else {}
            return self._reply(ev, exc.status, now, **warn)
        resp = make_response(req, 200)
        resp.headers.add("Contact", dialog.local_contact)
        resp.headers.add("Allow", ALLOW)
        resp.headers.add("Supported", "timer")
        timer = self.timer
        if asked is not None:  # their roles: "uac" is the peer, ours the other way round
            timer = SessionTimer(asked.interval, flip(asked.refresher), asked.require)
        if timer is not None:
            resp.headers.add(
                "Session-Expires", f"{timer.interval};refresher={flip(timer.refresher)}"
            )
            if supports_timer(req):
                resp.headers.add("Require", "timer")
        self._start_timer(timer, now)
        our_offer = None
        if offer is not None:
            self.local_sdp = sdp
        elif req.method == "INVITE":  # no offer: ours goes in the 2xx, the ACK answers
            version = self.local_sdp.origin.version + 1
            our_offer = make_offer(self.media_config, int(sdp.origin.session_id), version)
            sdp = our_offer
        if offer is not None or our_offer is not None:
            resp.headers.add("Content-Type", "application/sdp")
            resp.body = sdp.to_bytes()
        out = sends(self.layer.send_response(ev.tx_id, resp, now))
        if req.method == "INVITE":
            self._peer_reinvite = _PeerReinvite(ev.tx_id, our_offer)
        return out + (self._media_event(media) if media is not None else [])

    def _on_ack(self, ev: AckReceived, now: float) -> list[UacEvent]:
        """The ACK of our 2xx to the peer's re-INVITE; it carries the answer to our offer."""
        pending = self._peer_reinvite
        if pending is None or ev.tx_id != pending.tx_id:
            return []
        self._peer_reinvite = None
        if pending.offer is None:
            return []
        try:
            media = accept_answer(pending.offer, parse_sdp(ev.request.body))
        except (SdpError, ValueError) as exc:  # no usable answer: end it (RFC 3261 13.3.1.4)
            return self._bye(now, f"bad SDP answer in ACK: {exc}")
        self.local_sdp = pending.offer
        return self._media_event(media)

    def _on_ack_timeout(self, ev: AckTimeout, now: float) -> list[UacEvent]:
        if self._peer_reinvite is None or ev.tx_id != self._peer_reinvite.tx_id:
            return []
        self._peer_reinvite = None
        return self._bye(now, "no ACK for our 2xx to the re-INVITE")  # 13.3.1.4

    def _media_event(self, media: NegotiatedMedia) -> list[UacEvent]:
        if media == self.media:
            return []
        self.media = media
        return [MediaChanged(media)]


def _min_se(resp: SipResponse) -> int | None:
    value = (resp.headers.get("Min-SE") or "").split(";")[0].strip()
    return int(value) if value.isdigit() else None


def sends(events: list[Event]) -> list[UacEvent]:
    """The datagrams among the layer's events (the only kind a send can produce)."""
    return [e for e in events if isinstance(e, SendMessage)]

"""Re-INVITE/UPDATE and RFC 4028 session timers: the part of the bridge UA that keeps a
confirmed call's session alive (or notices it is dead).

A mixin over :class:`~sip_bridge.sip.ua_core.UaCore`: the peer's refreshes are answered here
(new remote target, a new SDP answer, the timer restarted) and, as refresher, we send
UPDATE (re-INVITE with our SDP when the peer does not allow UPDATE) at half the interval.
"""

from __future__ import annotations

from sip_bridge.sip.dialog import DialogError
from sip_bridge.sip.message import SipResponse
from sip_bridge.sip.offer_answer import answer, answered_media
from sip_bridge.sip.sdp import NoCommonCodec, SdpError
from sip_bridge.sip.session_timer import (
    IntervalTooSmall,
    SessionTimer,
    flip,
    negotiate,
    parse_session_expires,
)
from sip_bridge.sip.transaction import (
    RequestReceived,
    ResponseReceived,
    TransactionError,
    TransactionTimeout,
)
from sip_bridge.sip.ua_core import ALLOW, SUPPORTED, UaCall, UaCore
from sip_bridge.sip.ua_events import MediaUpdated, UaEvent
from sip_bridge.sip.uas_invite import in_dialog_destination, sdp_offer

__all__ = ["SessionMixin"]


class SessionMixin(UaCore):
    """re-INVITE/UPDATE from the peer and the session timer, on both sides."""

    min_se: int

    def _on_refresh(self, call: UaCall, ev: RequestReceived, now: float) -> list[UaEvent]:
        """re-INVITE or UPDATE: new remote target and, with SDP, a new answer."""
        req = ev.request
        if call.state != "confirmed" or call.reoffer_tx is not None or call.media is None:
            return self._reply(ev, 500, now, Retry_After="1")  # RFC 3261 14.2
        if req.method == "INVITE" and call.refresh_ack and call.refresh_ack[0] == call.refresh_tx:
            return self._reply(ev, 491, now)  # our refresh re-INVITE is pending: glare (14.2)
        try:
            timer = negotiate(req, self.min_se) or call.timer
        except IntervalTooSmall as exc:  # the session goes on unchanged (RFC 4028 9)
            return self._reply(ev, 422, now, Min_SE=str(exc.min_se))
        except ValueError:
            return self._reply(ev, 400, now, Warning=f'399 {self.host} "bad Session-Expires"')
        try:
            offer = sdp_offer(req)
            sdp = call.local_sdp
            assert sdp is not None
            negotiated = None
            if offer is not None:
                sdp = answer(offer, call.media, previous=call.local_sdp)
                negotiated = answered_media(offer, sdp)
            call.dialog.refresh_target(req)  # only once the request is accepted (12.2.2)
        except (DialogError, SdpError) as exc:  # the old session stays as it was (14.2)
            warn = {"Warning": exc.warning(self.host)} if isinstance(exc, NoCommonCodec) else {}
            return self._reply(ev, exc.status, now, **warn)
        call.timer = timer
        resp = self._response(req, 200, call.dialog.local_tag)
        resp.headers.add("Contact", call.dialog.local_contact)
        self._describe(resp)
        self._session_headers(resp, call, now)
        if offer is not None:
            call.offer, call.local_sdp = offer, sdp
        elif req.method == "INVITE":
            call.reoffer_tx = ev.tx_id  # we re-offer what we have; the ACK carries the answer
        else:
            return self._send_response(ev.tx_id, resp, now)  # UPDATE without SDP: a refresh
        resp.headers.add("Content-Type", "application/sdp")
        resp.body = sdp.to_bytes()
        out = self._send_response(ev.tx_id, resp, now)
        if req.method == "INVITE":
            self._track(call, ev.tx_id)
        return out + ([MediaUpdated(call.call_id, negotiated)] if negotiated else [])

    def _on_refresh_result(
        self, call: UaCall, ev: ResponseReceived | TransactionTimeout, now: float
    ) -> list[UaEvent]:
        """A final response (or timeout) of our refresh; every 2xx to a re-INVITE is ACKed."""
        ack = call.refresh_ack
        resp = ev.response if isinstance(ev, ResponseReceived) else None
        if resp is not None and resp.status < 300 and ack and ack[0] == ev.tx_id:
            # Every 2xx copy to our re-INVITE gets the ACK (RFC 3261 13.2.2.4).
            dest, transport = in_dialog_destination(call.dialog, call.source, call.transport)
            out = self._process(self._layer.send_stateless(ack[1], dest, transport), "", now)
            if ack[0] != call.refresh_tx:
                return out  # a retransmitted 2xx: the refresh already counted
            return out + self._on_refreshed(call, resp, now)
        if ev.tx_id != call.refresh_tx:
            return []
        call.refresh_tx = None
        if call.call_id not in self._calls:
            return []
        if isinstance(ev, TransactionTimeout) or ev.response.status in (408, 481):
            return self._hang(call, now, "session refresh failed", "timeout")  # 12.2.1.2
        if ev.response.status >= 300:
            return []  # e.g. 491: the expiry timer still runs and decides
        return self._on_refreshed(call, ev.response, now)

    # ------------------------------------------------------------------ session timers
    def _session_headers(self, resp: SipResponse, call: UaCall, now: float) -> None:
        """Session-Expires (and Require: timer) on a 2xx; the session timer restarts."""
        timer = call.timer
        if timer is None:
            return
        resp.headers.add("Session-Expires", timer.header)
        if timer.require:
            resp.headers.add("Require", "timer")
        self._arm_session(call, now)

    def _arm_session(self, call: UaCall, now: float) -> None:
        timer = call.timer
        if timer is None:
            return
        self._timers.cancel_all(call.call_id, ("st-refresh", "st-expire"))
        if timer.refresher == "uas":
            self._timers.arm(call.call_id, "st-refresh", now + timer.refresh_after)
        self._timers.arm(call.call_id, "st-expire", now + timer.expire_after)

    def _send_refresh(self, call: UaCall, now: float) -> list[UaEvent]:
        """We refresh (RFC 4028 7.4): UPDATE when allowed, else re-INVITE with our SDP."""
        timer, sdp = call.timer, call.local_sdp
        if timer is None or sdp is None or call.state != "confirmed":
            return []
        if call.refresh_tx is not None or call.reoffer_tx is not None:
            return []  # a transaction is still pending; the expiry timer stays armed
        try:
            if call.peer_allows_update:
                req = call.dialog.create_request("UPDATE")
            else:
                req = call.dialog.create_request("INVITE", sdp.to_bytes())
                req.headers.add("Allow", ", ".join(ALLOW))
            # we refresh, and in this transaction we are the UAC (RFC 4028 7.4)
            req.headers.add("Session-Expires", f"{timer.interval};refresher=uac")
            req.headers.add("Min-SE", str(self.min_se))
            req.headers.add("Supported", ", ".join(SUPPORTED))
            tx_id, out = self._send_in_dialog(call, req, now)
        except (TransactionError, ValueError):
            return []
        call.refresh_tx = tx_id
        if req.method == "INVITE":
            call.refresh_ack = (tx_id, call.dialog.create_ack(req.cseq[0]))
        return out

    def _on_refreshed(self, call: UaCall, resp: SipResponse, now: float) -> list[UaEvent]:
        """A 2xx to our refresh: the peer may have changed interval or refresher."""
        call.refresh_tx = None
        timer = call.timer
        value = resp.headers.get("Session-Expires")
        if timer is not None and value:
            try:
                interval, refresher = parse_session_expires(value)
                # the answer names roles of our refresh transaction: its "uac" is us, the
                # original dialog's "uas"
                ours = flip(refresher) if refresher is not None else "uas"
                call.timer = SessionTimer(interval, ours, timer.require)
            except ValueError:
                pass  # keep what we asked for
        if call.call_id in self._calls:
            self._arm_session(call, now)
        return []

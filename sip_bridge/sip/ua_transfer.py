"""Blind transfer of a caller by REFER: the bridge UA's wiring of :mod:`sip_bridge.sip.transfer`.

A mixin over :class:`~sip_bridge.sip.ua_core.UaCore`.  ``transfer()`` sends the REFER in the
call's dialog; its response, the NOTIFYs of the implicit subscription and two per-call
timers turn into :class:`~sip_bridge.sip.transfer.TransferProgress` events:

- ``xfer-expire``: no final report ``transfer_timeout_s`` after the REFER -> failed
  (status 0).  The REFER's own timeout (Timer F) reports 408 sooner.
- ``xfer-bye``: after "succeeded" the transferee normally hangs up on us; if it has not
  within ``transfer_bye_s`` we send BYE ourselves (RFC 5589 practice).
"""

from __future__ import annotations

from sip_bridge.sip.message import NameAddr
from sip_bridge.sip.transaction import (
    RequestReceived,
    ResponseReceived,
    TransactionError,
    TransactionTimeout,
)
from sip_bridge.sip.transfer import Refer, TransferProgress, parse_event, refer_target
from sip_bridge.sip.ua_core import ALLOW, UaCall, UaCore
from sip_bridge.sip.ua_events import UaEvent

__all__ = ["TransferMixin"]


class TransferMixin(UaCore):
    """REFER out, NOTIFY in; one transfer at a time per call."""

    transfer_timeout_s: float
    transfer_bye_s: float

    def transfer(self, call_id: str, target_uri: str, now: float) -> list[UaEvent]:
        """Blind-transfer the caller to ``target_uri`` (a SIP/tel URI or a bare number).

        A call that is not established, a transfer already running or a target that is
        neither URI nor number gives a final "failed" progress at once (status 0).
        """
        call = self._calls.get(call_id)
        if call is None:
            return []
        running = call.transfer is not None and not call.transfer.final
        if call.state == "answered" and not running and call.pending_transfer is None:
            call.pending_transfer = target_uri  # our 200 is out, its ACK not yet in
            return []
        try:
            if call.state != "confirmed":
                raise ValueError("the call is not established")
            if running:
                raise ValueError("a transfer is already in progress")
            caller = NameAddr.parse(call.invite.headers.get("From") or "").uri
            uri = refer_target(target_uri, caller)
        except ValueError as exc:
            return [TransferProgress(call_id, target_uri, 0, True, "failed", str(exc))]
        try:
            req = call.dialog.create_request("REFER")
            req.headers.add("Refer-To", f"<{uri}>")
            req.headers.add("Referred-By", call.dialog.local_uri)
            req.headers.add("Allow", ", ".join(ALLOW))
            tx_id, out = self._send_in_dialog(call, req, now)
        except (TransactionError, ValueError) as exc:
            return [TransferProgress(call_id, uri, 0, True, "failed", f"REFER not sent: {exc}")]
        call.transfer, call.refer_tx = Refer(call_id, uri, req.cseq[0]), tx_id
        self._timers.cancel(call_id, "xfer-bye")
        self._timers.arm(call_id, "xfer-expire", now + self.transfer_timeout_s)
        return out

    def _on_refer_result(
        self, call: UaCall, ev: ResponseReceived | TransactionTimeout, now: float
    ) -> list[UaEvent]:
        """The REFER's final response (2xx: the subscription is on) or its timeout."""
        call.refer_tx = None
        transfer = call.transfer
        if transfer is None or call.call_id not in self._calls:
            return []
        if isinstance(ev, TransactionTimeout):
            return self._report(call, transfer.failed(408, "REFER timed out"), now)
        resp = ev.response
        return self._report(call, transfer.on_refer_response(resp.status, resp.reason), now)

    def _on_notify(self, call: UaCall, ev: RequestReceived, now: float) -> list[UaEvent]:
        """An in-dialog NOTIFY: 200 and progress for our REFER's subscription, else 481/489."""
        req = ev.request
        event = req.headers.get("Event") or ""
        transfer = call.transfer
        if transfer is None:
            return self._notify_reply(ev, 481 if parse_event(event)[0] == "refer" else 489, now)
        answer = transfer.on_notify(
            event,
            req.headers.get("Subscription-State") or "",
            req.headers.get("Content-Type") or "",
            req.body,
        )
        out = self._notify_reply(ev, answer.status, now)
        return out + self._report(call, answer.progress, now)

    def _notify_reply(self, ev: RequestReceived, status: int, now: float) -> list[UaEvent]:
        """489 names the one event package we take (RFC 6665 8.2.2)."""
        if status == 489:
            return self._reply(ev, status, now, Allow_Events="refer")
        return self._reply(ev, status, now)

    def _report(self, call: UaCall, progress: TransferProgress | None, now: float) -> list[UaEvent]:
        """Pass a progress on; a final one stops the wait, a success starts the BYE grace."""
        if progress is None:
            return []
        if progress.final:
            self._timers.cancel(call.call_id, "xfer-expire")
            if progress.outcome == "succeeded":
                self._timers.arm(call.call_id, "xfer-bye", now + self.transfer_bye_s)
        return [progress]

    def _transfer_timer(self, call: UaCall, name: str, now: float) -> list[UaEvent]:
        """``xfer-expire`` (no final report in time) or ``xfer-bye`` (nobody hung up)."""
        transfer = call.transfer
        if name == "xfer-bye":
            return self._hang(call, now, "transferred", "local")
        if transfer is None:
            return []
        bound = f"no final transfer report within {self.transfer_timeout_s:g} s"
        return self._report(call, transfer.failed(0, bound), now)

    def _pending_transfer(self, call: UaCall, now: float) -> list[UaEvent]:
        """The ACK came: send the REFER an agent asked for while it was on its way."""
        target, call.pending_transfer = call.pending_transfer, None
        return self.transfer(call.call_id, target, now) if target is not None else []

    def _transfer_abandoned(self, call: UaCall) -> list[UaEvent]:
        """The call ends (caller's BYE) with a transfer still open: its outcome is unknown."""
        if call.pending_transfer is not None:
            target, call.pending_transfer = call.pending_transfer, None
            reason = "the call ended before it was established"
            return [TransferProgress(call.call_id, target, 0, True, "failed", reason)]
        transfer = call.transfer
        if transfer is None or transfer.final:
            return []
        progress = transfer.failed(0, "the call ended before the transfer reported an outcome")
        return [progress] if progress is not None else []

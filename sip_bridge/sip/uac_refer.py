"""Blind transfer seen from the transferee (RFC 3515): REFER in, NOTIFY out, sans-I/O.

A mixin of :class:`~sip_bridge.sip.uac.OutboundCall`, so an outbound call (the call-script
runner's) can be transferred the way a phone is: a REFER in our dialog with one valid
``Refer-To`` gets 202 Accepted and becomes :class:`~sip_bridge.sip.uac_events.ReferReceived`;
the runner places the new call and reports it with :meth:`notify_refer`, one NOTIFY of
the implicit subscription (``Event: refer;id=<the REFER's CSeq>``) per status, a
``message/sipfrag`` status line in each; a final status terminates the subscription.

A REFER outside an established call gets 481, one without exactly one usable Refer-To
400, and a second one while a transfer is still running 491 (Request Pending).
"""

from __future__ import annotations

from sip_bridge.sip.message import NameAddr, SipUri
from sip_bridge.sip.transaction import RequestReceived
from sip_bridge.sip.uac_events import ReferReceived, UacEvent, UacState
from sip_bridge.sip.uac_session import UacSession, sends

__all__ = ["UacTransferee"]


class UacTransferee(UacSession):
    """The REFER half of an outbound call; one transfer at a time."""

    def _init_transferee(self) -> None:
        self._refer_id: int | None = None  # CSeq of the REFER whose subscription runs
        self._refer_final = True

    def _on_refer(self, ev: RequestReceived, now: float) -> list[UacEvent]:
        req = ev.request
        if self.state is not UacState.CONFIRMED:
            return self._reply(ev, 481, now)
        values = req.headers.get_all("Refer-To")
        try:
            if len(values) != 1:
                raise ValueError("one Refer-To is required")
            target = NameAddr.parse(values[0]).uri
            if not target.lower().startswith("tel:"):
                SipUri.parse(target)
        except ValueError:
            return self._reply(ev, 400, now)
        if not self._refer_final:
            return self._reply(ev, 491, now)
        self._refer_id, self._refer_final = req.cseq[0], False
        referred_by = req.headers.get("Referred-By") or ""
        return [*self._reply(ev, 202, now), ReferReceived(target, referred_by)]

    def notify_refer(self, status: int, reason: str, now: float) -> list[UacEvent]:
        """Tell the transferor how the new call goes: a 1xx keeps the subscription active,
        a final status (2xx success, anything else failure) ends it. A no-op without a
        running transfer or once the call is over."""
        dialog = self.dialog
        if self._refer_id is None or self._refer_final or dialog is None:
            return []
        if self.state is not UacState.CONFIRMED:
            return []
        final = status >= 200
        body = f"SIP/2.0 {status} {reason}\r\n".encode()
        req = dialog.create_request("NOTIFY", body, "message/sipfrag;version=2.0")
        req.headers.add("Event", f"refer;id={self._refer_id}")
        state = "terminated;reason=noresource" if final else "active;expires=60"
        req.headers.add("Subscription-State", state)
        self._refer_final = final
        _, events = self.layer.send_request(req, self._hop(), self.transport, now)
        return sends(events)

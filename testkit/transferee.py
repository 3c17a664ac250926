"""The caller's side of a blind transfer: a phone that follows the bridge's REFER.

A transferee (RFC 3515) takes the REFER with 202, places a call to the Refer-To target
itself and reports that call's progress back in NOTIFYs (``Event: refer``, a
``message/sipfrag`` status line): 100 Trying, 180 Ringing, then the final status with
``Subscription-State: terminated``. After a 2xx it hangs up on the bridge, as a phone
does once it is connected elsewhere. The target is a real UAS on loopback (sipp in the
tests): one that answers, one that rejects, one that only rings.

:class:`ReferableCall` is the caller's call (an :class:`OutboundCall` that accepts REFER);
:class:`Transferee` places the call to the target and feeds its progress back.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sip_bridge.sip.message import NameAddr, SipUri, make_response
from sip_bridge.sip.offer_answer import MediaConfig
from sip_bridge.sip.transaction import RequestReceived, SendMessage
from sip_bridge.sip.transport import Received, SipTransport, next_item
from sip_bridge.sip.uac import CallAnswered, CallFailed, CallProgress, OutboundCall, UacEvent
from sip_bridge.sip.uac_session import sends

__all__ = ["ReferableCall", "Referred", "Transferee"]


@dataclass(frozen=True)
class Referred:
    """The bridge asked us (REFER, answered 202) to call ``target``."""

    target: str
    refer_cseq: int


class ReferableCall(OutboundCall):
    """An outbound call that accepts an in-dialog REFER (:attr:`referrals` collects them)
    and can NOTIFY its progress."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.referrals: list[Referred] = []
        self.refer_cseq = 0

    def _on_request(self, ev: RequestReceived, now: float) -> list[UacEvent]:
        req = ev.request
        dialog = self.dialog
        if req.method != "REFER" or dialog is None or not dialog.matches(req):
            return super()._on_request(ev, now)
        if not dialog.accept_remote_cseq(req):
            return sends(self.layer.send_response(ev.tx_id, make_response(req, 500), now))
        target = NameAddr.parse(req.headers.get("Refer-To") or "").uri
        self.refer_cseq = req.cseq[0]
        self.referrals.append(Referred(target, self.refer_cseq))
        return sends(self.layer.send_response(ev.tx_id, make_response(req, 202), now))

    def notify(self, status: int, reason: str, now: float, *, final: bool) -> list[UacEvent]:
        """One NOTIFY of the refer subscription carrying ``SIP/2.0 status reason``."""
        assert self.dialog is not None
        frag = f"SIP/2.0 {status} {reason}\r\n".encode()
        req = self.dialog.create_request("NOTIFY", frag, "message/sipfrag;version=2.0")
        req.headers.add("Event", f"refer;id={self.refer_cseq}")
        state = "terminated;reason=noresource" if final else "active;expires=60"
        req.headers.add("Subscription-State", state)
        _, events = self.layer.send_request(req, self._hop(), self.transport, now)
        return sends(events)


class Transferee:
    """Places the call a REFER asks for and reports it back through ``caller``'s NOTIFYs.

    ``send(events)`` puts the caller call's datagrams on its SIP socket; ``hang_up()`` is
    called once the target answered (the transferee leaves the bridge)."""

    def __init__(
        self,
        caller: ReferableCall,
        send: Callable[[list[UacEvent]], None],
        hang_up: Callable[[], None],
    ) -> None:
        self.caller = caller
        self._send = send
        self._hang_up = hang_up
        self.progress: list[int] = []  # statuses heard from the target
        self.referred: Referred | None = None
        self._task: asyncio.Task[None] | None = None
        self._call: OutboundCall | None = None
        self._sip: SipTransport | None = None

    def on_referred(self, ev: Referred) -> None:
        self.referred = ev
        self._task = asyncio.get_running_loop().create_task(self._dial(ev.target))

    def _notify(self, status: int, reason: str, *, final: bool) -> None:
        now = asyncio.get_running_loop().time()
        self._send(self.caller.notify(status, reason, now, final=final))

    async def _dial(self, target: str) -> None:
        loop = asyncio.get_running_loop()
        uri = SipUri.parse(target)
        inbox: asyncio.Queue[Received] = asyncio.Queue()
        sip = self._sip = SipTransport(inbox.put_nowait)
        await sip.start("127.0.0.1", 0, ("udp",))
        assert sip.local is not None
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # a port for our SDP
            s.bind(("127.0.0.1", 0))
            rtp_port = s.getsockname()[1]
        media = MediaConfig("127.0.0.1", rtp_port, codecs=("PCMU",), telephone_event=False)
        call = self._call = OutboundCall(target, sip.local, (uri.host, uri.port or 5060), media)
        self._notify(100, "Trying", final=False)
        events = call.start(loop.time())
        while True:
            for ev in events:
                if isinstance(ev, SendMessage):
                    sip.send_nowait(ev.data, ev.destination, ev.transport)
                elif isinstance(ev, CallProgress):
                    self.progress.append(ev.status)
                    self._notify(ev.status, ev.reason, final=False)
                elif isinstance(ev, CallAnswered):
                    self.progress.append(ev.response.status)
                    self._notify(200, "OK", final=True)
                    await asyncio.sleep(0.2)  # the NOTIFY's answer, then leave the bridge
                    self._hang_up()
                elif isinstance(ev, CallFailed):
                    self.progress.append(ev.status)
                    self._notify(ev.status, ev.reason or "Failed", final=True)
                    return
            deadline = call.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - loop.time())
            item = await next_item(inbox, timeout)
            now = loop.time()
            events = []
            if item is not None and item.data is not None:
                events = call.receive(item.data, item.source, now)
            events += call.tick(now)

    async def close(self) -> None:
        """Hang up the target call (if any) and stop."""
        call, sip = self._call, self._sip
        if call is not None and sip is not None:
            for ev in call.hangup(asyncio.get_running_loop().time()):
                if isinstance(ev, SendMessage):
                    sip.send_nowait(ev.data, ev.destination, ev.transport)
            await asyncio.sleep(0.1)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if sip is not None:
            await sip.close()

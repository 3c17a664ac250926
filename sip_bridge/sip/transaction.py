"""The RFC 3261 section 17 transaction layer (with RFC 6026's Accepted state), sans-I/O.

Messages and an explicit ``now`` go in; :class:`SendMessage` (bytes for the transport) and
events for the transaction user (TU) come out. Nothing here reads a clock, sleeps or
touches a socket: the asyncio layer calls :meth:`TransactionLayer.tick` at
:meth:`TransactionLayer.next_deadline`. Every transaction ends on a timer, so state stays
bounded whatever peers do (a scanner's never-ACKed rejections are gone after Timer H).

Choices the RFC leaves open, made here:

- An INVITE server transaction sends ``100 Trying`` at once (RFC 3261 17.2.1 allows it;
  the TU of a voice agent rarely answers within 200 ms, and an early 100 stops the
  caller's Timer A sooner).
- Responses go back to the request's source address and transport (symmetric response
  routing, as RFC 3581 ``rport`` does; right for NAT'd callers and for TCP connections).
- 2xx reliability (RFC 3261 13.3.1.4) lives inside the layer: a 2xx puts the INVITE server
  transaction in RFC 6026's Accepted state, which retransmits the 2xx (T1 doubling, capped
  at T2, on unreliable transports only), reports the ACK as :class:`AckReceived` and, if
  no ACK came by Timer L (64*T1), reports :class:`AckTimeout` so the UA can send BYE.
- The ACK for a non-2xx final is built and sent by the INVITE client transaction
  (17.1.1.3); the ACK for a 2xx is the UA's, sent with :meth:`TransactionLayer.send_stateless`.
- :meth:`TransactionLayer.cancel` before any provisional response queues the CANCEL and
  sends it when the first 1xx arrives (RFC 3261 9.1); a final response drops it.
- RFC 3261 gives an INVITE client transaction in Proceeding no timer. Here Timer C
  (``TimerConfig.c``, 180 s, restarted by each 101-199 as in 16.7) sends a CANCEL and, if
  no final comes within 64*T1 more, ends it with :class:`TransactionTimeout` ``"C"``.
- Server transactions waiting for the TU's first final response have no timer: the TU
  (ours) must answer every :class:`RequestReceived`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from sip_bridge.sip.message import NameAddr, SipRequest, SipResponse, make_response
from sip_bridge.sip.timers import TimerConfig, TimerQueue, is_reliable
from sip_bridge.sip.transaction_events import (
    AckReceived,
    AckTimeout,
    Event,
    RequestReceived,
    ResponseReceived,
    SendMessage,
    StrayResponse,
    TransactionError,
    TransactionTimeout,
    TxState,
)

__all__ = [
    "AckReceived",
    "AckTimeout",
    "Event",
    "RequestReceived",
    "ResponseReceived",
    "SendMessage",
    "StrayResponse",
    "TimerConfig",
    "TransactionError",
    "TransactionLayer",
    "TransactionTimeout",
    "TxState",
]

Address = tuple[str, int]
MAGIC_COOKIE = "z9hG4bK"


@dataclass(slots=True, eq=False)
class _Tx:
    """One transaction, client or server; ``peer`` is the destination or the source."""

    tx_id: str
    key: tuple[object, ...]
    server: bool
    invite: bool
    request: SipRequest
    peer: Address
    transport: str
    reliable: bool
    state: TxState
    out: bytes = b""  # bytes replayed on retransmission/timer: request, response or ACK
    response: SipResponse | None = None
    interval: float = 0.0
    ack_key: tuple[object, ...] | None = None
    ack_seen: bool = False
    cancel_id: str | None = None  # allocated when the TU asks, even if still queued
    cancel_sent: bool = False
    c_fired: bool = False


_TIMER_NAMES = ("A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K", "L", "M", "2xx")
_REASONS = {
    "B": "Timer B: no response to the INVITE within 64*T1",
    "C": "Timer C: no final response after a provisional, nor after our CANCEL",
    "F": "Timer F: no final response to the request within 64*T1",
    "H": "Timer H: no ACK for the final response within 64*T1",
}


def _tag(value: str | None) -> str | None:
    return NameAddr.parse(value).tag if value else None


def _strip_to(req: SipRequest, keep: set[str]) -> SipRequest:
    """A copy of ``req`` with only the ``keep`` headers and the top Via (for ACK/CANCEL)."""
    headers = req.headers.copy()
    for name in {n for n, _ in headers.items()}:
        if name.lower() not in keep:
            headers.remove(name)
    headers.set("Via", req.headers.get_all("Via")[0])
    if headers.get("Max-Forwards") is None:
        headers.set("Max-Forwards", "70")
    return SipRequest(method=req.method, uri=req.uri, headers=headers, body=b"")


_HOP_HEADERS = {"via", "from", "to", "call-id", "route", "max-forwards"}


def build_ack(invite: SipRequest, response: SipResponse) -> SipRequest:
    """The ACK for a non-2xx final response (RFC 3261 17.1.1.3)."""
    ack = _strip_to(invite, _HOP_HEADERS)
    ack.method = "ACK"
    ack.headers.set("To", response.headers.get("To") or invite.headers.get("To") or "")
    ack.headers.set("CSeq", f"{invite.cseq[0]} ACK")
    return ack


def build_cancel(invite: SipRequest) -> SipRequest:
    """The CANCEL for a pending INVITE: same branch, URI, tags and CSeq number (9.1)."""
    cancel = _strip_to(invite, _HOP_HEADERS)
    cancel.method = "CANCEL"
    cancel.headers.set("CSeq", f"{invite.cseq[0]} CANCEL")
    return cancel


class TransactionLayer:
    """All client and server transactions of one SIP endpoint; ``len()`` counts them."""

    def __init__(self, timers: TimerConfig | None = None) -> None:
        self.timers = timers or TimerConfig()
        self._by_id: dict[str, _Tx] = {}
        self._by_key: dict[tuple[object, ...], _Tx] = {}
        self._accepted: dict[tuple[object, ...], _Tx] = {}
        self._queue = TimerQueue()
        self._ids = itertools.count(1)

    # ------------------------------------------------------------------ inspection
    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, tx_id: object) -> bool:
        return tx_id in self._by_id

    @property
    def active(self) -> int:
        """Live transactions (same as ``len(layer)``)."""
        return len(self._by_id)

    @property
    def pending_timers(self) -> int:
        """Armed timers plus stale heap entries: zero once everything has expired."""
        return max(len(self._queue), self._queue.heap_size)

    def state(self, tx_id: str) -> TxState | None:
        """The transaction's state, or None once it is terminated (freed)."""
        tx = self._by_id.get(tx_id)
        return tx.state if tx else None

    def next_deadline(self) -> float | None:
        """When :meth:`tick` must next be called, or None when no timer is armed."""
        return self._queue.next_deadline()

    # ------------------------------------------------------------------ bookkeeping
    def _new(
        self,
        key: tuple[object, ...],
        request: SipRequest,
        peer: Address,
        transport: str,
        state: TxState,
        server: bool,
        tx_id: str | None = None,
    ) -> _Tx:
        """Register a transaction; ids are "s<n>" (server) or "c<n>" (client)."""
        tx_id = tx_id or f"{'s' if server else 'c'}{next(self._ids)}"
        invite = request.method == "INVITE"
        tx = _Tx(
            tx_id, key, server, invite, request, peer, transport, is_reliable(transport), state
        )
        self._by_id[tx.tx_id] = tx
        self._by_key[key] = tx
        return tx

    def _free(self, tx: _Tx) -> None:
        self._by_id.pop(tx.tx_id, None)
        if self._by_key.get(tx.key) is tx:
            del self._by_key[tx.key]
        if tx.ack_key is not None and self._accepted.get(tx.ack_key) is tx:
            del self._accepted[tx.ack_key]
        self._queue.cancel_all(tx.tx_id, _TIMER_NAMES)
        if not self._by_id:  # dicts keep their peak capacity: idle means empty again
            self._by_id, self._by_key, self._accepted = {}, {}, {}

    def _arm(self, tx: _Tx, name: str, now: float, delay: float) -> None:
        self._queue.arm(tx.tx_id, name, now + delay)

    def _end_after(self, tx: _Tx, name: str, now: float, delay: float) -> None:
        """Free ``tx`` after ``delay`` (at once when it is zero, e.g. on TCP)."""
        if delay <= 0:
            self._free(tx)
        else:
            self._arm(tx, name, now, delay)

    def _send(self, tx: _Tx, data: bytes) -> SendMessage:
        return SendMessage(data, tx.peer, tx.transport)

    @staticmethod
    def _server_key(req: SipRequest) -> tuple[object, ...]:
        """RFC 3261 17.2.3: branch + sent-by + method (ACK counts as INVITE)."""
        via = req.top_via
        method = "INVITE" if req.method == "ACK" else req.method
        branch = via.branch
        if branch and branch.startswith(MAGIC_COOKIE):
            return ("3261", branch, via.host.lower(), via.port, method)
        # RFC 2543 peers: simplified to Call-ID, CSeq number, From tag and top Via.
        from_tag = _tag(req.headers.get("From"))
        return ("2543", req.call_id, req.cseq[0], from_tag, via.to_str(), method)

    # ------------------------------------------------------------------ receive
    def receive(
        self, msg: SipRequest | SipResponse, source: Address, transport: str, now: float
    ) -> list[Event]:
        """Feed one parsed message from the transport; malformed ones are dropped."""
        try:
            msg.call_id, msg.cseq, msg.top_via  # noqa: B018 - each raises when missing/bad
            if not (msg.headers.get("From") and msg.headers.get("To")):
                return []
            if isinstance(msg, SipRequest):
                return self._receive_request(msg, source, transport, now)
            return self._receive_response(msg, source, now)
        except (ValueError, IndexError, TypeError, AttributeError):
            return []  # missing/broken Via, CSeq, Call-ID: nothing we can match or answer

    def _receive_request(
        self, req: SipRequest, source: Address, transport: str, now: float
    ) -> list[Event]:
        key = self._server_key(req)
        tx = self._by_key.get(key)
        if req.method == "ACK":
            return self._receive_ack(tx, req, source, now)
        if tx is not None:  # a retransmission: replay, never surface twice
            if tx.out and tx.state in (TxState.PROCEEDING, TxState.COMPLETED):
                return [self._send(tx, tx.out)]
            return []  # Trying (nothing sent yet), Confirmed, Accepted: absorbed
        if req.method == "INVITE":
            tx = self._new(key, req, source, transport, TxState.PROCEEDING, server=True)
            trying = make_response(req, 100, "Trying")
            tx.out = trying.to_bytes()
            return [self._send(tx, tx.out), RequestReceived(tx.tx_id, req, source)]
        tx = self._new(key, req, source, transport, TxState.TRYING, server=True)
        invite_tx_id = None
        if req.method == "CANCEL":
            invite = self._by_key.get((*key[:-1], "INVITE"))
            invite_tx_id = invite.tx_id if invite is not None else None
        return [RequestReceived(tx.tx_id, req, source, invite_tx_id)]

    def _receive_ack(
        self, tx: _Tx | None, ack: SipRequest, source: Address, now: float
    ) -> list[Event]:
        if tx is not None and tx.state is TxState.COMPLETED:
            tx.state = TxState.CONFIRMED
            self._queue.cancel_all(tx.tx_id, ("G", "H"))
            self._end_after(tx, "I", now, self.timers.timer_i(tx.reliable))
            return []
        if tx is not None and tx.state is TxState.ACCEPTED:
            target: _Tx | None = tx  # same branch as the INVITE (RFC 2543-style peers)
        else:
            target = self._accepted.get(self._ack_key(ack, ack))
        if target is None:
            # Confirmed/Proceeding absorb it; otherwise the UA's dialog layer decides.
            return [] if tx is not None else [AckReceived(None, ack, source)]
        if target.ack_seen:
            return []  # retransmitted ACK for the 2xx
        target.ack_seen = True
        self._queue.cancel(target.tx_id, "2xx")
        return [AckReceived(target.tx_id, ack, source)]

    @staticmethod
    def _ack_key(msg: SipRequest, to: SipRequest | SipResponse) -> tuple[object, ...]:
        """Matches a 2xx and its ACK: Call-ID, CSeq number, From and To tags."""
        from_tag, to_tag = _tag(msg.headers.get("From")), _tag(to.headers.get("To"))
        return (msg.call_id, msg.cseq[0], from_tag, to_tag)

    def _receive_response(self, resp: SipResponse, source: Address, now: float) -> list[Event]:
        branch = resp.top_via.branch
        tx = self._by_key.get(("client", branch, resp.cseq[1]))
        if tx is None:
            return [StrayResponse(resp, source)]
        if tx.invite:
            return self._invite_client_response(tx, resp, now)
        if tx.state is TxState.COMPLETED:
            return []
        if resp.status < 200:
            tx.state = TxState.PROCEEDING
            return [ResponseReceived(tx.tx_id, resp)]
        tx.state = TxState.COMPLETED
        self._queue.cancel_all(tx.tx_id, ("E", "F"))
        self._end_after(tx, "K", now, self.timers.timer_k(tx.reliable))
        return [ResponseReceived(tx.tx_id, resp)]

    def _invite_client_response(self, tx: _Tx, resp: SipResponse, now: float) -> list[Event]:
        status = resp.status
        if tx.state is TxState.COMPLETED:  # final retransmitted: our ACK got lost
            return [self._send(tx, tx.out)] if status >= 300 else []
        if tx.state is TxState.ACCEPTED:  # 2xx retransmission (or forked 2xx): UA re-ACKs
            return [ResponseReceived(tx.tx_id, resp)] if 200 <= status < 300 else []
        if status < 200:
            if tx.state is TxState.CALLING:
                tx.state = TxState.PROCEEDING
                self._queue.cancel_all(tx.tx_id, ("A", "B"))
            if (status > 100 or not self._queue.is_armed(tx.tx_id, "C")) and not tx.c_fired:
                self._arm(tx, "C", now, self.timers.c)  # (re)started as in RFC 3261 16.7
            events: list[Event] = [ResponseReceived(tx.tx_id, resp)]
            if tx.cancel_id is not None and not tx.cancel_sent:
                events += self._send_cancel(tx, now)  # queued before this first 1xx
            return events
        self._queue.cancel_all(tx.tx_id, ("A", "B", "C"))
        if not tx.cancel_sent:
            tx.cancel_id = None  # a queued CANCEL has nothing left to cancel
        if status < 300:
            tx.state = TxState.ACCEPTED
            self._arm(tx, "M", now, self.timers.timer_m)
            return [ResponseReceived(tx.tx_id, resp)]
        tx.state = TxState.COMPLETED
        tx.out = build_ack(tx.request, resp).to_bytes()
        events = [self._send(tx, tx.out), ResponseReceived(tx.tx_id, resp)]
        self._end_after(tx, "D", now, self.timers.timer_d(tx.reliable))
        return events

    # ------------------------------------------------------------------ server side
    def send_response(self, tx_id: str, response: SipResponse, now: float) -> list[Event]:
        """Answer the server transaction ``tx_id``; the layer retransmits as needed."""
        tx = self._by_id.get(tx_id)
        if tx is None or not tx.server:
            raise TransactionError(f"no server transaction {tx_id!r}")
        status = response.status
        data = response.to_bytes()
        if tx.state is TxState.ACCEPTED and 200 <= status < 300:
            tx.response, tx.out = response, data  # the UA's own 2xx retransmission
            return [self._send(tx, data)]
        if tx.state not in (TxState.TRYING, TxState.PROCEEDING):
            raise TransactionError(f"{tx_id} is {tx.state}: no more responses")
        tx.response, tx.out = response, data
        events: list[Event] = [self._send(tx, data)]
        if status < 200:
            tx.state = TxState.PROCEEDING
        elif not tx.invite:
            tx.state = TxState.COMPLETED
            self._end_after(tx, "J", now, self.timers.timer_j(tx.reliable))
        elif status < 300:
            tx.state = TxState.ACCEPTED
            tx.ack_key = self._ack_key(tx.request, response)
            self._accepted[tx.ack_key] = tx
            tx.interval = self.timers.g
            if not tx.reliable:
                self._arm(tx, "2xx", now, tx.interval)
            self._arm(tx, "L", now, self.timers.timer_l)
        else:
            tx.state = TxState.COMPLETED
            tx.interval = self.timers.g
            if not tx.reliable:
                self._arm(tx, "G", now, tx.interval)
            self._arm(tx, "H", now, self.timers.timer_h)
        return events

    def refuse_once(self, tx_id: str, response: SipResponse) -> list[Event]:
        """Answer ``tx_id`` with a 3xx-6xx sent once, and forget the transaction.

        RFC 3261 26.3.2.4: requests we refuse before knowing who sent them (a stranger's
        403, a source over its rate, a digest challenge) get one response and no state, so
        a flood costs one send each instead of ten retransmissions held until Timer H.
        A retransmitted request is judged again; its ACK finds nothing and is dropped.
        """
        tx = self._by_id.get(tx_id)
        if tx is None or not tx.server:
            raise TransactionError(f"no server transaction {tx_id!r}")
        if response.status < 300:
            raise TransactionError("only a refusal (3xx-6xx) may be sent without state")
        self._free(tx)
        return [self._send(tx, response.to_bytes())]

    # ------------------------------------------------------------------ client side
    def send_request(
        self, request: SipRequest, destination: Address, transport: str, now: float
    ) -> tuple[str, list[Event]]:
        """Start a client transaction; the request's top Via needs an RFC 3261 branch."""
        if request.method == "ACK":
            raise TransactionError("an ACK is not a transaction: use send_stateless")
        branch = request.top_via.branch
        if not branch or not branch.startswith(MAGIC_COOKIE):
            raise TransactionError("top Via needs a z9hG4bK branch (use new_branch())")
        return self._start_client(request, destination, transport, now, None)

    def _start_client(
        self, request: SipRequest, peer: Address, transport: str, now: float, tx_id: str | None
    ) -> tuple[str, list[Event]]:
        key = ("client", request.top_via.branch, request.cseq[1])
        if key in self._by_key:
            raise TransactionError(f"a client transaction with branch {key[1]} exists")
        invite = request.method == "INVITE"
        state = TxState.CALLING if invite else TxState.TRYING
        tx = self._new(key, request, peer, transport, state, server=False, tx_id=tx_id)
        tx.out = request.to_bytes()
        tx.interval = self.timers.t1
        if not tx.reliable:
            self._arm(tx, "A" if invite else "E", now, tx.interval)
        t = self.timers
        self._arm(tx, "B" if invite else "F", now, t.timer_b if invite else t.timer_f)
        return tx.tx_id, [self._send(tx, tx.out)]

    def cancel(self, tx_id: str, now: float) -> tuple[str | None, list[Event]]:
        """CANCEL a pending INVITE client transaction; returns the CANCEL's transaction id.

        Before any provisional response the CANCEL is queued (sent on the first 1xx);
        after a final response there is nothing to cancel and the id is None.
        """
        tx = self._by_id.get(tx_id)
        if tx is None or tx.server or not tx.invite:
            return None, []
        if tx.state is TxState.CALLING:
            if tx.cancel_id is None:
                tx.cancel_id = f"c{next(self._ids)}"
            return tx.cancel_id, []
        if tx.state is not TxState.PROCEEDING:
            return None, []
        if tx.cancel_sent:
            return tx.cancel_id, []
        events = self._send_cancel(tx, now)
        return tx.cancel_id, events

    def _send_cancel(self, tx: _Tx, now: float) -> list[Event]:
        cancel = build_cancel(tx.request)
        tx.cancel_id, events = self._start_client(cancel, tx.peer, tx.transport, now, tx.cancel_id)
        tx.cancel_sent = True
        return events

    def send_stateless(
        self, message: SipRequest | SipResponse, destination: Address, transport: str
    ) -> list[Event]:
        """Send outside any transaction (the ACK for a 2xx, stateless replies)."""
        return [SendMessage(message.to_bytes(), destination, transport)]

    # ------------------------------------------------------------------ timers
    def tick(self, now: float) -> list[Event]:
        """Fire every timer due at ``now``."""
        events: list[Event] = []
        while (due := self._queue.pop_due(now)) is not None:
            tx_id, name, _deadline = due
            tx = self._by_id.get(str(tx_id))
            if tx is not None:
                events += self._fire(tx, name, now)
        return events

    def _fire(self, tx: _Tx, name: str, now: float) -> list[Event]:
        t = self.timers
        if name in ("A", "E", "G", "2xx"):  # retransmissions
            if name == "A":
                tx.interval *= 2  # Timer A is not capped
            elif name == "E" and tx.state is TxState.PROCEEDING:
                tx.interval = t.t2
            else:
                tx.interval = t.backoff(tx.interval)
            self._arm(tx, name, now, tx.interval)
            return [self._send(tx, tx.out)]
        if name == "C" and not tx.c_fired:  # give up on the call: CANCEL, then wait 64*T1
            tx.c_fired = True
            self._arm(tx, "C", now, t.timer_b)
            return [] if tx.cancel_sent else self._send_cancel(tx, now)
        if name in _REASONS:
            self._free(tx)
            return [TransactionTimeout(tx.tx_id, name, _REASONS[name])]
        self._free(tx)  # D, I, J, K, M and L
        if name == "L" and not tx.ack_seen and tx.response is not None:
            return [AckTimeout(tx.tx_id, tx.response)]
        return []

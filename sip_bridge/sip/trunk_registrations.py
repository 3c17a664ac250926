"""Every configured trunk's registration, driven through client transactions, sans-I/O.

:class:`~sip_bridge.sip.registration.Registration` decides what to send and when; this wraps
one per registering trunk with its own :class:`~sip_bridge.sip.transaction.TransactionLayer`
(retransmissions, Timer F), so the server only routes REGISTER responses here, sends the
bytes that come out and calls :meth:`tick` at :meth:`next_deadline`. Its own layer keeps
REGISTER transactions out of the call UA's, whose state is about calls.

State changes come out as :class:`RegistrationChanged` so they reach the log as they
happen; :meth:`status` is what ``sip-bridge status`` shows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sip_bridge.config.trunks import TrunkConfig, registrar_uri
from sip_bridge.sip.fields import SipUri
from sip_bridge.sip.message import SipResponse
from sip_bridge.sip.registration import Registration, RegState
from sip_bridge.sip.timers import TimerConfig
from sip_bridge.sip.transaction import (
    Event,
    ResponseReceived,
    SendMessage,
    TransactionLayer,
    TransactionTimeout,
)

__all__ = ["RegistrationChanged", "TrunkRegistrations"]

Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class RegistrationChanged:
    trunk: str
    state: str
    error: str | None
    expires_in: float | None


@dataclass(eq=False)
class _Entry:
    trunk: TrunkConfig
    reg: Registration
    destination: Address | None = None  # None until the registrar's name resolved
    tx_id: str | None = None
    last_state: str = ""
    last_error: str | None = None


class TrunkRegistrations:
    """The registrations of all trunks that have a ``registrar``."""

    def __init__(
        self,
        trunks: tuple[TrunkConfig, ...],
        contact_host: str,
        ports: dict[str, int],
        now: float,
        *,
        timers: TimerConfig | None = None,
        jitter: Callable[[float], float] | None = None,
    ) -> None:
        self._layer = TransactionLayer(timers)
        self._entries: dict[str, _Entry] = {}
        host = f"[{contact_host}]" if ":" in contact_host else contact_host
        for t in trunks:
            if not t.registers:
                continue
            port = ports.get(t.transport) or ports["udp"]
            contact = f"sip:{t.username}@{host}:{port};transport={t.transport}"
            reg = Registration(
                t.aor,
                registrar_uri(t.registrar),
                contact,
                t.digest_user,
                t.password,
                t.expires_s,
                now,
                transport=t.transport,
                jitter=jitter,
            )
            self._entries[t.name] = _Entry(t, reg)

    def __len__(self) -> int:
        return len(self._entries)

    def target(self, trunk: str) -> tuple[str, int, str]:
        """(host, port, transport) of the trunk's registrar, for the caller to resolve."""
        e = self._entries[trunk]
        uri = SipUri.parse(e.reg.registrar_uri)
        tls = e.trunk.transport == "tls" or uri.scheme == "sips"
        return uri.host.strip("[]"), uri.port or (5061 if tls else 5060), e.trunk.transport

    def set_destination(self, trunk: str, destination: Address) -> None:
        self._entries[trunk].destination = destination

    def resolution_failed(self, trunk: str, error: str, now: float) -> list[RegistrationChanged]:
        """The registrar's name did not resolve: report it; the caller retries later."""
        e = self._entries[trunk]
        e.reg.last_error = error
        return self._changes(now)

    def owns(self, resp: SipResponse) -> bool:
        """Is this response to one of our REGISTERs? (Route it here rather than to the UA.)"""
        try:
            return resp.cseq[1] == "REGISTER"
        except ValueError:
            return False

    def receive(
        self, resp: SipResponse, source: Address, transport: str, now: float
    ) -> list[SendMessage | RegistrationChanged]:
        return self._process(self._layer.receive(resp, source, transport, now), now)

    def tick(self, now: float) -> list[SendMessage | RegistrationChanged]:
        return self._process(self._layer.tick(now), now)

    def next_deadline(self) -> float | None:
        deadlines = [self._layer.next_deadline()]
        deadlines += [e.reg.next_deadline() for e in self._entries.values() if e.destination]
        pending = [d for d in deadlines if d is not None]
        return min(pending) if pending else None

    def unregister_all(self, now: float) -> list[SendMessage | RegistrationChanged]:
        """Remove our bindings (Expires: 0) on shutdown."""
        for e in self._entries.values():
            e.reg.unregister(now)
        return self._process([], now)

    @property
    def pending(self) -> int:
        """REGISTERs still waiting for their final response (shutdown waits for them)."""
        return sum(e.tx_id is not None for e in self._entries.values())

    def status(self, now: float) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for name, e in self._entries.items():
            reg = e.reg
            expires_in = reg.expires_at - now if reg.expires_at is not None else None
            out.append(
                {
                    "trunk": name,
                    "aor": reg.aor,
                    "registrar": reg.registrar_uri,
                    "transport": e.trunk.transport,
                    "state": str(reg.state),
                    "expires_in_s": round(expires_in, 1) if expires_in is not None else None,
                    "last_error": reg.last_error,
                }
            )
        return out

    def _process(self, events: list[Event], now: float) -> list[SendMessage | RegistrationChanged]:
        out: list[SendMessage | RegistrationChanged] = []
        by_tx = {e.tx_id: e for e in self._entries.values() if e.tx_id is not None}
        for ev in events:
            if isinstance(ev, SendMessage):
                out.append(ev)
            elif isinstance(ev, ResponseReceived) and ev.response.status >= 200:
                entry = by_tx.get(ev.tx_id)
                if entry is not None:
                    entry.tx_id = None
                    entry.reg.on_response(ev.response, now)
            elif isinstance(ev, TransactionTimeout):
                entry = by_tx.get(ev.tx_id)
                if entry is not None:
                    entry.tx_id = None
                    entry.reg.on_timeout(now)
        for e in self._entries.values():
            if e.destination is None or e.tx_id is not None:
                continue
            req = e.reg.next_request(now)
            if req is not None:
                e.tx_id, sent = self._layer.send_request(req, e.destination, e.trunk.transport, now)
                out += [s for s in sent if isinstance(s, SendMessage)]
        return out + self._changes(now)

    def _changes(self, now: float) -> list[RegistrationChanged]:
        changes = []
        for name, e in self._entries.items():
            state, error = str(e.reg.state), e.reg.last_error
            if (state, error) != (e.last_state, e.last_error):
                e.last_state, e.last_error = state, error
                at = e.reg.expires_at
                expires_in = at - now if at is not None and state == RegState.REGISTERED else None
                changes.append(RegistrationChanged(name, state, error, expires_in))
        return changes

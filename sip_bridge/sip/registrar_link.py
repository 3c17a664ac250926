"""The asyncio side of trunk registrations: DNS, a timer, and the SIP transport.

:class:`~sip_bridge.sip.trunk_registrations.TrunkRegistrations` decides; this resolves each
registrar's name (retrying while DNS fails: a boot during a DNS outage must still end
registered), sends what it asks, calls it back at its next deadline and logs every state
change, so the operator sees "registered for 3600 s" or why not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Sequence

from sip_bridge.sip.message import SipResponse
from sip_bridge.sip.transaction import SendMessage
from sip_bridge.sip.trunk_registrations import RegistrationChanged, TrunkRegistrations

__all__ = ["RegistrarLink"]

log = logging.getLogger("sip_bridge.sip.registration")

Address = tuple[str, int]
Sender = Callable[[bytes, Address, str], None]
DNS_RETRY_S = 30.0


class RegistrarLink:
    """Runs a :class:`TrunkRegistrations` on the running loop."""

    def __init__(
        self,
        regs: TrunkRegistrations,
        send: Sender,
        on_resolved: Callable[[str, list[str]], None] | None = None,
    ) -> None:
        self.regs = regs
        self._send = send
        self._on_resolved = on_resolved  # the admission policy learns the registrar's address
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, trunks: Sequence[str]) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._resolve(name)) for name in trunks]

    def receive(self, resp: SipResponse, source: Address, transport: str) -> None:
        now = asyncio.get_running_loop().time()
        self._handle(self.regs.receive(resp, source, transport, now))

    async def stop(self, deadline: float) -> None:
        """Unregister (Expires: 0) and wait for the answers until ``deadline`` (loop time)."""
        loop = asyncio.get_running_loop()
        for task in self._tasks:
            task.cancel()
        self._handle(self.regs.unregister_all(loop.time()))
        while self.regs.pending and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _resolve(self, trunk: str) -> None:
        host, port, transport = self.regs.target(trunk)
        loop = asyncio.get_running_loop()
        kind = socket.SOCK_DGRAM if transport == "udp" else socket.SOCK_STREAM
        while True:
            try:
                infos = await loop.getaddrinfo(host, port, type=kind)
                break
            except OSError as exc:
                error = f"cannot resolve {host}: {exc}"
                self._handle(self.regs.resolution_failed(trunk, error, loop.time()))
                await asyncio.sleep(DNS_RETRY_S)
        addresses = [str(info[4][0]) for info in infos]
        if self._on_resolved is not None:
            self._on_resolved(trunk, addresses)
        self.regs.set_destination(trunk, (addresses[0], port))
        self._handle(self.regs.tick(loop.time()))

    def _handle(self, events: Sequence[SendMessage | RegistrationChanged]) -> None:
        for ev in events:
            if isinstance(ev, SendMessage):
                self._send(ev.data, ev.destination, ev.transport)
            elif ev.state in ("failed", "backoff"):
                log.warning("trunk %s: registration %s: %s", ev.trunk, ev.state, ev.error)
            else:
                exp = f" for {ev.expires_in:.0f} s" if ev.expires_in is not None else ""
                log.info("trunk %s: %s%s", ev.trunk, ev.state, exp)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self.regs.next_deadline()
        if deadline is not None:
            self._timer = asyncio.get_running_loop().call_at(deadline, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._handle(self.regs.tick(asyncio.get_running_loop().time()))

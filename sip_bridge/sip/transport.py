"""SIP over UDP, TCP and TLS (IPv4 and IPv6): the thin asyncio layer under the sans-I/O core.

It only moves bytes: UDP datagrams are handed up whole, TCP and TLS streams are
cut into messages with :class:`~sip_bridge.sip.framing.StreamFramer`. Replies to a
stream peer go back on the connection the peer opened (RFC 3261 18.2.2); a new
connection is opened only when there is none. TLS is TCP with an
:class:`ssl.SSLContext` on the connection (RFC 3261 26.2, RFC 5630); the
contexts come from :func:`tls_server_context` and :func:`tls_client_context`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

from sip_bridge.sip.framing import StreamFramer
from sip_bridge.sip.message import SipMessage, SipParseError

__all__ = [
    "Address",
    "Received",
    "SipTransport",
    "TransportError",
    "tls_client_context",
    "tls_server_context",
]

log = logging.getLogger(__name__)

Address = tuple[str, int]


class TransportError(OSError):
    """A listener could not be started (busy port, bad address): says which and why."""

    in_use: bool = False  # the address was taken (EADDRINUSE)


#: how many OS-chosen ports a listener on port 0 tries before it gives up
_ANY_PORT_TRIES = 8


@dataclass(frozen=True)
class Received:
    """What came in: raw bytes (UDP) or a framed message / framing error (TCP, TLS)."""

    transport: str  # "udp" | "tcp" | "tls"
    source: Address
    data: bytes | None = None
    message: SipMessage | None = None
    error: SipParseError | None = None


Handler = Callable[[Received], None]
T = TypeVar("T")


async def next_item(queue: asyncio.Queue[T], timeout_s: float | None) -> T | None:
    """The queue's next item, or None when ``timeout_s`` passes first.

    Loops that wait on an inbox with a deadline use this, not :func:`asyncio.wait_for`:
    on Python 3.11 ``wait_for`` returns the item and drops a cancellation that lands just
    as the item arrives, and a loop that is being stopped then waits forever.
    """
    try:
        async with asyncio.timeout(timeout_s):
            return await queue.get()
    except TimeoutError:
        return None


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if not data.strip(b"\r\n"):
            return  # keep-alive ping (RFC 5626 CRLF)
        try:
            self.handler(Received("udp", (str(addr[0]), int(addr[1])), data=data))
        except Exception:  # one bad datagram must never take the listener down
            log.exception("SIP handler failed on a datagram from %s", addr)

    def error_received(self, exc: Exception) -> None:
        log.debug("UDP error: %s", exc)  # ICMP unreachable etc.: the transactions time out


class _TcpConnection(asyncio.Protocol):
    """One TCP or TLS stream; `kind` says which table it lives in and what it reports."""

    def __init__(self, owner: SipTransport, kind: str = "tcp") -> None:
        self.owner = owner
        self.kind = kind
        self.table = owner._tls if kind == "tls" else owner._tcp
        self.framer = StreamFramer()
        self.transport: asyncio.Transport | None = None
        self.peer: Address | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = (str(peer[0]), int(peer[1]))
        self.table[self.peer] = self

    def data_received(self, data: bytes) -> None:
        assert self.peer is not None
        try:
            messages = self.framer.feed(data)
            while True:  # drain: errors after good messages surface on the next feed
                more = self.framer.feed(b"")
                if not more:
                    break
                messages += more
        except SipParseError as exc:
            messages = []
            self._deliver(Received(self.kind, self.peer, error=exc))
            if self.transport is not None:
                self.transport.close()  # framing is lost: the stream cannot be trusted
        for msg in messages:
            self._deliver(Received(self.kind, self.peer, message=msg))

    def _deliver(self, item: Received) -> None:
        try:
            self.owner.handler(item)
        except Exception:
            log.exception("SIP handler failed on a %s message from %s", self.kind, self.peer)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.table.get(self.peer) is self:
            del self.table[self.peer]


class SipTransport:
    """Listeners on one host:port for the configured transports."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self._udp: _Udp | None = None
        self._tcp_server: asyncio.Server | None = None
        self._tcp: dict[Address, _TcpConnection] = {}
        self._tls_server: asyncio.Server | None = None
        self._tls: dict[Address, _TcpConnection] = {}
        self.local: Address | None = None
        self.tls_local: Address | None = None
        # Used for connections we open to TLS peers (in-dialog requests to a TLS phone).
        self.tls_client: ssl.SSLContext | None = None

    async def start_tls(
        self,
        host: str,
        port: int,
        server: ssl.SSLContext,
        client: ssl.SSLContext | None = None,
    ) -> None:
        """Listen for SIP over TLS (port 0: the OS picks); `client` is for outgoing TLS."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._tls_server = await asyncio.get_running_loop().create_server(
                lambda: _TcpConnection(self, "tls"), host=host, port=port, family=family,
                reuse_address=True, ssl=server, ssl_handshake_timeout=10.0,
            )  # fmt: skip
        except OSError as exc:
            raise _explain(exc, host, port, "tls") from None
        self.tls_local = (host, int(self._tls_server.sockets[0].getsockname()[1]))
        if client is not None:
            self.tls_client = client

    async def start(
        self, host: str, port: int, transports: tuple[str, ...] = ("udp", "tcp")
    ) -> None:
        """Listen on ``port`` for each of ``transports``; port 0 asks the OS for a port,
        and UDP and TCP share it: one whose TCP twin is taken is given back and another
        asked for (a few times), rather than the start failing on a port nobody chose."""
        for attempt in range(_ANY_PORT_TRIES if port == 0 else 1):
            try:
                await self._listen(host, port, transports)
                return
            except TransportError as exc:
                if not (port == 0 and exc.in_use and attempt < _ANY_PORT_TRIES - 1):
                    raise

    async def _listen(self, host: str, port: int, transports: tuple[str, ...]) -> None:
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        if "udp" in transports:
            try:
                _, proto = await loop.create_datagram_endpoint(
                    lambda: _Udp(self.handler), local_addr=(host, port), family=family
                )
            except OSError as exc:
                raise _explain(exc, host, port, "udp") from None
            self._udp = proto
            assert proto.transport is not None
            sock = proto.transport.get_extra_info("sockname")
            port = int(sock[1])  # port 0 asks the OS for one; TCP then takes the same
        if "tcp" in transports:
            try:
                self._tcp_server = await loop.create_server(
                    lambda: _TcpConnection(self), host=host, port=port, family=family,
                    reuse_address=True,
                )  # fmt: skip
            except OSError as exc:
                await self.close()
                raise _explain(exc, host, port, "tcp") from None
            sock = self._tcp_server.sockets[0].getsockname()
            port = int(sock[1])
        self.local = (host, port)

    async def send(self, data: bytes, dest: Address, transport: str = "udp") -> None:
        """Send one message; TCP/TLS reuse the peer's connection or open one."""
        if transport == "udp":
            if self._udp is None or self._udp.transport is None:
                raise TransportError("UDP is not listening")
            self._udp.transport.sendto(data, dest)
            return
        kind = "tls" if transport.lower() == "tls" else "tcp"
        conn = (self._tls if kind == "tls" else self._tcp).get(dest)
        if conn is None or conn.transport is None or conn.transport.is_closing():
            conn = await self._connect(dest, kind)
        if conn is None or conn.transport is None:
            raise TransportError(f"no connection to {dest[0]}:{dest[1]}/{kind}")
        conn.transport.write(data)

    async def _connect(self, dest: Address, kind: str) -> _TcpConnection:
        loop = asyncio.get_running_loop()
        if kind == "tls" and self.tls_client is None:
            raise TransportError(f"cannot connect to {dest[0]}:{dest[1]}/tls: TLS is off")
        ctx = self.tls_client if kind == "tls" else None
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _TcpConnection(self, kind), dest[0], dest[1], ssl=ctx,
                    server_hostname=dest[0] if ctx is not None else None,
                ),
                5.0,
            )  # fmt: skip
        except (OSError, TimeoutError) as exc:
            raise TransportError(f"cannot connect to {dest[0]}:{dest[1]}/{kind}: {exc}") from None
        return conn

    def send_nowait(self, data: bytes, dest: Address, transport: str = "udp") -> None:
        """Fire-and-forget `send` for callers that are not coroutines (timers, callbacks)."""
        if transport == "udp":
            if self._udp is not None and self._udp.transport is not None:
                self._udp.transport.sendto(data, dest)
            return
        task = asyncio.get_running_loop().create_task(self.send(data, dest, transport))
        task.add_done_callback(_log_failure)

    async def close(self) -> None:
        if self._udp is not None and self._udp.transport is not None:
            self._udp.transport.close()
        self._udp = None
        for conn in [*self._tcp.values(), *self._tls.values()]:
            if conn.transport is not None:
                conn.transport.close()
        self._tcp.clear()
        self._tls.clear()
        for server in (self._tcp_server, self._tls_server):
            if server is not None:
                server.close()
                with contextlib.suppress(Exception):
                    await server.wait_closed()
        self._tcp_server = None
        self._tls_server = None
        self.tls_local = None


def tls_server_context(
    certificate: str, private_key: str, ca_file: str = "", verify_peer: bool = False
) -> ssl.SSLContext:
    """Our side of TLS connections peers open; `verify_peer` demands a client certificate
    signed by `ca_file` (or the system CAs), as trunks doing mutual TLS expect."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(certificate, private_key)
    if verify_peer:
        ctx.verify_mode = ssl.CERT_REQUIRED
        _load_cas(ctx, ca_file, ssl.Purpose.CLIENT_AUTH)
    return ctx


def tls_client_context(
    certificate: str = "", private_key: str = "", ca_file: str = "", verify_peer: bool = False
) -> ssl.SSLContext:
    """Connections we open: check the peer's certificate and name only when `verify_peer`,
    and present our certificate in case the peer asks for one."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if certificate:
        ctx.load_cert_chain(certificate, private_key or None)
    if verify_peer:
        _load_cas(ctx, ca_file, ssl.Purpose.SERVER_AUTH)
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _load_cas(ctx: ssl.SSLContext, ca_file: str, purpose: ssl.Purpose) -> None:
    if ca_file:
        ctx.load_verify_locations(cafile=ca_file)
    else:
        ctx.load_default_certs(purpose)


def _explain(exc: OSError, host: str, port: int, transport: str) -> TransportError:
    where = f"{host}:{port}/{transport}"
    if exc.errno == errno.EADDRINUSE:
        taken = TransportError(
            f"{where} is already in use (another sip-bridge or PBX?); "
            f"free it or choose another with --listen HOST:PORT"
        )
        taken.in_use = True
        return taken
    if exc.errno in (errno.EACCES, errno.EPERM):
        return TransportError(f"{where}: permission denied (ports below 1024 need root)")
    if exc.errno == errno.EADDRNOTAVAIL:
        return TransportError(f"{where}: this machine has no such address")
    return TransportError(f"{where}: {exc.strerror or exc}")


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("SIP send failed: %s", task.exception())

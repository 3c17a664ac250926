"""SIP transports on loopback: UDP/TCP, IPv4/IPv6, framing, busy ports, same-connection replies."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from sip_bridge.sip.message import SipRequest, parse_message
from sip_bridge.sip.transport import Received, SipTransport, TransportError, next_item

OPTIONS = (
    b"OPTIONS sip:bridge@{host} SIP/2.0\r\n"
    b"Via: SIP/2.0/{tr} {host}:5999;branch=z9hG4bK-{n}\r\n"
    b"From: <sip:probe@{host}>;tag=a{n}\r\nTo: <sip:bridge@{host}>\r\n"
    b"Call-ID: c{n}@test\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
)


def _options(host: str, tr: str, n: int) -> bytes:
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal in a SIP URI or Via needs brackets
    return (
        OPTIONS.replace(b"{host}", host.encode())
        .replace(b"{tr}", tr.encode())
        .replace(b"{n}", str(n).encode())
    )


def _has_ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_udp_and_tcp_deliver_and_reply(host: str) -> None:
    if host == "::1" and not _has_ipv6():
        pytest.fail("IPv6 loopback is required for the IPv6 transport test")

    async def main() -> None:
        got: list[Received] = []
        t = SipTransport(got.append)
        await t.start(host, 0)
        assert t.local is not None
        port = t.local[1]
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        loop = asyncio.get_running_loop()
        # UDP: a datagram in, bytes up, a reply back to the source address.
        with socket.socket(family, socket.SOCK_DGRAM) as u:
            u.bind((host, 0))
            u.setblocking(False)
            u.sendto(_options(host, "UDP", 1), (host, port))
            for _ in range(100):
                if got:
                    break
                await asyncio.sleep(0.01)
            assert got and got[0].transport == "udp" and got[0].data is not None
            assert got[0].source[1] == u.getsockname()[1]
            await t.send(b"SIP/2.0 200 OK\r\n\r\n", got[0].source, "udp")
            data = await asyncio.wait_for(loop.sock_recv(u, 2048), 2)
            assert data.startswith(b"SIP/2.0 200 OK")
        # TCP: two messages split oddly across writes arrive framed, reply on the same socket.
        got.clear()
        reader, writer = await asyncio.open_connection(host, port)
        stream = _options(host, "TCP", 2) + b"\r\n" + _options(host, "TCP", 3)
        writer.write(stream[:50])
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(stream[50:])
        await writer.drain()
        for _ in range(100):
            if len(got) == 2:
                break
            await asyncio.sleep(0.01)
        assert [r.transport for r in got] == ["tcp", "tcp"]
        msgs = [r.message for r in got]
        assert all(isinstance(m, SipRequest) for m in msgs)
        assert [m.call_id for m in msgs if m is not None] == ["c2@test", "c3@test"]
        await t.send(b"SIP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n", got[0].source, "tcp")
        reply = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
        assert reply.startswith(b"SIP/2.0 200 OK")
        writer.close()
        await t.close()

    asyncio.run(main())


def test_tcp_garbage_is_reported_and_the_connection_closed() -> None:
    async def main() -> None:
        got: list[Received] = []
        t = SipTransport(got.append)
        await t.start("127.0.0.1", 0)
        assert t.local is not None
        reader, writer = await asyncio.open_connection(*t.local)
        writer.write(b"INVITE sip:x SIP/2.0\r\nVia: nonsense\r\n\r\n")  # no Content-Length
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 2) == b""  # closed by the bridge
        assert got and got[0].error is not None and got[0].message is None
        await t.close()

    asyncio.run(main())


def test_busy_port_is_a_clear_error() -> None:
    async def main() -> None:
        first = SipTransport(lambda r: None)
        await first.start("127.0.0.1", 0)
        assert first.local is not None
        second = SipTransport(lambda r: None)
        with pytest.raises(TransportError, match=r"127\.0\.0\.1:\d+/udp is already in use"):
            await second.start("127.0.0.1", first.local[1])
        await first.close()

    asyncio.run(main())


def test_port_0_whose_tcp_twin_is_taken_meanwhile_gets_another_port() -> None:
    """Port 0: the OS picks a UDP port and TCP takes the same number. If something else
    listens on that TCP port first (make test saw it: "127.0.0.1:45538/tcp is already in
    use"), the bridge gives the pair back and asks again instead of failing to start."""
    squatters: list[socket.socket] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        real_create_server = loop.create_server

        async def squatted_first(*args: Any, **kwargs: Any) -> Any:
            if not squatters:  # someone takes the TCP twin between our two binds
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.bind(("127.0.0.1", kwargs["port"]))
                s.listen()
                squatters.append(s)
            return await real_create_server(*args, **kwargs)

        loop.create_server = squatted_first  # type: ignore[method-assign]
        t = SipTransport(lambda r: None)
        await t.start("127.0.0.1", 0)
        assert t.local is not None and len(squatters) == 1
        taken = squatters[0].getsockname()[1]
        assert t.local[1] != taken
        for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):  # both listen on the new port
            probe = socket.socket(socket.AF_INET, kind)
            with pytest.raises(OSError):
                probe.bind(t.local)
            probe.close()
        await t.close()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as free:
            free.bind(("127.0.0.1", taken))  # the UDP port given back is free again

    try:
        asyncio.run(main())
    finally:
        for s in squatters:
            s.close()


def test_handler_exception_does_not_kill_the_listener() -> None:
    async def main() -> None:
        calls: list[Received] = []

        def handler(r: Received) -> None:
            calls.append(r)
            if len(calls) == 1:
                raise RuntimeError("boom")

        t = SipTransport(handler)
        await t.start("127.0.0.1", 0, ("udp",))
        assert t.local is not None
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            for n in range(2):
                u.sendto(_options("127.0.0.1", "UDP", n), t.local)
                await asyncio.sleep(0.05)
        assert len(calls) == 2
        assert parse_message(calls[1].data or b"").call_id == "c1@test"
        await t.close()

    asyncio.run(main())


def test_next_item_waits_gives_up_and_is_stopped_even_as_an_item_arrives() -> None:
    """A stopped inbox loop stops: on Python 3.11 ``wait_for`` returned the item and lost
    the cancellation when both came in one loop pass, and a test caller's signalling loop
    then ran on, its hang-up waiting for it until the suite's timeout."""

    async def run() -> None:
        queue: asyncio.Queue[str] = asyncio.Queue()
        nothing = await next_item(queue, 0.01)
        assert nothing is None  # nothing came in time
        queue.put_nowait("first")
        assert await next_item(queue, None) == "first"
        pending = next_item(queue, 5.0)
        waiting = asyncio.create_task(pending)
        await asyncio.sleep(0)  # it waits on the queue
        queue.put_nowait("late")
        waiting.cancel()  # in the same pass as the item
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert queue.get_nowait() == "late"  # nothing lost: the next reader has it

    asyncio.run(run())

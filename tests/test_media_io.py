"""The media's I/O edges: the packed RTP sender and the polled, kernel-stamped socket."""

from __future__ import annotations

import asyncio
import random
import socket

import pytest

from sip_bridge.media.media_io import AudioRtpSender, PolledSocket, RtpProtocol
from sip_bridge.media.rtp import RtpSender


def test_packed_sender_makes_the_same_bytes_as_rtp_sender() -> None:
    rng = random.Random(5)
    ours = AudioRtpSender(8, ssrc=0xDEADBEEF, sequence=65530, timestamp=0xFFFFFF00)
    ref = RtpSender(8, ssrc=0xDEADBEEF, sequence=65530, timestamp=0xFFFFFF00)
    for _ in range(300):
        op = rng.random()
        if op < 0.1:
            n = rng.randrange(0, 1000)
            ours.skip(n)
            ref.skip(n)
        elif op < 0.15:
            ours.start_talkspurt()
            ref.start_talkspurt()
        else:
            payload = rng.randbytes(rng.choice([4, 160]))
            marker, pt = rng.random() < 0.1, rng.choice([None, 101])
            assert ours.next_packet(payload, 160, marker, pt) == ref.next_packet(
                payload, 160, marker, pt
            )
    assert (ours.packet_count, ours.octet_count) == (ref.packet_count, ref.octet_count)


# serial: kernel arrival times, compared across two readers, move with other tests' load
@pytest.mark.serial
def test_polled_socket_reads_what_asyncio_would_with_kernel_arrival_times() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(RtpProtocol, local_addr=("127.0.0.1", 0))
        port = transport.get_extra_info("sockname")[1]
        polled = PolledSocket(transport)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.bind(("127.0.0.1", 0))
            # Linux stamps arrivals only once timestamping is on system-wide, and the first
            # socket to ask turns it on from a work queue: a datagram that comes before is
            # stamped when it is read ("race between timestamp enabling and packet
            # receiving", net/socket.c), so the drain puts it at its own time. Seen: the
            # burst's first datagram 50 ms late, at the drain. Wait until one is stamped.
            for _ in range(100):
                peer.sendto(b"w", ("127.0.0.1", port))
                await asyncio.sleep(0.005)
                t = loop.time()
                if any(at < t for _, _, at in polled.drain(t)):
                    break
            sent_at = loop.time()
            for i in range(100):
                peer.sendto(bytes([i]) * 20, ("127.0.0.1", port))
            await asyncio.sleep(0.05)
            now = loop.time()
            got = polled.drain(now, limit=64) + polled.drain(now, limit=64)
            assert [d[0] for d, _, _ in got] == list(range(100))  # all, in order, no loss
            assert {a for _, a, _ in got} == {peer.getsockname()}
            assert polled.stamped
            stamps = [t for _, _, t in got]
            assert stamps == sorted(stamps)  # kernel arrival order
            # on the loop's clock: after the first send (the realtime/monotonic mapping is
            # read twice, a few ms of scheduling apart at worst), never after the drain
            assert all(sent_at - 0.02 <= t <= now for t in stamps)
            assert polled.drain(loop.time()) == []
            polled.sendto(b"x", peer.getsockname())
            assert peer.recv(10) == b"x"
        polled.close()
        transport.close()

    asyncio.run(main())

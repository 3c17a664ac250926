"""RFC 4733 key presses sent by an agent: what goes on the wire, decoded by a receiver.

The outbox is tested without sockets (one packet per frame slot); then a real CallMedia
sends ``12#`` to a phone socket on loopback, and what arrived is checked packet by packet:
digits in order with 100 ms durations, marker on each event's first packet, three End
packets, the audio stream's SSRC and an unbroken sequence, timestamps that keep the clock.
"""

from __future__ import annotations

import asyncio
import itertools
import random

import numpy as np
import pytest
from numpy.typing import NDArray

from agent import Agent, AgentEvent, AgentOutput, CallInfo, DtmfEvent
from sip_bridge.media.call_media import CallMedia, MediaParams
from sip_bridge.media.dtmf import DtmfOutbox, DtmfReceiver, DtmfSender
from sip_bridge.media.rtp import RtpPacket, RtpSender, TelephoneEvent
from sip_bridge.media.rtp_ports import RtpPortPool


def test_outbox_fills_frame_slots_with_one_digits_packets_then_gives_audio_back() -> None:
    rtp = RtpSender(0, rng=random.Random(3))
    box = DtmfOutbox(DtmfSender(rtp, 101), 160, duration_ms=100, gap_ms=40)
    ts0 = rtp.timestamp
    assert not box.busy and box.next_packet() is None
    box.add("7")
    slots = [box.next_packet() for _ in range(12)]
    sent = [RtpPacket.parse(d) for d in slots if d is not None]
    # 4 updates (20..80 ms) + 3 End (100 ms), one per slot, then the 2-slot gap, then audio
    assert [d is not None for d in slots] == [True] * 7 + [False] * 5
    assert not box.busy
    events = [TelephoneEvent.parse(p.payload) for p in sent]
    assert [e.duration for e in events] == [160, 320, 480, 640, 800, 800, 800]
    assert [e.end for e in events] == [False] * 4 + [True] * 3
    assert [p.marker for p in sent] == [True] + [False] * 6
    assert {p.timestamp for p in sent} == {ts0}
    # the 7 slots lasted 140 ms: the stream clock moved that far, next audio is marked
    assert rtp.timestamp == (ts0 + 7 * 160) % (1 << 32)
    audio = RtpPacket.parse(rtp.next_packet(bytes(160), 160))
    assert audio.marker and audio.sequence == (sent[-1].sequence + 1) % 65536
    with pytest.raises(ValueError):
        box.add("12x")  # nothing queued
    assert not box.busy


class KeyPresser(Agent):
    """Presses keys once the call starts; keeps what the bridge tells it."""

    name = "keys"

    def __init__(self, keys: str) -> None:
        self.keys = keys
        self.events: list[AgentEvent] = []

    async def start(self, call: CallInfo, output: AgentOutput) -> None:
        output.send_dtmf(self.keys)

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        pass

    def on_event(self, event: AgentEvent) -> None:
        self.events.append(event)


class Phone(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.received: list[bytes] = []

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.received.append(data)


async def _send_keys(
    keys: str, telephone_event: int | None
) -> tuple[list[RtpPacket], list[AgentEvent]]:
    loop = asyncio.get_running_loop()
    phone_t, phone = await loop.create_datagram_endpoint(Phone, local_addr=("127.0.0.1", 0))
    port = phone_t.get_extra_info("sockname")[1]
    low = random.Random().randrange(30000, 60000, 2)
    told: list[AgentEvent] = []
    params = MediaParams(
        "127.0.0.1", port, telephone_event_pt=telephone_event, local_host="127.0.0.1"
    )
    media = CallMedia(KeyPresser(keys), RtpPortPool(low, low + 199), params,
                      on_agent_event=told.append)  # fmt: skip
    await media.start()
    await asyncio.sleep(0.8)
    await media.close()
    phone_t.close()
    return [RtpPacket.parse(d) for d in phone.received], told


def test_media_sends_the_keys_as_rfc4733_events_on_its_stream() -> None:
    packets, told = asyncio.run(_send_keys("12#", 101))
    assert told == []
    events = [p for p in packets if p.payload_type == 101]
    audio = [p for p in packets if p.payload_type == 0]
    digits = DtmfReceiver(101).feed_all(events)
    assert [d.digit for d in digits] == ["1", "2", "#"]
    assert [d.duration_ms for d in digits] == [100.0, 100.0, 100.0]
    assert all(d.end_seen for d in digits)
    assert len(events) == 3 * 7
    for k in range(3):  # each event: marker on its first packet, then 3 End packets
        ev = events[7 * k : 7 * k + 7]
        assert [p.marker for p in ev] == [True] + [False] * 6
        assert [TelephoneEvent.parse(p.payload).end for p in ev] == [False] * 4 + [True] * 3
        assert len({p.timestamp for p in ev}) == 1
    # one stream: same SSRC, sequence numbers unbroken across audio and events
    assert {p.ssrc for p in packets} == {audio[0].ssrc}
    seqs = [p.sequence for p in packets]
    assert all((b - a) % 65536 == 1 for a, b in itertools.pairwise(seqs))
    # the stream clock advances 160 per 20 ms slot whatever the slot carried
    starts = [i for i, p in enumerate(packets) if p.payload_type == 101 and p.marker]
    for i in starts:
        if i > 0:
            assert (packets[i].timestamp - packets[i - 1].timestamp) % (1 << 32) == 160
    after = starts[0] + 7
    assert packets[after].payload_type == 0 and packets[after].marker  # audio again, marked
    assert (packets[after].timestamp - packets[starts[0]].timestamp) % (1 << 32) == 7 * 160


def test_without_telephone_event_nothing_goes_in_band_and_the_bridge_is_told() -> None:
    packets, told = asyncio.run(_send_keys("9*", None))
    assert packets and all(p.payload_type == 0 for p in packets)
    assert told == [DtmfEvent("9"), DtmfEvent("*")]

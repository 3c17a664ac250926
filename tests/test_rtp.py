"""Tests for sip_bridge.media.rtp: RFC 3550 packets, RFC 4733 events, DTMF, sender, unwrap."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sip_bridge.media.dtmf import END_LOST_S, DtmfDigit, DtmfReceiver, DtmfSender
from sip_bridge.media.rtp import (
    DTMF_EVENTS,
    InterarrivalJitter,
    RtpError,
    RtpExtension,
    RtpPacket,
    RtpSender,
    TelephoneEvent,
    dtmf_to_event,
    event_to_dtmf,
    looks_like_rtcp,
    unwrap_seq,
    unwrap_ts,
)
from sip_bridge.media.rtp_receiver import CODECS

# ---------------------------------------------------------------------------------------
# Hand-assembled vectors (RFC 3550 section 5.1 layout)
#
#  0                   1                   2                   3
#  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
# |V=2|P|X|  CC   |M|     PT      |       sequence number         |
# |                           timestamp                           |
# |           synchronization source (SSRC) identifier            |
# |            contributing source (CSRC) identifiers             |
# ---------------------------------------------------------------------------------------

# V=2 P=0 X=0 CC=0 | M=0 PT=0 | seq 0x1234 | ts 0xDEADBEEF | ssrc 0x01020304 | 4 x 0xFF
PLAIN = bytes.fromhex("80 00 1234 DEADBEEF 01020304 FFFFFFFF")
# M=1 PT=101 (0x80 | 0x65 = 0xE5), seq 0xFFFF, ts 0, ssrc 0xFFFFFFFF, event payload
MARKER_101 = bytes.fromhex("80 E5 FFFF 00000000 FFFFFFFF 058A0320")
# CC=2, PT=8, CSRCs 0xAAAAAAAA 0x00000001, payload "hi"
CSRC2 = bytes.fromhex("82 08 0001 00000010 0000002A AAAAAAAA 00000001") + b"hi"
# X=1: profile 0xBEDE, length 1 word, data 10 AB CD 00, payload 01 02
EXT = bytes.fromhex("90 00 0002 00000020 0000002B BEDE0001 10ABCD00 0102")
# X=1 with an empty extension (length 0 words)
EXT_EMPTY = bytes.fromhex("90 00 0002 00000020 0000002B 12340000")
# P=1: payload "abc" + padding 00 00 03
PAD = bytes.fromhex("A0 00 0003 00000030 0000002C") + b"abc" + bytes.fromhex("000003")
# everything: P=1 X=1 CC=1 M=1 PT=127
ALL = (
    bytes.fromhex("B1 FF 8000 80000000 C0FFEE00 00000007 ABCD0002 0102030405060708")
    + b"payload"
    + bytes.fromhex("01")
)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            PLAIN,
            RtpPacket(0, 0x1234, 0xDEADBEEF, 0x01020304, b"\xff" * 4),
        ),
        (
            MARKER_101,
            RtpPacket(101, 0xFFFF, 0, 0xFFFFFFFF, bytes.fromhex("058A0320"), marker=True),
        ),
        (
            CSRC2,
            RtpPacket(8, 1, 16, 42, b"hi", csrc=(0xAAAAAAAA, 1)),
        ),
        (
            EXT,
            RtpPacket(
                0, 2, 32, 43, b"\x01\x02", extension=RtpExtension(0xBEDE, b"\x10\xab\xcd\x00")
            ),
        ),
        (EXT_EMPTY, RtpPacket(0, 2, 32, 43, b"", extension=RtpExtension(0x1234))),
        (PAD, RtpPacket(0, 3, 48, 44, b"abc", padding=3)),
        (
            ALL,
            RtpPacket(
                127,
                0x8000,
                0x80000000,
                0xC0FFEE00,
                b"payload",
                marker=True,
                csrc=(7,),
                extension=RtpExtension(0xABCD, bytes(range(1, 9))),
                padding=1,
            ),
        ),
    ],
)
def test_known_vectors(data: bytes, expected: RtpPacket) -> None:
    assert RtpPacket.parse(data) == expected
    assert expected.serialize() == data
    assert RtpPacket.parse(bytearray(data)) == expected
    assert RtpPacket.parse(memoryview(data)) == expected


def test_header_size() -> None:
    assert RtpPacket.parse(PLAIN).header_size == 12
    assert RtpPacket.parse(CSRC2).header_size == 20
    assert RtpPacket.parse(ALL).header_size == 12 + 4 + 4 + 8


def test_padding_keeps_count_only() -> None:
    # padding octets other than the count are not preserved (written back as zeros)
    data = bytearray(PAD)
    data[-3:-1] = b"\x55\x66"
    packet = RtpPacket.parse(bytes(data))
    assert packet.payload == b"abc" and packet.padding == 3
    assert packet.serialize() == PAD


def test_padding_may_eat_the_whole_payload() -> None:
    data = bytes.fromhex("A0 00 0003 00000030 0000002C 00000004")
    assert RtpPacket.parse(data) == RtpPacket(0, 3, 48, 44, b"", padding=4)


@pytest.mark.parametrize("pad_to", [1, 4, 16, 160, 255])
def test_serialize_pad_to(pad_to: int) -> None:
    packet = RtpPacket(0, 1, 2, 3, b"x" * 13, csrc=(9,))
    data = packet.serialize(pad_to=pad_to)
    assert len(data) % pad_to == 0
    assert len(data) - len(packet.serialize()) < pad_to
    back = RtpPacket.parse(data)
    assert back.payload == packet.payload
    assert back.padding == len(data) - (12 + 4 + 13)
    assert bool(data[0] & 0x20) == (back.padding > 0)


def test_serialize_pad_to_already_aligned_adds_nothing() -> None:
    packet = RtpPacket(0, 1, 2, 3, b"abcd", padding=8)
    assert packet.serialize(pad_to=4) == RtpPacket(0, 1, 2, 3, b"abcd").serialize()
    with pytest.raises(RtpError):
        packet.serialize(pad_to=0)
    with pytest.raises(RtpError):
        packet.serialize(pad_to=256)


# ---------------------------------------------------------------------------------------
# Error paths
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "too short"),
        (PLAIN[:11], "too short"),
        (bytes([0x00]) + PLAIN[1:], "version 0"),
        (bytes([0x40]) + PLAIN[1:], "version 1"),
        (bytes([0xC0]) + PLAIN[1:], "version 3"),
        (bytes([0x81]) + PLAIN[1:12], "CSRC count"),  # 1 CSRC, no octets for it
        (bytes([0x8F]) + PLAIN[1:], "CSRC count"),  # 15 CSRCs in 16 octets
        (CSRC2[:19], "CSRC count"),
        (bytes([0x90]) + PLAIN[1:12] + b"\xbe\xde", "extension header"),
        (EXT[:19], "extension length"),  # announces 1 word, 3 octets present
        (bytes([0x90]) + PLAIN[1:12] + b"\xbe\xde\xff\xff" + bytes(100), "extension length"),
        (bytes([0xA0]) + PLAIN[1:12], "no octet left"),  # P set, nothing after header
        (PAD[:-1] + b"\x00", "padding count is 0"),
        (PAD[:-1] + b"\x07", "exceeds"),  # 7 > 6 octets after the header
        (bytes([0xB0]) + PLAIN[1:12] + bytes.fromhex("00010000") + b"\x02", "exceeds"),
    ],
)
def test_malformed_raises_rtp_error(data: bytes, message: str) -> None:
    with pytest.raises(RtpError, match=message):
        RtpPacket.parse(data)


def test_rtp_error_is_value_error() -> None:
    assert issubclass(RtpError, ValueError)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"payload_type": 128},
        {"payload_type": -1},
        {"sequence": 1 << 16},
        {"timestamp": 1 << 32},
        {"ssrc": -1},
        {"csrc": tuple(range(16))},
        {"csrc": (1 << 32,)},
        {"padding": 256},
    ],
)
def test_out_of_range_fields_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(RtpError):
        RtpPacket(**kwargs)  # type: ignore[arg-type]


def test_extension_validation() -> None:
    with pytest.raises(RtpError):
        RtpExtension(0x10000)
    with pytest.raises(RtpError):
        RtpExtension(1, b"abc")


def test_looks_like_rtcp() -> None:
    assert looks_like_rtcp(bytes.fromhex("80C8000600000001"))  # SR, PT 200
    assert looks_like_rtcp(bytes.fromhex("81C9"))  # RR
    assert not looks_like_rtcp(PLAIN)
    assert not looks_like_rtcp(MARKER_101)  # 0xE5 = 229, above the RTCP range
    assert not looks_like_rtcp(b"\x80")
    assert not looks_like_rtcp(b"INVITE")


# ---------------------------------------------------------------------------------------
# Property tests
# ---------------------------------------------------------------------------------------

u32 = st.integers(0, (1 << 32) - 1)
packets = st.builds(
    RtpPacket,
    payload_type=st.integers(0, 127),
    sequence=st.integers(0, 0xFFFF),
    timestamp=u32,
    ssrc=u32,
    payload=st.binary(max_size=300),
    marker=st.booleans(),
    csrc=st.lists(u32, max_size=15).map(tuple),
    extension=st.none()
    | st.builds(
        RtpExtension,
        profile=st.integers(0, 0xFFFF),
        data=st.binary(max_size=64).map(lambda b: b[: len(b) - len(b) % 4]),
    ),
    padding=st.integers(0, 255),
)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_parse_raises_only_rtp_error(data: bytes) -> None:
    try:
        packet = RtpPacket.parse(data)
    except RtpError:
        return
    # anything that parses re-serializes to something that parses identically
    assert RtpPacket.parse(packet.serialize()) == packet
    assert len(packet.serialize()) == len(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=12, max_size=120), st.integers(0, 0xFF))
def test_fuzz_version2_headers(body: bytes, b0_low: int) -> None:
    # force version 2 so the deeper paths (CSRC, extension, padding) get exercised
    data = bytes([0x80 | (b0_low & 0x3F)]) + body[1:]
    try:
        packet = RtpPacket.parse(data)
    except RtpError:
        return
    assert RtpPacket.parse(packet.serialize()) == packet


@settings(max_examples=300, deadline=None)
@given(packets)
def test_round_trip(packet: RtpPacket) -> None:
    data = packet.serialize()
    assert RtpPacket.parse(data) == packet
    assert len(data) == packet.header_size + len(packet.payload) + packet.padding


@settings(max_examples=100, deadline=None)
@given(packets, st.integers(1, 255))
def test_round_trip_pad_to(packet: RtpPacket, pad_to: int) -> None:
    data = packet.serialize(pad_to=pad_to)
    assert len(data) % pad_to == 0
    back = RtpPacket.parse(data)
    assert back.payload == packet.payload
    assert back.csrc == packet.csrc and back.extension == packet.extension


# ---------------------------------------------------------------------------------------
# RFC 4733 telephone-event
# ---------------------------------------------------------------------------------------


def test_telephone_event_vectors() -> None:
    # event 5, E=1, R=0, volume 10, duration 800 (100 ms at 8 kHz)
    data = bytes.fromhex("058A0320")
    ev = TelephoneEvent.parse(data)
    assert ev == TelephoneEvent(event=5, end=True, volume=10, duration=800)
    assert ev.serialize() == data
    # R bit (0x40) is ignored; trailing octets ignored
    assert TelephoneEvent.parse(bytes.fromhex("0B4A0000FFFF")) == TelephoneEvent(11, False, 10, 0)
    assert TelephoneEvent(15, False, 63, 0xFFFF).serialize() == bytes.fromhex("0F3FFFFF")


@pytest.mark.parametrize("size", [0, 1, 2, 3])
def test_telephone_event_short(size: int) -> None:
    with pytest.raises(RtpError, match="too short"):
        TelephoneEvent.parse(bytes(size))


@pytest.mark.parametrize(
    "kwargs", [{"event": 256}, {"event": 1, "volume": 64}, {"event": 1, "duration": 1 << 16}]
)
def test_telephone_event_ranges(kwargs: dict[str, int]) -> None:
    with pytest.raises(RtpError):
        TelephoneEvent(**kwargs)  # type: ignore[arg-type]


@given(st.integers(0, 255), st.booleans(), st.integers(0, 63), st.integers(0, 0xFFFF))
def test_telephone_event_round_trip(event: int, end: bool, volume: int, duration: int) -> None:
    ev = TelephoneEvent(event, end, volume, duration)
    assert TelephoneEvent.parse(ev.serialize()) == ev


def test_dtmf_helpers() -> None:
    assert [dtmf_to_event(c) for c in "0123456789*#ABCD"] == list(range(16))
    assert dtmf_to_event("a") == 12 and dtmf_to_event("d") == 15
    assert "".join(event_to_dtmf(i) or "?" for i in range(17)) == DTMF_EVENTS + "?"
    assert event_to_dtmf(-1) is None
    for bad in ("", "E", "12", " "):
        with pytest.raises(ValueError):
            dtmf_to_event(bad)


# ---------------------------------------------------------------------------------------
# Unwrap helpers
# ---------------------------------------------------------------------------------------


def test_unwrap_seq_boundaries() -> None:
    assert unwrap_seq(None, 65535) == 65535
    assert unwrap_seq(65535, 0) == 65536
    assert unwrap_seq(65536, 65535) == 65535
    assert unwrap_seq(65535, 32766) == 65535 + 32767  # furthest ahead
    assert unwrap_seq(65535, 32767) == 65535 - 32768  # exactly half a cycle: behind
    assert unwrap_seq(0, 32767) == 32767
    assert unwrap_seq(0, 32768) == -32768
    assert unwrap_seq(5 * 65536 + 10, 10) == 5 * 65536 + 10
    with pytest.raises(ValueError):
        unwrap_seq(0, 65536)


def test_unwrap_ts_boundaries() -> None:
    m = 1 << 32
    assert unwrap_ts(None, m - 1) == m - 1
    assert unwrap_ts(m - 160, 0) == m
    assert unwrap_ts(m, m - 160) == m - 160
    assert unwrap_ts(0, (1 << 31) - 1) == (1 << 31) - 1
    assert unwrap_ts(0, 1 << 31) == -(1 << 31)
    with pytest.raises(ValueError):
        unwrap_ts(0, m)


@given(st.integers(-(1 << 40), 1 << 40), st.integers(-(1 << 15), (1 << 15) - 1))
def test_unwrap_seq_property(last: int, delta: int) -> None:
    assert unwrap_seq(last, (last + delta) % (1 << 16)) == last + delta


@given(st.integers(-(1 << 50), 1 << 50), st.integers(-(1 << 31), (1 << 31) - 1))
def test_unwrap_ts_property(last: int, delta: int) -> None:
    assert unwrap_ts(last, (last + delta) % (1 << 32)) == last + delta


@given(st.integers(0, 0xFFFF), st.lists(st.integers(-3000, 32767), max_size=200))
def test_unwrap_seq_tracks_a_stream(start: int, steps: list[int]) -> None:
    ext = unwrap_seq(None, start)
    true = start
    for step in steps:
        true += step
        ext = unwrap_seq(ext, true % (1 << 16))
        assert ext == true


# ---------------------------------------------------------------------------------------
# RtpSender
# ---------------------------------------------------------------------------------------


def test_sender_random_initial_state_is_injectable() -> None:
    a = RtpSender(0, rng=random.Random(7))
    b = RtpSender(0, rng=random.Random(7))
    assert (a.ssrc, a.sequence, a.timestamp) == (b.ssrc, b.sequence, b.timestamp)
    c = RtpSender(0)  # SystemRandom: just in range
    assert 0 <= c.ssrc < 1 << 32 and 0 <= c.sequence < 1 << 16 and 0 <= c.timestamp < 1 << 32


def test_sender_sequence_timestamp_marker_and_wrap() -> None:
    s = RtpSender(0, ssrc=0x11223344, sequence=0xFFFE, timestamp=(1 << 32) - 320)
    frames = [RtpPacket.parse(s.next_packet(bytes([i]) * 160, 160)) for i in range(4)]
    assert [p.sequence for p in frames] == [0xFFFE, 0xFFFF, 0, 1]
    assert [p.timestamp for p in frames] == [(1 << 32) - 320, (1 << 32) - 160, 0, 160]
    assert [p.marker for p in frames] == [True, False, False, False]
    assert {p.ssrc for p in frames} == {0x11223344}
    assert {p.payload_type for p in frames} == {0}
    assert s.packet_count == 4 and s.octet_count == 640
    assert (s.sequence, s.timestamp) == (2, 320)


def test_sender_talkspurt_skip_and_payload_type() -> None:
    s = RtpSender(8, ssrc=1, sequence=100, timestamp=1000)
    first = RtpPacket.parse(s.next_packet(b"a" * 160, 160))
    assert first.marker and first.payload_type == 8
    s.skip(800)  # 100 ms of silence (DTX): the next packet starts a talkspurt
    p = RtpPacket.parse(s.next_packet(b"b" * 160, 160))
    assert p.marker and p.timestamp == 1000 + 160 + 800 and p.sequence == 101
    s.skip(160, talkspurt=False)
    p = RtpPacket.parse(s.next_packet(b"c" * 160, 160))
    assert not p.marker and p.timestamp == 1000 + 160 + 800 + 160 + 160
    s.start_talkspurt()
    p = RtpPacket.parse(s.next_packet(b"", 0, payload_type=13))  # comfort noise
    assert p.marker and p.payload_type == 13
    p = RtpPacket.parse(s.next_packet(b"d", 160, marker=True))
    assert p.marker
    assert s.packet_count == 5 and s.octet_count == 160 * 3 + 1
    with pytest.raises(ValueError):
        s.skip(-1)
    with pytest.raises(ValueError):
        s.next_packet(b"", -1)
    with pytest.raises(RtpError):
        RtpSender(0, ssrc=1 << 32)


# ---------------------------------------------------------------------------------------
# DTMF send / receive
# ---------------------------------------------------------------------------------------


def _event_packet(
    ts: int,
    event: int,
    duration: int,
    end: bool = False,
    seq: int = 0,
    marker: bool = False,
    ssrc: int = 0x5555,
    pt: int = 101,
) -> RtpPacket:
    payload = TelephoneEvent(event, end, 10, duration).serialize()
    return RtpPacket(pt, seq % (1 << 16), ts % (1 << 32), ssrc, payload, marker=marker)


def _press(ts: int, event: int, total: int = 800, marker: bool = True) -> list[RtpPacket]:
    """A typical key press: start (marker), updates every 160, 3 End packets."""
    out = [_event_packet(ts, event, d, marker=marker and d == 160) for d in range(160, total, 160)]
    out += [_event_packet(ts, event, total, end=True) for _ in range(3)]
    return out


def test_dtmf_sender_packet_layout() -> None:
    rtp = RtpSender(0, ssrc=42, sequence=65534, timestamp=5000)
    rtp.next_packet(b"\xff" * 160, 160)  # some audio first
    plan = DtmfSender(rtp).packets("5", duration_ms=100)
    offsets = [t for t, _ in plan]
    pkts = [RtpPacket.parse(d) for _, d in plan]
    events = [TelephoneEvent.parse(p.payload) for p in pkts]
    assert offsets == pytest.approx([0.0, 0.02, 0.04, 0.06, 0.08, 0.10, 0.12])
    assert [p.sequence for p in pkts] == [65535, 0, 1, 2, 3, 4, 5]
    assert {p.timestamp for p in pkts} == {5160}
    assert {p.payload_type for p in pkts} == {101}
    assert [p.marker for p in pkts] == [True] + [False] * 6
    assert [e.duration for e in events] == [160, 320, 480, 640, 800, 800, 800]
    assert [e.end for e in events] == [False] * 4 + [True] * 3
    assert {e.event for e in events} == {5} and {e.volume for e in events} == {10}
    # audio resumes after the event, timestamp advanced by its duration
    after = RtpPacket.parse(rtp.next_packet(b"\xff" * 160, 160))
    assert after.sequence == 6 and after.timestamp == 5160 + 800 and not after.marker


def test_dtmf_sender_short_event_and_errors() -> None:
    rtp = RtpSender(0, ssrc=1, sequence=0, timestamp=0)
    plan = DtmfSender(rtp, ptime_ms=50).packets("#", duration_ms=40)
    events = [TelephoneEvent.parse(RtpPacket.parse(d).payload) for _, d in plan]
    assert [(e.duration, e.end) for e in events] == [(320, False)] + [(320, True)] * 3
    sender = DtmfSender(rtp)
    with pytest.raises(ValueError):
        sender.packets("X")
    with pytest.raises(ValueError):
        sender.packets("1", duration_ms=0)
    with pytest.raises(ValueError):
        sender.packets("1", duration_ms=9000)  # > 0xFFFF ticks
    with pytest.raises(ValueError):
        DtmfSender(rtp, end_packets=0)


@pytest.mark.parametrize("digit", list(DTMF_EVENTS))
def test_dtmf_round_trip_every_digit(digit: str) -> None:
    rtp = RtpSender(0, rng=random.Random(digit))
    plan = DtmfSender(rtp).packets(digit, duration_ms=120)
    rx = DtmfReceiver()
    got = rx.feed_all(RtpPacket.parse(d) for _, d in plan)
    assert got == [DtmfDigit(digit, 120.0, RtpPacket.parse(plan[0][1]).timestamp)]


def test_dtmf_round_trip_sequence_of_digits_with_audio() -> None:
    rtp = RtpSender(0, rng=random.Random(3))
    dtmf = DtmfSender(rtp)
    wire: list[bytes] = []
    for digit in "1234567890*#":
        wire += [rtp.next_packet(b"\xff" * 160, 160) for _ in range(3)]
        wire += [d for _, d in dtmf.packets(digit, 80)]
    rx = DtmfReceiver()
    got = rx.feed_all(RtpPacket.parse(d) for d in wire)
    assert "".join(d.digit for d in got) == "1234567890*#"
    assert all(d.end_seen and d.duration_ms == 80.0 for d in got)
    assert rx.flush() == []


def test_dtmf_without_marker_bit() -> None:
    rx = DtmfReceiver()
    got = rx.feed_all(_press(1000, 7, marker=False))
    assert got == [DtmfDigit("7", 100.0, 1000)]


def test_dtmf_only_end_packets_arrive() -> None:
    # start and updates lost, no marker ever seen: still exactly one digit
    rx = DtmfReceiver()
    got = rx.feed_all([_event_packet(1000, 3, 800, end=True) for _ in range(3)])
    assert got == [DtmfDigit("3", 100.0, 1000)]


def test_dtmf_duplicated_end_packets_reported_once() -> None:
    rx = DtmfReceiver()
    pkts = _press(1000, 1)
    pkts += pkts[-3:] * 3  # network duplicates on top of the 3 retransmissions
    assert rx.feed_all(pkts) == [DtmfDigit("1", 100.0, 1000)]
    # the same digit pressed again is a new event (new timestamp)
    assert rx.feed_all(_press(3000, 1)) == [DtmfDigit("1", 100.0, 3000)]


def test_dtmf_late_and_stale_packets_ignored() -> None:
    rx = DtmfReceiver()
    first = _press(1000, 4)
    second = _press(3000, 6)
    got = rx.feed_all(first[:-1] + second[:2])
    assert got == [DtmfDigit("4", 100.0, 1000)]
    # a late retransmission of the first event, and a late update of it
    assert rx.feed(first[-1]) == []
    assert rx.feed(first[0]) == []
    assert rx.feed_all(second[2:]) == [DtmfDigit("6", 100.0, 3000)]
    assert rx.ignored >= 2


def test_dtmf_all_end_packets_lost_then_next_event() -> None:
    rx = DtmfReceiver()
    first = [p for p in _press(1000, 9, total=960) if not TelephoneEvent.parse(p.payload).end]
    got = rx.feed_all(first)
    assert got == []
    got = rx.feed_all(_press(4000, 2))
    # the lost-End event is reported once, with the last duration seen (800 = 100 ms),
    # before the new one
    assert got == [
        DtmfDigit("9", 100.0, 1000, end_seen=False),
        DtmfDigit("2", 100.0, 4000),
    ]


def test_dtmf_a_key_whose_end_packets_are_lost_is_reported_once_it_goes_quiet() -> None:
    """A key pressed alone, its three End packets lost in a burst: no next key will come
    to report it. Once no packet of it has arrived for END_LOST_S it is reported, once
    (bench/conversations: the caller waited 6.5 s for "Are you still there?")."""
    rx = DtmfReceiver()
    heard = [p for p in _press(1000, 2, total=960) if not TelephoneEvent.parse(p.payload).end]
    for k, pkt in enumerate(heard):
        assert rx.feed(pkt, now=10.0 + 0.02 * k) == []
    last = 10.0 + 0.02 * (len(heard) - 1)
    assert rx.expire(last + END_LOST_S - 0.02) == []  # a gap in its updates, not its end
    assert rx.expire(last + END_LOST_S) == [DtmfDigit("2", 100.0, 1000, end_seen=False)]
    assert rx.expire(last + 2 * END_LOST_S) == []
    assert rx.feed_all(_press(1000, 2, total=960)[-3:]) == []  # its End packets, late
    untimed = DtmfReceiver()  # packets fed without their arrival time never expire
    untimed.feed_all(heard)
    assert untimed.expire(1e9) == []
    assert untimed.flush() == [DtmfDigit("2", 100.0, 1000, end_seen=False)]


def test_dtmf_flush_reports_pending_event_once() -> None:
    rx = DtmfReceiver()
    rx.feed_all(_press(1000, 10)[:2])
    assert rx.flush() == [DtmfDigit("*", 40.0, 1000, end_seen=False)]
    assert rx.flush() == []
    # its End packets arriving after the flush are not reported again
    assert rx.feed_all(_press(1000, 10)[-3:]) == []


def test_dtmf_timestamp_wrap() -> None:
    rx = DtmfReceiver()
    near_end = (1 << 32) - 400
    got = rx.feed_all(_press(near_end, 0) + _press(near_end + 2000, 11))
    assert got == [DtmfDigit("0", 100.0, near_end), DtmfDigit("#", 100.0, 1600)]


def test_dtmf_ignores_other_payload_types_bad_payloads_and_events() -> None:
    rx = DtmfReceiver(payload_type=96)
    audio = RtpPacket(0, 1, 0, 0x5555, b"\xff" * 160)
    short = RtpPacket(96, 2, 0, 0x5555, b"\x01\x80")
    flash = _event_packet(500, 16, 800, end=True, pt=96)
    other_pt = _event_packet(700, 1, 800, end=True, pt=101)
    assert rx.feed_all([audio, short, flash, other_pt]) == []
    assert rx.ignored == 4
    assert rx.feed(_event_packet(900, 12, 400, end=True, pt=96)) == [DtmfDigit("A", 50.0, 900)]


def test_dtmf_ssrc_change_flushes() -> None:
    rx = DtmfReceiver()
    got = rx.feed_all(_press(1000, 5)[:2])
    got += rx.feed_all([_event_packet(10, 8, 800, end=True, ssrc=0x7777)])
    # the new source's timestamp (10) is "older" than 1000 but a new SSRC resets state
    assert got == [DtmfDigit("5", 40.0, 1000, end_seen=False), DtmfDigit("8", 100.0, 10)]


def test_dtmf_long_duration_event_segments() -> None:
    # RFC 4733 2.5.1.3: a key held past 0xFFFF ticks continues in a new segment whose
    # timestamp is 0xFFFF later; it is one key press
    rx = DtmfReceiver()
    seg1 = [_event_packet(1000, 1, d) for d in (160, 0x8000, 0xFFFF)]
    seg2 = [_event_packet(1000 + 0xFFFF, 1, d) for d in (160, 800)]
    seg2 += [_event_packet(1000 + 0xFFFF, 1, 1600, end=True)] * 3
    got = rx.feed_all(seg1 + seg2)
    assert got == [DtmfDigit("1", (0xFFFF + 1600) / 8, 1000)]


def test_dtmf_receiver_validation() -> None:
    with pytest.raises(RtpError):
        DtmfReceiver(payload_type=128)
    with pytest.raises(ValueError):
        DtmfReceiver(clock_rate=0)


@settings(max_examples=50, deadline=None)
@given(
    st.text(alphabet=DTMF_EVENTS, min_size=1, max_size=6),
    st.integers(0, 0xFFFF),
    st.integers(0, (1 << 32) - 1),
    st.randoms(use_true_random=False),
)
def test_dtmf_round_trip_with_loss_and_duplicates(
    digits: str, seq: int, ts: int, rnd: random.Random
) -> None:
    rtp = RtpSender(0, ssrc=9, sequence=seq, timestamp=ts)
    dtmf = DtmfSender(rtp)
    wire: list[bytes] = []
    for digit in digits:
        plan = [d for _, d in dtmf.packets(digit, 100)]
        # lose some start/update packets, keep at least one End, duplicate some
        body = [d for d in plan[:-3] if rnd.random() < 0.7]
        ends = [d for d in plan[-3:] if rnd.random() < 0.6] or [plan[-1]]
        wire += body + ends + [d for d in ends if rnd.random() < 0.5]
        rtp.skip(800)
    got = DtmfReceiver().feed_all(RtpPacket.parse(d) for d in wire)
    assert "".join(d.digit for d in got) == digits
    assert all(d.end_seen and d.duration_ms == 100.0 for d in got)


# ---------------------------------------------------------------------------------------
# RFC 3550 interarrival jitter
# ---------------------------------------------------------------------------------------


def test_jitter_zero_for_perfect_pacing_across_wrap() -> None:
    j = InterarrivalJitter(8000)
    ts = (1 << 32) - 800
    for i in range(20):
        j.update(10.0 + i * 0.02, (ts + 160 * i) % (1 << 32))
    assert j.jitter == pytest.approx(0.0, abs=1e-6)


def test_jitter_known_values() -> None:
    j = InterarrivalJitter(8000)
    j.update(0.000, 0)
    # second packet 5 ms late: |D| = 40 ticks, J = 40/16 = 2.5 ticks
    assert j.update(0.025, 160) == pytest.approx(2.5)
    # third on time again: D = 40 ticks relative to the late one
    assert j.update(0.040, 320) == pytest.approx(2.5 + (40 - 2.5) / 16)
    assert j.jitter_ms == pytest.approx(j.jitter / 8)
    with pytest.raises(ValueError):
        InterarrivalJitter(0)


def test_struct_layout_sanity() -> None:
    # the header really is network byte order
    data = RtpPacket(0, 0x0102, 0x03040506, 0x0708090A).serialize()
    assert struct.unpack("!BBHII", data) == (0x80, 0, 0x0102, 0x03040506, 0x0708090A)


def test_codec_lookup_tables_are_the_codec_functions() -> None:
    """The receive and send hot paths decode/encode by table lookup: every code and
    every sample value must come out as the G.711 functions give it."""
    codes = np.arange(256, dtype=np.uint8)
    pcm = np.arange(-32768, 32768, dtype=np.int32).astype(np.int16)
    for codec in CODECS.values():
        assert np.array_equal(codec.dec_table.take(codes), codec.decode(codes))
        assert np.array_equal(codec.enc_table.take(pcm.view(np.uint16)), codec.encode(pcm))

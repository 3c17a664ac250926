"""RTCP packets (RFC 3550 6.4-6.6), receiver statistics (A.3, A.8) and RtcpSession."""

from __future__ import annotations

import contextlib
import heapq
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sip_bridge.media.rtcp import (
    NTP_UNIX_OFFSET,
    Bye,
    ReceiverReport,
    ReportBlock,
    RtcpError,
    RtcpPacket,
    SdesChunk,
    SenderReport,
    SourceDescription,
    UnknownRtcp,
    ntp_from_seconds,
    ntp_middle32,
    parse_compound,
    serialize_compound,
    serialize_packet,
)
from sip_bridge.media.rtcp_session import ReceptionStats, RtcpReport, RtcpSession, rtcp_interval

# --- byte-exact vectors, assembled field by field from the RFC 3550 figures -------------

SR_BYTES = bytes.fromhex(
    "81c8000c"  # V=2 P=0 RC=1, PT=200, length 12 words
    "12345678"  # SSRC of sender
    "e1a2b3c480000000"  # NTP timestamp
    "00010000"  # RTP timestamp
    "00000064"  # sender's packet count (100)
    "00003e80"  # sender's octet count (16000)
    "deadbeef"  # report block: SSRC_1
    "40000003"  # fraction lost 64/256, cumulative lost 3
    "00010005"  # extended highest seq (cycles 1, seq 5)
    "00000020"  # interarrival jitter
    "b3c48000"  # LSR
    "00010000"  # DLSR (1 s)
)
SR = SenderReport(
    0x12345678,
    0xE1A2B3C480000000,
    0x10000,
    100,
    16000,
    (ReportBlock(0xDEADBEEF, 64, 3, 0x10005, 0x20, 0xB3C48000, 0x10000),),
)

RR_BYTES = bytes.fromhex(
    "82c9000d"  # RC=2, PT=201, length 13 words
    "12345678"
    "0000000a"
    "0a000005"
    "00000100"
    "00000007"
    "00000000"
    "00000000"
    "0000000b"
    "00ffffff"
    "0000ffff"
    "00000000"
    "11112222"
    "00000800"
)
RR = ReceiverReport(
    0x12345678,
    (
        ReportBlock(10, 10, 5, 256, 7),
        ReportBlock(11, 0, -1, 0xFFFF, 0, 0x11112222, 0x800),
    ),
)

SDES_BYTES = bytes.fromhex("81ca000512345678010b") + b"bridge@host" + bytes(3)
SDES = SourceDescription((SdesChunk(0x12345678, ((1, b"bridge@host"),)),))

BYE_BYTES = bytes.fromhex("81cb00031234567805") + b"done!" + bytes(2)
BYE = Bye((0x12345678,), b"done!")


@pytest.mark.parametrize(
    ("packet", "wire"),
    [(SR, SR_BYTES), (RR, RR_BYTES), (SDES, SDES_BYTES), (BYE, BYE_BYTES)],
    ids=["sr", "rr", "sdes", "bye"],
)
def test_vectors_serialize_and_parse(packet: RtcpPacket, wire: bytes) -> None:
    assert serialize_packet(packet) == wire
    assert parse_compound(wire) == [packet]


def test_sdes_cname_and_missing_cname() -> None:
    assert SDES.chunks[0].cname == "bridge@host"
    assert SdesChunk(1, ((2, b"name"),)).cname is None


def test_compound_skips_unknown_types_by_length() -> None:
    app = bytes.fromhex("80cc000312345678") + b"TEST" + b"\x01\x02\x03\x04"  # APP
    fb = bytes.fromhex("81cd000212345678deadbeef")  # RTPFB generic NACK header
    xr = bytes.fromhex("80cf000112345678")  # XR with no blocks
    packets = parse_compound(SR_BYTES + app + fb + SDES_BYTES + xr + BYE_BYTES)
    assert packets[0] == SR
    assert packets[1] == UnknownRtcp(204, 0, bytes.fromhex("12345678") + b"TEST\x01\x02\x03\x04")
    assert packets[2] == UnknownRtcp(205, 1, bytes.fromhex("12345678deadbeef"))
    assert packets[3] == SDES
    assert packets[4] == UnknownRtcp(207, 0, bytes.fromhex("12345678"))
    assert packets[5] == BYE
    assert serialize_compound(packets) == SR_BYTES + app + fb + SDES_BYTES + xr + BYE_BYTES


def test_padding_on_last_packet() -> None:
    wire = serialize_compound([RR, SDES], pad_to=32)
    assert len(wire) == 96  # 56 + 24 + 16 padding
    tail = wire[len(RR_BYTES) :]
    assert tail[0] & 0x20  # P bit on SDES only
    assert not wire[0] & 0x20
    pad = tail[-1]
    assert pad == len(wire) - len(RR_BYTES) - len(SDES_BYTES)
    assert parse_compound(wire) == [RR, SDES]
    # hand-padded RR: 4 padding octets ending in the count
    padded = bytes((RR_BYTES[0] | 0x20, 0xC9, 0, 14)) + RR_BYTES[4:] + b"\0\0\0\x04"
    assert parse_compound(padded) == [RR]


def test_profile_extension_after_blocks_is_ignored() -> None:
    wire = bytes((0x80, 0xC9, 0, 2)) + bytes.fromhex("12345678cafebabe")
    assert parse_compound(wire) == [ReceiverReport(0x12345678)]


@pytest.mark.parametrize(
    "wire",
    [
        b"",
        b"\x80",
        bytes.fromhex("8060000000000000"),  # RTP payload type, not RTCP
        bytes.fromhex("40c9000100000000"),  # version 1
        bytes.fromhex("80c900010000000040"),  # trailing partial header
        bytes.fromhex("80c900010000000000c90000"),  # second packet version 0
        bytes.fromhex("80c9000200000000"),  # length overruns datagram
        bytes.fromhex("81c9000100000000"),  # RC=1 without a block
        bytes.fromhex("80c8000100000000"),  # SR without sender info
        bytes.fromhex("80c90000"),  # RR without SSRC
        bytes.fromhex("a0c9000100000000"),  # padding count 0
        bytes.fromhex("a0c9000100000009"),  # padding larger than the packet
        bytes.fromhex("81ca000112345678"),  # SDES chunk without END
        bytes.fromhex("81ca00011234567801"),  # (not 32-bit) + truncated item
        bytes.fromhex("81ca0002123456780109616200"),  # item longer than packet
        bytes.fromhex("82ca0002123456780000000000"),  # second chunk missing
        bytes.fromhex("82cb000112345678"),  # BYE SC=2 but one SSRC
        bytes.fromhex("81cb00021234567809616263"),  # BYE reason overruns
    ],
)
def test_malformed_raises_rtcp_error(wire: bytes) -> None:
    with pytest.raises(RtcpError):
        parse_compound(wire)


@pytest.mark.parametrize(
    "packet",
    [
        ReceiverReport(1 << 32),
        ReceiverReport(1, (ReportBlock(1, 256, 0, 0, 0),)),
        ReceiverReport(1, (ReportBlock(1, 0, 1 << 23, 0, 0),)),
        ReceiverReport(1, (ReportBlock(1, 0, -(1 << 23) - 1, 0, 0),)),
        ReceiverReport(1, tuple(ReportBlock(i, 0, 0, 0, 0) for i in range(32))),
        SourceDescription((SdesChunk(1, ((0, b"x"),)),)),
        SourceDescription((SdesChunk(1, ((1, bytes(256)),)),)),
        Bye((1,), bytes(256)),
        UnknownRtcp(204, 0, b"abc"),
    ],
)
def test_unencodable_fields_raise(packet: RtcpPacket) -> None:
    with pytest.raises(RtcpError):
        serialize_packet(packet)


def test_rtcp_error_is_value_error() -> None:
    assert issubclass(RtcpError, ValueError)


# --- NTP --------------------------------------------------------------------------------


def test_ntp_conversion_and_middle_bits() -> None:
    assert ntp_from_seconds(NTP_UNIX_OFFSET + 0.5) == (NTP_UNIX_OFFSET << 32) | 0x8000_0000
    assert ntp_middle32(0xE1A2B3C4_80000000) == 0xB3C48000
    assert ntp_middle32(ntp_from_seconds(65535.5)) == 0xFFFF8000
    assert ntp_middle32(ntp_from_seconds(65536.25)) == 0x00004000  # 16-bit seconds wrapped
    assert ntp_from_seconds(2.0**32 + 1.0) == 1 << 32  # era wrap of the 64-bit form


# --- receiver statistics ----------------------------------------------------------------


def test_loss_reorder_duplicates_and_seq_wrap() -> None:
    stats = ReceptionStats(0xAB, 8000)
    order = [i for i in range(100) if i not in (10, 11, 50, 70, 90)]
    k = order.index(30)
    order[k], order[k + 1] = order[k + 1], order[k]  # 31 arrives before 30
    for n, i in enumerate(order):
        stats.on_packet((65500 + i) % 65536, 1000 + 160 * i, n * 0.02)
    block = stats.report_block(now=2.0)
    assert block.highest_seq == (1 << 16) | 63  # 65599 extended: one cycle
    assert block.cumulative_lost == 5
    assert block.fraction_lost == 5 * 256 // 100
    assert block.lsr == 0 and block.dlsr == 0
    # next interval: 50 packets, none lost, 2 duplicates -> fraction 0, cum goes down
    for i in range(100, 150):
        stats.on_packet((65500 + i) % 65536, 1000 + 160 * i, 2.0 + (i - 100) * 0.02)
    stats.on_packet((65500 + 120) % 65536, 1000 + 160 * 120, 3.5)
    stats.on_packet((65500 + 121) % 65536, 1000 + 160 * 121, 3.5)
    block = stats.report_block(now=4.0)
    assert block.cumulative_lost == 3
    assert block.fraction_lost == 0
    assert block.highest_seq == (1 << 16) | 113
    # third interval: 3 of 4 lost
    stats.on_packet((65500 + 153) % 65536, 1000 + 160 * 153, 4.1)
    block = stats.report_block(now=4.2)
    assert block.fraction_lost == 3 * 256 // 4
    assert block.cumulative_lost == 6


def test_packet_before_first_counts_as_expected() -> None:
    stats = ReceptionStats(1, 8000)
    for seq in (2, 3, 1, 0, 65535):
        stats.on_packet(seq, 0, 0.0)
    assert stats.expected == 5 and stats.cumulative_lost == 0
    assert stats.report_block(0.0).highest_seq == 3


def test_negative_and_clamped_cumulative_loss() -> None:
    dup = ReceptionStats(1, 8000)
    for _ in range(3):
        dup.on_packet(7, 0, 0.0)
    block = dup.report_block(0.0)
    assert block.cumulative_lost == -2
    assert block.serialize()[4:8] == bytes.fromhex("00fffffe")
    big = ReceptionStats(1, 8000)
    for i in range(300):
        big.on_packet((i * 30000) % 65536, 0, 0.0)
    assert big.cumulative_lost > (1 << 23)
    assert big.report_block(0.0).cumulative_lost == (1 << 23) - 1


def test_jitter_matches_rfc_recursion() -> None:
    stats = ReceptionStats(1, 8000)
    for i in range(200):  # every other packet 5 ms late: |D| = 40 timestamp units
        stats.on_packet(i, 160 * i, i * 0.02 + (0.005 if i % 2 else 0.0))
    expected = 40 * (1 - (15 / 16) ** 199)
    block = stats.report_block(4.0)
    assert block.jitter == int(expected) == 39


def test_dlsr_from_last_sr() -> None:
    stats = ReceptionStats(1, 8000)
    stats.on_packet(0, 0, 0.0)
    stats.last_sr = (0xB3C48000, 10.0)
    block = stats.report_block(11.5)
    assert block.lsr == 0xB3C48000
    assert block.dlsr == 98304  # 1.5 s in 1/65536 s


# --- interval ---------------------------------------------------------------------------


def test_rtcp_interval_rfc_a7() -> None:
    comp = math.e - 1.5
    assert rtcp_interval(2, 1, 400.0, True, 128.0, True, 0.5) == pytest.approx(2.5 / comp)
    assert rtcp_interval(2, 1, 400.0, True, 128.0, False, 0.0) == pytest.approx(2.5 / comp)
    assert rtcp_interval(2, 1, 400.0, True, 128.0, False, 1.0) == pytest.approx(7.5 / comp)
    # 100 members, 2 senders: receivers share 75 % of the bandwidth
    recv = rtcp_interval(100, 2, 400.0, False, 128.0, False, 0.5)
    assert recv == pytest.approx(128.0 * 98 / 300.0 / comp)
    send = rtcp_interval(100, 2, 400.0, True, 128.0, False, 0.5)
    assert send == pytest.approx(5.0 / comp)  # 2 * 128 / 100 < 5 s minimum


def test_session_report_schedule_and_kinds() -> None:
    s = RtcpSession(
        0x1111, 8000, "a@bridge", now=100.0, ntp_offset=NTP_UNIX_OFFSET, rand=lambda: 0.5
    )
    assert s.next_report_time() == pytest.approx(100.0 + 2.5 / (math.e - 1.5))
    rr = parse_compound(s.build_report(102.0))
    assert rr == [
        ReceiverReport(0x1111),
        SourceDescription((SdesChunk(0x1111, ((1, b"a@bridge"),)),)),
    ]
    assert s.next_report_time() == pytest.approx(102.0 + 5.0 / (math.e - 1.5))
    for i in range(10):
        s.on_rtp_sent(172, 160, (5000 + 160 * i) & 0xFFFFFFFF, 103.0 + 0.02 * i)
    s.on_rtp_received(0x2222, 9, 0, 103.0)
    sr = parse_compound(s.build_report(103.5))
    head = sr[0]
    assert isinstance(head, SenderReport)
    assert (head.packet_count, head.octet_count) == (10, 1600)
    assert head.rtp_timestamp == 5000 + 160 * 9 + round((103.5 - 103.18) * 8000)
    assert head.ntp_timestamp == ntp_from_seconds(103.5 + NTP_UNIX_OFFSET)
    assert [b.ssrc for b in head.reports] == [0x2222]
    assert isinstance(parse_compound(s.build_report(110.0))[0], ReceiverReport)


def test_bye_and_peer_bye_forgets_source() -> None:
    a = RtcpSession(1, 8000, "a", now=0.0, rand=lambda: 0.0)
    b = RtcpSession(2, 8000, "b", now=0.0, rand=lambda: 0.0)
    a.on_rtp_received(2, 1, 0, 0.1)
    packets = parse_compound(b.bye(1.0, reason="caller hung up"))
    assert isinstance(packets[0], ReceiverReport)
    assert packets[1] == SourceDescription((SdesChunk(2, ((1, b"b"),)),))
    assert packets[-1] == Bye((2,), b"caller hung up")
    assert a.on_rtcp(b.bye(1.0), 1.03) == []
    assert a.sources == {}


# --- two-party simulation ---------------------------------------------------------------


def _simulate(
    offset_a: float, offset_b: float, seconds: float, drop_every: int = 0
) -> list[RtcpReport]:
    """A and B exchange 20 ms RTP and RTCP over a 30 ms one-way path; A's reports."""
    delay_ms = 30
    a = RtcpSession(0xA, 8000, "a@x", now=0.0, ntp_offset=offset_a, rand=lambda: 0.3)
    b = RtcpSession(0xB, 8000, "b@y", now=0.0, ntp_offset=offset_b, rand=lambda: 0.7)
    events: list[tuple[int, int, str, bytes | tuple[int, int, int]]] = []
    got: list[RtcpReport] = []
    seq = 0
    for ms in range(int(seconds * 1000)):
        now = ms / 1000
        while events and events[0][0] <= ms:
            _, _, kind, item = heapq.heappop(events)
            dst = a if kind.startswith("a") else b
            if isinstance(item, bytes):
                reports = dst.on_rtcp(item, now)
                if dst is a:
                    got.extend(reports)
            else:
                dst.on_rtp_received(*item, now)
        if ms % 20 == 0:
            for src, dst_name, ssrc in ((a, "b-rtp", 0xA), (b, "a-rtp", 0xB)):
                ts = (seq * 160) & 0xFFFFFFFF
                src.on_rtp_sent(172, 160, ts, now)
                if not (drop_every and ssrc == 0xA and seq % drop_every == 1):
                    heapq.heappush(
                        events, (ms + delay_ms, len(events), dst_name, (ssrc, seq & 0xFFFF, ts))
                    )
            seq += 1
        for src, dst_name in ((a, "b-rtcp"), (b, "a-rtcp")):
            if now >= src.next_report_time():
                heapq.heappush(events, (ms + delay_ms, ms, dst_name, src.build_report(now)))
    return got


def test_rtt_two_party_simulation() -> None:
    reports = _simulate(NTP_UNIX_OFFSET + 1000.0, NTP_UNIX_OFFSET + 777_777.125, 30.0)
    assert len(reports) >= 5
    assert all(r.reporter_ssrc == 0xB for r in reports)
    with_rtt = [r for r in reports if r.rtt_s is not None]
    assert len(with_rtt) >= 4
    for r in with_rtt:
        assert r.rtt_s == pytest.approx(0.060, abs=1e-3)
        assert r.cumulative_lost == 0 and r.fraction_lost == 0.0
        assert r.jitter_s < 1e-3


def test_loss_seen_by_peer_in_simulation() -> None:
    reports = _simulate(NTP_UNIX_OFFSET, NTP_UNIX_OFFSET, 20.0, drop_every=10)
    last = reports[-1]
    assert last.fraction_lost == pytest.approx(0.1, abs=0.02)
    assert last.cumulative_lost > 50


def test_rtt_across_ntp_middle_bits_wrap() -> None:
    a = RtcpSession(0xA, 8000, "a", now=0.0, ntp_offset=65536.0 * 1000 - 0.5, rand=lambda: 0.5)
    b = RtcpSession(0xB, 8000, "b", now=0.0, ntp_offset=12345.0, rand=lambda: 0.5)
    b.on_rtp_received(0xA, 1, 0, 0.0)
    a.on_rtp_sent(172, 160, 0, 0.0)
    sr = a.build_report(0.0)
    assert ntp_middle32(parse_compound(sr)[0].ntp_timestamp) == 0xFFFF8000  # type: ignore[union-attr]
    b.on_rtcp(sr, 0.03)
    rr = b.build_report(1.0)
    (report,) = a.on_rtcp(rr, 1.03)
    assert ntp_middle32(a.ntp(1.03)) < 0x10000  # A's clock wrapped meanwhile
    assert report.rtt_s == pytest.approx(0.060, abs=1e-4)


# --- fuzz and round trips ---------------------------------------------------------------

u32 = st.integers(0, 0xFFFFFFFF)
blocks = st.builds(
    ReportBlock,
    u32,
    st.integers(0, 255),
    st.integers(-(1 << 23), (1 << 23) - 1),
    u32,
    u32,
    u32,
    u32,
)
block_lists = st.lists(blocks, max_size=31).map(tuple)
heads = st.one_of(
    st.builds(SenderReport, u32, st.integers(0, (1 << 64) - 1), u32, u32, u32, block_lists),
    st.builds(ReceiverReport, u32, block_lists),
)
items = st.tuples(st.integers(1, 255), st.binary(max_size=255))
others = st.one_of(
    heads,
    st.builds(
        SourceDescription,
        st.lists(st.builds(SdesChunk, u32, st.lists(items, max_size=3).map(tuple)), max_size=4).map(
            tuple
        ),
    ),
    st.builds(Bye, st.lists(u32, max_size=31).map(tuple), st.none() | st.binary(max_size=255)),
    st.builds(
        UnknownRtcp,
        st.integers(204, 255),
        st.integers(0, 31),
        st.binary(max_size=64).map(lambda b: b[: len(b) // 4 * 4]),
    ),
)


@settings(max_examples=200, deadline=None)
@given(heads, st.lists(others, max_size=4), st.sampled_from([None, 4, 16, 64]))
def test_round_trip(head: RtcpPacket, rest: list[RtcpPacket], pad_to: int | None) -> None:
    packets = [head, *rest]
    wire = serialize_compound(packets, pad_to=pad_to)
    assert parse_compound(wire) == packets
    if pad_to:
        assert len(wire) % pad_to == 0


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(data: bytes) -> None:
    for candidate in (data, b"\x80\xc9" + data, b"\x81\xca" + data):
        with contextlib.suppress(RtcpError):
            parse_compound(candidate)


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 255), st.integers(0, 200))
def test_fuzz_mutated_valid_compound(pos: int, value: int, cut: int) -> None:
    wire = bytearray(SR_BYTES + SDES_BYTES + RR_BYTES + BYE_BYTES)
    wire[pos % len(wire)] = value
    for candidate in (bytes(wire), bytes(wire[: len(wire) - cut])):
        with contextlib.suppress(RtcpError):
            parse_compound(candidate)

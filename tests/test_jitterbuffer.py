"""JitterBuffer unit and property tests (no network models: hand-made packet sequences)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from jitter import JitterBuffer, Unwrapper, unwrap_near, wrapped_diff

RATE = 8000
FRAME = 160
TICK = 0.020
PHASE = 0.0073


def pcm_at(ts_ext: int, n: int) -> NDArray[np.int16]:
    """Audio identified by its (unwrapped) timestamp, so output can be checked sample-exactly."""
    return (((ts_ext + np.arange(n)) * 37) % 16000 - 8000).astype(np.int16)


@dataclass
class Pkt:
    seq: int
    ts_ext: int
    n: int
    arrival: float
    marker: bool = False
    ssrc: int = 1234
    cn: bool = False
    event: bool = False  # an RFC 4733 event: takes a sequence number, carries no audio

    @property
    def ts(self) -> int:
        return self.ts_ext & 0xFFFFFFFF


def stream(
    count: int,
    *,
    seq0: int = 1000,
    ts0: int = 50_000,
    ptimes: list[int] | None = None,
    t0: float = 0.0,
    delay: float = 0.030,
    ssrc: int = 1234,
) -> list[Pkt]:
    out = []
    ts = ts0
    for i in range(count):
        n = (ptimes[i % len(ptimes)] if ptimes else 20) * RATE // 1000
        out.append(Pkt(seq0 + i, ts, n, t0 + (ts - ts0 + n) / RATE + delay, ssrc=ssrc))
        ts += n
    return out


@dataclass
class Run:
    frames: list[NDArray[np.int16]]
    pts: list[int | None]
    jb: JitterBuffer
    cur_ms: list[float]


def drive(pkts: list[Pkt], jb: JitterBuffer | None = None, extra_s: float = 0.3) -> Run:
    jb = jb or JitterBuffer(RATE)
    order = sorted(pkts, key=lambda p: p.arrival)
    t = PHASE
    end = max(p.arrival for p in pkts) + extra_s
    i = 0
    frames: list[NDArray[np.int16]] = []
    pts: list[int | None] = []
    cur: list[float] = []
    while t <= end:
        while i < len(order) and order[i].arrival <= t:
            p = order[i]
            if p.event:
                jb.skip_sequence(p.seq & 0xFFFF, p.ssrc)
            elif p.cn:
                jb.push_comfort_noise(p.seq & 0xFFFF, p.ts, 40, p.arrival, p.ssrc)
            else:
                jb.push(p.seq & 0xFFFF, p.ts, pcm_at(p.ts_ext, p.n), p.arrival, p.marker, p.ssrc)
            i += 1
        f = jb.pop(t)
        assert f.dtype == np.int16 and f.shape == (FRAME,)
        frames.append(f)
        pts.append(jb.playout_timestamp)
        cur.append(jb.stats.current_delay_ms)
        t += TICK
    return Run(frames, pts, jb, cur)


def played_audio(run: Run, upto: int | None = None) -> tuple[NDArray[np.int16], NDArray[np.int16]]:
    """(output, expected) over the frames tied to the stream, by playout timestamp."""
    got, want = [], []
    for f, p in zip(run.frames, run.pts, strict=True):
        if p is not None and (upto is None or p + FRAME <= upto):
            got.append(f)
            want.append(pcm_at(p, FRAME))
    return np.concatenate(got), np.concatenate(want)


# -- seqnum ------------------------------------------------------------------------------------


def test_unwrap_helpers_exact_at_the_wrap() -> None:
    assert wrapped_diff(0, 65535, 16) == 1
    assert wrapped_diff(65535, 0, 16) == -1
    assert unwrap_near(2, 65534, 16) == 65538
    assert unwrap_near(65534, 65538, 16) == 65534
    u = Unwrapper(32)
    assert u.unwrap(2**32 - 160) == 2**32 - 160
    assert u.unwrap(0) == 2**32
    assert u.unwrap(2**32 - 320) == 2**32 - 320  # reordered: older, behind the wrap
    assert u.highest == 2**32
    assert u.unwrap(160) == 2**32 + 160


# -- basic behaviour -----------------------------------------------------------------------


def test_clean_stream_is_reproduced_exactly_at_min_delay() -> None:
    run = drive(stream(200))
    got, want = played_audio(run)
    np.testing.assert_array_equal(got, want)
    s = run.jb.stats
    assert (s.lost, s.late, s.concealed, s.dropped_frames, s.inserted_frames) == (0, 0, 0, 0, 0)
    assert s.target_delay_ms == 20.0
    playing = [c for c, p in zip(run.cur_ms, run.pts, strict=True) if p is not None]
    assert min(playing) >= 20.0 and max(playing) < 42.0
    ticks = [p for p in run.pts if p is not None]
    assert all(b - a == FRAME for a, b in itertools.pairwise(ticks))
    assert run.pts[0] is None  # silence before playout starts


def test_reordering_within_the_window_is_transparent() -> None:
    pkts = stream(200)
    for k in range(10, 190, 7):  # swap neighbours: the earlier one arrives 25 ms late
        pkts[k].arrival += 0.025
    run = drive(pkts)
    s = run.jb.stats
    assert s.lost == 0 and s.late == 0 and s.concealed == 0
    got, want = played_audio(run)
    assert np.mean(got == want) > 0.97  # only insert/blend frames may differ


def test_duplicates_are_counted_and_ignored() -> None:
    pkts = stream(100)
    dups = [Pkt(p.seq, p.ts_ext, p.n, p.arrival + 0.004) for p in pkts[::3]]
    run = drive(pkts + dups)
    s = run.jb.stats
    assert s.duplicates == len(dups)
    assert s.received == len(pkts) + len(dups)
    assert s.lost == 0 and s.late == 0 and s.concealed == 0
    got, want = played_audio(run)
    np.testing.assert_array_equal(got, want)


def test_seq_and_timestamp_wrap_mid_stream() -> None:
    pkts = stream(300, seq0=65_400, ts0=2**32 - 20 * FRAME)
    run = drive(pkts)
    s = run.jb.stats
    assert (s.lost, s.late, s.concealed, s.resyncs, s.duplicates) == (0, 0, 0, 0, 0)
    ticks = [p for p in run.pts if p is not None]
    assert ticks[0] < 2**32 < ticks[-1]  # unwrapped across the 32-bit wrap
    got, want = played_audio(run)
    np.testing.assert_array_equal(got, want)


def test_lost_packet_is_concealed_and_counted() -> None:
    pkts = stream(100)
    del pkts[50]
    run = drive(pkts)
    s = run.jb.stats
    assert s.lost == 1 and s.concealed == 1 and s.late == 0


@pytest.mark.parametrize("burst", [1, 2, 3])
def test_a_burst_lost_at_the_edge_of_a_short_buffer_fades_instead_of_falling_silent(
    burst: int,
) -> None:
    """On loopback at a 20 ms target nothing newer is buffered when a lost packet is due,
    so the hole is not yet known for a loss: it fades out as G.711 Appendix I conceals
    (60 ms to silence), never drops to digital zero mid-word (the VAD and the recogniser
    took 40 ms of zeros in a caller's question for a pause), and the words after it play
    as sent."""
    pkts = stream(120, delay=0.001)
    lost = range(60, 60 + burst)
    kept = [p for i, p in enumerate(pkts) if i not in lost]
    run = drive(kept, JitterBuffer(RATE, min_delay_ms=20))
    first = run.pts.index(pkts[lost[0] - 1].ts_ext)  # the frame before the hole
    hole = run.frames[first + 1 : first + 1 + burst]
    assert all(f.any() for f in hole)
    rms = [float(np.sqrt(np.mean(f.astype(np.float64) ** 2))) for f in hole]
    assert rms == sorted(rms, reverse=True)  # fading
    after = run.pts.index(pkts[lost[-1] + 1].ts_ext)
    assert after == first + 1 + burst  # no frame of the words after it is lost
    got = np.concatenate(run.frames[after + 1 : after + 20])
    want = pcm_at(pkts[lost[-1] + 2].ts_ext, got.size)
    assert np.array_equal(got, want)


def test_a_silence_announced_by_comfort_noise_fades_in_one_frame() -> None:
    """A CN packet says the sender went quiet: one frame of tail, then the noise."""
    a = stream(100, seq0=10, ts0=0, delay=0.001)
    cn = Pkt(110, a[-1].ts_ext + FRAME, 0, a[-1].arrival + TICK, cn=True)
    run = drive([*a, cn], JitterBuffer(RATE, min_delay_ms=20))
    last = run.pts.index(a[-1].ts_ext)
    level = [float(np.sqrt(np.mean(f.astype(np.float64) ** 2))) for f in run.frames]
    assert level[last + 1] > 700  # the tail
    assert all(150 < x < 700 for x in level[last + 2 : last + 10])  # -40 dBov of noise


def key_press(pkts: list[Pkt], first: int, count: int) -> list[Pkt]:
    """``pkts`` with ``count`` audio packets from ``first`` taken by a key's event packets
    (same SSRC, same sequence numbers and arrival times), as RFC 4733 senders do."""
    out = list(pkts)
    for i in range(first, first + count):
        p = out[i]
        out[i] = Pkt(p.seq, pkts[first].ts_ext, p.n, p.arrival, ssrc=p.ssrc, event=True)
    return out


def test_a_key_press_taking_audio_sequence_numbers_is_no_loss_and_not_concealed() -> None:
    pkts = stream(100)
    keyed = drive(key_press(pkts, 40, 6)).jb.stats
    assert (keyed.lost, keyed.concealed, keyed.late, keyed.resyncs) == (0, 0, 0, 0)
    assert keyed.comfort_noise >= 6  # the key's 120 ms is a pause
    dropped = drive(pkts[:40] + pkts[46:]).jb.stats  # the same gap, had they been lost
    assert dropped.lost == 6 and dropped.concealed > 0


def test_a_key_press_after_the_audio_it_preceded_still_fills_its_numbers() -> None:
    pkts = key_press(stream(100), 40, 3)
    for i in (40, 41, 42):
        pkts[i].arrival += 0.1  # arrive after packet 43
    s = drive(pkts).jb.stats
    assert s.lost == 0 and s.resyncs == 0


def test_an_event_of_another_stream_or_far_away_changes_nothing() -> None:
    jb = JitterBuffer(RATE)
    jb.skip_sequence(7, 99)  # before any audio: nothing to number it against
    for p in stream(10):
        jb.push(p.seq, p.ts, pcm_at(p.ts_ext, p.n), p.arrival, False, p.ssrc)
    jb.skip_sequence(1012, 4321)  # another SSRC
    jb.skip_sequence(1010 + 5000, 1234)  # a jump no stream makes
    jb.skip_sequence(1005, 1234)  # already received
    p = stream(12)[11]
    jb.push(p.seq, p.ts, pcm_at(p.ts_ext, p.n), p.arrival, False, p.ssrc)
    assert jb.stats.lost == 1 and jb.stats.duplicates == 0  # 1010 alone is missing


def test_late_packet_counted_late_and_dropped() -> None:
    pkts = stream(100)
    pkts[40].arrival += 0.5
    run = drive(pkts)
    s = run.jb.stats
    assert s.late == 1
    assert s.lost == 0  # it arrived: moved from lost to late
    assert s.concealed >= 1
    assert s.resyncs == 0


def test_ptime_10_30_60_mixed() -> None:
    pkts = stream(150, ptimes=[60, 10, 30, 20, 10, 10, 30])
    run = drive(pkts, JitterBuffer(RATE, min_delay_ms=20))
    s = run.jb.stats
    # 60 ms packets arrive 40 ms after a 20 ms one would: before the target has learnt
    # that, at most one start-up packet may come too late.
    assert s.lost == 0 and s.late <= 1 and s.concealed <= 1
    got, want = played_audio(run, upto=pkts[-1].ts_ext + pkts[-1].n)
    assert np.mean(got == want) > 0.97


def test_odd_packet_sizes_and_partial_overlap() -> None:
    pkts = stream(120, ptimes=[20])
    for p in pkts:  # every packet carries 3 ms of the next one too (overlap) and odd length
        p.n += 24 + p.seq % 3
    run = drive(pkts)
    s = run.jb.stats
    assert s.lost == 0 and s.concealed == 0
    got, want = played_audio(run, upto=pkts[-1].ts_ext + FRAME)
    np.testing.assert_array_equal(got, want)


def test_ssrc_change_resyncs_without_loss_counting() -> None:
    a = stream(100, seq0=500, ts0=1000)
    t_switch = a[-1].arrival + 0.0
    b = stream(100, seq0=40_000, ts0=3_000_000_000, t0=t_switch - 0.030 + 0.0, ssrc=999)
    run = drive(a + b)
    s = run.jb.stats
    assert s.resyncs == 1
    assert s.lost == 0 and s.late == 0
    assert s.concealed <= 1
    ticks = [p for p in run.pts if p is not None]
    assert ticks[-1] > 3_000_000_000  # reported in the new stream's timestamp space
    got, want = played_audio(run)
    assert np.mean(got == want) > 0.95


def test_timestamp_jump_resyncs() -> None:
    a = stream(100, seq0=7, ts0=0)
    b = stream(100, seq0=107, ts0=80_000_000, t0=a[-1].arrival - 0.030)
    run = drive(a + b)
    s = run.jb.stats
    assert s.resyncs == 1 and s.lost == 0 and s.late == 0 and s.concealed <= 1
    # ... and a silly seq jump is a resync too
    c = stream(50, seq0=30_000, ts0=b[-1].ts_ext + FRAME, t0=b[-1].arrival - 0.030)
    run2 = drive(a + b + c)
    assert run2.jb.stats.resyncs == 2


def test_dtx_gap_with_cn_is_not_loss() -> None:
    a = stream(100, seq0=10, ts0=0)
    gap_ts = a[-1].ts_ext + FRAME
    cn = Pkt(110, gap_ts, 0, a[-1].arrival + TICK, cn=True)
    b = stream(100, seq0=111, ts0=gap_ts + 25 * FRAME, t0=a[-1].arrival + 0.5 - 0.03)
    b[0].marker = True
    run = drive([*a, cn, *b])
    s = run.jb.stats
    assert s.lost == 0 and s.concealed == 0 and s.late == 0
    assert s.comfort_noise >= 20
    # the gap is comfort noise at the signalled level (-40 dBov ~ rms 328)
    last = max(k for k, p in enumerate(run.pts) if p is not None and p < gap_ts)
    quiet = run.frames[last + 2 : last + 20]  # after the <= 1 frame PLC tail
    gap = np.concatenate(quiet).astype(np.float64)
    rms = np.sqrt(np.mean(gap**2))
    assert 150 < rms < 700


def test_dtx_gap_without_cn_is_digital_silence() -> None:
    a = stream(100, seq0=10, ts0=0)
    b = stream(100, seq0=110, ts0=a[-1].ts_ext + 40 * FRAME, t0=a[-1].arrival + 0.8 - 0.03)
    run = drive([*a, *b])
    s = run.jb.stats
    assert s.lost == 0 and s.concealed == 0
    assert s.comfort_noise >= 30
    quiet = [f for f, p in zip(run.frames, run.pts, strict=True) if p is None]
    assert sum(1 for f in quiet if not f.any()) >= 30


def test_talkspurt_start_absorbs_a_delay_change() -> None:
    """The path gets 60 ms shorter during a pause: the next talkspurt starts earlier,
    without dropping speech frames."""
    a = stream(150, seq0=10, ts0=0, delay=0.090)
    gap_ts = a[-1].ts_ext + FRAME
    cn = Pkt(160, gap_ts, 0, a[-1].arrival + TICK, cn=True)
    b = stream(150, seq0=161, ts0=gap_ts + 50 * FRAME, t0=a[-1].arrival + 1.0 - 0.03, delay=0.03)
    b[0].marker = True
    jb = JitterBuffer(RATE)
    run = drive([*a, cn, *b], jb)
    s = jb.stats
    assert s.dropped_frames == 0 and s.lost == 0 and s.late == 0
    # after 6 s the 4 s base window forgot the old path: delay is back near the target
    assert run.cur_ms[-20] < s.target_delay_ms + 25


def test_jitter_raises_target_and_stays_low_on_clean_path() -> None:
    rng = np.random.default_rng(5)
    clean = drive(stream(300)).jb.stats
    pk = stream(300)
    for p in pk:
        p.arrival += float(rng.uniform(0, 0.060))
    jit = drive(pk).jb.stats
    assert clean.target_delay_ms == 20.0
    assert jit.target_delay_ms > 50.0
    assert jit.late <= 3
    assert jit.jitter_ms > 5.0 > clean.jitter_ms


# -- property tests ------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    shifts=st.lists(st.floats(min_value=0.0, max_value=0.060), min_size=120, max_size=120),
    drop=st.sets(st.integers(min_value=5, max_value=115), max_size=6),
)
def test_reorder_and_loss_accounting(shifts: list[float], drop: set[int]) -> None:
    pkts = stream(120)
    for p, d in zip(pkts, shifts, strict=True):
        p.arrival += d
    kept = [p for i, p in enumerate(pkts) if i not in drop]
    run = drive(kept, extra_s=0.5)
    s = run.jb.stats
    assert s.duplicates == 0 and s.resyncs == 0
    assert s.lost + s.late == len(drop) + s.late - 0  # lost counts exactly the missing seqs
    assert s.lost == len(drop)
    assert s.late <= 8


packet_op = st.tuples(
    st.sampled_from(["push", "cn", "pop"]),
    st.integers(min_value=-(2**40), max_value=2**40),  # seq (garbage welcome)
    st.integers(min_value=-(2**40), max_value=2**40),  # ts
    st.floats(allow_nan=True, allow_infinity=True, width=64),  # arrival / now
    st.integers(min_value=1, max_value=3000),  # pcm size
    st.sampled_from([None, 1, 2]),  # ssrc
    st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(packet_op, min_size=1, max_size=60))
def test_garbage_never_raises_and_frames_are_exact(
    ops: list[tuple[str, int, int, float, int, int | None, bool]],
) -> None:
    jb = JitterBuffer(RATE)
    for kind, seq, ts, t, n, ssrc, marker in ops:
        if kind == "push":
            jb.push(seq, ts, np.full(n, 100, np.int16), t, marker, ssrc)
        elif kind == "cn":
            jb.push_comfort_noise(seq, ts, seq % 200, t, ssrc)
        else:
            f = jb.pop(t)
            assert f.dtype == np.int16 and f.shape == (FRAME,)
    for k in range(5):
        assert jb.pop(1e3 + k * TICK).shape == (FRAME,)
    s = jb.stats
    assert s.lost >= 0 and s.late >= 0


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.integers(0, 3),  # pushes before the next pop
            st.integers(-3, 6),  # seq step
            st.integers(-2, 5),  # ts step in frames
            st.floats(min_value=-0.05, max_value=0.2),  # arrival jitter
        ),
        min_size=1,
        max_size=80,
    ),
    rate=st.sampled_from([8000, 16000]),
)
def test_plausible_interleavings_never_raise(
    ops: list[tuple[int, int, int, float]], rate: int
) -> None:
    jb = JitterBuffer(rate)
    frame = rate // 50
    seq, ts, now = 65_530, 2**32 - 3 * frame, 0.0
    for pushes, dseq, dts, jit in ops:
        for _ in range(pushes):
            seq += dseq
            ts += dts * frame
            jb.push(seq, ts, np.ones(frame, np.int16), now + jit)
        now += 0.02
        f = jb.pop(now)
        assert f.dtype == np.int16 and f.shape == (frame,)


def test_bad_pcm_raises_value_error() -> None:
    jb = JitterBuffer()
    for bad in (np.zeros(0, np.int16), np.zeros(160, np.float32), np.zeros((2, 80), np.int16)):
        try:
            jb.push(1, 1, bad, 0.0)  # type: ignore[arg-type]
        except ValueError:
            pass
        else:  # pragma: no cover
            raise AssertionError("expected ValueError")


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.integers(0, 3),  # pushes before the next pop
            st.integers(-3, 6),  # seq step
            st.integers(-2, 5),  # ts step in frames
            st.floats(min_value=-0.05, max_value=0.2),  # arrival jitter
            st.sampled_from([1234, 1234, 1234, 99]),  # mostly one SSRC, sometimes another
            st.sampled_from([80, 160, 160, 240]),  # samples per packet
        ),
        min_size=1,
        max_size=80,
    ),
    follows_due=st.booleans(),
)
def test_push_packet_is_push_for_a_parsed_packet(
    ops: list[tuple[int, int, int, float, int, int]], follows_due: bool
) -> None:
    """The receiver's fast entry (ints in range, decoded PCM) changes nothing: the same
    frames, the same due times, the same counters as push() for every packet."""
    a = JitterBuffer(RATE, follows_due=follows_due)
    b = JitterBuffer(RATE, follows_due=follows_due)
    seq, ts, now = 65_530, 2**32 - 3 * FRAME, 0.0
    for pushes, dseq, dts, jit, ssrc, n in ops:
        for _ in range(pushes):
            seq = (seq + dseq) & 0xFFFF
            ts = (ts + dts * FRAME) & 0xFFFFFFFF
            pcm = pcm_at(ts, n)
            a.push(seq, ts, pcm, now + jit, False, ssrc)
            b.push_packet(seq, ts, pcm, now + jit, False, ssrc)
        now += 0.02
        assert a.due_s == b.due_s
        assert np.array_equal(a.pop(now), b.pop(now))
    assert a.stats == b.stats


def test_a_frame_with_a_hole_is_not_taken_for_a_full_one() -> None:
    """pop() takes a frame as complete without scanning it when one packet wrote both of
    its ends; a frame made of two packets with a gap between them must still be seen as
    incomplete (the gap concealed or silent, never stale samples)."""
    jb = JitterBuffer(RATE, min_delay_ms=20)
    for k in range(10):  # a clean stream first: playing, cursor on the packet grid
        jb.push(k, k * FRAME, pcm_at(k * FRAME, FRAME), k * TICK)
        jb.pop(k * TICK + 0.03)
    # then half-frame packets with the middle quarter of one frame missing
    base = 10 * FRAME
    jb.push(10, base, pcm_at(base, 60), 10 * TICK)
    jb.push(11, base + 100, pcm_at(base + 100, 60), 10 * TICK)
    out = jb.pop(10 * TICK + 0.03)
    want = pcm_at(base, FRAME)
    assert np.array_equal(out[:60], want[:60])
    # the audio after the gap plays as sent once it has cross-faded (at most 10 ms) out of
    # the concealment that filled the gap
    assert np.array_equal(out[180:], want[180:])
    assert not np.array_equal(out[60:100], want[60:100])  # filled, not taken as audio


def test_source_changed_reanchors_a_stream_with_the_same_ssrc() -> None:
    """Symmetric RTP moved to another address (or back to the signalled one): its packets,
    numbered far behind what a stranger sent with the same SSRC, are a new stream, not
    late ones."""
    jb = JitterBuffer()
    pcm = np.full(FRAME, 1000, np.int16)
    for k in range(5):  # a stranger, sequence numbers well ahead
        jb.push(1050 + k, 8000 * 50 + FRAME * k, pcm, 0.02 * k, ssrc=7)
    jb.source_changed()
    for k in range(5):  # the real peer, same SSRC, behind
        jb.push(1000 + k, FRAME * k, -pcm, 0.1 + 0.02 * k, ssrc=7)
    s = jb.stats
    assert s.resyncs == 1 and s.late == 0 and s.lost == 0 and s.duplicates == 0
    played = [jb.pop(0.2 + 0.02 * k) for k in range(12)]
    assert any(int(p.min()) == -1000 for p in played)  # the new stream is what plays
    fresh = JitterBuffer()
    fresh.source_changed()  # no stream yet: nothing to re-anchor
    fresh.push(1, 0, pcm, 0.0, ssrc=7)
    assert fresh.stats.resyncs == 0

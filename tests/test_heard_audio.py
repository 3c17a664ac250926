"""Measuring what a caller heard: speech/silence, turn latency, barge-in reaction, dead air."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from sip_bridge.heard_audio import (
    FRAME_S,
    Gap,
    HeardAudio,
    Segment,
    Span,
    barge_in_reaction,
    dead_air_gaps,
    frame_dbfs,
    merge_spans,
    turn_latency,
)

LOUD = (3000 * np.sin(np.arange(160) * 2 * np.pi * 440 / 8000)).astype(np.int16)  # -23 dBFS
QUIET = np.zeros(160, np.int16)


def heard(pattern: str, t0: float = 10.0) -> HeardAudio:
    """One frame per character, 20 ms apart from ``t0``: '#' sound, '.' silence."""
    h = HeardAudio()
    for i, c in enumerate(pattern):
        h.add(t0 + i * FRAME_S, LOUD if c == "#" else QUIET)
    return h


def at(i: int, t0: float = 10.0) -> float:
    return t0 + i * FRAME_S


def test_levels_and_segments() -> None:
    assert abs(frame_dbfs(LOUD) - (20 * np.log10(3000 / 32768) - 3.01)) < 0.1
    assert frame_dbfs(QUIET) == -100.0 and frame_dbfs(np.zeros(0, np.int16)) == -100.0
    h = heard("..####..##" + "." * 30 + "###")
    segs = h.segments(0, 100, gap_s=0.3)
    assert segs == [Segment(at(2), at(10)), Segment(at(40), at(43))]
    assert h.segments(0, 100, gap_s=0.03)[0] == Segment(at(2), at(6))
    assert h.last_loud_end() == at(43)
    assert h.first_loud(at(11)) == at(40)
    assert h.speaking(at(41)) and not h.speaking(at(30))
    pcm: NDArray[np.int16] = h.audio(at(2), at(6))
    assert pcm.size == 4 * 160 and np.array_equal(pcm[:160], LOUD)


def test_arrival_times_never_go_back() -> None:
    h = HeardAudio()
    h.add(5.0, LOUD)
    h.add(4.0, LOUD)  # a clock step back: kept in order
    assert h.times == [5.0, 5.0]


def test_turn_latency_from_the_callers_last_speech_to_the_first_sound() -> None:
    h = heard("#####" + "." * 30 + "####")  # the agent's last words, a pause, the answer
    assert turn_latency(h, at(20), until=at(100)) == at(35) - at(20)
    assert turn_latency(h, at(3), until=at(100)) is None  # the agent was still talking
    assert turn_latency(h, at(20), until=at(30)) is None  # the caller acted again first


def test_barge_in_the_agent_stops() -> None:
    # the agent talks; the caller starts at frame 20 and talks to frame 80; the agent's
    # audio ends at frame 35 and stays off
    h = heard("#" * 35 + "." * 60)
    r = barge_in_reaction(h, at(20), at(80), now=at(95))
    assert r is not None and r.talking and r.stopped
    assert abs(r.seconds - 15 * FRAME_S) < 1e-9  # type: ignore[operator]
    assert abs(r.overlap_s - 15 * FRAME_S) < 1e-9


def test_barge_in_undecided_until_the_silence_is_long_enough() -> None:
    h = heard("#" * 35 + "." * 10)  # 200 ms of quiet so far: maybe a pause
    assert barge_in_reaction(h, at(20), at(80), now=at(45)) is None


def test_barge_in_pauses_inside_a_reply_are_not_a_stop() -> None:
    # sentence pauses of 300 ms while the caller talks: the agent went on
    h = heard("#" * 30 + ("." * 15 + "#" * 20) * 4)
    r = barge_in_reaction(h, at(20), at(60), now=at(200))
    assert r is not None and r.talking and not r.stopped and r.seconds is None
    assert abs(r.overlap_s - 40 * FRAME_S) < 1e-9  # all of the caller's speech


def test_barge_in_when_the_agent_was_quiet() -> None:
    h = heard("#" * 10 + "." * 50)
    r = barge_in_reaction(h, at(40), at(60), now=at(60))
    assert r is not None and not r.talking and r.overlap_s == 0.0


def test_waits_that_touch_merge() -> None:
    spans = [Span(5, 6), Span(1, 2), Span(2.02, 3, True), Span(4, 3)]
    assert merge_spans(spans) == [Span(1, 3, True), Span(5, 6)]


def test_dead_air_is_silence_while_the_caller_waits() -> None:
    # the caller stops at frame 0; the answer comes at frame 40 with a 200 ms pause (speech)
    # and a 1.2 s pause in it; the caller then waits from frame 150 for a transfer
    h = heard("." * 40 + "#" * 20 + "." * 10 + "#" * 10 + "." * 60 + "#" * 10 + "." * 100)
    spans = [Span(at(0), at(140)), Span(at(150), at(250), open_end=True)]
    gaps = dead_air_gaps(h, spans)
    assert gaps == [Gap(at(0), at(40)), Gap(at(80), at(140)), Gap(at(150), at(250))]
    assert [round(g.seconds, 3) for g in gaps] == [0.8, 1.2, 2.0]
    # waited for an answer that came (not open): the silence after it is not dead air
    assert dead_air_gaps(h, [Span(at(40), at(80))]) == []


def test_a_stop_before_the_caller_began_is_no_reaction() -> None:
    # the agent's sound ended 0.2 s before the caller began and never came back
    h = heard("#" * 40 + "." * 60)
    r = barge_in_reaction(h, at(50), at(80), now=at(100))
    assert r is not None and not r.talking and r.seconds is None

"""Measuring what a caller heard: speech/silence, turn latency, barge-in reaction, dead air."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from agent.voice.hold_audio import Ringback
from resample.g711 import ulaw_decode, ulaw_encode
from sip_bridge.script.heard_audio import (
    FRAME_S,
    Gap,
    HeardAudio,
    Segment,
    Span,
    barge_in_reaction,
    dead_air_gaps,
    frame_dbfs,
    merge_spans,
    ringback_like,
    turn_latency,
)
from sip_bridge.script.script_voice import espeak_ng

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


def _ringback(seconds: float, off_s: float = 4.0) -> list[NDArray[np.int16]]:
    """What the bridge plays while a transfer rings (agent.voice.hold_audio), through G.711."""
    ring = Ringback(off_s=off_s)
    return [ulaw_decode(ulaw_encode(ring.next_frame(160))) for _ in range(round(seconds / 0.02))]


def test_ringback_is_told_apart_from_speech_and_a_lone_tone() -> None:
    frames = _ringback(2.0, off_s=0.5)[:100]  # one 2 s burst
    assert sum(ringback_like(f) for f in frames) >= 98
    assert not ringback_like(LOUD)  # 440 Hz alone (a test tone, a filler pip)
    voice = (espeak_ng("Sorry, nobody is free right now. Is there anything else?") * 4).astype(
        np.int16
    )
    h = HeardAudio()
    for i, f in enumerate(voice[: voice.size // 160 * 160].reshape(-1, 160)):
        h.add(i * FRAME_S, f)
    assert not any(h.ringback)  # speech has moments near 440/480 Hz, never 200 ms of them


def test_ringback_is_sound_without_words_and_its_off_time_is_no_dead_air() -> None:
    # the transfer's reply, 2 s ringback, its 4 s off, 2 s more, the apology right after
    h = HeardAudio()
    t = 0.0
    frames = [LOUD] * 50 + [QUIET] * 5 + _ringback(8.0)[:400] + [LOUD] * 40 + [QUIET] * 20
    for f in frames:
        h.add(t, f)
        t += FRAME_S
    ring = [i for i, r in enumerate(h.ringback) if r]  # each burst and 2 frames either side
    assert ring == [*range(53, 157), *range(353, 457)], ring
    # speech only: the reply and the apology (less the burst's edge), not the bursts
    words = h.segments(0, t, 0.5, speech_only=True)
    assert [(round(s.start, 2), round(s.end, 2)) for s in words] == [(0.0, 1.0), (9.14, 9.9)]
    assert h.audio(0.0, t, speech_only=True).size == (len(frames) - len(ring)) * 160
    assert len(h.segments(0, t, 0.5)) == 2  # as sound: reply + burst, burst + apology
    # the caller waits from the reply's end to the apology: the 4 s off time rings on
    assert dead_air_gaps(h, [Span(1.0, 9.9)]) == []
    # a transfer that ends in the off time: the silence after it is dead air again
    h2 = HeardAudio()
    for i, f in enumerate(_ringback(2.0)[:100] + [QUIET] * 300):
        h2.add(i * FRAME_S, f)
    (gap,) = dead_air_gaps(h2, [Span(0.0, 8.0, open_end=True)])
    assert gap.start == pytest.approx(2.0 + 4.0 + 0.04, abs=0.03) and gap.end == 8.0

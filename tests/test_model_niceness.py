"""The model threads run nicer than the media loop (``[models] nice``): the workers that
run ASR, smart-turn and TTS jobs, and the threads ONNX Runtime starts with each session,
while the thread that made the models (the loop's) keeps its priority."""

from __future__ import annotations

import contextlib
import os
import threading
from types import SimpleNamespace
from typing import Any, cast

import pytest

from agent.voice.tts import PiperTts
from agent.voice.voice_models import VoiceModels, made_at_niceness, renice
from agent.voice_settings import ModelSettings


def _niceness(tid: int | None = None) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid or threading.get_native_id())


def _threads() -> dict[int, int]:
    """Every live thread of this process and its niceness."""
    out: dict[int, int] = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that just ended
            out[int(tid)] = _niceness(int(tid))
    return out


def test_a_sessions_threads_inherit_the_niceness_it_was_made_at() -> None:
    base = _niceness()
    before = set(_threads())
    tts = made_at_niceness(7, lambda: PiperTts(threads=2))
    assert tts.synthesize("Hello there.").size > 0  # its threads work
    started = {tid: n for tid, n in _threads().items() if tid not in before}
    assert started, "PiperTts(threads=2) starts a session thread"
    assert set(started.values()) == {min(19, base + 7)}
    assert _niceness() == base  # the caller's own thread is untouched


def test_the_workers_run_jobs_at_the_models_niceness() -> None:
    base = _niceness()
    stub = cast(Any, SimpleNamespace(voice_name="stub", length_scale=1.0))
    models = VoiceModels(ModelSettings(workers=2, nice=5), vad=stub, turn=stub, asr=stub, tts=stub)
    try:
        seen = {models.executor.submit(_niceness).result(timeout=10) for _ in range(4)}
        assert seen == {min(19, base + 5)}
    finally:
        models.close()
    # a worker started by a thread that is itself niced runs at the models' niceness too
    # (from the thread that made the models, not from its starter's)
    models = VoiceModels(ModelSettings(workers=1, nice=5), vad=stub, turn=stub, asr=stub, tts=stub)
    try:
        got: list[int] = []

        def submit_from_a_niced_thread() -> None:
            renice(3)
            got.append(models.executor.submit(_niceness).result(timeout=10))

        starter = threading.Thread(target=submit_from_a_niced_thread)
        starter.start()
        starter.join()
        assert got == [min(19, base + 5)]
    finally:
        models.close()
    plain = VoiceModels(ModelSettings(workers=1, nice=0), vad=stub, turn=stub, asr=stub, tts=stub)
    try:
        assert plain.executor.submit(_niceness).result(timeout=10) == base
    finally:
        plain.close()
    assert _niceness() == base


def test_what_the_loader_raises_reaches_the_caller() -> None:
    def broken() -> None:
        raise FileNotFoundError("no such model")

    with pytest.raises(FileNotFoundError, match="no such model"):
        made_at_niceness(3, broken)


def test_renice_is_relative_and_stops_at_19() -> None:
    got: list[int] = []

    def run() -> None:
        renice(25)
        got.append(_niceness())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert got == [19]

"""A call made with ``sip-bridge call`` and checked by ear: the question it plays, and what
its recording says. Shared by tests/test_deploy.py (the wheel in a venv) and
tests/container_check.py (the wheel in a container)."""

from __future__ import annotations

import subprocess
import wave
from pathlib import Path

import numpy as np

from sip_bridge.agents import prepare_agents
from sip_bridge.config.loader import load_config
from testkit.vad_audio import resampled

__all__ = ["spoken_question", "transcribe_recording"]

ROOT = Path(__file__).resolve().parents[1]


def spoken_question(path: Path) -> Path:
    """ "What are your opening hours?" in espeak-ng's voice, as a WAV at ``path``."""
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "160", "-w", str(path),
                    "What are your opening hours?"], check=True)  # fmt: skip
    return path


def transcribe_recording(path: Path) -> str:
    """What the shipped ASR hears in the WAV at ``path``, lower-case: each stretch of
    speech on its own, joined with spaces.

    Stretches are 20 ms frames above -50 dBFS, split where 0.3 s or more was quiet, each
    with 0.3 s either side. Why: Moonshine hears nothing in 13 s of which 8 are silent; a
    bridge on a loaded machine says "One moment", then its answer a sentence at a time
    with a second or more of silence between; and two full ``make test`` runs read the
    recording of tests/test_deploy.py as the answer's last sentence alone (the audio was
    not kept; every loaded recording since reads whole either way)."""
    with wave.open(str(path), "rb") as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    frame = rate // 50
    rms = np.sqrt(np.mean(pcm[: pcm.size // frame * frame].reshape(-1, frame) ** 2.0, axis=1))
    loud = np.flatnonzero(rms > 32768 * 10 ** (-50 / 20))
    assert loud.size, "the recording is silent"
    pad = 15  # frames: 0.3 s
    breaks = np.flatnonzero(np.diff(loud) > pad) + 1
    models, _ = prepare_agents(load_config(ROOT / "config" / "bridge.toml"))
    heard = []
    for run in np.split(loud, breaks):
        lo, hi = max(0, (run[0] - pad) * frame), (run[-1] + 1 + pad) * frame
        heard.append(models.asr.transcribe(resampled(pcm[lo:hi], rate, 16000)).strip())
    return " ".join(t for t in heard if t).lower()

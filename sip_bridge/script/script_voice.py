"""The caller's voice in a call script: espeak-ng for ``say``, a WAV for ``play``.

Never the agent's own voice (Piper): a test that speaks with the voice the agent was tuned
on proves little about callers. Each utterance is brought to the run's active speech
level (P.56, :func:`~sip_bridge.script.line_sim.scale_to_level`) plus the step's ``gain_db``.
"""

from __future__ import annotations

import subprocess
import tempfile
import wave
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from agent.lines.playback import load_wav
from resample import Resampler
from sip_bridge.script.line_sim import scale_to_level
from sip_bridge.script.script_file import Script, Speak

__all__ = ["RATE", "Renderer", "ScriptError", "espeak_ng", "render_speech"]

RATE = 8000

#: Another source of the caller's voice (the bench's recorded human speech): the audio at
#: 8 kHz for a step with this voice, or None to let espeak-ng say it.
Renderer = Callable[[Speak, str], NDArray[np.int16] | None]


class ScriptError(RuntimeError):
    """The script cannot be played (espeak-ng missing, a voice it does not have, a bad
    WAV, no target): says which step and why."""


def espeak_ng(text: str, voice: str = "en-us", rate_wpm: int = 165) -> NDArray[np.int16]:
    """espeak-ng saying ``text`` with ``voice`` at 8 kHz."""
    with tempfile.TemporaryDirectory() as d:
        wav = Path(d) / "say.wav"
        cmd = ["espeak-ng", "-v", voice, "-s", str(rate_wpm), "-w", str(wav), text]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        except FileNotFoundError:
            raise ScriptError("espeak-ng is not installed (Debian package espeak-ng)") from None
        except subprocess.TimeoutExpired:
            raise ScriptError(f"espeak-ng took over 30 s to say {text[:40]!r}") from None
        if proc.returncode != 0 or not wav.exists():
            why = (proc.stderr or proc.stdout).strip().splitlines()
            raise ScriptError(f"espeak-ng voice {voice!r}: {why[-1] if why else 'failed'}")
        with wave.open(str(wav)) as w:
            rate = w.getframerate()
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    out: NDArray[np.int16] = Resampler(rate, RATE).process(pcm)
    return out


def render_speech(
    step: Speak,
    script: Script,
    *,
    voice: str | None,
    level_dbfs: float,
    renderer: Renderer | None = None,
) -> NDArray[np.int16]:
    """The caller's audio for a ``say``/``play`` step, at the run's level. The step's own
    voice wins over ``voice`` (the run's), which wins over the script's."""
    where = f"{script.path}: step {step.index}"
    try:
        if step.wav is not None:
            pcm = load_wav(step.wav, RATE)
        else:
            chosen = step.voice or voice or script.voice
            got = renderer(step, chosen) if renderer is not None else None
            pcm = (
                got
                if got is not None
                else espeak_ng(step.text, chosen, step.rate_wpm or script.rate_wpm)
            )
    except ScriptError as exc:
        raise ScriptError(f"{where}: {exc}") from None
    except ValueError as exc:  # an unplayable WAV
        raise ScriptError(f"{where}: {exc}") from None
    if not np.any(pcm):
        raise ScriptError(f"{where}: the audio is silent")
    return scale_to_level(pcm, level_dbfs + step.gain_db, RATE)

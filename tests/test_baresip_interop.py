"""A real softphone calls the bridge: baresip dials `sip-bridge run` and hears itself.

baresip (Debian `baresip-core`, installed by `make test`) plays a 1 kHz tone
from a WAV file into the call; its `sndfile` module records what it decoded
from the bridge. The echo agent must play the tone back, at the same pitch and
level, `agent.echo.delay_s` later.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BARESIP = shutil.which("baresip")
ECHO_DELAY_S = 0.5  # the shipped config/bridge.toml


def _write_tone(path: Path, seconds: float = 4.0) -> None:
    t = np.arange(int(8000 * seconds)) / 8000
    pcm = (0.3 * 32767 * np.sin(2 * np.pi * 1000 * t)).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(pcm.tobytes())


def _baresip_config(conf: Path, tone: Path) -> None:
    conf.mkdir()
    (conf / "accounts").write_text("<sip:tester@127.0.0.1>;regint=0\n")
    (conf / "config").write_text(
        "poll_method epoll\n"
        "sip_listen 127.0.0.1:0\n"
        "module_path /usr/lib/baresip/modules\n"
        "module stdio.so\nmodule g711.so\nmodule aufile.so\nmodule sndfile.so\n"
        "module account.so\nmodule menu.so\n"
        f"audio_source aufile,{tone}\n"
        f"audio_player aufile,{conf / 'unused.wav'}\n"
        "audio_alert aufile,/dev/null\n"
        "audio_srate 8000\naudio_channels 1\n"
        f"snd_path {conf}\n"
    )


def test_baresip_calls_make_run_and_hears_its_tone_echoed(tmp_path: Path) -> None:
    assert BARESIP is not None, "baresip not found: run `make setup` (apt package baresip-core)"
    tone = tmp_path / "tone.wav"
    _write_tone(tone)
    conf = tmp_path / "baresip"
    _baresip_config(conf, tone)
    bridge = subprocess.Popen(
        [
            sys.executable, "-m", "sip_bridge.cli", "run",
            "--config", str(ROOT / "config" / "bridge.toml"),
            "--listen", "127.0.0.1:0", "--rtp-ports", "48000-48099",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert bridge.stdout is not None
        bridge.stdout.readline()
        m = re.search(r"dial (sip:echo@127\.0\.0\.1:\d+)", bridge.stdout.readline())
        assert m, "the bridge did not print its URI"
        phone = subprocess.run(
            [BARESIP, "-f", str(conf), "-e", f"/dial {m.group(1)}", "-t", "6"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        log = phone.stdout + phone.stderr
        assert "Call established" in log, log[-2000:]
    finally:
        bridge.terminate()
        bridge.wait(timeout=10)
    [heard] = conf.glob("dump-*-dec.wav")
    with wave.open(str(heard)) as w:
        assert w.getframerate() == 8000
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64) / 32767
    rms = np.sqrt(np.mean(x[: len(x) // 160 * 160].reshape(-1, 160) ** 2, axis=1))
    onset = int(np.argmax(rms > 0.05)) * 0.02
    assert rms.max() > 0.05, "baresip heard nothing back"
    # baresip starts its tone when the call is up; the echo follows after the agent's delay.
    assert ECHO_DELAY_S <= onset <= ECHO_DELAY_S + 0.3, onset
    seg = x[int((onset + 0.5) * 8000) : int((onset + 2.5) * 8000)]
    spec = np.abs(np.fft.rfft(seg * np.hanning(len(seg))))
    assert abs(np.argmax(spec) * 8000 / len(seg) - 1000) < 5
    level_db = 20 * np.log10(np.sqrt(2 * np.mean(seg**2)))
    assert abs(level_db - 20 * np.log10(0.3)) < 1.5  # what baresip sent: -10.5 dBFS peak

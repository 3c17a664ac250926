"""The whole receive and send media path, checked by what comes out of it.

RTP bytes -> parse -> G.711 decode -> JitterBuffer (jittery, lossy network) ->
8k->24k (what the agent hears) -> 24k->8k -> G.711 encode -> RTP bytes -> decode.
A tone goes in; the test checks frequency, level and cleanliness at the agent
and at the far end, not just that bytes moved.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from numpy.typing import NDArray

from jitter import JitterBuffer
from jitter.netsim import NetworkModel, make_trace
from resample import Resampler, alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from sip_bridge.media.rtp import RtpPacket, RtpSender

CODECS = {
    0: (ulaw_encode, ulaw_decode),
    8: (alaw_encode, alaw_decode),
}


def _tone(freq: float, rate: int, seconds: float, dbfs: float) -> NDArray[np.int16]:
    t = np.arange(int(rate * seconds)) / rate
    return (32767 * 10 ** (dbfs / 20) * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def _analyse(x: NDArray[np.int16], rate: int) -> tuple[float, float, float]:
    """(peak frequency Hz, level dBFS of the peak, SNR dB of the rest), Hann window."""
    y = x.astype(np.float64) / 32767
    w = np.hanning(len(y))
    spec = np.abs(np.fft.rfft(y * w))
    k = int(np.argmax(spec))
    freq = k * rate / len(y)
    band = slice(max(k - 3, 0), k + 4)
    sig = float(np.sum(spec[band] ** 2))
    noise = float(np.sum(spec**2)) - sig
    level = 20 * np.log10(np.sqrt(2 * np.mean((y * w) ** 2) / np.mean(w**2)) + 1e-12)
    return freq, level, 10 * np.log10(sig / max(noise, 1e-20))


def _send_and_receive(
    pcm: NDArray[np.int16], payload_type: int, model: NetworkModel, seed: int
) -> tuple[NDArray[np.int16], JitterBuffer]:
    """Packetise, send over a simulated network, de-jitter on a 20 ms pop clock."""
    encode, decode = CODECS[payload_type]
    sender = RtpSender(payload_type, rng=random.Random(seed))
    frames = len(pcm) // 160
    datagrams = [
        sender.next_packet(encode(pcm[i * 160 : (i + 1) * 160]).tobytes(), 160)
        for i in range(frames)
    ]
    trace = make_trace(model, frames * 0.02, seed)
    arrivals = sorted(
        (p.arrival_s, i) for i, p in enumerate(trace[:frames]) if p.arrival_s is not None
    )
    jb = JitterBuffer()
    out: list[NDArray[np.int16]] = []
    k = 0
    t = 0.0
    for _ in range(frames + 50):  # the stream, plus time for the buffer's delay
        while k < len(arrivals) and arrivals[k][0] <= t:
            pkt = RtpPacket.parse(datagrams[arrivals[k][1]])
            assert pkt.payload_type == payload_type
            audio = decode(np.frombuffer(pkt.payload, dtype=np.uint8))
            jb.push(pkt.sequence, pkt.timestamp, audio, arrivals[k][0], pkt.marker, pkt.ssrc)
            k += 1
        frame = jb.pop(t)
        assert frame.dtype == np.int16 and frame.size == 160
        if jb.playout_timestamp is not None:
            out.append(frame)
        t += 0.02
    assert frames - 2 <= len(out) <= frames + 2
    return np.concatenate(out), jb


@pytest.mark.parametrize("payload_type", [0, 8])
def test_tone_survives_the_whole_chain(payload_type: int) -> None:
    src = _tone(1000.0, 8000, 3.0, -12.0)
    model = NetworkModel(base_delay_ms=30, jitter="gaussian", jitter_ms=8.0)
    heard8, jb = _send_and_receive(src, payload_type, model, seed=3)
    assert jb.stats.late == 0 and jb.stats.concealed == 0

    # What the agent hears: 24 kHz, the same tone, same level, clean.
    up = Resampler(8000, 24000)
    agent_in = np.concatenate([up.process(heard8[i : i + 160]) for i in range(0, len(heard8), 160)])
    steady = agent_in[24000 // 2 : 24000 // 2 + 24000]
    freq, level, snr = _analyse(steady, 24000)
    assert freq == pytest.approx(1000.0, abs=1.5)
    assert level == pytest.approx(-12.0, abs=0.5)
    assert snr > 30.0  # G.711 quantisation noise is ~38 dB below a -12 dBFS tone

    # What the caller hears back (the echo path): 24k -> 8k -> G.711 -> decode.
    encode, decode = CODECS[payload_type]
    down = Resampler(24000, 8000)
    back = np.concatenate(
        [down.process(agent_in[i : i + 480]) for i in range(0, len(agent_in), 480)]
    )
    far = decode(encode(back))
    freq, level, snr = _analyse(far[4000:12000], 8000)
    assert freq == pytest.approx(1000.0, abs=1.5)
    assert level == pytest.approx(-12.0, abs=0.6)
    assert snr > 28.0


def test_loss_is_concealed_not_silenced() -> None:
    """2 % bursty loss on a voiced tone: the gaps are filled with pitch, not holes."""
    src = _tone(200.0, 8000, 4.0, -10.0)
    model = NetworkModel(
        base_delay_ms=20, jitter="gaussian", jitter_ms=2.0, loss="gilbert", loss_pct=2.0
    )
    heard, jb = _send_and_receive(src, 0, model, seed=5)
    assert jb.stats.concealed > 0
    rms = np.sqrt(np.mean(heard.reshape(-1, 160).astype(np.float64) ** 2, axis=1))
    steady = rms[5:-25]
    # No frame drops to silence: PLC keeps at least ~40 % of the level over short bursts.
    assert steady.min() > 0.4 * np.median(steady)
    freq, _, _ = _analyse(heard[8000:24000], 8000)
    assert freq == pytest.approx(200.0, abs=1.0)

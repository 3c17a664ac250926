"""`sip-bridge call` end to end: our UAC calls the in-process bridge's echo agent.

A 2 s 1 kHz tone WAV is played into the call; the recording must hold that tone again,
at its level, starting the echo delay after playback began (both share one timeline:
the play-record agent says one frame per frame it hears).
"""

from __future__ import annotations

import asyncio
import socket
import wave
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from agent.base import Agent, DtmfEvent
from agent.lines.echo import EchoAgent
from sip_bridge import cli
from sip_bridge.config.loader import BridgeConfig
from sip_bridge.script.caller import CallOptions, CallResult, place_call
from sip_bridge.server import BridgeServer
from sip_bridge.sip.message import SipRequest, make_response, parse_message

ECHO_DELAY_S = 0.4
LEVEL = 0.25  # peak, of full scale


def _tone_wav(path: Path, seconds: float = 2.0) -> None:
    t = np.arange(int(8000 * seconds)) / 8000
    pcm = (LEVEL * 32767 * np.sin(2 * np.pi * 1000 * t)).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(pcm.tobytes())


def _read_wav(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth()) == (1, 2)
        return np.frombuffer(w.readframes(w.getnframes()), "<i2"), w.getframerate()


def _config() -> BridgeConfig:
    base = BridgeConfig.line_check()
    return replace(
        base,
        sip=replace(base.sip, listen="127.0.0.1:0"),
        rtp=replace(base.rtp, ports="44100-44199"),
        agent=replace(base.agent, echo_delay_s=ECHO_DELAY_S),
    )


@pytest.mark.parametrize("rfc4733", [True, False])
def test_call_records_the_tone_echoed_by_the_bridge(tmp_path: Path, rfc4733: bool) -> None:
    play, record = tmp_path / "tone.wav", tmp_path / "heard.wav"
    _tone_wav(play)

    agents: list[EchoAgent] = []

    async def main() -> tuple[CallResult, dict[str, int]]:
        server = BridgeServer(_config())
        make = server.agent_factory

        def keep(config: BridgeConfig) -> Agent:
            agent = make(config)
            assert isinstance(agent, EchoAgent)
            agents.append(agent)
            return agent

        server.agent_factory = keep
        await server.start()
        try:
            opts = CallOptions(
                f"sip:echo@127.0.0.1:{server.port}",
                play,
                record,
                duration_s=2.8,
                dtmf="12#",
                telephone_event=rfc4733,
                rtp_ports=(44200, 44299),
                local_host="127.0.0.1",
            )
            result = await place_call(opts)
            await asyncio.sleep(0.1)
            return result, dict(server.stats)
        finally:
            await server.stop()

    result, stats = asyncio.run(main())
    assert result.answered and result.status == 200, result
    assert result.media is not None and result.media.codec == "PCMU"
    assert stats == {"offered": 1, "established": 1, "ended": 1}  # our BYE ended it
    # The digits reached the far end's agent: as RFC 4733 when negotiated (100 ms key
    # presses, timed by the events), else as SIP INFO (no duration reaches the agent).
    keys = [e for e in agents[0].events if isinstance(e, DtmfEvent)]
    assert [e.digit for e in keys] == ["1", "2", "#"]
    assert [e.duration_ms for e in keys] == [100.0 if rfc4733 else 0.0] * 3
    pcm, rate = _read_wav(record)
    assert rate == 8000
    assert 2.6 <= pcm.size / rate <= 3.2
    frames = pcm[: pcm.size // 160 * 160].reshape(-1, 160).astype(np.float64)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    loud = rms > 0.1 * LEVEL * 32767 / np.sqrt(2)
    assert loud.any(), "no echo recorded"
    onset = np.argmax(loud) * 0.02
    # The echo starts the configured delay after our playback (plus jitter buffers,
    # pacing and resampler delays on both legs).
    assert ECHO_DELAY_S <= onset <= ECHO_DELAY_S + 0.25, onset
    steady = pcm[np.repeat(rms > 0.5 * rms.max(), 160)].astype(np.float64) / 32767
    assert steady.size > 8000  # over a second of it
    spec = np.abs(np.fft.rfft(steady * np.hanning(steady.size)))
    freq = np.argmax(spec) * 8000 / steady.size
    assert abs(freq - 1000) < 5, freq
    level_db = 20 * np.log10(np.sqrt(2 * np.mean(steady**2)) / LEVEL)
    assert abs(level_db) < 2.0, level_db


def test_cli_call_exits_1_and_prints_the_status_when_the_callee_is_busy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    play = tmp_path / "tone.wav"
    _tone_wav(play, 0.2)

    async def busy_peer(sock: socket.socket) -> list[str]:
        """Answer the INVITE 486 and collect the methods it receives."""
        loop = asyncio.get_running_loop()
        methods: list[str] = []
        while "ACK" not in methods:
            data, addr = await asyncio.wait_for(loop.sock_recvfrom(sock, 65535), 5)
            msg = parse_message(data)
            assert isinstance(msg, SipRequest)
            methods.append(msg.method)
            if msg.method == "INVITE":
                await loop.sock_sendto(sock, make_response(msg, 486, to_tag="b").to_bytes(), addr)
        return methods

    async def main() -> tuple[int, list[str]]:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind(("127.0.0.1", 0))
            sock.setblocking(False)
            peer = asyncio.create_task(busy_peer(sock))
            argv = [
                "call",
                f"sip:busy@127.0.0.1:{sock.getsockname()[1]}",
                "--play",
                str(play),
                "--record",
                str(tmp_path / "out.wav"),
                "--rtp-ports",
                "44300-44399",
            ]
            rc = await cli.run_call(cli.build_parser().parse_args(argv))
            return rc, await peer

    rc, methods = asyncio.run(main())
    assert rc == 1
    assert methods == ["INVITE", "ACK"]
    assert "486 Busy Here" in capsys.readouterr().out
    assert not (tmp_path / "out.wav").exists()


def test_a_wav_it_cannot_play_is_named_in_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`call --play` on a 32-bit float WAV (what editors and sox write as EXTENSIBLE): exit 2
    and the format in words, not `unknown format: 65534`; nothing is dialled."""
    import struct

    guid = struct.pack("<H", 3) + bytes.fromhex("000000001000800000aa00389b71")
    fmt = struct.pack("<HHIIHH", 0xFFFE, 1, 8000, 32000, 4, 32) + struct.pack("<HHI", 22, 32, 4)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 40) + fmt + guid
    body += b"data" + struct.pack("<I", 800) + b"\0" * 800
    play = tmp_path / "float.wav"
    play.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    code = cli.main(["call", "sip:echo@127.0.0.1:9", "--play", str(play),
                     "--record", str(tmp_path / "out.wav")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == (
        f"sip-bridge call: {play}: 32-bit float WAV (WAVE_FORMAT_EXTENSIBLE) is not supported:"
        " use 16-bit PCM (e.g. `sox in.wav -b 16 -e signed-integer out.wav`)"
    )

"""The browser leg with aiortc as the browser: the talk page's one-POST signalling, its
token and origin checks, ICE limited to loopback, and audio both ways through the same agent
a SIP call gets (the echo agent: what the "browser" says comes back, checked by frequency).
The real-browser version (Chromium) is tests/test_browser.py."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fractions
import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import av
import numpy as np
import pytest
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)
from numpy.typing import NDArray

from agent.base import Agent, AgentOutput, CallInfo, ModelFault
from agent.lines.echo import EchoAgent
from agent.lines.fallback_prompt import FAULT_REASON
from sip_bridge.config.loader import BridgeConfig, HttpConfig
from sip_bridge.server import BridgeServer
from sip_bridge.web.web_server import PageTokens
from sip_bridge.web.webrtc_leg import BrowserOutput, filter_candidates, gathering_on
from testkit.peers.support import bridge_config, dominant_hz

RATE = 48000


class ToneTrack(MediaStreamTrack):
    """A microphone saying a steady tone, paced like a real one (20 ms frames)."""

    kind = "audio"

    def __init__(self, freq: float, level: float = 0.3) -> None:
        super().__init__()
        self.freq, self.level, self.n = freq, level, 0
        self.t0: float | None = None

    async def recv(self) -> av.AudioFrame:
        loop = asyncio.get_running_loop()
        if self.t0 is None:
            self.t0 = loop.time()
        wait = self.t0 + self.n * 0.02 - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        t = (np.arange(960) + self.n * 960) / RATE
        pcm = (self.level * 32767 * np.sin(2 * np.pi * self.freq * t)).astype(np.int16)
        stereo = np.repeat(pcm, 2).reshape(1, -1)  # mono would be upmixed at -3 dB
        frame = av.AudioFrame.from_ndarray(stereo, format="s16", layout="stereo")
        frame.sample_rate, frame.time_base, frame.pts = (
            RATE,
            fractions.Fraction(1, RATE),
            self.n * 960,
        )
        self.n += 1
        return frame


class Browser:
    """What the talk page does, in Python: offer, POST, answer; keeps what it hears."""

    def __init__(self, base: str, http: aiohttp.ClientSession) -> None:
        self.base, self.http = base, http
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.heard: list[NDArray[np.int16]] = []
        self.rate = RATE
        self.session_url = ""
        self._tasks: list[asyncio.Task[None]] = []

    async def page(self) -> tuple[str, list[dict[str, Any]]]:
        async with self.http.get(f"{self.base}/talk") as r:
            assert r.status == 200
            text = await r.text()
        token = re.search(r'name="page-token" content="([^"]+)"', text)
        profiles = re.search(r'<script id="profiles" type="application/json">(.*?)</script>',
                             text, re.S)  # fmt: skip
        assert token and profiles, text[:500]
        return token.group(1), json.loads(profiles.group(1))

    async def offer(
        self, token: str, profile: str = "", codec: str = "", **headers: str
    ) -> aiohttp.ClientResponse:
        self.pc.addTrack(ToneTrack(1000.0))
        if codec:  # offer only this one (a browser may prefer PCMU over Opus)
            caps = RTCRtpSender.getCapabilities("audio").codecs
            [t] = self.pc.getTransceivers()
            t.setCodecPreferences([c for c in caps if c.mimeType == f"audio/{codec}"])

        @self.pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            self._tasks.append(asyncio.ensure_future(self._listen(track)))

        with gathering_on(("127.0.0.1",)):
            await self.pc.setLocalDescription(await self.pc.createOffer())
        h = {"Content-Type": "application/sdp", "Authorization": f"Bearer {token}", **headers}
        url = f"{self.base}/talk/offer" + (f"?profile={profile}" if profile else "")
        r = await self.http.post(url, data=self.pc.localDescription.sdp, headers=h)
        if r.status == 201:
            self.session_url = self.base + r.headers["Location"]
            answer = await r.text()
            await self.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        return r

    async def _listen(self, track: MediaStreamTrack) -> None:
        while True:
            frame = await track.recv()
            assert isinstance(frame, av.AudioFrame)
            data = frame.to_ndarray().reshape(-1)
            ch = len(frame.layout.channels)
            mono = data.reshape(-1, ch).mean(axis=1) if ch > 1 else data
            self.heard.append(np.asarray(mono, np.int16))
            self.rate = frame.sample_rate  # 48 kHz for Opus, 8 kHz for PCMU

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await self.pc.close()


class FaultyAgent(Agent):
    """Talks (a tone) for half a second, then its model "hangs": a ModelFault."""

    name = "faulty"
    sample_rate = 8000

    async def start(self, call: CallInfo, output: AgentOutput) -> None:
        self.out, self.ticks = output, 0

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        self.ticks += 1
        if self.ticks == 25:
            self.out.emit(ModelFault("no ASR result within 10 s", "asr"))


@contextlib.asynccontextmanager
async def running(
    agent: Callable[[], Agent] = lambda: EchoAgent(delay_s=0.3, sample_rate=8000),
) -> AsyncIterator[BridgeServer]:
    """A bridge whose agent is the echo (at the line rate, as for SIP line checks)."""
    base = bridge_config()
    cfg: BridgeConfig = dataclasses.replace(base, http=HttpConfig(listen="127.0.0.1:0"))
    server = BridgeServer(cfg, lambda c: agent())
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace_s=0.5)


def _url(server: BridgeServer) -> str:
    assert server.web is not None
    return server.web.url


@pytest.mark.parametrize("codec", ["opus", "PCMU"])
def test_a_browser_talks_to_the_agent_and_hears_it(codec: str) -> None:
    asyncio.run(asyncio.wait_for(_talk(codec), 30))


async def _talk(codec: str) -> None:
    async with running() as bridge, aiohttp.ClientSession() as http:
        b = Browser(_url(bridge), http)
        token, profiles = await b.page()
        assert profiles[0]["agent"] == "echo"
        r = await b.offer(token, codec=codec)
        assert r.status == 201, await r.text()
        answer = b.pc.remoteDescription.sdp
        [m_line] = [ln for ln in answer.splitlines() if ln.startswith("m=audio")]
        rtpmap = [ln for ln in answer.splitlines() if ln.startswith("a=rtpmap:")]
        assert codec.lower() in rtpmap[0].lower(), (m_line, rtpmap)
        # host candidates on loopback only: no STUN (srflx), no other address
        cands = [ln for ln in answer.splitlines() if ln.startswith("a=candidate:")]
        assert cands and all(c.split()[4] == "127.0.0.1" and " typ host" in c for c in cands)
        deadline = asyncio.get_running_loop().time() + 10
        while (
            sum(x.size for x in b.heard) < 3 * b.rate
            and asyncio.get_running_loop().time() < deadline
        ):
            await asyncio.sleep(0.1)
        async with http.get(f"{_url(bridge)}/api/calls") as resp:
            live = (await resp.json())["calls"]
        assert [c["leg"] for c in live] == ["webrtc"] and live[0]["state"] == "connected"
        async with http.delete(b.session_url, headers={"Authorization": f"Bearer {token}"}) as resp:
            assert resp.status == 204
        await b.close()
        async with http.get(f"{_url(bridge)}/api/calls") as resp:
            assert (await resp.json())["calls"] == []
        # a token starts one session; the answer gave the page the next one
        again = Browser(_url(bridge), http)
        assert (await again.offer(token)).status == 401
        again = Browser(_url(bridge), http)
        r2 = await again.offer(r.headers["X-Next-Token"])
        assert r2.status == 201
        await again.close()
    heard = np.concatenate(b.heard).astype(np.float64) / 32768
    tail = heard[-b.rate :]  # the last second: the echo of a steady tone
    assert np.sqrt(np.mean(tail**2)) > 0.05, "the browser heard nothing back"
    assert abs(dominant_hz(tail, b.rate) - 1000) < 15


def test_offers_without_the_page_token_or_from_another_origin_are_refused() -> None:
    asyncio.run(asyncio.wait_for(_refusals(), 30))


async def _refusals() -> None:
    async with running() as bridge, aiohttp.ClientSession() as http:
        base = _url(bridge)
        b = Browser(base, http)
        token, _ = await b.page()
        for tok, headers, status in [
            ("made-up", {}, 401),
            (token, {"Origin": "http://evil.example"}, 403),
            (token, {"Content-Type": "text/plain"}, 415),
        ]:
            r = await b.offer(tok, **headers)
            assert r.status == status, (headers, await r.text())
            b = Browser(base, http)
        r = await b.offer(token, profile="../../etc/passwd")
        assert r.status == 404
        async with http.post(f"{base}/api/calls/x/hangup") as resp:  # read-only console
            assert resp.status == 403
        assert bridge.web is not None and not bridge.web.sessions


def test_candidates_the_bridge_cannot_reach_are_dropped() -> None:
    sdp = "\r\n".join([
        "v=0", "m=audio 9 UDP/TLS/RTP/SAVPF 111",
        "a=candidate:1 1 udp 2122260223 127.0.0.1 40000 typ host",
        "a=candidate:2 1 udp 2122260223 10.1.2.3 40001 typ host",
        "a=candidate:3 1 udp 2122260223 4b1c6f3e-1c1f.local 40002 typ host",
        "a=candidate:4 1 udp 1686052607 203.0.113.9 40003 typ srflx raddr 10.1.2.3 rport 1",
        "a=candidate:5 1 udp 2122260223 ::1 40004 typ host",
    ])  # fmt: skip
    kept, dropped = filter_candidates(sdp, ("127.0.0.1",))
    assert dropped == 4 and "127.0.0.1 40000" in kept and "a=candidate:2" not in kept
    kept, dropped = filter_candidates(sdp, ("127.0.0.1", "::1"))
    assert dropped == 3 and "::1 40004" in kept
    kept, dropped = filter_candidates(sdp, None)  # on every address: never loopback or mDNS
    assert dropped == 3 and "10.1.2.3" in kept and "203.0.113.9" in kept


def test_page_tokens_expire_and_are_bounded() -> None:
    now = [0.0]
    tokens = PageTokens(60.0, clock=lambda: now[0], limit=3)
    a = tokens.issue()
    assert tokens.valid(a) and not tokens.valid("") and not tokens.valid(a + "x")
    now[0] = 61.0
    assert not tokens.valid(a)
    made = [tokens.issue() for _ in range(4)]
    assert not tokens.valid(made[0]) and all(tokens.valid(t) for t in made[1:])


def test_the_agents_voice_is_paced_in_20_ms_frames_and_flushed_on_barge_in() -> None:
    class _S:
        def agent_event(self, e: object) -> None: ...

    out = BrowserOutput(_S(), 24000)  # type: ignore[arg-type]
    out.write(np.full(24000 // 10, 1000, np.int16))  # 100 ms at 24 kHz
    frames = [out.next_frame() for _ in range(3)]
    assert all(f.size == 960 for f in frames)
    assert np.abs(frames[1]).min() > 500  # a full frame of the reply
    assert 30 < out.flush() < 50  # the 40 ms not yet sent
    assert not out.next_frame().any()


def test_a_model_fault_plays_the_fallback_prompt_to_the_browser_then_ends_the_session() -> None:
    asyncio.run(asyncio.wait_for(_fault(), 30))


async def _fault() -> None:
    async with running(FaultyAgent) as bridge, aiohttp.ClientSession() as http:
        b = Browser(_url(bridge), http)
        token, _ = await b.page()
        assert (await b.offer(token)).status == 201
        assert bridge.web is not None
        [session] = bridge.web.sessions.values()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while session.closed_reason is None and loop.time() < deadline:
            await asyncio.sleep(0.1)
        await b.close()
    assert session.faulted and session.closed_reason == FAULT_REASON
    assert type(session.agent).__name__ == "FallbackPromptAgent"
    heard = np.concatenate(b.heard).astype(np.float64) / 32768
    frames = heard[: heard.size // 960 * 960].reshape(-1, 960)
    spoken = np.sqrt((frames**2).mean(axis=1)) > 0.02
    assert spoken.sum() > 50, "the browser did not hear the fallback prompt (1 s or more)"


def test_the_level_of_each_sent_frame_is_rfc_6465s_without_a_python_loop() -> None:
    import aiortc.rtp

    from sip_bridge.web.webrtc_leg import _audio_level_dbov

    assert aiortc.rtp.compute_audio_level_dbov is _audio_level_dbov  # the sender calls this

    def frame(pcm: NDArray[np.int16]) -> av.AudioFrame:
        f = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        f.sample_rate = RATE
        return f

    full = np.where(np.arange(960) % 2 == 0, 32767, -32767).astype(np.int16)
    assert _audio_level_dbov(frame(full)) == 0
    assert _audio_level_dbov(frame(np.zeros(960, np.int16))) == -127
    assert _audio_level_dbov(frame((full // 10).astype(np.int16))) == -20  # 20 dB down
    assert _audio_level_dbov(frame(np.ones(960, np.int16))) == -90  # 20*log10(1/32767)

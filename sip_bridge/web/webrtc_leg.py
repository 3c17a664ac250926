"""The browser leg: one WebRTC peer connection (aiortc) talking to the same agent a SIP call
gets, through the same :class:`~agent.base.Agent` interface.

Why this shape: the agent must not know it is talking to a browser. The browser's audio
(Opus at 48 kHz, or PCMU) is mixed to mono, resampled by ``resample/`` to the agent's rate
and handed over in 20 ms frames, one per tick, silence when nothing arrived; what the agent
writes is resampled to 48 kHz and paced out by :class:`AgentTrack`, whose ``recv`` aiortc
calls once per 20 ms frame it sends. That one clock drives both directions, as the media
clock does for a SIP call.

ICE is host-candidates only: no STUN server (aiortc's default Google server is switched
off), our candidates only on the configured addresses, and the browser's candidates kept
only when they are reachable the same way (a loopback bridge talks to loopback candidates;
mDNS ``.local`` names are never resolved, which would need multicast).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import fractions
import ipaddress
import logging
import math
import secrets
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import aioice.ice
import aiortc.rtp
import av
import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from numpy.typing import NDArray

from agent.base import (
    FADE_MS,
    Agent,
    AgentEvent,
    AgentOutput,
    CallInfo,
    HangupEvent,
    TransferRequest,
    TransferResult,
    TurnCompleted,
    fade_out_gain,
)
from resample import Resampler
from sip_bridge.logs import CALL_ID
from sip_bridge.ops.call_telemetry import turn_total_ms

__all__ = [
    "AgentTrack",
    "BrowserOutput",
    "BrowserSession",
    "filter_candidates",
    "gathering_on",
    "ice_hosts",
]

log = logging.getLogger(__name__)

RATE = 48000  # what WebRTC audio (Opus) runs at, both ways
FRAME_S = 0.020
_FRAME = int(RATE * FRAME_S)
_TIME_BASE = fractions.Fraction(1, RATE)
_MAX_BACKLOG_S = 0.2  # caller audio waiting for the agent's tick; more: a stall, drop oldest
_KEEP_AFTER_STALL_S = 0.06

# -- ICE: host candidates on the configured addresses only ---------------------------------

_ice_hosts: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "ice_hosts", default=None
)
_gather_everywhere = aioice.ice.get_host_addresses


def _host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    """aioice's host address lookup, limited to the addresses the gathering task was given
    (aiortc offers no option for it). Without a limit: aioice's own list."""
    hosts = _ice_hosts.get()
    if hosts is None:
        return _gather_everywhere(use_ipv4, use_ipv6)
    return [h for h in hosts if (":" in h and use_ipv6) or (":" not in h and use_ipv4)]


aioice.ice.get_host_addresses = _host_addresses


def _audio_level_dbov(frame: av.AudioFrame) -> int:
    """aiortc's RFC 6464 level of a frame it sends, computed with numpy: its own loops over
    every sample in Python, 0.36 ms a frame, ~2 % of a core per browser session. Same
    figure: the sum of squares of the plane's samples over ``samples`` full-scale ones."""
    x = np.frombuffer(memoryview(frame.planes[0]), np.int16).astype(np.float64)
    rms = math.sqrt(float(np.dot(x, x)) / (frame.samples * 32767.0 * 32767.0))
    if rms <= 0:
        return -127
    return round(min(0.0, max(-127.0, 20 * math.log10(rms))))


aiortc.rtp.compute_audio_level_dbov = _audio_level_dbov


@contextlib.contextmanager
def gathering_on(hosts: tuple[str, ...] | None) -> Iterator[None]:
    """ICE candidates gathered inside this block (by this task and those it starts) use
    only ``hosts`` (None: every address aioice finds)."""
    token = _ice_hosts.set(hosts)
    try:
        yield
    finally:
        _ice_hosts.reset(token)


def ice_hosts(listen_host: str, configured: tuple[str, ...]) -> tuple[str, ...] | None:
    """The addresses our candidates may use: those configured, else the HTTP listen address,
    else (listening on every address) None: every host address aioice finds."""
    if configured:
        return configured
    if listen_host in ("0.0.0.0", "::", ""):
        return None
    return (listen_host,)


def _reachable(address: str, hosts: tuple[str, ...] | None) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False  # an mDNS name (.local): resolving it would need multicast
    if hosts is None:
        return not ip.is_loopback
    ours = [ipaddress.ip_address(h) for h in hosts]
    return any(ip.version == o.version and ip.is_loopback == o.is_loopback for o in ours)


def filter_candidates(sdp: str, hosts: tuple[str, ...] | None) -> tuple[str, int]:
    """The browser's offer without the ICE candidates we could not (or must not) reach;
    returns the SDP and how many candidates were dropped."""
    out, dropped = [], 0
    for line in sdp.splitlines():
        if line.startswith("a=candidate:"):
            parts = line.split()
            if len(parts) < 8 or not _reachable(parts[4], hosts):
                dropped += 1
                continue
        out.append(line)
    return "\r\n".join(out) + "\r\n", dropped


# -- audio both ways -------------------------------------------------------------------------


def _mono_int16(frame: av.AudioFrame) -> NDArray[np.int16]:
    """A decoded frame (packed s16, mono or interleaved stereo) as mono int16."""
    channels = len(frame.layout.channels)
    data = frame.to_ndarray()
    if data.dtype != np.int16:  # planar float or the like: aiortc's decoders give s16
        data = np.clip(data.astype(np.float64) * 32768.0, -32768, 32767).astype(np.int16)
    pcm = np.asarray(data, np.int16).reshape(-1)
    if channels > 1:
        pcm = pcm.reshape(-1, channels).mean(axis=1).astype(np.int16)
    return pcm


class _Samples:
    """int16 chunks in arrival order, taken out in frames of a fixed size."""

    def __init__(self) -> None:
        self._chunks: deque[NDArray[np.int16]] = deque()
        self.size = 0

    def push(self, pcm: NDArray[np.int16]) -> None:
        if pcm.size:
            self._chunks.append(pcm)
            self.size += pcm.size

    def take(self, n: int) -> NDArray[np.int16]:
        """The next ``n`` samples, padded with silence when fewer are there."""
        out = np.zeros(n, np.int16)
        filled = 0
        while filled < n and self._chunks:
            head = self._chunks[0]
            take = min(n - filled, head.size)
            out[filled : filled + take] = head[:take]
            filled += take
            if take == head.size:
                self._chunks.popleft()
            else:
                self._chunks[0] = head[take:]
        self.size -= filled
        return out

    def keep_newest(self, keep: int) -> None:
        """Drop the oldest chunks while at least ``keep`` samples would remain."""
        while self._chunks and self.size - self._chunks[0].size >= keep:
            self.size -= self._chunks.popleft().size

    def clear(self) -> None:
        self._chunks.clear()
        self.size = 0


class BrowserOutput(AgentOutput):
    """What the agent says, at 48 kHz, waiting for :class:`AgentTrack` to send it."""

    def __init__(self, session: BrowserSession, agent_rate: int) -> None:
        self._session = session
        self._to_48k = Resampler(agent_rate, RATE) if agent_rate != RATE else None
        self._queue = _Samples()  # at 48 kHz

    def write(self, pcm: NDArray[np.int16]) -> None:
        out = self._to_48k.process(pcm) if self._to_48k is not None else pcm
        self._queue.push(np.asarray(out, np.int16))

    def flush(self) -> float:
        dropped_ms = 1000.0 * self._queue.size / RATE
        self._queue.clear()
        if self._to_48k is not None:
            self._to_48k.reset()
        return dropped_ms

    def fade_out(self, ms: float = FADE_MS) -> float:
        n = min(self._queue.size, round(RATE * ms / 1000))
        head = self._queue.take(n).astype(np.float64) * fade_out_gain(n)
        dropped = self.flush()
        self._queue.push(np.rint(head).astype(np.int16))
        return dropped

    def queued_ms(self) -> float:
        return 1000.0 * self._queue.size / RATE

    def hangup(self, reason: str = "") -> None:
        self.emit(HangupEvent(reason))

    def emit(self, event: AgentEvent) -> None:
        self._session.agent_event(event)

    def next_frame(self) -> NDArray[np.int16]:
        """20 ms at 48 kHz: what is queued, padded with silence."""
        return self._queue.take(_FRAME)


class AgentTrack(MediaStreamTrack):
    """The agent's voice as a WebRTC audio track. aiortc pulls one frame per 20 ms; each
    pull is also the agent's tick (:meth:`BrowserSession.tick`)."""

    kind = "audio"

    def __init__(self, session: BrowserSession) -> None:
        super().__init__()
        self._session = session
        self._t0: float | None = None
        self._n = 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        if self._t0 is None:
            self._t0 = loop.time()
        else:
            late = loop.time() - (self._t0 + self._n * FRAME_S)
            if late < 0:
                await asyncio.sleep(-late)
            elif late > 0.2:  # the loop stalled: go on from now, never burst to catch up
                self._t0 += late
        self._session.tick()
        pcm = self._session.output.next_frame()
        # stereo, each channel the voice: aiortc's encoder would upmix mono at -3 dB
        frame = av.AudioFrame.from_ndarray(
            np.repeat(pcm, 2).reshape(1, -1), format="s16", layout="stereo"
        )
        frame.sample_rate = RATE
        frame.time_base = _TIME_BASE
        frame.pts = self._n * _FRAME
        self._n += 1
        return frame


# -- one browser session ---------------------------------------------------------------------


class BrowserSession:
    """One browser talking to one agent. Made by the web server per accepted offer;
    :meth:`close` is idempotent and ends everything (agent, tasks, peer connection)."""

    def __init__(
        self,
        agent: Agent,
        caller: str,
        *,
        ice: tuple[str, ...] | None,
        profile: str,
        on_event: Callable[[BrowserSession, AgentEvent], None],
        on_closed: Callable[[BrowserSession, str], None],
    ) -> None:
        self.id = secrets.token_hex(12)
        self.agent = agent
        self.call = CallInfo(f"webrtc-{self.id}", caller, profile, "opus")
        self.profile = profile
        self.ice = ice
        self.output = BrowserOutput(self, agent.sample_rate)
        self.track = AgentTrack(self)
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # no STUN, ever
        self.state = "connecting"
        self.faulted = False  # a model fault: the fallback prompt took the agent's place
        self.closed_reason: str | None = None
        self.events: list[dict[str, Any]] = []  # what the page's event stream replays
        self._subscribers: set[asyncio.Queue[dict[str, Any]]] = set()
        self._inbound = _Samples()  # the caller, at the agent's rate
        self._in_frame = agent.sample_rate * 20 // 1000
        self._primed = False  # a spare frame was buffered since the last underrun
        self._from: dict[int, Resampler] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._on_event = on_event
        self._on_closed = on_closed
        self.started_at = asyncio.get_running_loop().time()
        self.connected_at: float | None = None

    async def answer(
        self, offer_sdp: str, connect_timeout_s: float = 15.0, max_s: float = 0.0
    ) -> str:
        """Our SDP answer to the browser's offer (candidates included: no trickle ICE).
        The session ends if media does not connect within ``connect_timeout_s``, and after
        ``max_s`` (0: no limit), as a SIP call does after ``sip.max_call_s``."""
        CALL_ID.set(self.call.call_id)  # this request's task, and all it starts, is the session's
        sdp, dropped = filter_candidates(offer_sdp, self.ice)
        if dropped:
            log.debug("browser %s: %d unreachable ICE candidates dropped", self.id, dropped)
        pc = self.pc
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", self._on_state)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        if not any(t.kind == "audio" for t in pc.getTransceivers()):
            raise ValueError("the offer has no audio")
        pc.addTrack(self.track)
        with gathering_on(self.ice):  # our candidates: gathered in setLocalDescription
            await pc.setLocalDescription(await pc.createAnswer())
        await self.agent.start(self.call, self.output)
        self._spawn(self._connect_deadline(connect_timeout_s))
        if max_s > 0:
            self._spawn(self._length_limit(max_s))
        return pc.localDescription.sdp

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._spawn(self._read(track))

    async def _on_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected" and self.connected_at is None:
            self.connected_at = asyncio.get_running_loop().time()
            self.state = "connected"
            self.publish({"type": "state", "state": "connected"})
        elif state in ("failed", "closed"):
            await self.close(f"connection {state}")

    async def _connect_deadline(self, timeout_s: float) -> None:
        await asyncio.sleep(timeout_s)
        if self.connected_at is None:
            await self.close(f"no media connection (ICE) within {timeout_s:g} s")

    async def _length_limit(self, max_s: float) -> None:
        await asyncio.sleep(max_s)
        await self.close("call length limit")

    async def _read(self, track: MediaStreamTrack) -> None:
        """The browser's audio into the inbound buffer, at the agent's rate."""
        rate = self.agent.sample_rate
        limit = int(_MAX_BACKLOG_S * rate)
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            assert isinstance(frame, av.AudioFrame)
            pcm = _mono_int16(frame)
            if frame.sample_rate != rate:
                r = self._from.get(frame.sample_rate)
                if r is None:
                    r = self._from[frame.sample_rate] = Resampler(frame.sample_rate, rate)
                pcm = r.process(pcm)
            self._inbound.push(pcm)
            if self._inbound.size > limit:  # the agent's clock fell behind: keep the newest
                self._inbound.keep_newest(int(_KEEP_AFTER_STALL_S * rate))

    def _take_frame(self) -> NDArray[np.int16]:
        """The caller's next 20 ms. aiortc has de-jittered the packets, but its frames and
        our ticks run on two clocks: after a start or an underrun, wait until a spare frame
        is buffered (20 ms more delay, once) instead of cutting speech at every tick whose
        frame is a moment late."""
        n = self._in_frame
        if self._inbound.size < (n if self._primed else 2 * n):
            self._primed = False
            return np.zeros(n, np.int16)  # nothing (enough) arrived: silence, as on SIP
        self._primed = True
        return self._inbound.take(n)

    def tick(self) -> None:
        """20 ms of the caller into the agent (called by :class:`AgentTrack`)."""
        if self.closed_reason is not None:
            return
        try:
            self.agent.on_audio(self._take_frame())
        except Exception:  # one broken agent ends its own session, never the server
            log.exception("browser %s: agent %s failed", self.id, self.agent.name)
            self._spawn(self.close("agent error"))

    def agent_event(self, event: AgentEvent) -> None:
        if isinstance(event, TurnCompleted):
            self.publish({
                "type": "turn", "caller": event.caller_text, "agent": event.agent_text,
                "stages_ms": {k: round(v, 1) for k, v in event.stages_ms.items()},
                "total_ms": turn_total_ms(event.stages_ms), "barged_in": event.barged_in,
            })  # fmt: skip
        elif isinstance(event, HangupEvent):
            self._spawn(self.close(event.reason or "agent hung up"))
        elif isinstance(event, TransferRequest):  # there is no SIP leg to refer
            why = "a browser session has no phone line"
            result = TransferResult(event.target, "failed", 0, why)
            asyncio.get_running_loop().call_soon(self.agent.on_event, result)
        self._on_event(self, event)  # a ModelFault: the web server puts the prompt in

    # -- page events (server-sent) --------------------------------------------------------------

    def publish(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        for q in self._subscribers:
            q.put_nowait(event)

    def subscribe(self) -> tuple[list[dict[str, Any]], asyncio.Queue[dict[str, Any]]]:
        """Everything said so far, and a queue of what comes next."""
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._subscribers.add(q)
        return list(self.events), q

    def unsubscribe(self, q: asyncio.Queue[dict[str, Any]]) -> None:
        self._subscribers.discard(q)

    # -- lifecycle ---------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self, reason: str) -> None:
        if self.closed_reason is not None:
            return
        self.closed_reason = reason
        self.state = "ended"
        log.info("browser session %s ended: %s", self.id, reason)
        self.publish({"type": "state", "state": "ended", "reason": reason})
        current = asyncio.current_task()
        for t in list(self._tasks):
            if t is not current:
                t.cancel()
        self.track.stop()
        try:
            await self.agent.stop()
        except Exception:
            log.exception("browser %s: agent %s did not stop cleanly", self.id, self.agent.name)
        await self.pc.close()
        self._on_closed(self, reason)

    def duration_s(self, now: float) -> float:
        return now - (self.connected_at or self.started_at)

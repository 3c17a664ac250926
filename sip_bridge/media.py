"""One call's media: an RTP socket, the receive chain into the agent, the paced send chain.

The decisions live in three small sans-I/O pieces (datagrams and a clock in, state and
decisions out), so they can be tested without sockets:

* :class:`RtpReceiver`: parse (a malformed datagram is counted and dropped, never raised),
  source filtering with optional symmetric-RTP latching, SSRC and payload-type filtering,
  G.711 decode into the :class:`~jitter.JitterBuffer`, RFC 4733 DTMF, RFC 3389 CN.
* :func:`next_tick`: the receive loop's pop clock, a 20 ms step nudged by at most 5 ms toward
  ``JitterBuffer.due_s`` (no waiting for a fixed grid's phase; follows a drifting sender).
* :class:`Pacer`: absolute deadlines ``t0 + k * ptime`` on the monotonic clock (sleeps never
  accumulate, so no drift); a late wake sends the frames that are due back to back, up to
  ``max_burst``; further behind, the oldest are skipped so the call does not lag for good.

:class:`CallMedia` wires them with asyncio. Silence choice: when the agent has nothing to
say we keep sending encoded G.711 silence (no DTX): carriers and PBXs hang up on RTP
timeouts, NAT pinholes stay open, and comfort noise may not have been negotiated. The first
packet of each talkspurt carries the marker bit and leaves at once, re-phasing the grid,
so new speech is on the wire as soon as a frame of it exists.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from agent.base import Agent, AgentEvent, AgentOutput, CallInfo, DtmfEvent, HangupEvent
from jitter import JitterBuffer, JitterStats, PlayoutBuffer
from resample import Resampler, alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from sip_bridge.dtmf import DtmfDigit, DtmfReceiver
from sip_bridge.pacer import Pacer, next_tick
from sip_bridge.rtp import RtpError, RtpPacket, RtpSender, looks_like_rtcp
from sip_bridge.rtp_ports import RtpPortLease, RtpPortPool

__all__ = [
    "CODECS",
    "CallMedia",
    "Codec",
    "MediaParams",
    "MediaStats",
    "Pacer",
    "RtpReceiver",
    "next_tick",
]

log = logging.getLogger(__name__)

RATE = 8000
CN_PAYLOAD_TYPE = 13
SSRC_SWITCH_PACKETS = 3  # consecutive packets of a new SSRC before we follow it


@dataclass(frozen=True, slots=True)
class Codec:
    name: str
    encode: Callable[[NDArray[np.int16]], NDArray[np.uint8]]
    decode: Callable[[NDArray[np.uint8] | bytes], NDArray[np.int16]]


CODECS: dict[int, Codec] = {
    0: Codec("PCMU", ulaw_encode, ulaw_decode),
    8: Codec("PCMA", alaw_encode, alaw_decode),
}


@dataclass(frozen=True, slots=True)
class MediaParams:
    """What SDP offer/answer decided for this call's audio stream."""

    remote_host: str  # IP literal from c= (resolve names before)
    remote_port: int
    payload_type: int = 0  # 0 PCMU, 8 PCMA
    telephone_event_pt: int | None = 101
    ptime_ms: int = 20
    latch: bool = False  # symmetric RTP: send to where the first valid packet came from
    local_host: str | None = None  # default: the wildcard of the remote's family
    jitter_min_ms: float = 20
    jitter_max_ms: float = 200
    max_queue_ms: float = 60_000  # cap on queued agent audio (oldest dropped beyond)

    def __post_init__(self) -> None:
        if self.payload_type not in CODECS:
            raise ValueError(f"payload type {self.payload_type} is not G.711 (0 or 8)")
        ipaddress.ip_address(self.remote_host)  # ValueError for a name
        if not 0 < self.remote_port < 65536:
            raise ValueError("remote_port out of range")
        if self.ptime_ms <= 0 or (RATE * self.ptime_ms) % 1000:
            raise ValueError("ptime_ms must be a positive whole number of samples")


def addr_key(host: str, port: int) -> tuple[str, int]:
    """Canonical (ip, port), with IPv4-mapped IPv6 turned back into IPv4."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host, port
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), port


@dataclass
class RtpReceiver:
    """Sans-I/O receive side: ``receive(datagram, source, now)`` and the counters."""

    jb: JitterBuffer
    codec: Codec
    payload_type: int
    remote: tuple[str, int]
    latch: bool = False
    dtmf: DtmfReceiver | None = None
    latched: bool = False
    packets: int = 0  # every datagram
    accepted: int = 0  # audio / CN packets pushed into the jitter buffer
    malformed: int = 0
    rtcp: int = 0
    wrong_source: int = 0
    wrong_payload_type: int = 0
    wrong_ssrc: int = 0
    dtmf_packets: int = 0
    ssrc: int | None = None
    _candidate: tuple[int, int] = field(default=(-1, 0))  # (ssrc, consecutive packets)

    def receive(self, data: bytes, source: tuple[str, int], now: float) -> list[DtmfDigit]:
        """One datagram that arrived at ``now``; returns completed DTMF key presses."""
        self.packets += 1
        if looks_like_rtcp(data):
            self.rtcp += 1  # RTCP muxed on the RTP port: not handled yet
            return []
        try:
            pkt = RtpPacket.parse(data)
        except RtpError:
            self.malformed += 1
            return []
        src = addr_key(*source[:2])
        is_event = self.dtmf is not None and pkt.payload_type == self.dtmf.payload_type
        known = pkt.payload_type in (self.payload_type, CN_PAYLOAD_TYPE) or is_event
        if src != self.remote:
            if not (self.latch and not self.latched and known):
                self.wrong_source += 1
                return []
            self.remote = src
        if not known:
            self.wrong_payload_type += 1
            return []
        if self.latch:
            self.latched = True
        if is_event:
            assert self.dtmf is not None
            self.dtmf_packets += 1
            return self.dtmf.feed(pkt)
        if not self._ssrc_ok(pkt.ssrc):
            self.wrong_ssrc += 1
            return []
        try:
            if pkt.payload_type == CN_PAYLOAD_TYPE:
                level = pkt.payload[0] & 0x7F if pkt.payload else 127
                self.jb.push_comfort_noise(pkt.sequence, pkt.timestamp, level, now, pkt.ssrc)
            else:
                pcm = self.codec.decode(pkt.payload)
                self.jb.push(pkt.sequence, pkt.timestamp, pcm, now, pkt.marker, pkt.ssrc)
        except ValueError:  # e.g. an empty payload
            self.malformed += 1
            return []
        self.accepted += 1
        return []

    def _ssrc_ok(self, ssrc: int) -> bool:
        """Lock on the first SSRC; follow a new one only after a few packets in a row.

        A lone stray packet cannot reset the jitter buffer, but a real stream change
        (re-INVITE, transfer inside the PBX) is followed within a few packets.
        """
        if self.ssrc is None or ssrc == self.ssrc:
            self.ssrc = ssrc
            self._candidate = (-1, 0)
            return True
        cand, count = self._candidate
        count = count + 1 if cand == ssrc else 1
        self._candidate = (ssrc, count)
        if count >= SSRC_SWITCH_PACKETS:
            self.ssrc = ssrc
            self._candidate = (-1, 0)
            return True
        return False


@dataclass(frozen=True, slots=True)
class MediaStats:
    """A snapshot for RTCP reports and CDRs."""

    local_port: int
    remote: tuple[str, int]
    latched: bool
    packets_in: int
    packets_accepted: int
    malformed: int
    rtcp_in: int
    wrong_source: int
    wrong_payload_type: int
    wrong_ssrc: int
    dtmf_digits: int
    packets_out: int
    octets_out: int
    send_errors: int
    jitter: JitterStats
    pacer_late_frames: int
    pacer_skipped_frames: int
    pacing_jitter_p50_ms: float
    pacing_jitter_p99_ms: float
    pacing_jitter_max_ms: float
    playout_underrun_frames: int
    playout_queued_ms: float
    agent_errors: int


def _khz(rate: int) -> str:
    return f"{rate / 1000:g}k"


class _Output(AgentOutput):
    """The agent's output into this call's send chain."""

    def __init__(self, media: CallMedia) -> None:
        self._media = media

    def write(self, pcm: NDArray[np.int16]) -> None:
        self._media._write(pcm)

    def flush(self) -> float:
        m = self._media
        if m._down is not None:
            m._down.reset()
        return m.playout.flush()

    def hangup(self, reason: str = "") -> None:
        self.emit(HangupEvent(reason))

    def emit(self, event: AgentEvent) -> None:
        m = self._media
        if isinstance(event, HangupEvent) and m.hangup_requested is None:
            m.hangup_requested = event.reason
        if m.on_agent_event is not None:
            m.on_agent_event(event)


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, media: CallMedia | None = None) -> None:
        self.media = media  # None while the port is reserved but the call not set up

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if self.media is not None:
            self.media._on_datagram(data, (str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        if self.media is not None:
            self.media.send_errors += 1  # ICMP port unreachable and the like: keep going


RtpLease = RtpPortLease[_Protocol]


async def reserve_rtp_port(pool: RtpPortPool, host: str) -> RtpLease:
    """Bind a port before the media parameters are known.

    SIP needs our port for the SDP answer before the call's media can be built;
    hand the lease to :class:`CallMedia` afterwards (packets before that are dropped).
    """
    return await pool.bind(host, _Protocol)


class CallMedia:
    """One call's RTP leg and media chain, from ``await start()`` to ``await close()``."""

    def __init__(
        self,
        agent: Agent,
        pool: RtpPortPool,
        params: MediaParams,
        call: CallInfo | None = None,
        *,
        on_agent_event: Callable[[AgentEvent], None] | None = None,
        lease: RtpLease | None = None,
    ) -> None:
        self.agent = agent
        self.pool = pool
        self.params = params
        self.codec = CODECS[params.payload_type]
        self.call = call or CallInfo(call_id="", codec=self.codec.name)
        self.on_agent_event = on_agent_event
        self.hangup_requested: str | None = None
        self.frame_samples = RATE * params.ptime_ms // 1000
        self.jb = JitterBuffer(
            RATE, params.ptime_ms, params.jitter_min_ms, params.jitter_max_ms, follows_due=True
        )
        dtmf = None
        if params.telephone_event_pt is not None:
            dtmf = DtmfReceiver(params.telephone_event_pt, RATE)
        remote = addr_key(params.remote_host, params.remote_port)
        self.receiver = RtpReceiver(self.jb, self.codec, params.payload_type, remote)
        self.receiver.latch = params.latch
        self.receiver.dtmf = dtmf
        rate = agent.sample_rate
        self._up = Resampler(RATE, rate) if rate != RATE else None
        self._down = Resampler(rate, RATE) if rate != RATE else None
        self.playout = PlayoutBuffer(RATE, params.ptime_ms, max_ms=params.max_queue_ms)
        self.pacer = Pacer(params.ptime_ms / 1000.0)
        self.sender = RtpSender(params.payload_type)
        self.output = _Output(self)
        self.send_errors = 0
        self.agent_errors = 0
        self.dtmf_digits = 0
        self._lease: RtpLease | None = lease
        if lease is not None:
            lease.protocol.media = self
        self._tasks: list[asyncio.Task[None]] = []
        self._talking = False
        self._wake_pending = False
        self._waker: asyncio.Future[None] | None = None
        self._closed = False

    # -- description and stats --------------------------------------------------------------

    def describe(self) -> str:
        """The chain as one line, built from the configured stages."""
        p = self.params
        codec = self.codec.name
        stages = [
            "RTP in",
            f"JitterBuffer(adaptive {p.jitter_min_ms:g}..{p.jitter_max_ms:g} ms)",
            f"G711Decode({codec})",
        ]
        if self._up is not None:
            stages.append(f"Resample({_khz(self._up.in_rate)}->{_khz(self._up.out_rate)})")
        stages.append(f"Agent({self.agent.name})")
        if self._down is not None:
            stages.append(f"Resample({_khz(self._down.in_rate)}->{_khz(self._down.out_rate)})")
        stages += [f"G711Encode({codec})", f"Pacer({self.playout.frame_ms} ms)", "RTP out"]
        return " -> ".join(stages)

    @property
    def local_port(self) -> int:
        if self._lease is None:
            raise RuntimeError("not started")
        return self._lease.port

    @property
    def stats(self) -> MediaStats:
        r = self.receiver
        p50, p99, pmax = self.pacer.jitter_ms()
        return MediaStats(
            local_port=self._lease.port if self._lease else 0,
            remote=r.remote,
            latched=r.latched,
            packets_in=r.packets,
            packets_accepted=r.accepted,
            malformed=r.malformed,
            rtcp_in=r.rtcp,
            wrong_source=r.wrong_source,
            wrong_payload_type=r.wrong_payload_type,
            wrong_ssrc=r.wrong_ssrc,
            dtmf_digits=self.dtmf_digits,
            packets_out=self.sender.packet_count,
            octets_out=self.sender.octet_count,
            send_errors=self.send_errors,
            jitter=self.jb.stats,
            pacer_late_frames=self.pacer.late_frames,
            pacer_skipped_frames=self.pacer.skipped_frames,
            pacing_jitter_p50_ms=p50,
            pacing_jitter_p99_ms=p99,
            pacing_jitter_max_ms=pmax,
            playout_underrun_frames=self.playout.underrun_frames,
            playout_queued_ms=self.playout.queued_ms,
            agent_errors=self.agent_errors,
        )

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> int:
        """Bind the RTP port, start the agent and the two loops; returns the local port."""
        if self._tasks:
            raise RuntimeError("already started")
        if self._lease is None:
            host = self.params.local_host
            if host is None:
                v6 = ipaddress.ip_address(self.params.remote_host).version == 6
                host = "::" if v6 else "0.0.0.0"
            self._lease = await self.pool.bind(host, lambda: _Protocol(self))
        try:
            await self.agent.start(self.call, self.output)
        except BaseException:
            self._lease.close()
            raise
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._tasks = [
            asyncio.create_task(self._receive_loop(now), name="rtp-receive"),
            asyncio.create_task(self._send_loop(now), name="rtp-pacer"),
        ]
        return self._lease.port

    async def close(self, reason: str = "") -> None:
        """Stop the loops, tell the agent the call is over, free the port (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for t in self._tasks:
            t.cancel()
        if self._tasks:  # bounded: a task that ignores cancellation must not hang the call
            _, stuck = await asyncio.wait(self._tasks, timeout=1.0)
            if stuck:
                log.error("media tasks did not stop: %s", [t.get_name() for t in stuck])
        if self.receiver.dtmf is not None:
            self._deliver_digits(self.receiver.dtmf.flush())
        try:
            self._event_to_agent(HangupEvent(reason))
            await self.agent.stop()
        finally:
            if self._lease is not None:
                await self._lease.aclose()

    # -- receive path -----------------------------------------------------------------------

    def _on_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        if self._closed:
            return
        now = asyncio.get_running_loop().time()
        self._deliver_digits(self.receiver.receive(data, addr, now))

    def _deliver_digits(self, digits: list[DtmfDigit]) -> None:
        for d in digits:
            self.dtmf_digits += 1
            self._event_to_agent(DtmfEvent(d.digit, d.duration_ms))

    def _event_to_agent(self, event: AgentEvent) -> None:
        try:
            self.agent.on_event(event)
        except Exception:
            self.agent_errors += 1
            log.exception("agent %s failed on %r", self.agent.name, event)

    async def _receive_loop(self, t: float) -> None:
        """Pop one frame per tick into the agent; silence too, so samples are a clock."""
        loop = asyncio.get_running_loop()
        frame_s = self.params.ptime_ms / 1000.0
        while True:
            now = loop.time()
            if t > now:
                await asyncio.sleep(t - now)
            elif now - t > 1.0:
                t = now  # the loop stalled for a second: do not replay every missed tick
            frame = self.jb.pop(t)
            pcm = self._up.process(frame) if self._up is not None else frame
            try:
                self.agent.on_audio(pcm)
            except Exception:
                self.agent_errors += 1
                if self.agent_errors <= 3:
                    log.exception("agent %s failed on audio", self.agent.name)
            t = next_tick(t, frame_s, self.jb.due_s)

    # -- send path --------------------------------------------------------------------------

    def _write(self, pcm: NDArray[np.int16]) -> None:
        a = np.asarray(pcm)
        if a.dtype != np.int16 or a.ndim != 1:
            raise ValueError("agent audio must be a 1-D int16 array")
        down = self._down
        if down is None:
            self.playout.write(a)
        else:
            # One frame at a time: the resampler's fast path is keyed on the chunk length,
            # and a long TTS burst as one chunk costs milliseconds to seconds (measured).
            step = self.agent.sample_rate * self.params.ptime_ms // 1000
            for i in range(0, a.size, step):
                self.playout.write(down.process(a[i : i + step]))
        if not self._talking and self.playout.queued_samples >= self.frame_samples:
            self._wake_pending = True
            if self._waker is not None and not self._waker.done():
                self._waker.set_result(None)

    def _send_frame(self, dest: tuple[str, int]) -> None:
        has_audio = self.playout.queued_samples > 0
        if has_audio and not self._talking:
            self.sender.start_talkspurt()
        self._talking = has_audio
        frame = self.playout.pop()
        payload = self.codec.encode(frame).tobytes()
        assert self._lease is not None
        self._lease.transport.sendto(self.sender.next_packet(payload, self.frame_samples), dest)

    async def _send_loop(self, t0: float) -> None:
        loop = asyncio.get_running_loop()
        pacer = self.pacer
        pacer.start(t0)
        while True:
            now = loop.time()
            if self._wake_pending:
                self._wake_pending = False
                if not self._talking and self.playout.queued_samples >= self.frame_samples:
                    pacer.rephase(now)  # new talkspurt: on the wire now, not at the grid
            skip, deadlines = pacer.poll(now)
            if skip:
                for _ in range(skip):  # keep audio in step with the clock after a stall
                    self.playout.pop()
                self.sender.skip(skip * self.frame_samples)
            dest = self.receiver.remote
            for _ in deadlines:
                self._send_frame(dest)
            delay = pacer.next_deadline - loop.time()
            if delay <= 0:
                continue
            if self._talking:
                await asyncio.sleep(delay)
            else:  # in silence, new speech wakes us before the grid does
                await self._sleep_or_wake(delay)

    async def _sleep_or_wake(self, delay: float) -> None:
        """Sleep ``delay`` s unless :meth:`_write` wakes us first.

        A bare future and a timer, not ``asyncio.wait_for(event.wait())``: on Python 3.11
        that can swallow a cancellation racing the wake-up, and ``close()`` then hangs.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._waker = fut
        timer = loop.call_later(delay, _resolve, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self._waker = None


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)

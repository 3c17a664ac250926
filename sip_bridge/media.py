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
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from agent.base import Agent, AgentEvent, AgentOutput, CallInfo, DtmfEvent, HangupEvent
from jitter import JitterBuffer, JitterStats, PlayoutBuffer
from resample import Resampler
from sip_bridge.dtmf import DtmfDigit, DtmfReceiver
from sip_bridge.media_rtcp import RtcpLink, RtcpPeerStats, RtcpProtocol
from sip_bridge.pacer import Pacer, next_tick
from sip_bridge.rtcp import NTP_UNIX_OFFSET
from sip_bridge.rtcp_session import RtcpSession
from sip_bridge.rtp import RtpPacket, RtpSender, looks_like_rtcp
from sip_bridge.rtp_ports import RtpPortLease, RtpPortPool
from sip_bridge.rtp_receiver import CODECS, RATE, RtpReceiver, addr_key

__all__ = [
    "CODECS",
    "CallMedia",
    "MediaParams",
    "MediaStats",
    "RtpLease",
    "RtpReceiver",
    "reserve_rtp_port",
]

log = logging.getLogger(__name__)


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
    rtcp_port: int | None = None  # the peer's RTCP port (a=rtcp); None: remote_port + 1
    rtcp_mux: bool = False  # RTCP on the RTP ports both ways (RFC 5761)
    send: bool = True  # False while the peer holds us (recvonly/inactive): send no RTP
    receive: bool = True  # False when the peer will not send: incoming audio is ignored

    def __post_init__(self) -> None:
        if self.payload_type not in CODECS:
            raise ValueError(f"payload type {self.payload_type} is not G.711 (0 or 8)")
        ipaddress.ip_address(self.remote_host)  # ValueError for a name
        if not 0 < self.remote_port < 65536:
            raise ValueError("remote_port out of range")
        if self.rtcp_port is not None and not 0 < self.rtcp_port < 65536:
            raise ValueError("rtcp_port out of range")
        if self.ptime_ms <= 0 or (RATE * self.ptime_ms) % 1000:
            raise ValueError("ptime_ms must be a positive whole number of samples")


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
    rtcp: RtcpPeerStats = field(default_factory=RtcpPeerStats)
    sending: bool = True
    receiving: bool = True


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
        cname: str | None = None,
        rtcp_rand: Callable[[], float] | None = None,
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
        self.receiver.on_accepted = self._on_rtp_accepted
        self.cname = cname or f"sip-bridge@{socket.gethostname()}"
        self._rtcp_rand = rtcp_rand  # tests pass a constant for a predictable schedule
        self.rtcp: RtcpLink | None = None  # from start()
        self._rtcp_transport: asyncio.DatagramTransport | None = None
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
            rtcp=self.rtcp.stats if self.rtcp is not None else RtcpPeerStats(),
            sending=self.params.send,
            receiving=self.params.receive,
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
        loop = asyncio.get_running_loop()
        now = loop.time()
        session = RtcpSession(
            self.sender.ssrc,
            RATE,
            self.cname,
            now,
            ntp_offset=time.time() - now + NTP_UNIX_OFFSET,
            rand=self._rtcp_rand,
        )
        p = self.params
        self.rtcp = RtcpLink(session, _rtcp_remote(p), mux=p.rtcp_mux, latch=p.latch)
        try:
            if not p.rtcp_mux:
                await self._bind_rtcp(self.rtcp)
            await self.agent.start(self.call, self.output)
        except BaseException:
            self._close_sockets()
            raise
        self._tasks = [
            asyncio.create_task(self._receive_loop(now), name="rtp-receive"),
            asyncio.create_task(self._send_loop(now), name="rtp-pacer"),
            asyncio.create_task(self._rtcp_loop(), name="rtcp"),
        ]
        return self._lease.port

    async def _bind_rtcp(self, link: RtcpLink) -> None:
        """RTCP on RTP port + 1 (the pool keeps it free); without it we report from RTP."""
        assert self._lease is not None
        host = str(self._lease.transport.get_extra_info("sockname")[0])
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_datagram_endpoint(
                lambda: RtcpProtocol(link), local_addr=(host, self._lease.port + 1)
            )
        except OSError as exc:
            log.warning("RTCP port %d unavailable (%s)", self._lease.port + 1, exc)
            return
        self._rtcp_transport = transport

    def _close_sockets(self) -> None:
        if self._rtcp_transport is not None:
            self._rtcp_transport.close()
        if self._lease is not None:
            self._lease.close()

    def update(self, params: MediaParams) -> None:
        """Apply a re-INVITE/UPDATE's outcome mid-call: address, codec, direction, RTCP.

        The packet clock cannot change under a running pacer, so a new ptime is refused
        (ValueError) and nothing is applied; the call keeps its current media.
        """
        old = self.params
        if params.ptime_ms != old.ptime_ms:
            raise ValueError(f"ptime change {old.ptime_ms} -> {params.ptime_ms} ms unsupported")
        r = self.receiver
        if params.payload_type != old.payload_type:
            self.codec = CODECS[params.payload_type]
            r.codec, r.payload_type = self.codec, params.payload_type
            self.sender.payload_type = params.payload_type
        if params.telephone_event_pt != old.telephone_event_pt:
            pt = params.telephone_event_pt
            r.dtmf = None if pt is None else DtmfReceiver(pt, RATE)
        moved = addr_key(params.remote_host, params.remote_port) != addr_key(
            old.remote_host, old.remote_port
        )
        if moved or params.latch != old.latch:
            r.remote = addr_key(params.remote_host, params.remote_port)
            r.latch, r.latched = params.latch, False  # re-latch on the new stream
        if self.rtcp is not None and (
            moved or _rtcp_remote(params) != _rtcp_remote(old) or params.rtcp_mux != old.rtcp_mux
        ):
            self.rtcp.retarget(_rtcp_remote(params), mux=params.rtcp_mux, latch=params.latch)
        if params.send and not old.send:
            self.sender.start_talkspurt()  # resuming after hold: marker bit
        self.params = params
        log.info(
            "media updated: remote %s, send %s, receive %s", r.remote, params.send, params.receive
        )

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
        if self.rtcp is not None and self._tasks:
            self._send_rtcp(self.rtcp.bye(asyncio.get_running_loop().time(), reason or None))
        if self._rtcp_transport is not None:
            self._rtcp_transport.close()
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
        if looks_like_rtcp(data):  # rtcp-mux, or a peer that muxes anyway: digest it
            self.receiver.receive(data, addr, now)  # counts it
            if self.rtcp is not None:
                self.rtcp.receive(data, addr, now)
            return
        if not self.params.receive:  # the peer said it will not send: ignore its audio
            self.receiver.packets += 1
            return
        self._deliver_digits(self.receiver.receive(data, addr, now))

    def _on_rtp_accepted(self, pkt: RtpPacket, now: float) -> None:
        if self.rtcp is not None:
            self.rtcp.session.on_rtp_received(pkt.ssrc, pkt.sequence, pkt.timestamp, now)

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
        if not self.params.send:  # on hold: the clock runs on, nothing goes out
            self.sender.skip(self.frame_samples)  # and the first packet after has the marker
            return
        payload = self.codec.encode(frame).tobytes()
        assert self._lease is not None
        ts = self.sender.timestamp
        data = self.sender.next_packet(payload, self.frame_samples)
        self._lease.transport.sendto(data, dest)
        if self.rtcp is not None:
            now = asyncio.get_running_loop().time()
            self.rtcp.session.on_rtp_sent(len(data), len(payload), ts, now)

    # -- RTCP -------------------------------------------------------------------------------

    async def _rtcp_loop(self) -> None:
        """Send a report whenever the session's randomised interval is up."""
        loop = asyncio.get_running_loop()
        while True:
            assert self.rtcp is not None
            delay = self.rtcp.session.next_report_time() - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            data = self.rtcp.due(loop.time())
            if data is not None:
                self._send_rtcp(data)

    def _send_rtcp(self, data: bytes) -> None:
        link = self.rtcp
        assert link is not None and self._lease is not None
        if link.mux:
            self._lease.transport.sendto(data, self.receiver.remote)
        elif self._rtcp_transport is not None:
            self._rtcp_transport.sendto(data, link.remote)
        else:
            self._lease.transport.sendto(data, link.remote)

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


def _rtcp_remote(p: MediaParams) -> tuple[str, int]:
    """Where reports go without rtcp-mux: ``a=rtcp`` if given, else RTP port + 1."""
    port = p.rtcp_port if p.rtcp_port is not None else p.remote_port + 1
    return addr_key(p.remote_host, min(port, 65535))


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)

"""One call's media: an RTP socket, the receive chain into the agent, the paced send chain.

The decisions live in three small sans-I/O pieces (datagrams and a clock in, state and
decisions out), so they can be tested without sockets:

* :class:`RtpReceiver`: parse (a malformed datagram is counted and dropped, never raised),
  source filtering with optional symmetric-RTP latching, SSRC and payload-type filtering,
  G.711 decode into the :class:`~jitter.JitterBuffer`, RFC 4733 DTMF, RFC 3389 CN.
* :func:`next_tick`: the receive side's pop clock, a 20 ms step nudged by at most 5 ms toward
  ``JitterBuffer.due_s`` (no waiting for a fixed grid's phase; follows a drifting sender).
* :class:`Pacer`: absolute deadlines ``t0 + k * ptime`` on the monotonic clock (sleeps never
  accumulate, so no drift); a late wake sends the frames that are due back to back, up to
  ``max_burst``; further behind, the oldest are skipped so the call does not lag for good.

:class:`CallMedia` holds one call's state and stages; the process-wide
:class:`~sip_bridge.media_clock.MediaClock` runs them for every call on one timer, batching
the DSP across calls. Silence choice: when the agent has nothing to say we keep sending
encoded G.711 silence (no DTX): carriers and PBXs hang up on RTP timeouts, NAT pinholes stay
open, and comfort noise may not have been negotiated. A talkspurt's first packet carries the
marker bit and re-phases the grid (see :meth:`CallMedia._talkspurt_ready`). RFC 4733 keys the
agent sends (:meth:`CallMedia.send_dtmf`) take the place of audio frames on the same SSRC
and sequence space; queued audio waits while an event plays.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from agent.base import Agent, AgentEvent, CallInfo, DtmfEvent, HangupEvent
from jitter import JitterBuffer, PlayoutBuffer
from resample import Resampler
from sip_bridge.dtmf import DtmfDigit, DtmfOutbox, DtmfReceiver
from sip_bridge.media_clock import MediaClock, media_clock
from sip_bridge.media_io import (
    AudioRtpSender,
    MediaOutput,
    PolledSocket,
    RtpLease,
    RtpProtocol,
    reserve_rtp_port,
)
from sip_bridge.media_params import MediaParams, MediaStats
from sip_bridge.media_rtcp import RtcpLink, RtcpPeerStats, bind_rtcp, rtcp_remote
from sip_bridge.pacer import Pacer, next_tick
from sip_bridge.rtcp import NTP_UNIX_OFFSET
from sip_bridge.rtcp_session import RtcpSession
from sip_bridge.rtp import looks_like_rtcp
from sip_bridge.rtp_ports import RtpPortPool
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

#: An audio frame a call's send tick left for the clock to encode: (call, frame, dest).
TxFrame = tuple["CallMedia", NDArray[np.int16], tuple[str, int]]


def _khz(rate: int) -> str:
    return f"{rate / 1000:g}k"


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
        self.sender = AudioRtpSender(params.payload_type)
        self.dtmf_out = self._dtmf_outbox(params)
        self.output = MediaOutput(self)
        self.send_errors = 0
        self.agent_errors = 0
        self.dtmf_digits = 0
        self._lease: RtpLease | None = lease
        if lease is not None:
            lease.protocol.media = self
        self._clock: MediaClock | None = None  # from start() to close()
        self._sock: PolledSocket | None = None  # the RTP socket, read by the clock
        self._frame_s = params.ptime_ms / 1000.0
        self._rx_t = 0.0  # when the jitter buffer is next popped (see next_tick)
        self._agent_step = rate * params.ptime_ms // 1000  # agent samples per frame
        self._pending: list[NDArray[np.int16]] = []  # agent audio not yet downsampled
        self._pending_samples = 0
        self._talking = False
        self._wake_pending = False
        self._wake_since: float | None = None  # when queued speech first waited to start
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
        return MediaStats(
            local_port=self._lease.port if self._lease else 0,
            **self.receiver.counters(),
            **self.pacer.figures(),
            dtmf_digits=self.dtmf_digits,
            dtmf_digits_sent=self.dtmf_out.sent_digits if self.dtmf_out is not None else 0,
            packets_out=self.sender.packet_count,
            octets_out=self.sender.octet_count,
            send_errors=self.send_errors + (self._sock.send_errors if self._sock else 0),
            jitter=self.jb.stats,
            playout_underrun_frames=self.playout.underrun_frames,
            playout_queued_ms=self.playout.queued_ms,
            agent_errors=self.agent_errors,
            rtcp=self.rtcp.stats if self.rtcp is not None else RtcpPeerStats(),
            sending=self.params.send,
            receiving=self.params.receive,
        )

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> int:
        """Bind the RTP port, start the agent, join the media clock; returns the local port."""
        if self._clock is not None:
            raise RuntimeError("already started")
        if self._lease is None:
            host = self.params.local_host
            if host is None:
                v6 = ipaddress.ip_address(self.params.remote_host).version == 6
                host = "::" if v6 else "0.0.0.0"
            self._lease = await self.pool.bind(host, lambda: RtpProtocol(self))
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
        self.rtcp = RtcpLink(session, rtcp_remote(p), mux=p.rtcp_mux, latch=p.latch)
        try:
            if not p.rtcp_mux:
                self._rtcp_transport = await bind_rtcp(self._lease.transport, self.rtcp)
            await self.agent.start(self.call, self.output)
        except BaseException:
            self._close_sockets()
            raise
        self._sock = PolledSocket(self._lease.transport)
        self._clock = media_clock()
        t0 = self._clock.add(self)
        self._rx_t = t0
        self.pacer.start(t0)
        return self._lease.port

    def _close_sockets(self) -> None:
        if self._sock is not None:
            self._sock.close()
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
        if params.dtmf_send_pt != old.dtmf_send_pt and (
            self.dtmf_out is None or not self.dtmf_out.playing
        ):
            self.dtmf_out = self._dtmf_outbox(params)
        moved = addr_key(params.remote_host, params.remote_port) != addr_key(
            old.remote_host, old.remote_port
        )
        if moved or params.latch != old.latch:
            r.remote = addr_key(params.remote_host, params.remote_port)
            r.latch, r.latched = params.latch, False  # re-latch on the new stream
        if self.rtcp is not None and (
            moved or rtcp_remote(params) != rtcp_remote(old) or params.rtcp_mux != old.rtcp_mux
        ):
            self.rtcp.retarget(rtcp_remote(params), mux=params.rtcp_mux, latch=params.latch)
        if params.send and not old.send:
            self.sender.start_talkspurt()  # resuming after hold: marker bit
        self.params = params
        log.info(
            "media updated: remote %s, send %s, receive %s", r.remote, params.send, params.receive
        )

    async def close(self, reason: str = "") -> None:
        """Leave the clock, tell the agent the call is over, free the port (idempotent)."""
        if self._closed:
            return
        self._closed = True
        started = self._clock is not None
        if self._clock is not None:
            self._clock.remove(self)
        if self.rtcp is not None and started:
            self._send_rtcp(self.rtcp.bye(asyncio.get_running_loop().time(), reason or None))
        if self._rtcp_transport is not None:
            self._rtcp_transport.close()
        if self._sock is not None:
            self._sock.close()
        if self.receiver.dtmf is not None:
            self._deliver_digits(self.receiver.dtmf.flush())
        try:
            self._event_to_agent(HangupEvent(reason))
            await self.agent.stop()
        finally:
            if self._lease is not None:
                await self._lease.aclose()

    # -- receive path -----------------------------------------------------------------------

    def _on_datagram(self, data: bytes, addr: tuple[str, int], now: float | None = None) -> None:
        if self._closed:
            return
        if now is None:
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

    def _on_rtp_accepted(self, ssrc: int, seq: int, ts: int, now: float) -> None:
        if self.rtcp is not None:
            self.rtcp.session.on_rtp_received(ssrc, seq, ts, now)

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

    # -- the clock's stages (see sip_bridge.media_clock) -------------------------------------

    def _rx_pop(self) -> NDArray[np.int16]:
        """One frame for the tick at ``_rx_t`` (silence too, so samples are a clock)."""
        t = self._rx_t
        now = self._clock.loop.time() if self._clock is not None else t
        if self._sock is not None and self._clock is not None and self._clock.poller is None:
            for data, addr, arrival in self._sock.drain(now):
                self._on_datagram(data, addr, arrival)
        if now - t > 1.0:
            t = now  # the loop stalled for a second: do not replay every missed tick
        frame = self.jb.pop(t)
        self._rx_t = next_tick(t, self._frame_s, self.jb.due_s)
        return frame

    def _flush(self) -> float:
        """Barge-in: drop queued agent audio and digits; returns the ms dropped."""
        pending_ms = 1000.0 * self._pending_samples / self.agent.sample_rate
        self._pending.clear()
        self._pending_samples = 0
        if self._down is not None:
            self._down.reset()
        if self.dtmf_out is not None:
            self.dtmf_out.clear()
        return self.playout.flush() + pending_ms

    def _rx_deliver(self, pcm: NDArray[np.int16]) -> None:
        try:
            self.agent.on_audio(pcm)
        except Exception:
            self.agent_errors += 1
            if self.agent_errors <= 3:
                log.exception("agent %s failed on audio", self.agent.name)

    def _write(self, pcm: NDArray[np.int16]) -> None:
        """Queue agent audio; the clock downsamples it (batched) before the next send."""
        a = np.asarray(pcm)
        if a.dtype != np.int16 or a.ndim != 1:
            raise ValueError("agent audio must be a 1-D int16 array")
        if not a.size:
            return
        self._pending.append(a)
        self._pending_samples += a.size
        if not self._talking and not self._wake_pending:
            queued = (
                self.playout.queued_samples + self._pending_samples * RATE / self.agent.sample_rate
            )
            self._wake_pending = queued >= self.frame_samples

    def _drain_one(self) -> None:
        """Pending agent audio into the playout buffer, one frame at a time: the
        resampler's fast path is keyed on the chunk length, and a long TTS burst as one
        chunk costs milliseconds to seconds (measured)."""
        down, step = self._down, self._agent_step
        for a in self._pending:
            if down is None:
                self.playout.write(a)
                continue
            for i in range(0, a.size, step):
                self.playout.write(down.process(a[i : i + step]))
        self._pending.clear()
        self._pending_samples = 0

    def _tx_tick(self, t: float, now: float, batch: list[TxFrame] | None = None) -> None:
        """Send the frames due at grid time ``t`` (``now`` >= t); audio frames go into
        ``batch`` for the clock to encode for all calls at once (:meth:`_send_audio`)."""
        if self.dtmf_out is not None and self.dtmf_out.busy:
            batch = None  # event packets hold sequence numbers: send strictly in order
        pacer = self.pacer
        if self._wake_pending and self._talkspurt_ready(now):
            clock = self._clock  # new talkspurt: on the quietest tick to come
            pacer.rephase(clock.quiet_phase(t, self._frame_s) if clock is not None else t)
        skip, deadlines = pacer.poll(now + 1e-6)
        if skip:
            for _ in range(skip):  # keep audio in step with the clock after a stall
                self.playout.pop()
            self.sender.skip(skip * self.frame_samples)
        dest = self.receiver.remote
        for _ in deadlines:
            self._send_frame(dest, now, batch)

    def _talkspurt_ready(self, now: float) -> bool:
        """Start queued speech once a second frame is queued (a burst has it at once) or the
        first waited a frame: that slack absorbs the drift between the call's receive and
        send ticks, which would cut holes in a frame-by-frame stream (an echo)."""
        queued = self.playout.queued_samples
        if self._talking or queued < self.frame_samples:
            self._wake_pending, self._wake_since = False, None
            return False
        if self._wake_since is None:
            self._wake_since = now
        if queued < 2 * self.frame_samples and now - self._wake_since < self._frame_s - 0.001:
            return False
        self._wake_pending, self._wake_since = False, None
        return True

    def _rtcp_tick(self, now: float) -> None:
        if self.rtcp is not None and now >= self.rtcp.session.next_report_time():
            data = self.rtcp.due(now)
            if data is not None:
                self._send_rtcp(data)

    def _send_frame(
        self, dest: tuple[str, int], now: float, batch: list[TxFrame] | None = None
    ) -> None:
        out = self.dtmf_out
        if out is not None and out.busy:
            data = out.next_packet()
            if data is not None:  # an event packet takes this slot; audio waits
                self._send_datagram(data, dest, now, 4)
                return
        has_audio = self.playout.queued_samples > 0
        if has_audio and not self._talking:
            self.sender.start_talkspurt()
        self._talking = has_audio
        frame = self.playout.pop()
        if not self.params.send:  # on hold: the clock runs on, nothing goes out
            self.sender.skip(self.frame_samples)  # and the first packet after has the marker
            return
        if batch is not None:
            batch.append((self, frame, dest))
        else:
            self._send_audio(self.codec.encode(frame).tobytes(), dest, now)

    def _send_audio(self, payload: bytes, dest: tuple[str, int], now: float) -> None:
        data = self.sender.next_packet(payload, self.frame_samples)
        self._send_datagram(data, dest, now, len(payload))

    def _send_datagram(self, data: bytes, dest: tuple[str, int], now: float, size: int) -> None:
        if not self.params.send:
            return
        assert self._sock is not None
        self._sock.sendto(data, dest)
        if self.rtcp is not None:
            ts = int.from_bytes(data[4:8], "big")
            self.rtcp.session.on_rtp_sent(len(data), size, ts, now)

    # -- DTMF out ---------------------------------------------------------------------------

    def _dtmf_outbox(self, p: MediaParams) -> DtmfOutbox | None:
        pt = p.dtmf_send_pt  # None: not negotiated
        return None if pt is None else DtmfOutbox.on(self.sender, pt, RATE, p.ptime_ms)

    def send_dtmf(self, digits: str) -> None:
        """Queue RFC 4733 key presses (100 ms each, 60 ms apart) on this call's stream.

        Without negotiated telephone-event nothing goes out in-band: a warning is logged
        and each digit is handed to ``on_agent_event`` as a :class:`DtmfEvent`, so the
        signalling side may send it another way (SIP INFO). ValueError for a non-DTMF
        character (nothing queued).
        """
        if self.dtmf_out is not None:
            self.dtmf_out.add(digits)
            return
        DtmfOutbox.check(digits)
        log.warning("peer did not negotiate telephone-event: DTMF %r not sent in-band", digits)
        if self.on_agent_event is not None:
            for d in digits:
                self.on_agent_event(DtmfEvent(d.upper()))

    # -- RTCP -------------------------------------------------------------------------------

    def _send_rtcp(self, data: bytes) -> None:
        link = self.rtcp
        assert link is not None and self._lease is not None
        send = self._sock.sendto if self._sock is not None else self._lease.transport.sendto
        if link.mux:
            send(data, self.receiver.remote)
        elif self._rtcp_transport is not None:
            self._rtcp_transport.sendto(data, link.remote)
        else:
            send(data, link.remote)

# size: one class, the call the media clock drives (media_clock.ClockedCall); its receive, send,
#       DTMF and update paths share the call's state, and kept apart they reached into each other
#       (media_update.py was folded back in)
"""One call's media: an RTP socket, the receive chain into the agent, the paced send chain.

Its decisions live in small sans-I/O pieces (datagrams and a clock in, decisions out),
tested without sockets: :class:`RtpReceiver` (parse, filter, latch, decode, DTMF, CN),
:func:`next_tick` (the receive pops' clock, following ``JitterBuffer.due_s``) and
:class:`Pacer` (absolute send deadlines with bounded catch-up, no drift).

:class:`CallMedia` holds one call's state and stages; the process-wide
:class:`~sip_bridge.media.media_clock.MediaClock` runs them for every call on one timer, batching
the DSP across calls. Silence choice: when the agent has nothing to say we keep sending
encoded G.711 silence (no DTX): carriers and PBXs hang up on RTP timeouts, NAT pinholes stay
open, and comfort noise may not have been negotiated. A talkspurt's first frame (agent audio
written while the call sends silence) is encoded and sent in the write itself, with the marker
bit, and the call's grid restarts there (:meth:`CallMedia._start_talkspurt`). RFC 4733 keys the
agent sends (:meth:`CallMedia.send_dtmf`) take the place of audio frames on the same SSRC
and sequence space; queued audio waits while an event plays.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections import deque
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from agent.base import (
    FADE_MS,
    Agent,
    AgentEvent,
    AgentOutput,
    CallInfo,
    DtmfEvent,
    HangupEvent,
    fade_out_gain,
)
from jitter import JitterBuffer, PlayoutBuffer
from resample import Resampler
from sip_bridge.logs import CALL_ID
from sip_bridge.media.call_recording import StereoRecorder
from sip_bridge.media.dtmf import DtmfDigit, DtmfOutbox, DtmfReceiver
from sip_bridge.media.media_clock import GRID_S, ClockedCall, MediaClock, TxFrame, media_clock
from sip_bridge.media.media_io import (
    AudioRtpSender,
    MediaSocket,
    PolledSocket,
    RtpLease,
    RtpProtocol,
    reserve_rtp_port,
)
from sip_bridge.media.media_params import MediaParams, MediaStats, delay_figures
from sip_bridge.media.media_rtcp import RtcpLink, RtcpPeerStats, bind_rtcp
from sip_bridge.media.pacer import Pacer, next_tick
from sip_bridge.media.rtcp import NTP_UNIX_OFFSET
from sip_bridge.media.rtcp_session import RtcpSession
from sip_bridge.media.rtp import looks_like_rtcp
from sip_bridge.media.rtp_ports import RtpPortPool
from sip_bridge.media.rtp_receiver import CODECS, RATE, RtpReceiver, addr_key
from sip_bridge.media.srtp import SrtpContext

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

_LEAD_FRAMES = 10  # a talkspurt's send phase may move earlier during its first frames only
_POP_LAG_S = 0.0002  # float slack: a pop on the grid point at due_s is not before it


class CallMedia(ClockedCall):
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
        self.on_caller_dtmf: Callable[[DtmfEvent], None] | None = None  # for call records
        self.recorder: StereoRecorder | None = None  # [records] recordings_dir: the WAV
        self.hangup_requested: str | None = None
        self.frame_samples = RATE * params.ptime_ms // 1000
        self.jb = JitterBuffer(
            RATE, params.ptime_ms, params.jitter_min_ms, params.jitter_max_ms, follows_due=True
        )
        pt = params.telephone_event_pt
        dtmf = None if pt is None else DtmfReceiver(pt, RATE)
        remote = addr_key(params.remote_host, params.remote_port)
        self.receiver = RtpReceiver(self.jb, self.codec, params.payload_type, remote)
        self.receiver.latch = params.latch
        self.receiver.dtmf = dtmf
        self.receiver.on_accepted = self._on_rtp_accepted
        self.cname = cname or f"sip-bridge@{socket.gethostname()}"
        # SDES-SRTP: every datagram in is unprotected (or dropped) first, every one out
        # protected last; None for plain RTP, so those calls pay one test per packet.
        self.srtp: SrtpContext | None = None if params.srtp is None else SrtpContext(params.srtp)
        self._rtcp_rand = rtcp_rand  # tests pass a constant for a predictable schedule
        self.rtcp: RtcpLink | None = None  # from start()
        self._rtcp_transport: asyncio.DatagramTransport | None = None
        rate = agent.sample_rate
        self.up = Resampler(RATE, rate) if rate != RATE else None
        self.down = Resampler(rate, RATE) if rate != RATE else None
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
        self.sock: MediaSocket | None = None  # the RTP socket, read by the clock
        self._frame_s = params.ptime_ms / 1000.0
        self.rx_due = 0.0  # when the jitter buffer is next popped (see next_tick)
        self._agent_step = rate * params.ptime_ms // 1000  # agent samples per frame
        self._pending: list[NDArray[np.int16]] = []  # agent audio not yet downsampled
        self._pending_samples = 0
        self._talking = False
        self.wake_pending = False  # a talkspurt waits for the clock (not started, DTMF)
        self._spurt_t: float | None = None  # when the waiting talkspurt's audio was written
        self._spurt_go = False  # the frame being sent starts a talkspurt
        self._spurt_pkt = 0  # packets sent before the talkspurt began
        self._held = False  # the due frame waits for the receive pop (see _holds)
        self.hold_s = GRID_S  # how far a frame may wait for its pop: the clock's tick
        self.first_frame_delays: deque[float] = deque(maxlen=1000)  # s, write -> sendto
        self._pop_wait = [0.0, 0]  # sum of (pop time - due_s) in seconds, pops counted
        self.closed = False

    # -- description and stats --------------------------------------------------------------

    def describe(self) -> str:
        """The chain as one line, built from the configured stages in the order the code
        runs them: each packet is decoded as it arrives (``rtp_receiver``) and the jitter
        buffer holds audio; each frame is encoded as it leaves the paced playout buffer."""
        p = self.params
        codec = self.codec.name
        stages = [
            "RTP in",
            f"G711Decode({codec})",
            f"JitterBuffer(adaptive {p.jitter_min_ms:g}..{p.jitter_max_ms:g} ms)",
        ]
        if self.up is not None:
            stages.append(f"Resample({_khz(self.up.in_rate)}->{_khz(self.up.out_rate)})")
        stages.append(f"Agent({self.agent.name})")
        if self.down is not None:
            stages.append(f"Resample({_khz(self.down.in_rate)}->{_khz(self.down.out_rate)})")
        stages += [f"PlayoutBuffer({self.playout.frame_ms} ms)", f"G711Encode({codec})", "RTP out"]
        return " -> ".join(stages)

    @property
    def local_port(self) -> int:
        if self._lease is None:
            raise RuntimeError("not started")
        return self._lease.port

    @property
    def stats(self) -> MediaStats:
        srtp = self.srtp
        return MediaStats(
            local_port=self._lease.port if self._lease else 0,
            **self.receiver.counters(),
            **self.pacer.figures(),
            dtmf_digits=self.dtmf_digits,
            dtmf_digits_sent=self.dtmf_out.sent_digits if self.dtmf_out is not None else 0,
            packets_out=self.sender.packet_count,
            octets_out=self.sender.octet_count,
            send_errors=self.send_errors + (self.sock.send_errors if self.sock else 0),
            jitter=self.jb.stats,
            playout_underrun_frames=self.playout.underrun_frames,
            playout_queued_ms=self.playout.queued_ms,
            agent_errors=self.agent_errors,
            rtcp=self.rtcp.stats if self.rtcp is not None else RtcpPeerStats(),
            sending=self.params.send,
            receiving=self.params.receive,
            pop_after_due_ms=1000.0 * self._pop_wait[0] / max(1, self._pop_wait[1]),
            **delay_figures(self.first_frame_delays),
            srtp_protected=srtp.protected if srtp is not None else 0,
            srtp_unprotected=srtp.unprotected if srtp is not None else 0,
            srtp_auth_fail=srtp.auth_fail if srtp is not None else 0,
            srtp_replay=srtp.replay if srtp is not None else 0,
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
        self.rtcp = RtcpLink(session, p.rtcp_remote, mux=p.rtcp_mux, latch=p.latch)
        self.rtcp.srtp = self.srtp
        self.receiver.on_accepted = session.on_rtp_received  # one call less per packet
        self.receiver.on_event_packet = session.on_event_received
        try:
            if not p.rtcp_mux:
                self._rtcp_transport = await bind_rtcp(self._lease.transport, self.rtcp)
            await self.agent.start(self.call, self.output)
        except BaseException:
            self._close_sockets()
            raise
        self.sock = PolledSocket(self._lease.transport)
        self._clock = media_clock()
        t0 = self._clock.add(self)
        self.rx_due = t0
        self.pacer.start(t0)
        if self.wake_pending:  # the agent spoke in start(): now it can go out
            self._start_talkspurt()
        return self._lease.port

    def _close_sockets(self) -> None:
        if self.sock is not None:
            self.sock.close()
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
        remote = addr_key(params.remote_host, params.remote_port)
        moved = remote != addr_key(old.remote_host, old.remote_port)
        if moved or params.latch != old.latch:
            r.remote = r.signalled = remote
            r.latch, r.latched = params.latch, False  # re-latch on the new stream
        if self.rtcp is not None and (
            moved or params.rtcp_remote != old.rtcp_remote or params.rtcp_mux != old.rtcp_mux
        ):
            self.rtcp.retarget(params.rtcp_remote, mux=params.rtcp_mux, latch=params.latch)
        if params.send and not old.send:
            self.sender.start_talkspurt()  # resuming after hold: marker bit
        self.params = params
        log.info("media updated: remote %s, send %s, receive %s", r.remote, params.send,
                 params.receive)  # fmt: skip

    def _dtmf_outbox(self, p: MediaParams) -> DtmfOutbox | None:
        """The call's RFC 4733 sender for ``p``; None when telephone-event is not negotiated."""
        pt = p.dtmf_send_pt
        return None if pt is None else DtmfOutbox.on(self.sender, pt, RATE, p.ptime_ms)

    async def close(self, reason: str = "") -> None:
        """Leave the clock, tell the agent the call is over, free the port (idempotent)."""
        if self.closed:
            return
        self.closed = True
        started = self._clock is not None
        if self._clock is not None:
            self._clock.remove(self)
        if self.rtcp is not None and started:
            self._send_rtcp(self.rtcp.bye(asyncio.get_running_loop().time(), reason or None))
        if self._rtcp_transport is not None:
            self._rtcp_transport.close()
        if self.sock is not None:
            self.sock.close()
        if self.receiver.dtmf is not None:
            self._deliver_digits(self.receiver.dtmf.flush())
        try:
            self._event_to_agent(HangupEvent(reason))
            await self.agent.stop()
        finally:
            if self._lease is not None:
                await self._lease.aclose()

    # -- receive path -----------------------------------------------------------------------

    def on_datagram(self, data: bytes, addr: tuple[str, int], now: float | None = None) -> None:
        if self.closed:
            return
        if now is None:
            now = asyncio.get_running_loop().time()
        if self.srtp is not None:
            clear = self.srtp.unprotect(data)
            if clear is None:
                return  # failed authentication or replay (counted): never latched on
            data = clear
        if self.params.receive and self.receiver.take_audio(data, addr, now):
            return  # the common packet: audio from the peer (no digits, never RTCP)
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
            event = DtmfEvent(d.digit, d.duration_ms)
            # the record first: it reads the agent's state the key was typed in (a key that
            # ends a sensitive slot's entry is masked; the agent leaves the slot on it)
            if self.on_caller_dtmf is not None:
                self.on_caller_dtmf(event)
            self._event_to_agent(event)

    def _event_to_agent(self, event: AgentEvent) -> None:
        token = CALL_ID.set(self.call.call_id)  # the clock serves every call: say which
        try:
            self.agent.on_event(event)
        except Exception:
            self.agent_errors += 1
            log.exception("agent %s failed on %r", self.agent.name, event)
        finally:
            CALL_ID.reset(token)

    # -- the clock's stages (see sip_bridge.media.media_clock) -------------------------------------

    def rx_pop(self) -> NDArray[np.int16]:
        """One frame for the tick at ``rx_due`` (silence too, so samples are a clock)."""
        t = self.rx_due
        clock = self._clock
        now = clock.loop.time() if clock is not None else t
        if self.sock is not None and clock is not None and clock.poller is None:
            for data, addr, arrival in self.sock.drain(now):
                self.on_datagram(data, addr, arrival)
        if self.receiver.dtmf is not None:  # a key whose End packets were lost
            self._deliver_digits(self.receiver.dtmf.expire(now))
        if now - t > 1.0:
            t = now  # the loop stalled for a second: do not replay every missed tick
        jb = self.jb
        due = jb.due_s
        frame = jb.pop(t)
        if due is not None:
            wait = self._pop_wait
            wait[0] += now - due
            wait[1] += 1
        # Pops happen on the first wake-up at or after _rx_t: keep it on the grid, so the
        # buffer is told when it really pops, and no lag adds to the grid's own 0..5 ms.
        nxt = next_tick(t, self._frame_s, jb.due_s, lag_s=_POP_LAG_S)
        self.rx_due = clock.grid_at_or_after(nxt) if clock is not None else nxt
        if self.recorder is not None:
            self.recorder.caller(frame)
        return frame

    def _flush(self, fade: NDArray[np.float64] | None = None) -> float:
        """Barge-in: drop queued agent audio and digits; returns the ms dropped. ``fade``:
        the next ``fade.size`` samples (8 kHz) play faded by it first (the agent's
        :meth:`~agent.base.AgentOutput.fade_out`); what they need of the audio not yet
        resampled is moved into the playout buffer before the rest is dropped."""
        if fade is not None:
            self._drain_upto(int(fade.size))
        pending_ms = 1000.0 * self._pending_samples / self.agent.sample_rate
        self._pending.clear()
        self._pending_samples = 0
        if self.down is not None:
            self.down.reset()
        if self.dtmf_out is not None:
            self.dtmf_out.clear()
        self._spurt_t = None
        return self.playout.flush(fade) + pending_ms

    def _drain_upto(self, samples: int) -> None:
        """Move pending agent audio into the playout buffer until it holds ``samples``
        (only what a fade needs: resampling seconds of a reply to drop them is waste)."""
        down, step = self.down, self._agent_step
        while self._pending and self.playout.queued_samples < samples:
            a = self._pending.pop(0)
            self._pending_samples -= a.size
            if down is None:
                self.playout.write(a)
                continue
            for i in range(0, a.size, step):
                self.playout.write(down.process(a[i : i + step]))

    def rx_deliver(self, pcm: NDArray[np.int16]) -> None:
        # what the agent logs, and the tasks it starts (a reply), are this call's
        token = CALL_ID.set(self.call.call_id)
        try:
            self.agent.on_audio(pcm)
        except Exception:
            self.agent_errors += 1
            if self.agent_errors <= 3:
                log.exception("agent %s failed on audio", self.agent.name)
        finally:
            CALL_ID.reset(token)

    def _write(self, pcm: NDArray[np.int16]) -> None:
        """Queue agent audio; the clock downsamples it (batched) before the next send."""
        a = np.asarray(pcm)
        if a.dtype != np.int16 or a.ndim != 1:
            raise ValueError("agent audio must be a 1-D int16 array")
        if not a.size:
            return
        self._pending.append(a)
        self._pending_samples += a.size
        if self._talking:
            return
        if self._spurt_t is None:
            self._spurt_t = time.monotonic()
        if self._queued() >= self.frame_samples:
            self._start_talkspurt()

    def _queued(self) -> float:
        """Samples (8 kHz) queued for sending, downsampled or not yet."""
        return self.playout.queued_samples + self._pending_samples * RATE / self.agent.sample_rate

    def _start_talkspurt(self) -> None:
        """Send a talkspurt's first frame now, not on the next grid point: the latency budget
        gives playout pacing 1 ms. The call's grid restarts on the clock's grid next to it
        (:meth:`MediaClock.grid_after_write`), so the rest follows 20 ms apart."""
        clock = self._clock
        if clock is None or self.closed or (self.dtmf_out is not None and self.dtmf_out.busy):
            self.wake_pending = True  # the clock (or start()) sends it when it can
            return
        self.wake_pending = False
        now = clock.loop.time()
        self.drain_pending()
        g = clock.grid_after_write(now, self.playout.queued_samples >= 2 * self.frame_samples)
        self.pacer.rephase(g)
        self.tx_tick(g, max(now, g))

    def pending_frame(self) -> NDArray[np.int16] | None:
        p = self._pending
        if len(p) == 1 and p[0].size == self._agent_step and self.down is not None:
            return p[0]
        return None

    def take_downsampled(self, frame: NDArray[np.int16]) -> None:
        self._pending.clear()
        self._pending_samples = 0
        self.playout.write(frame, copy=False)  # a row of a fresh array: ours alone

    def drain_pending(self) -> None:
        """Pending agent audio into the playout buffer, one frame at a time: the
        resampler's fast path is keyed on the chunk length, and a long TTS burst as one
        chunk costs milliseconds to seconds (measured)."""
        if not self._pending:
            return
        down, step = self.down, self._agent_step
        for a in self._pending:
            if down is None:
                self.playout.write(a)
                continue
            for i in range(0, a.size, step):
                self.playout.write(down.process(a[i : i + step]))
        self._pending.clear()
        self._pending_samples = 0

    def tx_tick(self, t: float, now: float, batch: list[TxFrame] | None = None) -> bool:
        """Send the frames due at grid time ``t`` (``now`` >= t); audio frames go into
        ``batch`` for the clock to encode for all calls at once (:meth:`send_audio`).
        False: the frame is held for the receive pop that produces it (:meth:`_holds`)."""
        if self.dtmf_out is not None and self.dtmf_out.busy:
            batch = None  # event packets hold sequence numbers: send strictly in order
        elif self.wake_pending and not self._talking:
            self.wake_pending = False  # a talkspurt that could not start in the write
            if self._queued() >= self.frame_samples:
                self.pacer.rephase(t)
        elif self._holds(t, now):
            self._held = True
            return False
        pacer = self.pacer
        if self._held:
            self._held = False
            if t > pacer.next_deadline + 1e-6:  # held into a later tick: follow the producer
                self._send_frame(self.receiver.remote, now, batch)
                pacer.follow(t, now)
                return True
        skip, deadlines = pacer.poll(now + 1e-6)
        if skip:
            for _ in range(skip):  # keep audio in step with the clock after a stall
                self.playout.pop()
            self.sender.skip(skip * self.frame_samples)
        dest = self.receiver.remote
        for _ in deadlines:
            self._send_frame(dest, now, batch)
        return True

    def after_pop(self, t: float) -> None:
        """After a pop at grid time t, early in a talkspurt: a frame it wrote goes out on the
        next tick. Why: the pops settle onto the peer's packets (the jitter buffer's due_s)
        after the talkspurt began; the send phase follows them earlier. Only early on: each
        move sends a frame sooner than its timestamp says, and two such calls facing each
        other (an echo called by a player) would otherwise speed each other up for good."""
        if (
            not self._talking
            or self.sender.packet_count - self._spurt_pkt >= _LEAD_FRAMES
            or (self.dtmf_out is not None and self.dtmf_out.busy)
        ):
            return
        nxt = t + self.hold_s
        q = self._queued()
        if (
            nxt + 1e-6 < self.pacer.next_deadline
            and self.frame_samples <= q < 2 * self.frame_samples
        ):
            self.pacer.rephase(nxt)

    def _holds(self, t: float, now: float) -> bool:
        """Whether a talking call's due frame waits for its receive pop (the frame goes out
        on the tick after the pop) instead of going out as an underrun. Why: an echo (or
        any agent that answers each frame it hears) writes in the pop; a slot on the pop's
        tick, a pop the jitter buffer nudged later, or pops late behind a load peak would
        otherwise cut a hole of silence and a double frame into the stream. The held frame
        moves the call's grid (:meth:`Pacer.follow`): the send phase settles one tick
        behind the producer."""
        if not self._talking or self._queued() >= self.frame_samples:
            return False
        d = self.pacer.next_deadline
        if self.rx_due <= now + 1e-6:  # the pop is due: it comes on this tick or a next one
            return t < d + self._frame_s - self.hold_s + 1e-6
        return t < d + self.hold_s - 1e-6 and self.rx_due <= t + self.hold_s + 1e-6

    def rtcp_tick(self, now: float) -> None:
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
                self._send_rtp(data, dest, now, 4, int.from_bytes(data[4:8], "big"))
                if self.recorder is not None:
                    self.recorder.agent_silence(self.frame_samples)
                return
        has_audio = self.playout.queued_samples > 0
        if has_audio and not self._talking:
            self.sender.start_talkspurt()
            self._spurt_pkt = self.sender.packet_count
            self._spurt_go = self._spurt_t is not None
        self._talking = has_audio
        frame = self.playout.pop()
        if self.recorder is not None:
            self.recorder.agent(frame)
        if not self.params.send:  # on hold: the clock runs on, nothing goes out
            self.sender.skip(self.frame_samples)  # and the first packet after has the marker
            self._spurt_go = False
            self._spurt_t = None
            return
        if batch is not None:
            batch.append((self, frame, dest))
        else:
            self.send_audio(self.codec.encode(frame).tobytes(), dest, now)

    def send_audio(self, payload: bytes, dest: tuple[str, int], now: float) -> None:
        sender = self.sender
        ts = sender.timestamp  # what the packet carries (no need to parse it back)
        self._send_rtp(sender.next_packet(payload, self.frame_samples), dest, now, len(payload), ts)
        if self._spurt_go and self._spurt_t is not None:
            self.first_frame_delays.append(time.monotonic() - self._spurt_t)
            self._spurt_go, self._spurt_t = False, None

    def _send_rtp(self, data: bytes, dest: tuple[str, int], now: float, size: int, ts: int) -> None:
        """One RTP packet out, SRTP-protected on an SRTP call, counted for RTCP (``size``:
        its payload octets, ``ts``: its timestamp); nothing while the peer holds us."""
        if not self.params.send:
            return
        sock = self.sock
        assert sock is not None
        if self.srtp is None:
            sock.sendto(data, dest)
        else:
            self.srtp.send(sock, data, dest)
        if self.rtcp is not None:
            self.rtcp.session.on_rtp_sent(len(data), size, ts, now)

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
        if self.srtp is not None:
            protected = self.srtp.protect_rtcp(data)
            if protected is None:
                return
            data = protected
        send = self.sock.sendto if self.sock is not None else self._lease.transport.sendto
        if link.mux:
            send(data, self.receiver.remote)
        elif self._rtcp_transport is not None:
            self._rtcp_transport.sendto(data, link.remote)
        else:
            send(data, link.remote)


class MediaOutput(AgentOutput):
    """The agent's output into one call's send chain."""

    def __init__(self, media: CallMedia) -> None:
        self._media = media

    def write(self, pcm: NDArray[np.int16]) -> None:
        self._media._write(pcm)

    def flush(self) -> float:
        return self._media._flush()

    def fade_out(self, ms: float = FADE_MS) -> float:
        rate = self._media.playout.rate
        return self._media._flush(fade_out_gain(round(rate * ms / 1000)))

    def queued_ms(self) -> float:
        return 1000.0 * self._media._queued() / self._media.playout.rate

    def send_dtmf(self, digits: str) -> None:
        self._media.send_dtmf(digits)

    def hangup(self, reason: str = "") -> None:
        self.emit(HangupEvent(reason))

    def emit(self, event: AgentEvent) -> None:
        m = self._media
        if isinstance(event, HangupEvent) and m.hangup_requested is None:
            m.hangup_requested = event.reason
        if m.on_agent_event is not None:
            m.on_agent_event(event)


def _khz(rate: int) -> str:
    return f"{rate / 1000:g}k"

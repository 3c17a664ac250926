"""The call-script runner's side of a call: SIP signalling and packet-level RTP (asyncio).

Why its own RTP instead of :class:`~sip_bridge.media.call_media.CallMedia` (what ``sip-bridge call``
uses): the figures a script reports are measured at the socket, packet by packet, as a
caller's phone would perceive them (a jitter buffer and resampler in between would add
their delay to every figure), and the caller's line is simulated on the packets it sends:
bursty loss and jitter (:class:`~sip_bridge.script.line_sim.PacketSchedule`) and line echo of
what it hears (:class:`~sip_bridge.script.line_sim.LineEcho`).

:class:`SipLeg` drives one :class:`~sip_bridge.sip.uac.OutboundCall` (the same UAC as
``sip-bridge call``) and hands its events to the owner; :class:`ScriptLeg` adds the RTP:
the caller's audio and RFC 4733 keys (:class:`~sip_bridge.media.dtmf.DtmfOutbox`, or SIP INFO)
go out paced on a 20 ms clock, and every received frame is put into a
:class:`~sip_bridge.script.heard_audio.HeardAudio` with its arrival time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from resample.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from sip_bridge.media.dtmf import DtmfOutbox, DtmfSender
from sip_bridge.media.rtp import RtpPacket, RtpSender, looks_like_rtcp
from sip_bridge.script.heard_audio import SPEECH_DBFS, HeardAudio, frame_dbfs
from sip_bridge.script.line_sim import LineEcho, PacketSchedule
from sip_bridge.script.script_actions import CallerTiming
from sip_bridge.sip.offer_answer import MediaConfig, NegotiatedMedia
from sip_bridge.sip.transaction import SendMessage
from sip_bridge.sip.transport import Received, SipTransport, next_item
from sip_bridge.sip.uac import (
    CallAnswered,
    CallEnded,
    CallFailed,
    OutboundCall,
    UacEvent,
    UacState,
)

__all__ = ["FRAME", "LineOptions", "ScriptLeg", "SipLeg", "media_config"]

log = logging.getLogger(__name__)

FRAME = 160  # 20 ms at 8 kHz
_FRAME_S = 0.02


@dataclass(frozen=True)
class LineOptions:
    """The caller's line: codec, level of its speech, and what the network and the line
    do to it. ``seed`` makes loss and jitter repeatable."""

    codec: str = "PCMU"
    level_dbfs: float = -20.0
    loss_pct: float = 0.0
    jitter_ms: float = 0.0
    echo_erl_db: float | None = None
    echo_delay_ms: float = 60.0
    seed: int = 0

    def describe(self) -> str:
        echo = (
            "no echo"
            if self.echo_erl_db is None
            else f"echo ERL {self.echo_erl_db:g} dB at {self.echo_delay_ms:g} ms"
        )
        return (
            f"{self.codec}, {self.level_dbfs:g} dBFS, loss {self.loss_pct:g} % (bursty), "
            f"jitter {self.jitter_ms:g} ms, {echo}"
        )


class SipLeg:
    """One outbound call's signalling: an :class:`OutboundCall` on its own UDP transport.

    ``on_event`` sees every call event (answered, progress, REFER, ended...) in order.
    """

    def __init__(
        self,
        target: str,
        destination: tuple[str, int],
        media: MediaConfig,
        on_event: Callable[[UacEvent], None],
        *,
        answer_timeout_s: float = 20.0,
        user: str = "sip-bridge-script",
    ) -> None:
        self.target = target
        self.destination = destination
        self.media = media
        self.on_event = on_event
        self.answer_timeout_s = answer_timeout_s
        self.user = user
        self.uac: OutboundCall | None = None
        self.answered: CallAnswered | None = None
        self.failed: CallFailed | None = None
        self.ended: CallEnded | None = None
        self.done = asyncio.Event()  # failed or ended
        self._sip: SipTransport | None = None
        self._inbox: asyncio.Queue[Received | tuple[str, ...]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._sip = SipTransport(self._inbox.put_nowait)
        await self._sip.start(self.media.address, 0, ("udp",))
        assert self._sip.local is not None
        self.uac = OutboundCall(
            self.target,
            self._sip.local,
            self.destination,
            self.media,
            answer_timeout_s=self.answer_timeout_s,
            user=self.user,
        )
        self._task = asyncio.get_running_loop().create_task(self._run())

    def command(self, *item: str) -> None:
        """``("hangup",)``, ``("info", DIGIT, MS)``, ``("notify", STATUS, REASON)``."""
        self._inbox.put_nowait(item)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        uac, sip = self.uac, self._sip
        assert uac is not None and sip is not None
        events = uac.start(loop.time())
        while True:
            for ev in events:
                if isinstance(ev, SendMessage):
                    sip.send_nowait(ev.data, ev.destination, ev.transport)
                    continue
                if isinstance(ev, CallAnswered):
                    self.answered = ev
                elif isinstance(ev, CallFailed):
                    self.failed = ev
                elif isinstance(ev, CallEnded):
                    self.ended = ev
                try:
                    self.on_event(ev)
                except Exception:  # the owner's bug must not stop the signalling
                    log.exception("call event handler failed on %r", ev)
                if isinstance(ev, CallFailed | CallEnded):
                    self.done.set()
            deadline = uac.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - loop.time())
            item = await next_item(self._inbox, timeout)
            now = loop.time()
            events = []
            try:
                if isinstance(item, Received) and item.data is not None:
                    events = uac.receive(item.data, item.source, now)
                elif item == ("hangup",):
                    events = uac.hangup(now)
                elif isinstance(item, tuple) and item[0] == "info":
                    if uac.state is UacState.CONFIRMED:
                        events = uac.send_dtmf_info(item[1], now, int(item[2]))
                elif isinstance(item, tuple) and item[0] == "notify":
                    events = uac.notify_refer(int(item[1]), item[2], now)
            except RuntimeError as exc:  # a command that no longer fits the call's state
                log.debug("call command %r not applied: %s", item, exc)
            events += uac.tick(now)

    async def hangup(self, timeout_s: float = 5.0) -> None:
        """CANCEL or BYE, and wait (a little) for it to be answered."""
        if self.uac is not None and not self.done.is_set():
            self.command("hangup")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), timeout_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._sip is not None:
            await self._sip.close()


class _Rtp(asyncio.DatagramProtocol):
    def __init__(self, on_packet: Callable[[bytes, tuple[str, int]], None]) -> None:
        self.on_packet = on_packet

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.on_packet(data, addr)

    def error_received(self, exc: Exception) -> None:
        log.debug("RTP socket: %s", exc)


@dataclass
class _Outgoing:
    """A step's audio or keys on their way out."""

    step: int
    frames: list[NDArray[np.int16]]
    loud: list[bool]
    dtmf: DtmfOutbox | None = None
    digits: int = 0
    sent: int = 0
    start: float | None = None
    onset: float | None = None
    end: float | None = None


class ScriptLeg:
    """The caller's RTP for a :class:`SipLeg`: sends paced frames with the line's loss,
    jitter and echo; records what it receives in ``heard``.

    ``on_sent(step, timing)`` is called when a step's audio or keys have all gone out.
    """

    def __init__(
        self,
        host: str,
        line: LineOptions,
        heard: HeardAudio,
        on_sent: Callable[[int, CallerTiming], None],
    ) -> None:
        self.host = host
        self.line = line
        self.heard = heard
        self.on_sent = on_sent
        self.port = 0
        self.schedule = PacketSchedule(line.loss_pct, line.jitter_ms, line.seed)
        self.echo = (
            None if line.echo_erl_db is None else LineEcho(line.echo_erl_db, line.echo_delay_ms)
        )
        self._encode = ulaw_encode if line.codec == "PCMU" else alaw_encode
        self._transport: asyncio.DatagramTransport | None = None
        self._media: NegotiatedMedia | None = None
        self._remote: tuple[str, int] | None = None
        self._rtp: RtpSender | None = None
        self._queue: list[_Outgoing] = []
        self._task: asyncio.Task[None] | None = None
        self._t_start = 0.0
        self._timers: list[asyncio.TimerHandle] = []
        self.sent_packets = 0
        self.lost_packets = 0

    async def open(self) -> int:
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Rtp(self._on_packet), local_addr=(self.host, 0), family=family
        )
        self._transport = transport
        self.port = int(transport.get_extra_info("sockname")[1])
        return self.port

    def start(self, media: NegotiatedMedia) -> None:
        """The call is answered: send to where the answer says, from now on."""
        self.update(media)
        self._rtp = RtpSender(media.payload_type)
        self._t_start = asyncio.get_running_loop().time()
        self._task = asyncio.get_running_loop().create_task(self._send_loop())

    def update(self, media: NegotiatedMedia) -> None:
        self._media = media
        self._remote = (media.remote_address, media.remote_port)

    # ------------------------------------------------------------------ out
    def say(self, step: int, pcm: NDArray[np.int16]) -> None:
        pad = (-pcm.size) % FRAME
        audio = np.concatenate([pcm, np.zeros(pad, np.int16)]) if pad else pcm
        frames = list(audio.reshape(-1, FRAME)) or [np.zeros(FRAME, np.int16)]
        loud = [frame_dbfs(f) > SPEECH_DBFS for f in frames]
        self._queue.append(_Outgoing(step, frames, loud))

    def dtmf(self, step: int, digits: str, method: str, duration_ms: int, gap_ms: int,
             sip: SipLeg) -> None:  # fmt: skip
        """Keys as RFC 4733 events (when the answer has telephone-event) or SIP INFO."""
        media, rtp = self._media, self._rtp
        if method == "rfc4733" and media is not None and media.telephone_event_pt is not None:
            assert rtp is not None
            sender = DtmfSender(rtp, media.telephone_event_pt, ptime_ms=20)
            box = DtmfOutbox(sender, FRAME, duration_ms=duration_ms, gap_ms=gap_ms)
            box.add(digits)
            self._queue.append(_Outgoing(step, [], [], dtmf=box, digits=len(digits)))
            return
        loop = asyncio.get_running_loop()
        start = loop.time()
        every = (duration_ms + gap_ms) / 1000.0
        for i, digit in enumerate(digits):
            self._timers.append(
                loop.call_later(i * every, sip.command, "info", digit, str(duration_ms))
            )
        done = start + (len(digits) - 1) * every
        timing = CallerTiming(start, None, None, done)
        self._timers.append(loop.call_later(done - start + 0.001, self.on_sent, step, timing))

    async def _send_loop(self) -> None:
        loop = asyncio.get_running_loop()
        k = 0
        silence = np.zeros(FRAME, np.int16)
        while True:
            t_send = self._t_start + (k + 1) * _FRAME_S
            await asyncio.sleep(max(0.0, t_send - loop.time()))
            now = loop.time()
            out = self._queue[0] if self._queue else None
            datagram: bytes | None = None
            if out is not None and out.dtmf is not None:
                datagram = out.dtmf.next_packet()
                if out.start is None and datagram is not None:
                    out.start = now
                if datagram is not None and out.dtmf.sent_digits >= out.digits:
                    self._queue.pop(0)
                    self.on_sent(out.step, CallerTiming(out.start or now, None, None, now))
            if datagram is None:
                frame = silence
                if out is not None and out.dtmf is None:
                    frame = out.frames[out.sent]
                    if out.start is None:
                        out.start = now
                    if out.loud[out.sent]:
                        out.onset = out.onset or now
                        out.end = now
                    out.sent += 1
                    if out.sent >= len(out.frames):
                        self._queue.pop(0)
                        self.on_sent(out.step, CallerTiming(out.start, out.onset, out.end, now))
                datagram = self._audio_packet(frame, k)
            self._send(datagram)
            k += 1

    def _audio_packet(self, frame: NDArray[np.int16], k: int) -> bytes:
        assert self._rtp is not None
        if self.echo is not None:
            mixed = frame.astype(np.float64) + self.echo.echo(k * FRAME, FRAME)
            frame = np.clip(np.rint(mixed), -32768, 32767).astype(np.int16)
        return self._rtp.next_packet(self._encode(frame).tobytes(), FRAME)

    def _send(self, datagram: bytes) -> None:
        if self._transport is None or self._remote is None:
            return
        if self._media is not None and not self._media.can_send:
            return
        self.sent_packets += 1
        delay = self.schedule.next()
        if delay is None:
            self.lost_packets += 1
        elif delay <= 0.0005:
            self._transport.sendto(datagram, self._remote)
        else:
            loop = asyncio.get_running_loop()
            self._timers.append(loop.call_later(delay, self._send_late, datagram, self._remote))
        if len(self._timers) > 256:
            self._timers = [t for t in self._timers if not t.cancelled()][-64:]

    def _send_late(self, datagram: bytes, remote: tuple[str, int]) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.sendto(datagram, remote)

    # ------------------------------------------------------------------ in
    def _on_packet(self, data: bytes, addr: tuple[str, int]) -> None:
        media = self._media
        if media is None or looks_like_rtcp(data):
            return
        try:
            pkt = RtpPacket.parse(data)
        except ValueError:
            return
        if pkt.payload_type != media.payload_type or not pkt.payload:
            return  # telephone-events, comfort noise: not audio to hear
        pcm = (ulaw_decode if media.codec == "PCMU" else alaw_decode)(pkt.payload)
        now = asyncio.get_running_loop().time()
        self.heard.add(now, pcm)
        if self.echo is not None:
            self.echo.heard(now - self._t_start, pcm)

    async def close(self) -> None:
        for t in self._timers:
            t.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._transport is not None:
            self._transport.close()


def media_config(host: str, rtp_port: int, codec: str) -> MediaConfig:
    """What the caller offers: one G.711 codec, RFC 4733 telephone-event, plain RTP."""
    return MediaConfig(host, rtp_port, codecs=(codec,), telephone_event=True, srtp="off")

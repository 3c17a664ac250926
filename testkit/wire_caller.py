"""A caller that talks and listens packet by packet, so turn latency is measured on the wire.

`sip-bridge call` records what it hears through its own jitter buffer and resampler, which
adds their delay to whatever is measured. This caller keeps the send time of every RTP
packet it sends and the arrival time of every packet it receives, with each payload's
level: "end of the caller's speech" is the last sent packet with speech energy and "start of
the reply" the first received one, both at the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from resample.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from sip_bridge.media.dtmf import DtmfOutbox
from sip_bridge.media.rtp import RtpPacket, RtpSender, looks_like_rtcp
from sip_bridge.sip.offer_answer import MediaConfig
from sip_bridge.sip.transaction import SendMessage
from sip_bridge.sip.transport import Received, SipTransport, next_item
from sip_bridge.sip.uac import OutboundCall
from sip_bridge.sip.uac_events import CallAnswered, CallEnded, CallFailed, ReferReceived, UacEvent
from testkit.line_echo import LineEcho
from testkit.transferee import ReferableCall, Transferee

__all__ = ["SPEECH_DBFS", "WireCaller", "level_dbfs"]

FRAME = 160
SPEECH_DBFS = -45.0  # a packet louder than this carries speech (G.711 idle is ~-70)


def level_dbfs(pcm: NDArray[np.int16]) -> float:
    rms = float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) if pcm.size else 0.0
    return float(20 * np.log10(max(rms, 1e-3) / 32768))


class LineEchoPath(Protocol):
    def process(self, sent: NDArray[np.int16]) -> NDArray[np.float64]: ...


@dataclass
class WireLog:
    sent: list[tuple[float, float]] = field(default_factory=list)  # (loop time, dBFS)
    received: list[tuple[float, float]] = field(default_factory=list)
    heard: list[NDArray[np.int16]] = field(default_factory=list)  # received audio, in order
    keys: list[tuple[float, str]] = field(default_factory=list)  # (last packet sent, key)


class _Rtp(asyncio.DatagramProtocol):
    def __init__(self, caller: WireCaller) -> None:
        self.caller = caller

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.caller._on_rtp(data)


class WireCaller:
    """One outbound call over loopback: `await connect()`, `say()`, watch `log`, `hangup()`."""

    def __init__(
        self,
        target: str,
        *,
        codec: str = "PCMU",
        host: str = "127.0.0.1",
        echo_db: float | None = None,
        echo_delay_ms: int = 120,
        dtmf: bool = False,
        transferee: bool = False,
        line_echo: LineEchoPath | None = None,
    ) -> None:
        """``echo_db``: a line echo, what we hear sent back ``echo_delay_ms`` later this many
        dB down (a 2-wire hybrid's return loss), mixed into what we say. ``line_echo``: any
        echo path instead (e.g. testkit/line_echo.py's with a hybrid's colouring), fed every
        frame our phone plays and returning the echo of it, sample for sample. ``dtmf``:
        offer telephone-event, so :meth:`press` sends RFC 4733 keys. ``transferee``: follow
        a REFER (call the target, NOTIFY its progress; :attr:`transfer`)."""
        self.dtmf = dtmf
        self.transferee = transferee
        self.transfer: Transferee | None = None
        self._outbox: DtmfOutbox | None = None
        self._pressing: str | None = None
        self.target = target
        # the echo: what we hear, placed by RTP timestamp on our own sample clock, 60 ms
        # behind and deeper after a late packet (a phone's jitter buffer): the echo's
        # delay then stays what it is, whatever the packets' arrival jitter
        self._playout: dict[int, NDArray[np.int16]] = {}  # frame index on our clock
        self._ts0: int | None = None
        self._frame0 = 0
        self._sent_frames = 0
        if line_echo is None and echo_db is not None:  # a flat echo path
            line_echo = LineEcho(echo_db, echo_delay_ms, colour=None)
        self._line_echo = line_echo
        self.codec = codec
        self.host = host
        self.log = WireLog()
        self._queue: deque[NDArray[np.int16]] = deque()
        self._sender = RtpSender(0 if codec == "PCMU" else 8)
        self._encode = ulaw_encode if codec == "PCMU" else alaw_encode
        self._decode = ulaw_decode if codec == "PCMU" else alaw_decode
        self._rtp: asyncio.DatagramTransport | None = None
        self._remote: tuple[str, int] | None = None
        self._uac: OutboundCall | None = None
        self._sip: SipTransport | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.answered = asyncio.Event()
        self.ended = asyncio.Event()
        self.status = 0

    @property
    def speaking(self) -> bool:
        return bool(self._queue)

    @property
    def pressing(self) -> bool:
        return self._outbox is not None and self._outbox.busy

    def press(self, keys: str) -> None:
        """Queue RFC 4733 key presses (100 ms each, 60 ms apart) on the caller's stream;
        each key's release (its first End packet) goes to ``log.keys``."""
        assert self._outbox is not None, "connect(dtmf=True) first"
        self._outbox.add(keys)

    async def press_all(self, keys: str) -> float:
        """Press them and wait until they are sent; the time the last key was released."""
        self.press(keys)
        while self.pressing:
            await asyncio.sleep(0.01)
        return self.log.keys[-1][0]

    def say(self, pcm8k: NDArray[np.int16]) -> None:
        """Queue audio; it leaves in 20 ms packets on the caller's clock."""
        pad = (-pcm8k.size) % FRAME
        a = np.concatenate([pcm8k, np.zeros(pad, np.int16)])
        self._queue.extend(a.reshape(-1, FRAME))

    async def say_all(self, pcm8k: NDArray[np.int16]) -> float:
        """Say it and wait until it is all sent; the send time of its last packet with
        speech (loop time): "the end of the caller's speech" on the wire."""
        self.say(pcm8k)
        while self.speaking:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # its last packet has left
        return max(t for t, db in self.log.sent if db > SPEECH_DBFS)

    async def wait_speech(self, since: float, timeout_s: float) -> float | None:
        """Arrival time of the first received packet with speech after ``since`` (loop
        time), or None if none came within ``timeout_s``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        seen = 0
        while True:
            rx = self.log.received
            for t, db in rx[seen:]:
                if t > since and db > SPEECH_DBFS:
                    return t
            seen = len(rx)
            if loop.time() >= end:
                return None
            await asyncio.sleep(0.005)

    async def wait_quiet(self, quiet_s: float, cap_s: float) -> float | None:
        """Until the far end has sent no speech for ``quiet_s`` (after having sent some):
        the arrival of its last speech packet, or None if it was still talking at ``cap_s``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + cap_s
        while loop.time() < end:
            last = max((t for t, db in self.log.received if db > SPEECH_DBFS), default=0.0)
            if last and loop.time() - last >= quiet_s:
                return last
            await asyncio.sleep(0.05)
        return None

    async def connect(self, dest: tuple[str, int], timeout_s: float = 30.0) -> None:
        loop = asyncio.get_running_loop()
        self._rtp, _ = await loop.create_datagram_endpoint(
            lambda: _Rtp(self), local_addr=(self.host, 0), family=socket.AF_INET
        )
        port = self._rtp.get_extra_info("sockname")[1]
        inbox: asyncio.Queue[Received | str] = asyncio.Queue()
        self._sip = SipTransport(inbox.put_nowait)
        await self._sip.start(self.host, 0, ("udp",))
        assert self._sip.local is not None
        media = MediaConfig(self.host, port, codecs=(self.codec,), telephone_event=self.dtmf)
        kind = ReferableCall if self.transferee else OutboundCall
        self._uac = kind(self.target, self._sip.local, dest, media)
        self._tasks.append(loop.create_task(self._signalling(inbox)))
        await asyncio.wait_for(self.answered.wait(), timeout_s)
        self._tasks.append(loop.create_task(self._send_loop()))

    async def _signalling(self, inbox: asyncio.Queue[Received | str]) -> None:
        loop = asyncio.get_running_loop()
        uac, sip = self._uac, self._sip
        assert uac is not None and sip is not None
        events = uac.start(loop.time())
        while True:
            for ev in events:
                if isinstance(ev, SendMessage):
                    sip.send_nowait(ev.data, ev.destination, ev.transport)
                elif isinstance(ev, CallAnswered):
                    self._remote = (ev.media.remote_address, ev.media.remote_port)
                    self.status = ev.response.status
                    pt = ev.media.telephone_event_pt
                    if self.dtmf and pt is not None:
                        self._outbox = DtmfOutbox.on(self._sender, pt, 8000, 20)
                    self.answered.set()
                elif isinstance(ev, CallFailed | CallEnded):
                    self.status = getattr(ev, "status", self.status)
                    self.ended.set()
                    self.answered.set()  # wake connect(); status tells
                elif isinstance(ev, ReferReceived) and not self.transferee:
                    # a phone that does not follow transfers: its user declines at once
                    self._send_sip(uac.notify_refer(603, "Declined", loop.time()))
            deadline = uac.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - loop.time())
            item = await next_item(inbox, timeout)
            now = loop.time()
            events = []
            if isinstance(item, Received) and item.data is not None:
                events = uac.receive(item.data, item.source, now)
            elif item == "hangup":
                events = uac.hangup(now)
            events += uac.tick(now)
            if isinstance(uac, ReferableCall) and uac.referrals:
                if self.transfer is None:
                    self.transfer = Transferee(uac, self._send_sip, self._leave)
                self.transfer.on_referred(uac.referrals.pop(0))

    def _send_sip(self, events: list[UacEvent]) -> None:
        assert self._sip is not None
        for ev in events:
            if isinstance(ev, SendMessage):
                self._sip.send_nowait(ev.data, ev.destination, ev.transport)

    def _leave(self) -> None:
        """The transfer succeeded: hang up on the bridge (BYE), as a transferee does."""
        uac = self._uac
        if uac is not None:
            self._send_sip(uac.hangup(asyncio.get_running_loop().time()))

    async def _send_loop(self) -> None:
        loop = asyncio.get_running_loop()
        t = loop.time()
        silence = np.zeros(FRAME, np.int16)
        ended = False  # the key being pressed has sent its End packet
        while not self.ended.is_set():
            key = self._outbox.next_packet() if self._outbox is not None else None
            if key is not None and self._rtp is not None and self._remote is not None:
                self._rtp.sendto(key, self._remote)  # a key press takes the audio's slot
                digit, end = _event_of(key)
                if end and not ended:  # the key is released: its first End packet
                    self.log.keys.append((loop.time(), digit))
                ended = end
                t += FRAME / 8000
                await asyncio.sleep(max(0.0, t - loop.time()))
                continue
            frame = self._queue.popleft() if self._queue else silence
            if self._line_echo is not None:
                back = self._line_echo.process(self._played_out())
                frame = np.clip(frame + back, -32768, 32767).astype(np.int16)
            if self._rtp is not None and self._remote is not None:
                payload = self._encode(frame).tobytes()
                self._rtp.sendto(self._sender.next_packet(payload, FRAME), self._remote)
                self.log.sent.append((loop.time(), level_dbfs(frame)))
            self._sent_frames += 1
            t += FRAME / 8000
            await asyncio.sleep(max(0.0, t - loop.time()))

    def _place(self, timestamp: int, pcm: NDArray[np.int16]) -> None:
        if self._ts0 is None:
            self._ts0, self._frame0 = timestamp, self._sent_frames + 3  # 60 ms behind
        k = self._frame0 + ((timestamp - self._ts0) % 2**32) // FRAME
        if k < self._sent_frames:  # too late: like a phone's buffer, grow (and stay) 60 ms
            self._frame0 += self._sent_frames + 3 - k  # deeper than this packet needed
            k = self._sent_frames + 3
        self._playout[k] = pcm

    def _played_out(self) -> NDArray[np.int16]:
        """The frame our phone plays now (silence where nothing arrived in time)."""
        return self._playout.pop(self._sent_frames, np.zeros(FRAME, np.int16))

    def _on_rtp(self, data: bytes) -> None:
        if looks_like_rtcp(data):
            return
        try:
            pkt = RtpPacket.parse(data)
        except ValueError:
            return
        if pkt.payload_type not in (0, 8):
            return
        pcm = self._decode(pkt.payload)
        self.log.received.append((asyncio.get_running_loop().time(), level_dbfs(pcm)))
        self.log.heard.append(pcm)
        if self._line_echo is not None and pcm.size == FRAME:
            self._place(pkt.timestamp, pcm)

    async def hangup(self) -> None:
        if self._sip is not None and self.answered.is_set() and not self.ended.is_set():
            loop = asyncio.get_running_loop()
            uac = self._uac
            assert uac is not None
            for ev in uac.hangup(loop.time()):
                if isinstance(ev, SendMessage):
                    self._sip.send_nowait(ev.data, ev.destination, ev.transport)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ended.wait(), 3.0)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._rtp is not None:
            self._rtp.close()
        if self.transfer is not None:
            await self.transfer.close()
        if self._sip is not None:
            await self._sip.close()


def _event_of(datagram: bytes) -> tuple[str, bool]:
    """The key an RFC 4733 event packet carries, and its End bit."""
    payload = RtpPacket.parse(datagram).payload
    return "0123456789*#ABCD"[payload[0]], bool(payload[1] & 0x80)

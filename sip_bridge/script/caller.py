"""The asyncio runner of one outbound call: ``sip-bridge call URI --play F --record OUT``.

It owns the I/O around the sans-I/O :class:`~sip_bridge.sip.uac.OutboundCall`: a UDP
:class:`~sip_bridge.sip.transport.SipTransport` on an ephemeral port, an RTP port, and the
:class:`~sip_bridge.media.call_media.CallMedia` chain with a
:class:`~agent.lines.play_record.PlayRecordAgent`.

``--dtmf`` digits go out (``--dtmf-at``: that many seconds after the answer, or once the far
end's first prompt ended) as RFC 4733 telephone-events on the call's RTP stream when the
answer negotiated telephone-event (the media's pacer puts them in place of audio frames,
same SSRC and sequence space), and as SIP INFO (``application/dtmf-relay``) otherwise: the
media hands a digit it cannot send in-band back as a :class:`~agent.base.DtmfEvent`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from agent.base import AgentEvent, CallInfo, DtmfEvent, HangupEvent
from agent.lines.play_record import PlayRecordAgent
from agent.lines.playback import load_wav
from sip_bridge.media.call_media import CallMedia, MediaParams, reserve_rtp_port
from sip_bridge.media.rtp_ports import RtpPortPool
from sip_bridge.sip.message import SipUri
from sip_bridge.sip.offer_answer import MediaConfig, NegotiatedMedia
from sip_bridge.sip.transaction import SendMessage
from sip_bridge.sip.transport import Received, SipTransport, next_item
from sip_bridge.sip.uac import (
    CallAnswered,
    CallEnded,
    CallFailed,
    MediaChanged,
    OutboundCall,
    UacEvent,
    UacState,
)

__all__ = [
    "CallOptions",
    "CallResult",
    "local_address_for",
    "place_call",
    "prompt_ended",
    "resolve_target",
]

log = logging.getLogger(__name__)

AGENT_RATE = 24000
KEY_GAP_S = 0.3  # between two keys of --dtmf
POLL_S = 0.1  # how often --dtmf-at prompt looks at what it heard
PROMPT_GAP_S = 0.8  # quiet after speech that ends a prompt (a pause between sentences: less)
SPEECH_RMS = 32768 * 10 ** (-45 / 20)  # -45 dBFS: above the line's noise, below quiet speech


@dataclass(frozen=True)
class CallOptions:
    """What ``sip-bridge call`` was asked to do."""

    target: str  # sip:user@host[:port]
    play: Path
    record: Path
    duration_s: float | None = None  # after answer; default: the file's length + tail_s
    dtmf: str = ""  # digits sent dtmf_at_s after answer, 0.3 s apart (RFC 4733, else INFO)
    dtmf_at_s: float = 0.5
    # or: once the far end's first prompt has ended (speech, then PROMPT_GAP_S of quiet)
    dtmf_after_prompt: bool = False
    telephone_event: bool = True  # offer RFC 4733 telephone-event in our SDP
    rtp_ports: tuple[int, int] = (40000, 40999)
    answer_timeout_s: float = 30.0
    tail_s: float = 1.0
    local_host: str | None = None  # default: the address that routes to the target
    srtp: str = "optional"  # "required": offer RTP/SAVP with SDES keys (sip_bridge.media.srtp)


@dataclass(frozen=True)
class CallResult:
    answered: bool
    status: int  # final status of the INVITE (0 if none came)
    reason: str
    recorded_s: float
    media: NegotiatedMedia | None = None

    @property
    def ok(self) -> bool:
        return self.answered


def local_address_for(dest: tuple[str, int]) -> str:
    """The source address the OS would use towards ``dest`` (a connected UDP socket sends
    nothing; it only asks the routing table). Shared with the call-script runner."""
    family = socket.AF_INET6 if ":" in dest[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(dest)
        return str(s.getsockname()[0])


async def resolve_target(uri: SipUri) -> tuple[str, int]:
    """Where a SIP URI's requests go: its host (resolved) and port (5060 by default)."""
    host, port = uri.host.strip("[]"), uri.port or 5060
    try:
        ipaddress.ip_address(host)
        return host, port
    except ValueError:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        return str(infos[0][4][0]), port


async def place_call(opts: CallOptions) -> CallResult:
    """Make the call, play the file, record what comes back, hang up; never raises for SIP
    failures (they are in the result)."""
    loop = asyncio.get_running_loop()
    audio = load_wav(opts.play, AGENT_RATE)
    agent = PlayRecordAgent(audio, AGENT_RATE)
    dest = await resolve_target(SipUri.parse(opts.target))
    host = opts.local_host or local_address_for(dest)
    inbox: asyncio.Queue[Received | str] = asyncio.Queue()
    sip = SipTransport(inbox.put_nowait)
    await sip.start(host, 0, ("udp",))
    assert sip.local is not None
    pool = RtpPortPool(*opts.rtp_ports)
    lease = await reserve_rtp_port(pool, host)
    uac = OutboundCall(
        opts.target,
        sip.local,
        dest,
        MediaConfig(host, lease.port, telephone_event=opts.telephone_event, srtp=opts.srtp),
        answer_timeout_s=opts.answer_timeout_s,
    )
    media: CallMedia | None = None
    timers: list[asyncio.TimerHandle] = []
    answered: CallAnswered | None = None
    result: CallResult | None = None

    def later(delay: float, item: str) -> None:
        timers.append(loop.call_later(delay, inbox.put_nowait, item))

    def press(at_s: float) -> None:
        for i, digit in enumerate(opts.dtmf):
            later(at_s + KEY_GAP_S * i, f"dtmf:{digit}")

    def on_agent_event(event: AgentEvent) -> None:
        if isinstance(event, HangupEvent):
            inbox.put_nowait("hangup")
        elif isinstance(event, DtmfEvent):  # not negotiated in-band: SIP INFO instead
            inbox.put_nowait(f"info:{event.digit}")

    try:
        events: list[UacEvent] = uac.start(loop.time())
        while result is None:
            for ev in events:
                if isinstance(ev, SendMessage):
                    sip.send_nowait(ev.data, ev.destination, ev.transport)
                elif isinstance(ev, CallAnswered):
                    answered = ev
                    params = _media_params(ev.media)
                    info = CallInfo(uac.dialog.call_id if uac.dialog else "", callee=opts.target)
                    media = CallMedia(
                        agent, pool, params, info, on_agent_event=on_agent_event, lease=lease
                    )
                    await media.start()
                    duration = opts.duration_s
                    if duration is None:
                        duration = audio.size / AGENT_RATE + opts.tail_s
                    later(duration, "hangup")
                    if opts.dtmf and opts.dtmf_after_prompt:
                        later(POLL_S, "prompt?")
                    elif opts.dtmf:
                        press(opts.dtmf_at_s)
                elif isinstance(ev, MediaChanged) and media is not None:
                    try:  # hold, unhold, a new address: the callee re-INVITEd
                        media.update(_media_params(ev.media))
                    except ValueError as exc:  # e.g. a ptime change: keep the current media
                        log.warning("media change not applied: %s", exc)
                elif isinstance(ev, CallFailed):
                    result = CallResult(False, ev.status, ev.reason, 0.0)
                elif isinstance(ev, CallEnded) and answered is not None:
                    status = answered.response.status
                    result = CallResult(True, status, ev.reason, 0.0, answered.media)
            if result is not None:
                break
            deadline = uac.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - loop.time())
            item = await next_item(inbox, timeout)
            now = loop.time()
            events = []
            if isinstance(item, Received) and item.data is not None:
                events = uac.receive(item.data, item.source, now)
            elif item == "hangup":
                events = uac.hangup(now)
            elif item == "prompt?":  # keys once the prompt ended; else look again soon
                if prompt_ended(agent.recording):
                    log.info("the prompt ended: pressing %s", opts.dtmf)
                    press(0.0)
                else:
                    later(POLL_S, "prompt?")
            elif isinstance(item, str) and item.startswith("dtmf:") and media is not None:
                media.send_dtmf(item[5:])  # RFC 4733, or back to us as "info:"
            elif (
                isinstance(item, str)
                and item.startswith("info:")
                and uac.state is UacState.CONFIRMED
            ):
                events = uac.send_dtmf_info(item[5:], now)
            events += uac.tick(now)
    finally:
        for t in timers:
            t.cancel()
        if media is not None:
            await media.close("call ended")
        else:
            await lease.aclose()
        await sip.close()
    recorded = agent.save(opts.record) if answered is not None else 0.0
    return CallResult(result.answered, result.status, result.reason, recorded, result.media)


def prompt_ended(heard: NDArray[np.int16], rate: int = 8000, gap_s: float = PROMPT_GAP_S) -> bool:
    """Whether ``heard`` (what the callee said so far) holds speech followed by at least
    ``gap_s`` of quiet: the point where a caller following a prompt starts typing."""
    frame = rate // 50  # 20 ms
    n = heard.size // frame
    if n == 0:
        return False
    x = heard[: n * frame].astype(np.float64).reshape(n, frame)
    rms = np.sqrt(np.mean(x * x, axis=1) + 1e-9)
    loud = np.flatnonzero(rms > SPEECH_RMS)
    return loud.size >= 5 and (n - 1 - int(loud[-1])) * 0.02 >= gap_s  # 100 ms of speech


def _media_params(neg: NegotiatedMedia) -> MediaParams:
    """What the call's media runs with; latching when the callee's SDP address is private."""
    return MediaParams.negotiated(neg, latch=neg.remote_is_private)

"""What changes or describes a running call's media from outside its chain: a re-INVITE's
or UPDATE's outcome, the DTMF sender, the chain's description (kept apart from
:mod:`sip_bridge.media` so that module stays short)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agent.base import DtmfEvent
from sip_bridge.dtmf import DtmfOutbox, DtmfReceiver
from sip_bridge.media_params import MediaParams
from sip_bridge.rtp_receiver import CODECS, RATE, addr_key

if TYPE_CHECKING:
    from sip_bridge.media import CallMedia

__all__ = ["apply_update", "describe_chain", "dtmf_outbox", "queue_dtmf"]

log = logging.getLogger("sip_bridge.media")


def _khz(rate: int) -> str:
    return f"{rate / 1000:g}k"


def describe_chain(media: CallMedia) -> str:
    """The chain as one line, built from the configured stages in the order the code runs
    them: each packet is decoded as it arrives (``rtp_receiver``) and the jitter buffer
    holds audio; each frame is encoded as it leaves the paced playout buffer."""
    p = media.params
    codec = media.codec.name
    stages = [
        "RTP in",
        f"G711Decode({codec})",
        f"JitterBuffer(adaptive {p.jitter_min_ms:g}..{p.jitter_max_ms:g} ms)",
    ]
    if media._up is not None:
        stages.append(f"Resample({_khz(media._up.in_rate)}->{_khz(media._up.out_rate)})")
    stages.append(f"Agent({media.agent.name})")
    if media._down is not None:
        stages.append(f"Resample({_khz(media._down.in_rate)}->{_khz(media._down.out_rate)})")
    stages += [f"Pacer({media.playout.frame_ms} ms)", f"G711Encode({codec})", "RTP out"]
    return " -> ".join(stages)


def dtmf_outbox(media: CallMedia, p: MediaParams) -> DtmfOutbox | None:
    """The call's RFC 4733 sender for ``p``; None when telephone-event is not negotiated."""
    pt = p.dtmf_send_pt
    return None if pt is None else DtmfOutbox.on(media.sender, pt, RATE, p.ptime_ms)


def queue_dtmf(media: CallMedia, digits: str) -> None:
    """See :meth:`CallMedia.send_dtmf`: in-band when negotiated, else out to the signalling."""
    if media.dtmf_out is not None:
        media.dtmf_out.add(digits)
        return
    DtmfOutbox.check(digits)
    log.warning("peer did not negotiate telephone-event: DTMF %r not sent in-band", digits)
    if media.on_agent_event is not None:
        for d in digits:
            media.on_agent_event(DtmfEvent(d.upper()))


def apply_update(media: CallMedia, params: MediaParams) -> None:
    """Apply a re-INVITE/UPDATE's outcome mid-call: address, codec, direction, RTCP.

    The packet clock cannot change under a running pacer, so a new ptime is refused
    (ValueError) and nothing is applied; the call keeps its current media.
    """
    old = media.params
    if params.ptime_ms != old.ptime_ms:
        raise ValueError(f"ptime change {old.ptime_ms} -> {params.ptime_ms} ms unsupported")
    r = media.receiver
    if params.payload_type != old.payload_type:
        media.codec = CODECS[params.payload_type]
        r.codec, r.payload_type = media.codec, params.payload_type
        media.sender.payload_type = params.payload_type
    if params.telephone_event_pt != old.telephone_event_pt:
        pt = params.telephone_event_pt
        r.dtmf = None if pt is None else DtmfReceiver(pt, RATE)
    if params.dtmf_send_pt != old.dtmf_send_pt and (
        media.dtmf_out is None or not media.dtmf_out.playing
    ):
        media.dtmf_out = dtmf_outbox(media, params)
    moved = addr_key(params.remote_host, params.remote_port) != addr_key(
        old.remote_host, old.remote_port
    )
    if moved or params.latch != old.latch:
        r.remote = r.signalled = addr_key(params.remote_host, params.remote_port)
        r.latch, r.latched = params.latch, False  # re-latch on the new stream
    if media.rtcp is not None and (
        moved or params.rtcp_remote != old.rtcp_remote or params.rtcp_mux != old.rtcp_mux
    ):
        media.rtcp.retarget(params.rtcp_remote, mux=params.rtcp_mux, latch=params.latch)
    if params.send and not old.send:
        media.sender.start_talkspurt()  # resuming after hold: marker bit
    media.params = params
    log.info("media updated: remote %s, send %s, receive %s", r.remote, params.send, params.receive)

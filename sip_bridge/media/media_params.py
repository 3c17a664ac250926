"""What SDP decided for one call's media (:class:`MediaParams`) and what it did
(:class:`MediaStats`); plain values, kept apart so :mod:`sip_bridge.media.call_media`
stays short."""

from __future__ import annotations

import ipaddress
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from jitter import JitterStats
from sip_bridge.media.media_rtcp import RtcpPeerStats
from sip_bridge.media.rtp_receiver import CODECS, RATE, addr_key

if TYPE_CHECKING:
    from sip_bridge.media.srtp import SrtpKeys
    from sip_bridge.sip.offer_answer import NegotiatedMedia

__all__ = ["MediaParams", "MediaStats", "delay_figures"]


@dataclass(frozen=True, slots=True)
class MediaParams:
    """What SDP offer/answer decided for this call's audio stream."""

    remote_host: str  # IP literal from c= (resolve names before)
    remote_port: int
    payload_type: int = 0  # 0 PCMU, 8 PCMA
    telephone_event_pt: int | None = 101  # what the peer sends DTMF with (our SDP's PT)
    # What we send DTMF with (the peer's SDP's PT); None: same as telephone_event_pt
    # (offer/answer negotiates telephone-event both ways or not at all).
    send_telephone_event_pt: int | None = None
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
    srtp: SrtpKeys | None = None  # SDES-SRTP keys (sip_bridge.media.srtp); None: plain RTP

    @property
    def dtmf_send_pt(self) -> int | None:
        """The payload type our RFC 4733 events go out with, None if not negotiated."""
        if self.send_telephone_event_pt is not None:
            return self.send_telephone_event_pt
        return self.telephone_event_pt

    @property
    def rtcp_remote(self) -> tuple[str, int]:
        """Where reports go without rtcp-mux: ``a=rtcp`` if given, else RTP port + 1."""
        port = self.rtcp_port if self.rtcp_port is not None else self.remote_port + 1
        return addr_key(self.remote_host, min(port, 65535))

    def __post_init__(self) -> None:
        if self.payload_type not in CODECS:
            raise ValueError(f"payload type {self.payload_type} is not G.711 (0 or 8)")
        ipaddress.ip_address(self.remote_host)  # ValueError for a name
        if not 0 < self.remote_port < 65536:
            raise ValueError("remote_port out of range")
        for pt in (self.telephone_event_pt, self.send_telephone_event_pt):
            if pt is not None and not 0 <= pt < 128:
                raise ValueError(f"telephone-event payload type {pt} out of range")
        if self.rtcp_port is not None and not 0 < self.rtcp_port < 65536:
            raise ValueError("rtcp_port out of range")
        if self.ptime_ms <= 0 or (RATE * self.ptime_ms) % 1000:
            raise ValueError("ptime_ms must be a positive whole number of samples")

    @classmethod
    def negotiated(
        cls,
        neg: NegotiatedMedia,
        *,
        latch: bool,
        jitter_min_ms: float = 20,
        jitter_max_ms: float = 200,
    ) -> MediaParams:
        """The media an offer/answer outcome asks for (inbound and outbound calls alike);
        ValueError when it cannot be run."""
        return cls(
            neg.remote_address,
            neg.remote_port,
            payload_type=neg.payload_type,
            telephone_event_pt=neg.recv_telephone_event_pt,
            send_telephone_event_pt=neg.telephone_event_pt,
            ptime_ms=neg.ptime,
            latch=latch,
            jitter_min_ms=jitter_min_ms,
            jitter_max_ms=jitter_max_ms,
            rtcp_port=neg.rtcp_port,
            rtcp_mux=neg.rtcp_mux,
            send=neg.can_send,
            receive=neg.can_receive,
            srtp=neg.srtp,
        )


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
    dtmf_digits_sent: int = 0  # RFC 4733 key presses we sent (agent send_dtmf)
    # Frames that waited past their slot for the receive pop that writes them (an echo's
    # pop late behind a load peak): the call's grid moved behind its producer.
    held_frames: int = 0
    # Mean time from when the jitter buffer wanted a frame popped (due_s) to the pop.
    pop_after_due_ms: float = 0.0
    held_wait_max_ms: float = 0.0
    # Per talkspurt: the agent's write of its first audio -> its first packet's sendto.
    talkspurts: int = 0
    first_frame_delay_p50_ms: float = 0.0
    first_frame_delay_p99_ms: float = 0.0
    first_frame_delay_max_ms: float = 0.0
    # SRTP calls only: packets protected (sent) and unprotected (accepted), and arrivals
    # dropped for failed authentication (tampered, injected plain RTP) or replay.
    srtp_protected: int = 0
    srtp_unprotected: int = 0
    srtp_auth_fail: int = 0
    srtp_replay: int = 0


def delay_figures(delays_s: Collection[float]) -> dict[str, Any]:
    """The first-frame-delay fields of :class:`MediaStats` from delays in seconds."""
    if not delays_s:
        return {"talkspurts": 0}
    a = 1000.0 * np.fromiter(delays_s, float, len(delays_s))
    p50, p99 = np.percentile(a, [50, 99])
    return {
        "talkspurts": len(delays_s),
        "first_frame_delay_p50_ms": float(p50),
        "first_frame_delay_p99_ms": float(p99),
        "first_frame_delay_max_ms": float(a.max()),
    }

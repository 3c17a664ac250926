"""SDES-SRTP (RFC 4568 keys, RFC 3711 packets) for one call, around ``pylibsrtp``.

I/O-free: bytes in, bytes out. One libsrtp session per direction: outbound with our key
(the one our SDP gave), inbound with the peer's. Why a class of our own: the receive path
must never raise, so a packet that fails authentication or replay checks is dropped and
counted here (``srtp_auth_fail``, ``srtp_replay`` in the call's media stats), and a call
without SRTP pays nothing (the media path holds ``None`` and tests it once per packet).

SDES keys travel in the SDP, in clear over UDP/TCP signalling: SRTP with them is only as
private as the SIP leg, so ``srtp = "required"`` belongs with TLS.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sip_bridge.media.rtp import looks_like_rtcp
from sip_bridge.sip.sdp import SRTP_KEY_LENGTHS, CryptoAttribute

__all__ = [
    "SRTP_MODES",
    "SUITES",
    "SrtpContext",
    "SrtpKeys",
    "new_key",
]

#: ``srtp`` config values: off (plain RTP only), optional (SRTP when offered), required.
SRTP_MODES = ("off", "optional", "required")
#: Suites in our order of preference (what our offers list, tag 1 first).
SUITES = ("AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32")


def new_key(suite: str = SUITES[0]) -> bytes:
    """A fresh master key||salt for ``suite`` (per call, never reused)."""
    return os.urandom(SRTP_KEY_LENGTHS[suite])


@dataclass(frozen=True, slots=True)
class SrtpKeys:
    """What offer/answer agreed: the suite, our key (we send with) and the peer's."""

    suite: str
    local_key: bytes
    remote_key: bytes
    tag: int = 1

    def __post_init__(self) -> None:
        want = SRTP_KEY_LENGTHS.get(self.suite)
        if want is None:
            raise ValueError(f"unsupported SRTP suite {self.suite!r}")
        if len(self.local_key) != want or len(self.remote_key) != want:
            raise ValueError(f"{self.suite} keys must be {want} bytes")

    def __repr__(self) -> str:  # never log key material
        return f"SrtpKeys(suite={self.suite!r}, tag={self.tag})"

    @classmethod
    def from_crypto(cls, local: CryptoAttribute, remote: CryptoAttribute) -> SrtpKeys:
        return cls(local.suite, local.key_salt, remote.key_salt, local.tag)


class _Sender(Protocol):
    def sendto(self, data: bytes, dest: tuple[str, int]) -> None: ...


class SrtpContext:
    """One call's SRTP state: protect what we send, unprotect (or drop) what arrives."""

    def __init__(self, keys: SrtpKeys) -> None:
        import pylibsrtp  # a C extension; only calls with SRTP load it

        self.keys = keys
        profile = {
            "AES_CM_128_HMAC_SHA1_80": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
            "AES_CM_128_HMAC_SHA1_32": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32,
        }[keys.suite]
        out = pylibsrtp.Policy(
            keys.local_key, pylibsrtp.Policy.SSRC_ANY_OUTBOUND, srtp_profile=profile
        )
        out.allow_repeat_tx = True  # a resent packet (same index) is not an error for us
        inbound = pylibsrtp.Policy(
            keys.remote_key, pylibsrtp.Policy.SSRC_ANY_INBOUND, srtp_profile=profile
        )
        self._tx = pylibsrtp.Session(out)
        self._rx = pylibsrtp.Session(inbound)
        self._error = pylibsrtp.Error
        self.protected = 0  # packets (RTP and RTCP) we protected and sent
        self.unprotected = 0  # packets that arrived and passed authentication
        self.auth_fail = 0  # dropped: authentication failed (tampered, wrong key, plain RTP)
        self.replay = 0  # dropped: an index seen before, or too old for the window
        self.tx_errors = 0  # ours that libsrtp refused to protect (not sent)

    def protect(self, data: bytes) -> bytes | None:
        """An RTP packet as SRTP; None (counted) if libsrtp refuses it."""
        return self._protect(self._tx.protect, data)

    def protect_rtcp(self, data: bytes) -> bytes | None:
        """A compound RTCP packet as SRTCP; None (counted) if libsrtp refuses it."""
        return self._protect(self._tx.protect_rtcp, data)

    def _protect(self, fn: Callable[[bytes], bytes], data: bytes) -> bytes | None:
        try:
            out = fn(data)
        except self._error:
            self.tx_errors += 1
            return None
        self.protected += 1
        return out

    def send(self, sock: _Sender, data: bytes, dest: tuple[str, int]) -> None:
        """Protect an RTP packet and send it (the media path's one call per packet)."""
        out = self.protect(data)
        if out is not None:
            sock.sendto(out, dest)

    def unprotect(self, data: bytes) -> bytes | None:
        """What arrived on the RTP port (SRTP, or SRTCP under rtcp-mux) in clear; None when
        dropped. Never raises."""
        if looks_like_rtcp(data):
            return self.unprotect_rtcp(data)
        return self._unprotect(self._rx.unprotect, data)

    def unprotect_rtcp(self, data: bytes) -> bytes | None:
        """An SRTCP packet in clear; None when dropped. Never raises."""
        return self._unprotect(self._rx.unprotect_rtcp, data)

    def _unprotect(self, fn: Callable[[bytes], bytes], data: bytes) -> bytes | None:
        try:
            out = fn(data)
        except Exception as exc:  # pylibsrtp.Error, or anything odd: drop, never raise
            if "replay" in str(exc):
                self.replay += 1
            else:  # authentication failure, or too short / not SRTP at all
                self.auth_fail += 1
            return None
        self.unprotected += 1
        return out

    def counters(self) -> dict[str, int]:
        """The :class:`~sip_bridge.media.media_params.MediaStats` fields."""
        return {
            "srtp_protected": self.protected,
            "srtp_unprotected": self.unprotected,
            "srtp_auth_fail": self.auth_fail,
            "srtp_replay": self.replay,
        }

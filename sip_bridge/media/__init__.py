"""One call's media and the clock that runs every call's: RTP and RTCP, SRTP, the receive
chain into the agent and the paced send chain out (``call_media.CallMedia``), the shared
media clock (``media_clock``, which drives calls through ``ClockedCall``), DTMF, recordings.
The compiled media path (:mod:`sip_bridge.native`) is most of this package.

May import: ``agent``, ``jitter``, ``resample``, :mod:`sip_bridge.sip` (SDP's SRTP
attributes, the negotiated media), :mod:`sip_bridge.logs`.
"""

"""A minimal SIP phone's requests, shared by the end-to-end tests that dial the bridge."""

from __future__ import annotations

import random


def phone_request(
    method: str,
    bridge_port: int,
    local_port: int,
    cseq: int,
    *,
    rtp: int = 0,
    to_tag: str = "",
    call_id: str = "phone-call",
    transport: str = "UDP",
    direction: str | None = None,
    telephone_event: bool = False,
    sdp_version: int = 1,
    host: str = "127.0.0.1",
) -> bytes:
    """One request as a phone at host:local_port sends it; INVITEs carry a PCMU offer."""
    body = ""
    if method == "INVITE":
        pts = "0 101" if telephone_event else "0"
        body = (
            f"v=0\r\no=phone 1 {sdp_version} IN IP4 {host}\r\ns=-\r\nc=IN IP4 {host}\r\n"
            f"t=0 0\r\nm=audio {rtp} RTP/AVP {pts}\r\na=rtpmap:0 PCMU/8000\r\n"
            + ("a=rtpmap:101 telephone-event/8000\r\n" if telephone_event else "")
            + "a=ptime:20\r\n"
            + (f"a={direction}\r\n" if direction else "")
        )
    param = ";transport=tls" if transport.upper() == "TLS" else ""
    tag = f";tag={to_tag}" if to_tag else ""
    head = (
        f"{method} sip:echo@{host}:{bridge_port}{param} SIP/2.0\r\n"
        f"Via: SIP/2.0/{transport.upper()} {host}:{local_port};"
        f"branch=z9hG4bK{method}{random.getrandbits(32)}\r\n"
        f"From: <sip:phone@{host}:{local_port}>;tag=ph1\r\n"
        f"To: <sip:echo@{host}:{bridge_port}>{tag}\r\n"
        f"Call-ID: {call_id}\r\nCSeq: {cseq} {method}\r\n"
        f"Contact: <sip:phone@{host}:{local_port}{param}>\r\nMax-Forwards: 70\r\n"
    )
    if body:
        head += "Content-Type: application/sdp\r\n"
    return (head + f"Content-Length: {len(body)}\r\n\r\n" + body).encode()

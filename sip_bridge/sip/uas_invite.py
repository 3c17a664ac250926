"""Stateless helpers of the bridge's UAS: reading incoming requests, routing our answers.

Kept out of :mod:`sip_bridge.sip.ua` so the call state machine there stays readable: nothing
here holds state, every function takes a message (or bytes) and returns a value.
"""

from __future__ import annotations

import ipaddress
import re

from sip_bridge.sip.dialog import Dialog
from sip_bridge.sip.message import (
    Headers,
    SipRequest,
    SipResponse,
    Via,
    canonical_name,
    make_response,
    new_tag,
)
from sip_bridge.sip.sdp import SdpError, SessionDescription, parse_sdp
from sip_bridge.sip.timers import is_reliable

__all__ = [
    "UnsupportedBody",
    "body_type",
    "dtmf_digit",
    "in_dialog_destination",
    "sdp_offer",
    "stamp_via",
    "stateless_error",
]

Address = tuple[str, int]
_DTMF = re.compile(r"^\s*signal\s*=\s*(1[0-5]|[0-9A-Da-d*#])\s*$", re.I | re.M)
_EVENT_DIGITS = "0123456789*#ABCD"  # RFC 4733 event codes 0..15


class UnsupportedBody(SdpError):
    """A body that is not SDP where we need an offer: answer 415 with Accept."""

    status = 415


def body_type(req: SipRequest) -> str:
    """The media type of the body (no parameters); SDP when the header is missing."""
    value = req.headers.get("Content-Type") or "application/sdp"
    return value.split(";", 1)[0].strip().lower()


def sdp_offer(req: SipRequest) -> SessionDescription | None:
    """The request's SDP, None without a body; SdpError (400) / UnsupportedBody (415)."""
    if not req.body.strip():
        return None
    if body_type(req) != "application/sdp":
        raise UnsupportedBody(f"unsupported body type {body_type(req)!r}")
    return parse_sdp(req.body)


def dtmf_digit(req: SipRequest) -> str | None:
    """The key in an INFO body: ``Signal=5`` (dtmf-relay) or ``5`` (application/dtmf)."""
    text = req.body.decode("utf-8", "replace")
    kind = body_type(req)
    if kind == "application/dtmf-relay":
        m = _DTMF.search(text)
        value = m.group(1) if m else ""
    elif kind == "application/dtmf":
        value = text.strip()
    else:
        return None
    if value.isdigit() and len(value) == 2:
        return _EVENT_DIGITS[int(value)]  # event numbers 10..15 (the regex caps them)
    value = value.upper()
    return value if len(value) == 1 and value in _EVENT_DIGITS else None


def stamp_via(req: SipRequest, source: Address) -> None:
    """RFC 3261 18.2.1 ``received`` and RFC 3581 ``rport`` on the top Via, in place."""
    values = req.headers.get_all("Via")
    top = Via.parse(values[0])
    changed = False
    if top.host.lower() != source[0].lower():
        top.params["received"] = source[0]
        changed = True
    if "rport" in top.params and top.params["rport"] is None:
        top.params["rport"] = str(source[1])
        top.params["received"] = source[0]
        changed = True
    if changed:
        req.headers.set("Via", ", ".join([top.to_str(), *values[1:]]))


def stateless_error(data: bytes, exc: ValueError, host: str, server: str) -> SipResponse | None:
    """The 400/505... for a request the parser refused, if it still names its transaction.

    Only Via, From, To, Call-ID and CSeq are read back (leniently); without all of them,
    for responses and for ACKs, there is nothing to answer and None comes back.
    """
    try:
        head = re.split(rb"\r?\n\r?\n", data.lstrip(b"\r\n"), maxsplit=1)[0]
        lines = head.decode("utf-8", "replace").splitlines()
        parts = lines[0].split() if lines else []
        if len(parts) != 3 or parts[0] == "ACK" or parts[0].upper().startswith("SIP/"):
            return None
        headers = Headers()
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            canon = canonical_name(name.strip()) if colon else ""
            if canon in ("Via", "From", "To", "Call-ID", "CSeq"):
                headers.add(canon, value.strip())
        req = SipRequest(parts[0], parts[1], headers)
        req.call_id, req.cseq, req.top_via  # noqa: B018 - each raises when missing/bad
        if not (headers.get("From") and headers.get("To")):
            return None
        status = getattr(exc, "status", 400)
        resp = make_response(req, status if 400 <= status < 600 else 400, to_tag=new_tag())
        text = str(exc).replace('"', "'").replace("\\", "/")[:100]
        resp.headers.add("Warning", f'399 {host} "{text}"')
        resp.headers.add("Server", server)
        return resp
    except (ValueError, IndexError):
        return None


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def in_dialog_destination(dialog: Dialog, source: Address, transport: str) -> tuple[Address, str]:
    """Where our in-dialog requests go: the next hop when it is a usable IP literal.

    The flow the dialog came in on (``source``) is reused over TCP (the peer's connection),
    for host names (a sans-I/O core does no DNS) and for a private Contact that is not
    where the packets come from (a caller behind NAT, no proxy in the route set).
    """
    if is_reliable(transport):
        return source, transport
    try:
        hop = dialog.next_hop()
    except ValueError:
        return source, transport
    ip = _ip(hop.host)
    if ip is None:
        return source, transport
    if not dialog.route_set and ip.is_private and hop.host != source[0]:
        return source, transport
    port = hop.port or (5061 if hop.scheme == "sips" else 5060)
    return (hop.host, port), hop.transport or transport

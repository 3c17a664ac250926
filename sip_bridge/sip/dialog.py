"""SIP dialogs (RFC 3261 section 12): identifiers, CSeq spaces, remote target, route set.

Sans-I/O and clock-free: a :class:`Dialog` is built from the INVITE that created it
(UAS side, :meth:`Dialog.from_uas`; or from our INVITE and its 2xx, :meth:`Dialog.from_uac`)
and then builds in-dialog requests and checks incoming ones.  It never sends anything: the
UA hands the requests it builds to the transaction layer.

Routing: loose routing (``;lr``, RFC 3261 16.12) is the normal case.  A strict router as
first route (RFC 2543 proxies, no ``;lr``) is handled as 12.2.1.1 says: its URI becomes the
Request-URI and the remote target goes last in the Route set.  :meth:`Dialog.next_hop`
names the URI the request must be sent to (first Route, else the remote target); turning
that into an address (DNS, NAT) is the UA's business.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from sip_bridge.sip.message import (
    Headers,
    NameAddr,
    SipRequest,
    SipResponse,
    SipUri,
    Via,
    new_branch,
)

__all__ = ["Dialog", "DialogError"]

_MAX_CSEQ = 2**31 - 1
_TARGET_REFRESH = frozenset({"INVITE", "UPDATE"})  # RFC 3311; SUBSCRIBE/NOTIFY unused here


class DialogError(ValueError):
    """A request or response cannot create/refresh a dialog; ``status`` is what to answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _without_tag(value: str) -> str:
    """The From/To value minus its tag (tags live in the dialog id, not in the URI text)."""
    addr = NameAddr.parse(value)
    params = {k: v for k, v in addr.params.items() if k != "tag"}
    return NameAddr(addr.display, addr.uri, params).to_str()


def _target(value: str | None, what: str) -> str:
    """The URI of a Contact, which must be a SIP URI we can route to."""
    if not value:
        raise DialogError(f"{what} has no Contact")
    try:
        addr = NameAddr.parse(value)
        SipUri.parse(addr.uri)
    except ValueError as exc:
        raise DialogError(f"bad Contact in {what}: {exc}", getattr(exc, "status", 400)) from None
    return addr.uri


def _routes(values: list[str]) -> list[str]:
    out = []
    for value in values:
        try:
            addr = NameAddr.parse(value)
            SipUri.parse(addr.uri)
        except ValueError as exc:
            raise DialogError(f"bad Record-Route {value[:60]!r}: {exc}") from None
        out.append(addr.to_str())
    return out


@dataclass
class Dialog:
    """One dialog, seen from our side; ``local_*`` are ours, ``remote_*`` the peer's."""

    call_id: str
    local_tag: str
    remote_tag: str | None
    local_uri: str  # name-addr (no tag) we put in From of our requests
    remote_uri: str  # name-addr (no tag) we put in To
    remote_target: str  # URI from the peer's Contact
    local_contact: str  # our Contact header value
    transport: str  # "udp" / "tcp": our Via and default next-hop transport
    sent_by: str  # host:port for our Via
    route_set: list[str] = field(default_factory=list)  # name-addr values, in use order
    local_cseq: int = field(default_factory=lambda: secrets.randbelow(2**30) + 1)
    remote_cseq: int | None = None
    user_agent: str | None = None

    # ------------------------------------------------------------------ creation
    @classmethod
    def from_uas(
        cls,
        invite: SipRequest,
        local_tag: str,
        local_contact: str,
        transport: str,
        sent_by: str,
        user_agent: str | None = None,
    ) -> Dialog:
        """RFC 3261 12.1.1: the dialog our 2xx to ``invite`` creates (route set in order)."""
        to, frm = invite.headers.get("To"), invite.headers.get("From")
        if not to or not frm:
            raise DialogError("INVITE lacks From or To")
        try:
            remote_tag = NameAddr.parse(frm).tag
            local_uri, remote_uri = _without_tag(to), _without_tag(frm)
            call_id, cseq = invite.call_id, invite.cseq[0]
        except ValueError as exc:
            raise DialogError(str(exc)) from None
        return cls(
            call_id=call_id,
            local_tag=local_tag,
            remote_tag=remote_tag,
            local_uri=local_uri,
            remote_uri=remote_uri,
            remote_target=_target(invite.headers.get("Contact"), "INVITE"),
            local_contact=local_contact,
            transport=transport,
            sent_by=sent_by,
            route_set=_routes(invite.headers.get_all("Record-Route")),
            remote_cseq=cseq,
            user_agent=user_agent,
        )

    @classmethod
    def from_uac(
        cls,
        invite: SipRequest,
        response: SipResponse,
        transport: str,
        sent_by: str,
        user_agent: str | None = None,
    ) -> Dialog:
        """RFC 3261 12.1.2: the dialog a 2xx to our ``invite`` creates (route set reversed)."""
        try:
            local_tag = NameAddr.parse(invite.headers.get("From") or "").tag
            remote_tag = NameAddr.parse(response.headers.get("To") or "").tag
            local_uri = _without_tag(invite.headers.get("From") or "")
            remote_uri = _without_tag(invite.headers.get("To") or "")
        except ValueError as exc:
            raise DialogError(str(exc)) from None
        if local_tag is None:
            raise DialogError("our INVITE has no From tag")
        return cls(
            call_id=invite.call_id,
            local_tag=local_tag,
            remote_tag=remote_tag,
            local_uri=local_uri,
            remote_uri=remote_uri,
            remote_target=_target(response.headers.get("Contact"), "2xx"),
            local_contact=invite.headers.get("Contact") or "",
            transport=transport,
            sent_by=sent_by,
            route_set=list(reversed(_routes(response.headers.get_all("Record-Route")))),
            local_cseq=invite.cseq[0],
            user_agent=user_agent,
        )

    # ------------------------------------------------------------------ matching
    @property
    def id(self) -> tuple[str, str, str | None]:
        """(Call-ID, local tag, remote tag): RFC 3261 12's dialog identifier."""
        return self.call_id, self.local_tag, self.remote_tag

    def matches(self, req: SipRequest) -> bool:
        """True when ``req`` (from the peer) belongs to this dialog."""
        try:
            to_tag = NameAddr.parse(req.headers.get("To") or "").tag
            from_tag = NameAddr.parse(req.headers.get("From") or "").tag
            return (req.call_id, to_tag, from_tag) == self.id
        except ValueError:
            return False

    def accept_remote_cseq(self, req: SipRequest) -> bool:
        """RFC 3261 12.2.2: False (answer 500) for a CSeq not above the last one seen.

        ACK and CANCEL carry the CSeq number of the INVITE they belong to, so they pass.
        """
        if req.method in ("ACK", "CANCEL"):
            return True
        number = req.cseq[0]
        if self.remote_cseq is not None and number <= self.remote_cseq:
            return False
        self.remote_cseq = number
        return True

    def refresh_target(self, req: SipRequest) -> None:
        """Take a target-refresh request's Contact as the new remote target (12.2.2)."""
        if req.method in _TARGET_REFRESH and req.headers.get("Contact"):
            self.remote_target = _target(req.headers.get("Contact"), req.method)

    # ------------------------------------------------------------------ our requests
    def next_hop(self) -> SipUri:
        """Where an in-dialog request goes first: the first route, else the remote target."""
        first = NameAddr.parse(self.route_set[0]).uri if self.route_set else self.remote_target
        return SipUri.parse(first)

    def _uri_and_routes(self) -> tuple[str, list[str]]:
        if not self.route_set:
            return self.remote_target, []
        first = SipUri.parse(NameAddr.parse(self.route_set[0]).uri)
        if first.lr:
            return self.remote_target, list(self.route_set)
        # Strict router (12.2.1.1): its URI is the Request-URI, the target goes last.
        first.params = {k: v for k, v in first.params.items() if k not in ("method", "maddr")}
        first.headers = {}
        return first.to_str(), [*self.route_set[1:], f"<{self.remote_target}>"]

    def create_request(
        self, method: str, body: bytes = b"", content_type: str | None = None
    ) -> SipRequest:
        """A new in-dialog request (not ACK/CANCEL), with its own CSeq and a fresh branch."""
        if method in ("ACK", "CANCEL"):
            raise ValueError(f"{method} reuses its INVITE's CSeq: not built here")
        if self.local_cseq >= _MAX_CSEQ:
            raise DialogError("local CSeq space exhausted", 500)
        self.local_cseq += 1
        return self._build(method, self.local_cseq, body, content_type)

    def create_ack(self, invite_cseq: int) -> SipRequest:
        """The ACK for a 2xx to our INVITE (RFC 3261 13.2.2.4).

        Request-URI and Route from the dialog, the INVITE's CSeq number, a new branch
        (a 2xx ACK is a transaction of its own); it takes no CSeq of the dialog's own.
        """
        return self._build("ACK", invite_cseq, b"", None)

    def _build(self, method: str, cseq: int, body: bytes, content_type: str | None) -> SipRequest:
        uri, routes = self._uri_and_routes()
        host, _, port = self.sent_by.rpartition(":")
        headers = Headers()
        via = Via(self.transport.upper(), host.strip("[]"), int(port), {"branch": new_branch()})
        via.params["rport"] = None  # RFC 3581: ask for responses to our source port
        headers.add("Via", via.to_str())
        headers.add("Max-Forwards", "70")
        for route in routes:
            headers.add("Route", route)
        headers.add("From", f"{self.local_uri};tag={self.local_tag}")
        remote_tag = f";tag={self.remote_tag}" if self.remote_tag else ""
        headers.add("To", f"{self.remote_uri}{remote_tag}")
        headers.add("Call-ID", self.call_id)
        headers.add("CSeq", f"{cseq} {method}")
        if self.local_contact:
            headers.add("Contact", self.local_contact)
        if self.user_agent:
            headers.add("User-Agent", self.user_agent)
        if body:
            headers.add("Content-Type", content_type or "application/sdp")
        return SipRequest(method, uri, headers, body)

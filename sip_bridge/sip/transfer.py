"""Blind transfer by REFER (RFC 3515), seen from the referrer: the bridge.

Sans-I/O and clock-free: :class:`Refer` is told what happened to the REFER (its final
response or timeout) and what each NOTIFY of the implicit subscription said (RFC 6665
``Event: refer``, a ``message/sipfrag`` body, RFC 3420), and answers with the status to
give the NOTIFY and the :class:`TransferProgress` to report.  The UA owns the clock (the
bound on waiting for a final NOTIFY) and the dialog; this module only reads and decides.

Choices made here:

- A bare number (``+15551234``, ``1001``; visual separators ``-.() `` dropped) becomes
  ``sip:NUMBER@<the caller's host>``: the peer that sent us the call (a PBX, a trunk) is
  the one that will dial it.  A ``sip:``/``sips:``/``tel:`` URI is used as given.  The
  server may map targets through its config before calling the UA.
- The sipfrag's status line decides: 100 and other 1xx -> "trying", 180/183 -> "ringing",
  2xx -> "succeeded", >= 300 -> "failed".  A malformed body gets 400 and changes nothing.
- ``Subscription-State: terminated`` before any final sipfrag is a failure (the transferee
  gave up telling us); a final outcome is reported once, later NOTIFYs only get 200.
- A NOTIFY whose ``Event`` is not ``refer`` gets 489; one whose ``id`` names another REFER
  (or arrives once the subscription ended) gets 481 (RFC 6665 4.1.3).
- ``Refer-Sub: false`` (RFC 4488) is never asked for: the outcome is what we are after.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from sip_bridge.sip.message import NameAddr, SipUri

__all__ = [
    "NotifyAnswer",
    "Outcome",
    "Refer",
    "TransferProgress",
    "parse_event",
    "parse_sipfrag",
    "parse_subscription_state",
    "refer_target",
]

Outcome = Literal["trying", "ringing", "succeeded", "failed"]
_NUMBER = re.compile(r"\+?[0-9*#]+")
_SEPARATORS = re.compile(r"[-.() ]")
_STATUS_LINE = re.compile(r"SIP/2\.0[ \t]+([1-6][0-9][0-9])(?:[ \t]+(.*))?", re.I)


@dataclass(frozen=True, slots=True)
class TransferProgress:
    """How a transfer goes: ``final`` once (succeeded or failed), after any number of others.

    ``status`` is the SIP status behind it: the REFER's response, the sipfrag's status
    line, 408 when the REFER timed out, 0 when no final report came (in time, or at all).
    """

    call_id: str
    target: str
    status: int
    final: bool
    outcome: Outcome
    reason: str


@dataclass(frozen=True, slots=True)
class NotifyAnswer:
    """What to do with a NOTIFY: answer ``status``; report ``progress`` if not None."""

    status: int
    progress: TransferProgress | None = None


def refer_target(target: str, caller_uri: str) -> str:
    """The Refer-To URI for an agent's target; ValueError if it is neither URI nor number."""
    text = target.strip()
    scheme = text.partition(":")[0].lower()
    if scheme in ("sip", "sips"):
        SipUri.parse(text)  # raises for a malformed URI
        return text
    if scheme == "tel" and len(text) > 4:
        return text
    number = _SEPARATORS.sub("", text)
    if not _NUMBER.fullmatch(number):
        raise ValueError(f"transfer target {target[:40]!r} is neither a URI nor a number")
    uri = SipUri.parse(NameAddr.parse(caller_uri).uri)
    return SipUri("sip", number, uri.host, uri.port).to_str()


def parse_sipfrag(body: bytes) -> tuple[int, str]:
    """A message/sipfrag's status line: ``SIP/2.0 180 Ringing`` -> (180, "Ringing")."""
    text = body.decode("utf-8", "replace").lstrip("\r\n \t")
    line = text.split("\n", 1)[0].rstrip("\r \t")
    match = _STATUS_LINE.fullmatch(line)
    if match is None:
        raise ValueError(f"not a sipfrag status line: {line[:60]!r}")
    return int(match.group(1)), (match.group(2) or "").strip()


def parse_event(value: str) -> tuple[str, str | None]:
    """``refer;id=93809824`` -> ("refer", "93809824"); the package name is lower-cased."""
    name, *params = (p.strip() for p in value.split(";"))
    ident = None
    for param in params:
        key, _, arg = param.partition("=")
        if key.strip().lower() == "id":
            ident = arg.strip()
    return name.lower(), ident


def parse_subscription_state(value: str) -> tuple[str, str]:
    """``terminated;reason=noresource`` -> ("terminated", "noresource")."""
    state, *params = (p.strip() for p in value.split(";"))
    reason = ""
    for param in params:
        key, _, arg = param.partition("=")
        if key.strip().lower() == "reason":
            reason = arg.strip()
    return state.lower(), reason


def _outcome(status: int) -> Outcome:
    if status >= 300:
        return "failed"
    if status >= 200:
        return "succeeded"
    return "ringing" if status in (180, 183) else "trying"


class Refer:
    """One REFER and its implicit subscription: sending -> pending -> done."""

    def __init__(self, call_id: str, target: str, refer_cseq: int) -> None:
        self.call_id = call_id
        self.target = target
        self.refer_cseq = refer_cseq
        self.state: Literal["sending", "pending", "done"] = "sending"
        self.outcome: Outcome | None = None  # set once the final progress went out
        self.last_status = 0

    @property
    def final(self) -> bool:
        return self.outcome in ("succeeded", "failed")

    def _progress(self, status: int, outcome: Outcome, reason: str) -> TransferProgress | None:
        """Report a change; nothing once final, nothing for a repeat of the last status."""
        if self.final or (status == self.last_status and outcome == self.outcome):
            return None
        self.last_status, self.outcome = status, outcome
        final = outcome in ("succeeded", "failed")
        return TransferProgress(self.call_id, self.target, status, final, outcome, reason)

    def failed(self, status: int, reason: str) -> TransferProgress | None:
        """Give up (REFER timeout, no final NOTIFY in time, call ended): the final report."""
        self.state = "done"
        return self._progress(status, "failed", reason)

    def on_refer_response(self, status: int, reason: str) -> TransferProgress | None:
        """A final response to our REFER: 2xx opens the subscription, others fail it."""
        if status < 200 or self.state != "sending":
            return None
        if status >= 300:
            return self.failed(status, f"REFER rejected: {status} {reason}".rstrip())
        self.state = "pending"
        return self._progress(status, "trying", "REFER accepted")

    def on_notify(
        self, event: str, subscription_state: str, content_type: str, body: bytes
    ) -> NotifyAnswer:
        """One NOTIFY's Event, Subscription-State and body -> its answer and progress."""
        try:
            package, ident = parse_event(event)
        except ValueError:
            return NotifyAnswer(400)
        if package != "refer":
            return NotifyAnswer(489)
        if (ident is not None and ident != str(self.refer_cseq)) or self.state == "done":
            return NotifyAnswer(481)
        state, why = parse_subscription_state(subscription_state or "active")
        if state not in ("active", "pending", "terminated"):
            return NotifyAnswer(400)
        progress = None
        if body.strip():
            if content_type.split(";", 1)[0].strip().lower() != "message/sipfrag":
                return NotifyAnswer(415)
            try:
                status, phrase = parse_sipfrag(body)
            except ValueError:
                return NotifyAnswer(400)
            progress = self._progress(status, _outcome(status), f"{status} {phrase}".rstrip())
        if self.state == "sending":
            self.state = "pending"  # the NOTIFY overtook the 202 (RFC 3515 2.4.4)
        if state == "terminated":
            self.state = "done"
            if progress is None and not self.final:
                gone = f"subscription terminated ({why or 'no reason'}) without a final status"
                progress = self._progress(0, "failed", gone)
        return NotifyAnswer(200, progress)

"""The sans-I/O REFER state (sip_bridge.sip.transfer): sipfrag parsing, target rules, and the
subscription's state machine, without a UA or a clock."""

from __future__ import annotations

import pytest

from sip_bridge.sip.transfer import (
    NotifyAnswer,
    Refer,
    TransferProgress,
    parse_event,
    parse_sipfrag,
    parse_subscription_state,
    refer_target,
)

SIPFRAG = "message/sipfrag;version=2.0"


def test_sipfrag_status_lines() -> None:
    assert parse_sipfrag(b"SIP/2.0 100 Trying\r\n") == (100, "Trying")
    assert parse_sipfrag(b"SIP/2.0 180 Ringing") == (180, "Ringing")
    assert parse_sipfrag(b"\r\nsip/2.0 200 OK\r\nContact: <sip:x@h>\r\n\r\n") == (200, "OK")
    assert parse_sipfrag(b"SIP/2.0 486 Busy Here\n") == (486, "Busy Here")
    assert parse_sipfrag(b"SIP/2.0 503") == (503, "")


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"OK",
        b"SIP/2.0 OK",
        b"SIP/2.0 20 OK",
        b"SIP/2.0 2000 OK",
        b"SIP/2.0 099 Low",
        b"SIP/2.0 700 High",
        b"SIP/3.0 200 OK",
        b"INVITE sip:bob@example.com SIP/2.0\r\n",
        b"\xff\xfe\x00",
    ],
)
def test_malformed_sipfrag_raises(body: bytes) -> None:
    with pytest.raises(ValueError):
        parse_sipfrag(body)


def test_event_and_subscription_state_headers() -> None:
    assert parse_event("refer") == ("refer", None)
    assert parse_event("Refer ; id=93809824") == ("refer", "93809824")
    assert parse_event("dialog;foo=bar") == ("dialog", None)
    assert parse_subscription_state("active;expires=60") == ("active", "")
    assert parse_subscription_state("Terminated;reason=noresource") == ("terminated", "noresource")


def test_refer_target_rules() -> None:
    caller = '"Alice" <sip:alice@pbx.example.com:5070>;tag=x'
    assert refer_target("sip:sales@example.com", caller) == "sip:sales@example.com"
    assert refer_target(" sips:bob@example.com;transport=tls ", caller) == (
        "sips:bob@example.com;transport=tls"
    )
    assert refer_target("tel:+15551234", caller) == "tel:+15551234"
    assert refer_target("1001", caller) == "sip:1001@pbx.example.com:5070"
    assert refer_target("+1 (555) 123-4567", caller) == "sip:+15551234567@pbx.example.com:5070"
    assert refer_target("*72", "<sip:alice@192.0.2.1>") == "sip:*72@192.0.2.1"
    for bad in ("", "sales desk", "sip:", "sip:a@b@c", "http://example.com", "12a"):
        with pytest.raises(ValueError):
            refer_target(bad, caller)


def notify(t: Refer, body: bytes, state: str = "active", event: str = "refer") -> NotifyAnswer:
    return t.on_notify(event, state, SIPFRAG, body)


def test_success_path_reports_each_stage_once() -> None:
    t = Refer("c1", "sip:1001@pbx", 7)
    assert t.on_refer_response(202, "Accepted") == TransferProgress(
        "c1", "sip:1001@pbx", 202, False, "trying", "REFER accepted"
    )
    steps = [
        notify(t, b"SIP/2.0 100 Trying\r\n"),
        notify(t, b"SIP/2.0 100 Trying\r\n"),  # a repeat: answered, not reported
        notify(t, b"SIP/2.0 183 Session Progress\r\n"),
        notify(t, b"SIP/2.0 200 OK\r\n", "terminated;reason=noresource"),
    ]
    assert [a.status for a in steps] == [200, 200, 200, 200]
    got = [(p.status, p.outcome, p.final) for a in steps if (p := a.progress) is not None]
    assert got == [(100, "trying", False), (183, "ringing", False), (200, "succeeded", True)]
    assert t.final and t.state == "done"
    # the subscription is over: another NOTIFY matches nothing
    assert notify(t, b"SIP/2.0 200 OK\r\n") == NotifyAnswer(481)


def test_final_failure_then_terminated_reports_once() -> None:
    t = Refer("c1", "sip:1001@pbx", 7)
    t.on_refer_response(202, "Accepted")
    busy = notify(t, b"SIP/2.0 486 Busy Here\r\n")
    assert busy.status == 200 and busy.progress is not None
    assert (busy.progress.status, busy.progress.outcome, busy.progress.final) == (
        486,
        "failed",
        True,
    )
    assert busy.progress.reason == "486 Busy Here"
    assert notify(t, b"SIP/2.0 486 Busy Here\r\n", "terminated") == NotifyAnswer(200)


def test_refer_rejected_or_timed_out() -> None:
    t = Refer("c1", "sip:x@h", 3)
    assert t.on_refer_response(100, "Trying") is None
    p = t.on_refer_response(603, "Decline")
    assert p is not None and (p.status, p.outcome, p.final) == (603, "failed", True)
    assert p.reason == "REFER rejected: 603 Decline"
    assert t.failed(408, "late") is None  # one final report only
    t2 = Refer("c1", "sip:x@h", 3)
    p2 = t2.failed(408, "REFER timed out")
    assert p2 is not None and (p2.status, p2.outcome) == (408, "failed")


def test_notify_checks_event_id_body_and_state() -> None:
    t = Refer("c1", "sip:x@h", 42)
    assert notify(t, b"SIP/2.0 100 Trying", event="dialog") == NotifyAnswer(489)
    assert notify(t, b"SIP/2.0 100 Trying", event="") == NotifyAnswer(489)
    assert notify(t, b"SIP/2.0 100 Trying", event="refer;id=41") == NotifyAnswer(481)
    assert notify(t, b"garbage") == NotifyAnswer(400)
    assert notify(t, b"SIP/2.0 100 Trying", state="weird") == NotifyAnswer(400)
    assert t.on_notify("refer", "active", "text/plain", b"SIP/2.0 100 Trying") == NotifyAnswer(415)
    assert t.state == "sending" and t.outcome is None  # none of those changed anything
    # the NOTIFY may overtake the 202 (RFC 3515): accepted with the right id
    early = notify(t, b"SIP/2.0 180 Ringing", event="refer;id=42")
    assert early.progress is not None and early.progress.outcome == "ringing"
    assert str(t.state) == "pending"
    assert t.on_refer_response(202, "Accepted") is None  # already pending: nothing new


def test_terminated_without_final_status_fails() -> None:
    t = Refer("c1", "sip:x@h", 1)
    t.on_refer_response(200, "OK")
    notify(t, b"SIP/2.0 180 Ringing")
    gone = notify(t, b"", "terminated;reason=timeout")
    assert gone.status == 200 and gone.progress is not None
    assert (gone.progress.status, gone.progress.outcome, gone.progress.final) == (0, "failed", True)
    assert "timeout" in gone.progress.reason

"""Call events and call commands on MQTT: topics, payloads and command parsing (no I/O).

Events go out on ``sipbridge/<node>/calls/<call_id>/<event>`` as one JSON object:

``{"schema": 1, "event": "turn", "node": "n1", "call_id": "c1", "seq": 42, "at": 1.7e9,
...the event's fields}``

``seq`` is a per-node sequence number that only grows (it survives restarts through the
spool, see ``mqtt_link``): events go out at least once (QoS 1), so a consumer drops a
``seq`` it has already seen and can check that nothing is missing. ``at`` is unix time in
seconds. The events and the fields their builders below produce:

- ``started``: ``caller``, ``callee``, ``direction``, ``trunk``
- ``answered``: ``codec``
- ``turn``: ``caller_text``, ``agent_text``, ``timings_ms`` (stage -> milliseconds),
  ``barged_in``, ``input`` (``speech`` or ``keypad``) and ``keys`` (what a keypad turn keyed;
  a sensitive slot's entry as one ``*`` per key, its ``caller_text`` ``[redacted N digits]``)
- ``dtmf``: ``digit``, ``method``, ``masked`` (the key is shown as ``*``: it was part of a
  sensitive slot's input or of a card number)
- ``operator``: ``action`` (hangup, transfer, say, pause, resume), ``by`` (the operator
  token's name; over MQTT the command's ``by``, else ``mqtt``), ``via`` (http or mqtt), and
  ``target`` or ``text``
- ``transfer``: ``target``, ``outcome``
- ``model_fault``: ``stage``, ``reason``, ``action`` (a model raised or hung mid-call)
- ``ended`` (the call's record): ``started_at``, ``answered_at``, ``ended_at``,
  ``duration_s``, ``outcome``, ``reason``, ``codec``, ``stats`` (packet, jitter, loss;
  ``dead_air_max_ms`` and ``dead_air_total_ms``: the caller's waits in silence)
- ``error``: ``source``, ``message`` and whatever detail helps

Commands arrive on ``sipbridge/<node>/cmd/<call_id>``: ``{"cmd": "hangup"}``,
``{"cmd": "transfer", "target": "sip:..."}``, ``{"cmd": "say", "text": "..."}``,
``{"cmd": "pause"}``, ``{"cmd": "resume"}``; each may add ``"by": "NAME"`` (who sends it,
for the call's timeline). ``parse_command`` turns a message into one of the ``Command``
dataclasses or a ``CommandError`` saying what was wrong; it never raises.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

SCHEMA = 1
ROOT = "sipbridge"
EVENTS = frozenset(
    {
        "started",
        "answered",
        "turn",
        "dtmf",
        "transfer",
        "recording",
        "model_fault",
        "operator",
        "ended",
        "error",
    }
)
MAX_COMMAND_BYTES = 16 * 1024
MAX_SEGMENT_CHARS = 256
# the call id of an error event about a command whose topic names no usable call
NO_CALL = "-"
ENVELOPE = ("schema", "event", "node", "call_id", "seq", "at")


def check_segment(kind: str, value: str) -> str:
    """A topic level must be one non-empty level without wildcards, or routing breaks."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{kind} must be a non-empty string")
    if len(value) > MAX_SEGMENT_CHARS:
        raise ValueError(f"{kind} longer than {MAX_SEGMENT_CHARS} characters")
    bad = set(value) & {"/", "+", "#", "\0"}
    if bad:
        raise ValueError(f"{kind} {value!r} contains {''.join(sorted(bad))!r}")
    return value


_ESCAPES = {"%": "%25", "/": "%2F", "+": "%2B", "#": "%23", "\0": "%00"}


def topic_call_id(call_id: str) -> str:
    """A SIP Call-ID as one topic level: ``/``, ``+``, ``#`` (legal in a Call-ID, not in a
    topic level) and ``%`` percent-encoded; payloads carry the Call-ID as it is."""
    if not isinstance(call_id, str) or not call_id:
        raise ValueError("call_id must be a non-empty string")
    return check_segment("call_id", "".join(_ESCAPES.get(c, c) for c in call_id))


def event_topic(node: str, call_id: str, event: str) -> str:
    """``sipbridge/<node>/calls/<call_id>/<event>``; a ValueError for an unknown event."""
    if event not in EVENTS:
        raise ValueError(f"unknown event {event!r} (one of {', '.join(sorted(EVENTS))})")
    return f"{ROOT}/{check_segment('node', node)}/calls/{topic_call_id(call_id)}/{event}"


def events_filter(node: str) -> str:
    """Subscription filter for every event of one node."""
    return f"{ROOT}/{check_segment('node', node)}/calls/#"


def command_topic(node: str, call_id: str) -> str:
    """Where a controller sends a command for one call."""
    return f"{ROOT}/{check_segment('node', node)}/cmd/{topic_call_id(call_id)}"


def commands_filter(node: str) -> str:
    """The node's subscription for commands to any of its calls."""
    return f"{ROOT}/{check_segment('node', node)}/cmd/+"


def _finite(value: object) -> object:
    """JSON has no NaN/inf: a broken measurement becomes null instead of a bad payload."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def build_event(
    node: str, call_id: str, event: str, seq: int, at: float, fields: Mapping[str, object]
) -> dict[str, object]:
    """The payload object; fields may not overwrite the envelope keys."""
    event_topic(node, call_id, event)
    clash = set(fields) & set(ENVELOPE)
    if clash:
        raise ValueError(f"event fields may not use {sorted(clash)}")
    payload: dict[str, object] = {
        "schema": SCHEMA,
        "event": event,
        "node": node,
        "call_id": call_id,
        "seq": seq,
        "at": at,
    }
    for key, value in fields.items():
        payload[key] = _finite(value)
    return payload


def encode_event(payload: Mapping[str, object]) -> bytes:
    """Compact UTF-8 JSON on one line (newlines in text are escaped), as spooled and sent."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


# ---- field builders: one per event, so every producer spells the fields the same way ----


def started(
    caller: str,
    callee: str,
    *,
    trunk: str | None = None,
    route: str | None = None,
    agent: str = "",
    remote: str = "",
    direction: str = "inbound",
) -> dict[str, object]:
    """A call arrived (or was placed): who, through which trunk and route, to which agent."""
    return {"caller": caller, "callee": callee, "direction": direction, "trunk": trunk,
            "route": route, "agent": agent, "remote": remote}  # fmt: skip


def answered(
    codec: str, *, agent: str = "", remote: str = "", setup_ms: float | None = None
) -> dict[str, object]:
    """The call was answered with this codec (``setup_ms``: offer to answer)."""
    return {"codec": codec, "agent": agent, "remote": remote, "setup_ms": setup_ms}


def turn(
    caller_text: str,
    agent_text: str,
    timings_ms: Mapping[str, float],
    barged_in: bool = False,
    *,
    input: str = "speech",
    keys: str = "",
) -> dict[str, object]:
    """One exchange: what the caller said (or keyed: ``input`` "keypad", ``keys``), what
    the agent played, each stage's time."""
    return {"caller_text": caller_text, "agent_text": agent_text,
            "timings_ms": dict(timings_ms), "barged_in": barged_in, "input": input,
            "keys": keys}  # fmt: skip


def dtmf(digit: str, method: str = "rfc4733", masked: bool = False) -> dict[str, object]:
    """A key the caller pressed (``method``: rfc4733 or info); a ``masked`` one is ``*``."""
    return {"digit": "*" if masked else digit, "method": method, "masked": masked}


def operator(action: str, by: str, via: str, **detail: object) -> dict[str, object]:
    """An operator acted on the call (``detail``: a transfer's ``target``, a say's ``text``)."""
    return {"action": action, "by": by, "via": via, **detail}


def transfer(target: str, outcome: str, status: int = 0, reason: str = "") -> dict[str, object]:
    """A transfer attempt and how it ended (the SIP status and reason behind it)."""
    return {"target": target, "outcome": outcome, "status": status, "reason": reason}


def model_fault(stage: str, reason: str, action: str) -> dict[str, object]:
    """A model of the call's agent raised or hung (``stage``: vad, turn, asr, tts,
    speech_model...); the bridge plays the fallback prompt, then ``action``: hangup or
    transfer."""
    return {"stage": stage, "reason": reason, "action": action}


def recording(path: str) -> dict[str, object]:
    """The call is being recorded to this file."""
    return {"path": path}


def ended(
    *,
    started_at: float,
    answered_at: float | None,
    ended_at: float,
    outcome: str,
    reason: str,
    codec: str | None,
    stats: Mapping[str, float | int | None],
    **call: object,
) -> dict[str, object]:
    """The call's record: times, outcome, reason, codec and media statistics (``call``:
    the facts ``started`` gave, repeated so this event alone is the record)."""
    return {
        **call,
        "started_at": started_at,
        "answered_at": answered_at,
        "ended_at": ended_at,
        "duration_s": round(ended_at - (answered_at or started_at), 3),
        "outcome": outcome,
        "reason": reason,
        "codec": codec,
        "stats": dict(stats),
    }


def error(source: str, message: str, **detail: object) -> dict[str, object]:
    """Something failed; ``source`` says which part (e.g. ``command``)."""
    return {"source": source, "message": message, **detail}


# ---- commands ----


@dataclass(frozen=True)
class HangupCommand:
    action: ClassVar[str] = "hangup"  # as the timeline and the MQTT topic name it
    call_id: str
    by: str = ""  # who sent it, as the command says (the timeline's "by")


@dataclass(frozen=True)
class TransferCommand:
    action: ClassVar[str] = "transfer"  # as the timeline and the MQTT topic name it
    call_id: str
    target: str
    by: str = ""


@dataclass(frozen=True)
class SayCommand:
    action: ClassVar[str] = "say"  # as the timeline and the MQTT topic name it
    call_id: str
    text: str
    by: str = ""


@dataclass(frozen=True)
class PauseCommand:
    action: ClassVar[str] = "pause"  # as the timeline and the MQTT topic name it
    call_id: str
    by: str = ""


@dataclass(frozen=True)
class ResumeCommand:
    action: ClassVar[str] = "resume"  # as the timeline and the MQTT topic name it
    call_id: str
    by: str = ""


Command = HangupCommand | TransferCommand | SayCommand | PauseCommand | ResumeCommand


@dataclass(frozen=True)
class CommandError:
    """Why a command was refused; ``call_id`` is None when the topic names no call."""

    message: str
    call_id: str | None = None
    cmd: str | None = None


# cmd -> its required string field (None: no field)
_COMMAND_FIELDS: dict[str, str | None] = {
    "hangup": None,
    "transfer": "target",
    "say": "text",
    "pause": None,
    "resume": None,
}
_MAX_FIELD_CHARS = {"target": 1024, "text": 4096}
_BY = re.compile(r"[\w.@+-]{1,64}")


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _call_id(topic: str, node: str | None) -> str | CommandError:
    parts = topic.split("/")
    if len(parts) != 4 or parts[0] != ROOT or parts[2] != "cmd":
        return CommandError(f"wrong topic {topic[:200]!r}: expected {ROOT}/<node>/cmd/<call_id>")
    if node is not None and parts[1] != node:
        return CommandError(f"topic {topic[:200]!r} is for node {parts[1]!r}, not {node!r}")
    try:
        return urllib.parse.unquote(check_segment("call_id", parts[3]))
    except ValueError as exc:
        return CommandError(f"bad topic {topic[:200]!r}: {exc}")


def parse_command(
    topic: str, payload: bytes | bytearray | str, node: str | None = None
) -> Command | CommandError:
    """Validate one command message completely; with ``node``, the topic must name it."""
    call_id = _call_id(topic, node)
    if isinstance(call_id, CommandError):
        return call_id
    raw = payload.encode() if isinstance(payload, str) else bytes(payload)
    if len(raw) > MAX_COMMAND_BYTES:
        return CommandError(f"command of {len(raw)} bytes, over {MAX_COMMAND_BYTES}", call_id)
    try:
        doc = json.loads(
            raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant
        )
    except (UnicodeDecodeError, ValueError) as exc:
        return CommandError(f"not JSON: {exc}", call_id)
    if not isinstance(doc, dict):
        return CommandError(f"expected a JSON object, got {type(doc).__name__}", call_id)
    cmd = doc.get("cmd")
    if not isinstance(cmd, str):
        return CommandError('missing "cmd" (a string)', call_id)
    if cmd not in _COMMAND_FIELDS:
        known = ", ".join(sorted(_COMMAND_FIELDS))
        return CommandError(f"unknown cmd {cmd[:100]!r} (one of {known})", call_id, cmd[:100])
    field = _COMMAND_FIELDS[cmd]
    extra = sorted(set(doc) - {"cmd", "by", field})
    if extra:
        return CommandError(f"{cmd}: unexpected field(s) {', '.join(extra)}", call_id, cmd)
    by = doc.get("by", "")
    if not isinstance(by, str) or (by and not _BY.fullmatch(by)):
        return CommandError(f'{cmd}: "by" must be a name (letters, digits, ._@+-; at most 64)',
                            call_id, cmd)  # fmt: skip
    value: str = ""
    if field is not None:
        got = doc.get(field)
        if not isinstance(got, str) or not got.strip():
            return CommandError(f'{cmd}: "{field}" must be a non-empty string', call_id, cmd)
        if len(got) > _MAX_FIELD_CHARS[field]:
            limit = _MAX_FIELD_CHARS[field]
            return CommandError(f'{cmd}: "{field}" longer than {limit} characters', call_id, cmd)
        value = got
    if cmd == "hangup":
        return HangupCommand(call_id, by)
    if cmd == "transfer":
        return TransferCommand(call_id, value, by)
    if cmd == "say":
        return SayCommand(call_id, value, by)
    if cmd == "pause":
        return PauseCommand(call_id, by)
    return ResumeCommand(call_id, by)

"""What the bridge tells the outside world about its calls: call records (SQLite), metrics
(Prometheus) and call events (MQTT), from one place.

Why one place: the server has a handful of moments in a call's life (offered, answered,
a turn, ended) and each sink wants the same facts in its own shape; the server calls
:class:`CallTelemetry` once per moment and never waits on a sink (records are small
autocommitted writes, metrics are counters, events are spooled by their link).

It is also the one place where what must not be kept is taken out before any sink sees it
(``[records] redact_card_numbers``, :mod:`agent.redaction`): card numbers in turns and
operator texts, and keys that make one, which are held back (:class:`KeypadRun`) until it
is known whether they do; keypad turns wait for their keys (:class:`KeypadTurns`: a card
keyed one menu key at a time is as many turns). Keys and keypad turns of a sensitive slot
arrive masked already.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.base import DeadAir, TurnCompleted
from agent.redaction import (
    HeldKey,
    KeypadRun,
    KeypadTurns,
    mask_card_keys,
    redact_card_numbers,
    redacted,
)
from sip_bridge.config.config_types import parse_hostport
from sip_bridge.ops import call_events as ce
from sip_bridge.ops.records import media_summary
from sip_bridge.sip.transport import TransportError

if TYPE_CHECKING:
    from sip_bridge.config.loader import BridgeConfig
    from sip_bridge.media.media_params import MediaStats
    from sip_bridge.ops.call_events import Command
    from sip_bridge.ops.headroom import HeadroomFigures
    from sip_bridge.ops.metrics import BridgeMetrics, MetricsServer
    from sip_bridge.ops.mqtt_link import MqttLink
    from sip_bridge.ops.records import CallRecords

__all__ = ["CallFacts", "CallTelemetry", "DeadAirTally", "EventSink", "hostport", "turn_total_ms"]

log = logging.getLogger(__name__)

RECENT_TURNS = 5  # per live call, for the console
KEY_GAP_S = 4.0  # keys further apart than this are not one card number
# the event fields that carry free text (what was said, typed or reported), redacted
TEXT_FIELDS = frozenset({"caller_text", "agent_text", "text", "message", "reason"})

#: ``publish(call_id, event, fields)``: a call event out (MQTT), never blocking.
EventSink = Callable[[str, str, dict[str, Any]], object]


def hostport(addr: tuple[str, int]) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass
class CallFacts:
    """What is known of one call, as the telemetry reports it."""

    call_id: str
    caller: str
    callee: str
    trunk: str | None
    route: str | None
    agent: str
    remote: str  # where the INVITE came from; then where the media goes
    started: float = field(default_factory=time.time)  # wall clock, for records and events
    answered: float | None = None
    codec: str = ""
    profile: str = ""  # the voice agent's profile that answered (its name), else ""


@dataclass
class DeadAirTally:
    """One call's dead air so far (agent.dead_air): its gaps, the longest, the total."""

    gaps: int = 0
    longest_ms: float = 0.0
    total_ms: float = 0.0

    def add(self, ms: float) -> None:
        self.gaps += 1
        self.longest_ms = max(self.longest_ms, ms)
        self.total_ms = round(self.total_ms + ms, 1)


@dataclass
class CallTelemetry:
    node: str
    records: CallRecords | None = None
    metrics: BridgeMetrics | None = None
    events: EventSink | None = None
    active: Callable[[], int] = lambda: 0
    event_errors: int = 0
    http: MetricsServer | None = None  # /metrics and /healthz
    mqtt: MqttLink | None = None  # events out, operator commands in
    # the last turns of each call in progress, for the operator console
    recent_turns: dict[str, deque[TurnCompleted]] = field(default_factory=dict)
    redact: bool = True  # [records] redact_card_numbers
    _keys: dict[str, KeypadRun] = field(default_factory=dict)  # held back, per call
    _key_timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    _key_turns: dict[str, KeypadTurns[TurnCompleted]] = field(default_factory=dict)
    # each call in progress whose agent measures it: dead air so far (console, records)
    dead_air: dict[str, DeadAirTally] = field(default_factory=dict)

    async def open(
        self,
        config: BridgeConfig,
        media_path: str,
        ready: Callable[[], bool],
        on_command: Callable[[str, Command], None],
    ) -> None:
        """Open what the config asks for. A store that cannot open, or a busy metrics port,
        stops the bridge's start with one line; the MQTT link connects in the background
        (events spool meanwhile)."""
        from model_runtime.observe import set_inference_observer
        from sip_bridge.ops.metrics import BridgeMetrics, MetricsServer
        from sip_bridge.ops.records import CallRecords
        from sip_bridge.ops.records_cli import default_db_path

        cut: list[dict[str, Any]] = []
        self.redact = config.records.redact_card_numbers
        if config.records.enabled:
            self.records = CallRecords(config.records.db or default_db_path())
            cut = self.records.mark_interrupted(self.node)
            if cut:
                log.warning("%d call(s) were in progress when this bridge last stopped", len(cut))
        if config.metrics.listen:
            host, port = parse_hostport(config.metrics.listen)
            metrics = self.metrics = BridgeMetrics()
            metrics.media_path(media_path)
            set_inference_observer(metrics.model_inference)  # every model run, timed
            http = MetricsServer(host, port, metrics, ready=ready)
            try:
                await http.start()
            except OSError as exc:
                raise TransportError(f"metrics.listen {host}:{port}: {exc.strerror}") from None
            self.http = http
        if config.mqtt.enabled:
            from sip_bridge.ops.mqtt_link import MqttLink

            m = config.mqtt
            spool = m.spool_dir or str(Path(default_db_path()).parent / "mqtt-spool")
            link = MqttLink(
                m.host, m.port, self.node, spool, on_command,
                username=m.username or None,
                password=os.environ.get(m.password_env) if m.password_env else None,
                keepalive=m.keepalive_s,
            )  # fmt: skip
            await link.start()
            self.mqtt = link
            self.events = link.publish
        for row in cut:  # their last event: a subscriber never sees a call start and not end
            self._event(row["call_id"], "ended", ce.ended(
                started_at=row["started_at"], answered_at=row["answered_at"],
                ended_at=row["ended_at"], outcome="interrupted", reason=row["end_reason"] or "",
                codec=row["codec"], stats={}, caller=row["caller"] or "",
                callee=row["callee"] or "", trunk=row["trunk"], route=None,
                agent=row["agent"] or "",
            ))  # fmt: skip

    def offered(self, c: CallFacts) -> None:
        if self.metrics is not None:
            self.metrics.call_offered(c.trunk)
            self.metrics.set_active(self.active())
        if self.records is not None:
            self.records.call_started(
                c.call_id, node=self.node, trunk=c.trunk, caller=c.caller, callee=c.callee,
                remote=c.remote, agent=c.agent, at=c.started,
            )  # fmt: skip
        self._event(c.call_id, "started", ce.started(
            c.caller, c.callee, trunk=c.trunk, route=c.route, agent=c.agent, remote=c.remote,
        ))  # fmt: skip

    def answered(
        self, c: CallFacts, codec: str, remote: str, agent: str, profile: str = ""
    ) -> None:
        c.answered, c.codec, c.remote, c.agent = time.time(), codec, remote, agent
        c.profile = profile
        setup_s = c.answered - c.started
        if self.metrics is not None:
            self.metrics.call_answered(setup_s)
        if self.records is not None:
            self.records.call_answered(c.call_id, codec=codec, agent=agent, remote=remote,
                                       at=c.answered, profile=profile)  # fmt: skip
        fields = ce.answered(codec, agent=agent, remote=remote, setup_ms=round(1000 * setup_s, 1))
        self._event(c.call_id, "answered", fields | ({"profile": profile} if profile else {}))

    def turn(self, call_id: str, t: TurnCompleted) -> bool:
        """One turn of the call; True when its caller text held a card number (masked).
        A keypad turn may wait for its keys' verdict (they may be part of a card number)."""
        if not self.redact:
            self._turn_out(call_id, t)
            return False
        # a card number said, or keyed into one entry (a sensitive slot's: the agent masked)
        found = redact_card_numbers(t.caller_text)[1] + mask_card_keys(t.keys)[1]
        if t.input != "keypad":
            self._flush_keys(call_id)  # its keys go first
            self._turn_out(call_id, t)
            return bool(found)
        ledger = self._key_turns.setdefault(call_id, KeypadTurns())
        for turn, mask in ledger.add(t.keys, t):
            self._turn_out(call_id, turn, mask)
        return bool(found)

    def _turn_out(self, call_id: str, t: TurnCompleted, card: list[bool] | None = None) -> None:
        """A turn to every sink; ``card``: which of its digits a card number keyed across
        turns holds (see KeypadTurns)."""
        if self.redact:
            t = _masked_turn(t, card or [])
        recent = self.recent_turns.get(call_id)
        if recent is None:
            recent = self.recent_turns[call_id] = deque(maxlen=RECENT_TURNS)
        recent.append(t)
        keyed = {"input": t.input, "keys": t.keys} if t.input == "keypad" else {}
        timings = {**t.stages_ms, "barged_in": t.barged_in, **keyed}
        if self.records is not None:
            self.records.turn(call_id, caller_text=t.caller_text, agent_text=t.agent_text,
                              timings=timings)  # fmt: skip
        if self.metrics is not None:
            self.metrics.turn(t.stages_ms)
        self._event(call_id, "turn", ce.turn(t.caller_text, t.agent_text, t.stages_ms,
                                             t.barged_in, input=t.input, keys=t.keys))  # fmt: skip

    def dead_air_gap(self, call_id: str, gap: DeadAir) -> None:
        """The caller waited ``gap.gap_ms`` in silence (one gap): the call's tally, metrics.
        No gap (None): the call is measured from now; its tally starts at 0."""
        tally = self.dead_air.setdefault(call_id, DeadAirTally())
        if gap.gap_ms is None:
            return
        tally.add(gap.gap_ms)
        if self.metrics is not None:
            self.metrics.dead_air_gap(gap.gap_ms / 1000)

    def load(self, figures: HeadroomFigures, shed_calls: int) -> None:
        """The node's headroom, each second and when shedding starts or ends: metrics, and
        ``/healthz`` (503 while shedding, as while draining)."""
        if self.metrics is not None:
            self.metrics.load(figures.shedding, figures.headroom_pct, figures.turn_p95_ms,
                              figures.cpu_busy_pct, shed_calls, figures.ceiling)  # fmt: skip
        if self.http is not None:
            self.http.set_shedding(figures.shedding)

    def model_fault(self, call_id: str, stage: str, reason: str, action: str) -> None:
        """A model of the call's agent raised or hung: the timeline, the fault counter and
        a ``model_fault`` event (the record's end reason comes with :meth:`ended`)."""
        if self.metrics is not None:
            self.metrics.model_fault(stage)
        self.event(call_id, "model_fault", ce.model_fault(stage, reason, action))

    def event(self, call_id: str, kind: str, fields: dict[str, Any]) -> None:
        """A line in the call's timeline (``fields`` from the call_events builder of
        ``kind``: transfer, recording, operator...): records and events."""
        self._flush_keys(call_id)
        self._timeline(call_id, kind, self._redacted(fields))

    def _timeline(self, call_id: str, kind: str, fields: dict[str, Any],
                  at: float | None = None) -> None:  # fmt: skip
        if self.records is not None:
            self.records.event(call_id, kind, fields, at=at)
        self._event(call_id, kind, fields)

    def transfer_ended(
        self, call_id: str, target: str, outcome: str, status: int, reason: str
    ) -> None:
        """A transfer's final outcome: in the call's timeline and the metrics; anything but
        success is a WARNING (an operator watching the log learns that escalations fail)."""
        if outcome != "succeeded":
            log.warning(
                "call %s: transfer to %s %s: status %d (%s)", call_id, target, outcome, status,
                reason,
            )  # fmt: skip
        if self.metrics is not None:
            self.metrics.transfer_ended(outcome, status)
        self.event(call_id, "transfer", ce.transfer(target, outcome, status, reason))

    def _redacted(self, fields: dict[str, Any]) -> dict[str, Any]:
        if not self.redact:
            return fields
        return {k: redact_card_numbers(v)[0] if k in TEXT_FIELDS and isinstance(v, str) else v
                for k, v in fields.items()}  # fmt: skip

    def operator(self, call_id: str, action: str, by: str, via: str, **detail: object) -> None:
        """An operator acted on the call (hang-up, transfer, say...): who, and how."""
        self.event(call_id, "operator", ce.operator(action, by, via, **detail))

    # -- keys ------------------------------------------------------------------------------

    def dtmf(self, call_id: str, digit: str, method: str = "rfc4733",
             sensitive: bool = False) -> None:  # fmt: skip
        """A key the caller pressed. ``sensitive``: part of a sensitive slot's input, kept
        as ``*``. Other digits wait until it is known whether they make a card number."""
        seq = -1
        if not sensitive and self.redact and "0" <= digit <= "9" and len(digit) == 1:
            seq = self._key_turns.setdefault(call_id, KeypadTurns()).pressed(digit)
        key = HeldKey(digit, time.time(), method, seq)
        if sensitive or not self.redact:
            self._flush_keys(call_id)
            self._timeline(call_id, "dtmf", ce.dtmf(digit, method, sensitive), at=key.at)
            return
        run = self._keys.get(call_id)
        if run is None:
            run = self._keys[call_id] = KeypadRun(KEY_GAP_S)
        self._keys_out(call_id, run.push(key))
        timer = self._key_timers.pop(call_id, None)
        if timer is not None:
            timer.cancel()
        if run.holding:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a tool, a test): they go at the next event
                return
            self._key_timers[call_id] = loop.call_later(KEY_GAP_S, self._flush_keys, call_id)

    def _flush_keys(self, call_id: str) -> None:
        """The call's run of keys is over: every held key goes out."""
        timer = self._key_timers.pop(call_id, None)
        if timer is not None:
            timer.cancel()
        run = self._keys.get(call_id)
        if run is not None and run.holding:
            self._keys_out(call_id, run.flush())

    def _keys_out(self, call_id: str, keys: list[tuple[HeldKey, bool]]) -> None:
        ledger = self._key_turns.get(call_id)
        for key, masked in keys:
            self._timeline(call_id, "dtmf", ce.dtmf(key.digit, key.method, masked), at=key.at)
            if ledger is not None:  # the keypad turns waiting for this key
                for turn, mask in ledger.released(key.seq, masked):
                    self._turn_out(call_id, turn, mask)

    def ended(
        self, c: CallFacts, outcome: str, reason: str, media: MediaStats | None = None
    ) -> None:
        self._flush_keys(c.call_id)
        self._keys.pop(c.call_id, None)
        ledger = self._key_turns.pop(c.call_id, None)
        for turn, mask in ledger.drain() if ledger is not None else ():
            self._turn_out(c.call_id, turn, mask)
        self.recent_turns.pop(c.call_id, None)
        tally = self.dead_air.pop(c.call_id, None)
        now = time.time()
        duration = now - c.answered if c.answered is not None else 0.0
        dead = None if tally is None else (tally.longest_ms, tally.total_ms)
        if self.records is not None:
            self.records.call_ended(c.call_id, outcome=outcome, end_reason=reason, media=media,
                                    dead_air=dead, at=now)  # fmt: skip
        stats: dict[str, float | int] = media_summary(media) if media is not None else {}
        if dead is not None:
            stats |= {"dead_air_max_ms": dead[0], "dead_air_total_ms": dead[1]}
            if self.metrics is not None:
                self.metrics.call_dead_air(dead[0] / 1000)
        if self.metrics is not None:
            late = media.pacer_late_frames + media.pacer_skipped_frames if media else 0
            self.metrics.set_active(self.active())
            self.metrics.call_ended(
                outcome, duration, late, int(stats.get("packets_out", 0)),
                float(stats.get("jb_delay_ms", 0.0)), float(stats.get("loss_pct", 0.0)),
            )  # fmt: skip
        self._event(c.call_id, "ended", ce.ended(
            started_at=c.started, answered_at=c.answered, ended_at=now, outcome=outcome,
            reason=reason, codec=c.codec, stats=stats, caller=c.caller, callee=c.callee,
            trunk=c.trunk, route=c.route, agent=c.agent,
            **({"profile": c.profile} if c.profile else {}),
        ))  # fmt: skip

    def _event(self, call_id: str, kind: str, fields: dict[str, object]) -> None:
        if self.events is not None:
            try:
                self.events(call_id, kind, fields)
            except (ValueError, TypeError) as exc:  # a Call-ID no topic can carry, say
                self.event_errors += 1
                if self.event_errors <= 3:
                    log.warning("call %s: event %s not sent: %s", call_id, kind, exc)

    async def close(self) -> None:
        for call_id in list(self._keys):
            self._flush_keys(call_id)
        if self.records is not None:
            self.records.close()
        if self.http is not None:
            from model_runtime.observe import set_inference_observer

            await self.http.stop()
            set_inference_observer(None)
        if self.mqtt is not None:  # the last events (ended) go out if the broker is there
            await self.mqtt.stop(drain_timeout=2.0)


def _masked_turn(t: TurnCompleted, keyed: list[bool]) -> TurnCompleted:
    """``t`` as it may be kept: card numbers out of its texts and keys; ``keyed``: which of
    its digits belong to a card number keyed across turns."""
    keys = t.keys
    if any(keyed):
        it = iter(keyed)
        keys = "".join("*" if "0" <= ch <= "9" and next(it, True) else ch for ch in t.keys)
        shown = re.sub(r"\*+", lambda m: redacted(len(m.group())), keys)
        t = replace(t, caller_text=f"(keypad {shown})")
    caller, _ = redact_card_numbers(t.caller_text)
    agent, _ = redact_card_numbers(t.agent_text)
    keys, _ = mask_card_keys(keys)
    return replace(t, caller_text=caller, agent_text=agent, keys=keys)


def turn_total_ms(stages: Mapping[str, Any]) -> float | None:
    """A turn's latency: its ``total``, else the sum of its stages (None: no figures)."""
    total = stages.get("total")
    if isinstance(total, int | float) and not isinstance(total, bool):
        return round(float(total), 1)
    parts = [v for v in stages.values() if isinstance(v, int | float) and not isinstance(v, bool)]
    return round(float(sum(parts)), 1) if parts else None

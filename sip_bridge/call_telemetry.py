"""What the bridge tells the outside world about its calls: call records (SQLite), metrics
(Prometheus) and call events (MQTT), from one place.

Why one place: the server has a handful of moments in a call's life (offered, answered,
a turn, ended) and each sink wants the same facts in its own shape; the server calls
:class:`CallTelemetry` once per moment and never waits on a sink (records are small
autocommitted writes, metrics are counters, events are spooled by their link).
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.base import DeadAir, TurnCompleted
from sip_bridge import call_events as ce
from sip_bridge.config_types import parse_hostport
from sip_bridge.records import media_summary
from sip_bridge.transport import TransportError

if TYPE_CHECKING:
    from sip_bridge.call_events import Command
    from sip_bridge.config import BridgeConfig
    from sip_bridge.media_params import MediaStats
    from sip_bridge.metrics import BridgeMetrics, MetricsServer
    from sip_bridge.mqtt_link import MqttLink
    from sip_bridge.records import CallRecords

__all__ = ["CallFacts", "CallTelemetry", "DeadAirTally", "EventSink", "hostport"]

log = logging.getLogger(__name__)

RECENT_TURNS = 5  # per live call, for the console

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
        from sip_bridge.metrics import BridgeMetrics, MetricsServer
        from sip_bridge.records import CallRecords
        from sip_bridge.records_cli import default_db_path

        cut: list[dict[str, Any]] = []
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
            from sip_bridge.mqtt_link import MqttLink

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

    def turn(self, call_id: str, t: TurnCompleted) -> None:
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
        """The caller waited ``gap.gap_ms`` in silence (one gap): the call's tally, metrics."""
        self.dead_air.setdefault(call_id, DeadAirTally()).add(gap.gap_ms)
        if self.metrics is not None:
            self.metrics.dead_air_gap(gap.gap_ms / 1000)

    def model_fault(self, call_id: str, stage: str, reason: str, action: str) -> None:
        """A model of the call's agent raised or hung: the timeline, the fault counter and
        a ``model_fault`` event (the record's end reason comes with :meth:`ended`)."""
        if self.metrics is not None:
            self.metrics.model_fault(stage)
        self.event(call_id, "model_fault", ce.model_fault(stage, reason, action))

    def event(self, call_id: str, kind: str, fields: dict[str, Any]) -> None:
        """A line in the call's timeline (``fields`` from the call_events builder of
        ``kind``: dtmf, transfer, recording): records and events."""
        if self.records is not None:
            self.records.event(call_id, kind, fields)
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

    def ended(
        self, c: CallFacts, outcome: str, reason: str, media: MediaStats | None = None
    ) -> None:
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
        if self.records is not None:
            self.records.close()
        if self.http is not None:
            from model_runtime.observe import set_inference_observer

            await self.http.stop()
            set_inference_observer(None)
        if self.mqtt is not None:  # the last events (ended) go out if the broker is there
            await self.mqtt.stop(drain_timeout=2.0)

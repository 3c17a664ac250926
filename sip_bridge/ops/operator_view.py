"""What an operator asks and tells a running bridge: its status (``sip-bridge status``,
the control socket) and commands for one call (MQTT: hang up, transfer, say, pause,
resume)."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import TYPE_CHECKING, Any

from agent.base import PauseAgent, ResumeAgent, SayText
from sip_bridge import __version__
from sip_bridge.ops.call_events import (
    Command,
    HangupCommand,
    PauseCommand,
    ResumeCommand,
    SayCommand,
    TransferCommand,
)
from sip_bridge.ops.records import media_summary

if TYPE_CHECKING:
    from sip_bridge.bridge_surface import Bridge, CallSnapshot

__all__ = ["apply_command", "bridge_status", "status_entry"]

log = logging.getLogger("sip_bridge.server")


def apply_command(
    server: Bridge, call_id: str, command: Command, *, by: str = "", via: str = "mqtt"
) -> None:
    """An operator's command for one call (MQTT, or the console's API: ``via``); ValueError
    becomes an error event. What is done goes on the call's timeline with ``by``, the
    operator token's name (over MQTT the command's own ``by``, else "mqtt")."""
    agent = server.call_agent(call_id)  # ValueError: no such call in progress
    by = by or command.by or via
    action = command.action
    log.info("call %s: operator command %s by %s (%s)", call_id, command, by, via)
    if isinstance(command, HangupCommand):
        server.telemetry.operator(call_id, action, by, via)
        server.hangup(call_id, "operator hung up")
        return
    if isinstance(command, TransferCommand):
        server.telemetry.operator(call_id, action, by, via, target=command.target)
        server.transfer(call_id, command.target)
        return
    if agent is None or not agent.takes_commands:
        name = agent.name if agent is not None else "(not answered yet)"
        raise ValueError(f"agent {name} does not take {action}")
    detail = {"text": command.text} if isinstance(command, SayCommand) else {}
    server.telemetry.operator(call_id, action, by, via, **detail)
    if isinstance(command, SayCommand):
        agent.on_event(SayText(command.text))
    elif isinstance(command, PauseCommand):
        agent.on_event(PauseAgent())
    elif isinstance(command, ResumeCommand):
        agent.on_event(ResumeAgent())


def status_entry(c: CallSnapshot) -> dict[str, Any]:
    """One call as ``sip-bridge status`` lists it."""
    entry: dict[str, Any] = {
        "call_id": c.call_id,
        "caller": c.caller,
        "callee": c.callee,
        "trunk": c.trunk,
        "route": c.route,
        "agent": c.agent,
        "state": "answered" if c.answered else "setting up",
        "duration_s": round(c.duration_s, 1),
    }
    st = c.media
    if st is not None:
        jb = st.jitter
        entry.update(
            codec=c.codec,
            remote=f"{st.remote[0]}:{st.remote[1]}",
            packets_in=st.packets_in,
            packets_out=st.packets_out,
            jitter_delay_ms=round(jb.current_delay_ms, 1),
            jitter_ms=round(jb.jitter_ms, 1),
            loss_pct=round(float(media_summary(st)["loss_pct"]), 2),
            sending=st.sending,
            receiving=st.receiving,
        )
    return entry


def bridge_status(server: Bridge) -> dict[str, Any]:
    """What an operator asks a running bridge: calls, registrations, counters."""
    now = asyncio.get_running_loop().time()
    calls = [status_entry(c) for c in server.call_snapshots()]
    regs = server.registrations
    sip = server.config.sip
    return {
        "version": __version__,
        "uptime_s": round(server.uptime_s, 1),
        # the file it runs with, and what chose it (--config, $SIP_BRIDGE_CONFIG, ...)
        "config": {"path": server.config.path, "source": server.config_source},
        "listen": f"{'+'.join(sip.transports)} {sip.listen_host}:{server.port}",
        "agent": server.config.agent.name,
        "limits": {"max_calls": sip.max_calls},
        "counters": {**server.stats, "active": server.active_calls},
        "draining": server.draining,
        "load": server.load_status(),
        "admission": (
            {**server.policy.counts, "silenced": server.policy.silenced_count}
            if server.policy is not None
            else {}
        ),
        "registrations": regs.regs.status(now) if regs is not None else [],
        "models": _models_in_use(),
        "media_path": server.media_path,
        "calls": calls,
    }


def _models_in_use() -> dict[str, str]:
    """Model -> the execution provider it really runs on (CPU, CUDA...): empty until an
    agent loaded one. Read lazily: a bridge with a line-check agent never loads onnxruntime."""
    sessions = sys.modules.get("model_runtime.sessions")
    return dict(sessions.providers_in_use()) if sessions is not None else {}

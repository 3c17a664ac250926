"""What the web pages show, as plain data: the agent profiles a browser may talk to, and the
live calls of both legs (SIP and WebRTC) in one shape for the operator console."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sip_bridge.ops.call_telemetry import turn_total_ms
from sip_bridge.ops.operator_view import status_entry

if TYPE_CHECKING:
    from agent.base import TurnCompleted
    from sip_bridge.bridge_surface import Bridge
    from sip_bridge.config.loader import BridgeConfig
    from sip_bridge.ops.call_telemetry import DeadAirTally
    from sip_bridge.web.webrtc_leg import BrowserSession

__all__ = ["live_calls", "talk_profiles"]

_CUT = 200  # characters of a turn's text in the live view


def talk_profiles(config: BridgeConfig) -> dict[str, tuple[str, BridgeConfig]]:
    """key -> (label, the config a session with it runs): the default agent, every route's,
    and every other profile file beside the default one (``config/agents/*.toml``). Only
    these can be picked: a page never names a file."""
    out: dict[str, tuple[str, BridgeConfig]] = {}
    seen: set[tuple[str, str]] = set()

    def add(key: str, label: str, cfg: BridgeConfig) -> None:
        a = cfg.agent
        ident = (a.name, a.voice_profile if a.name == "voice" else "")
        if ident in seen or key in out:
            return
        seen.add(ident)
        out[key] = (label, cfg)

    add(_name(config), f"{_describe(config)} (default)", config)
    for route in config.routes:
        cfg = config.for_route(route)
        add(f"route:{route.name}", f"{_describe(cfg)} (route {route.name})", cfg)
    folder = Path(config.agent.voice_profile).parent
    for path in sorted(folder.glob("*.toml")) if folder.is_dir() else ():
        cfg = replace(config, agent=replace(config.agent, name="voice", voice_profile=str(path)))
        add(path.stem, _describe(cfg), cfg)
    return out


def _name(cfg: BridgeConfig) -> str:
    a = cfg.agent
    return Path(a.voice_profile).stem if a.name == "voice" else a.name


def _describe(cfg: BridgeConfig) -> str:
    a = cfg.agent
    if a.name == "voice":
        return f"{_profile_name(a.voice_profile)} (voice agent, {Path(a.voice_profile).name})"
    return f"{a.name} agent"


def _profile_name(path: str) -> str:
    """A profile's own name (``[agent] name``, as records and events give it), else its
    file's stem; read without the whole check (the page lists files nobody loaded yet)."""
    try:
        name = tomllib.loads(Path(path).read_text(encoding="utf-8")).get("agent", {}).get("name")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, AttributeError):
        name = None
    return name if isinstance(name, str) and name.strip() else Path(path).stem


def _turns(turns: Iterable[TurnCompleted]) -> list[dict[str, Any]]:
    cut = _CUT
    return [
        {
            "caller": t.caller_text[:cut],
            "agent": t.agent_text[:cut],
            "total_ms": turn_total_ms(t.stages_ms),
            "input": t.input,
            "keys": t.keys,
        }
        for t in turns
    ]


def _dead_air(tally: DeadAirTally | None) -> dict[str, Any] | None:
    """The call's dead air so far (longest and total wait in silence, ms), if measured."""
    if tally is None:
        return None
    return {"longest_ms": tally.longest_ms, "total_ms": tally.total_ms, "gaps": tally.gaps}


def live_calls(
    bridge: Bridge, sessions: Iterable[BrowserSession], now: float
) -> list[dict[str, Any]]:
    """Every call in progress, SIP then WebRTC, in the console's shape."""
    out = []
    for snap in bridge.call_snapshots():
        c = status_entry(snap)
        turns = _turns(snap.recent_turns)
        cfg = snap.config
        out.append({
            "call_id": c["call_id"], "leg": "sip", "caller": c["caller"], "callee": c["callee"],
            "trunk": c["trunk"], "route": c["route"], "agent": c["agent"],
            # the profile's own name once it answered (the after-hours one, out of hours)
            "profile": (snap.profile or _name(cfg)) if cfg.agent.name == "voice" else None,
            "state": c["state"], "duration_s": c["duration_s"],
            "jitter_ms": c.get("jitter_ms"), "loss_pct": c.get("loss_pct"),
            "turn_latency_ms": turns[-1]["total_ms"] if turns else None,
            "dead_air": _dead_air(snap.dead_air), "last_turns": turns,
        })  # fmt: skip
    recent, dead_air = bridge.telemetry.recent_turns, bridge.telemetry.dead_air  # WebRTC's
    for s in sessions:
        if s.closed_reason is not None:
            continue
        turns = _turns(recent.get(s.call.call_id, ()))
        out.append({
            "call_id": s.call.call_id, "leg": "webrtc", "caller": s.call.caller,
            "callee": s.profile, "trunk": None, "route": f"webrtc:{s.profile}",
            "agent": s.agent.name, "profile": s.profile, "state": s.state,
            "duration_s": round(s.duration_s(now), 1), "jitter_ms": None, "loss_pct": None,
            "turn_latency_ms": turns[-1]["total_ms"] if turns else None,
            "dead_air": _dead_air(dead_air.get(s.call.call_id)), "last_turns": turns,
        })  # fmt: skip
    return out

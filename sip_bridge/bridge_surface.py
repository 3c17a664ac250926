"""What a running bridge offers the parts that watch and steer it: operator commands and
status (:mod:`sip_bridge.ops.operator_view`), the console (:mod:`sip_bridge.web.console_view`),
the web server and config reload.

:class:`sip_bridge.server.BridgeServer` imports those parts; they type against these
protocols instead of importing it back, and see only what is here: no private member of
the server or of its per-call record. May import the config, agent and media types it
names; nothing that imports the server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from agent.base import Agent, TurnCompleted
    from sip_bridge.config.loader import BridgeConfig
    from sip_bridge.media.media_params import MediaStats
    from sip_bridge.ops.call_telemetry import CallTelemetry, DeadAirTally
    from sip_bridge.sip.admission import InboundPolicy
    from sip_bridge.sip.registrar_link import RegistrarLink

__all__ = ["Bridge", "CallSnapshot"]


@dataclass(frozen=True)
class CallSnapshot:
    """One SIP call as the operators' tools show it, read at one moment: what it is, where
    its media stands, and what was said lately, in one record (the status, the console and
    the web API read this; none of them touches the server's per-call state)."""

    call_id: str
    caller: str
    callee: str
    trunk: str | None  # the [[trunks]] entry it came in on
    route: str | None  # the [[routes]] entry that picked its agent; None: the default
    config: BridgeConfig  # the call's own (its route's), kept across a reload
    profile: str  # the voice profile's own name it answered with ("" before, or no profile)
    answered: bool
    duration_s: float  # since answered (since offered, before)
    codec: str
    media: MediaStats | None  # None until answered
    recent_turns: tuple[TurnCompleted, ...]  # the last few, oldest first
    dead_air: DeadAirTally | None  # None until measured

    @property
    def agent(self) -> str:
        """The kind of agent answering it ([agent] name: voice, echo, ...)."""
        return self.config.agent.name


class Bridge(Protocol):
    """The bridge as its operators' tools see it: its state, and what they may ask of it."""

    @property
    def config(self) -> BridgeConfig: ...
    @property
    def config_source(self) -> str: ...  # what chose config.path (--config, the lookup...)
    @property
    def agent_factory(self) -> Callable[[BridgeConfig], Agent]: ...
    @property
    def active_calls(self) -> int: ...  # SIP calls in progress (set up or answered)
    @property
    def telemetry(self) -> CallTelemetry: ...
    @property
    def stats(self) -> Mapping[str, int]: ...
    @property
    def policy(self) -> InboundPolicy | None: ...
    @property
    def registrations(self) -> RegistrarLink | None: ...
    @property
    def media_path(self) -> str: ...
    @property
    def draining(self) -> bool: ...
    @property
    def port(self) -> int: ...
    @property
    def uptime_s(self) -> float: ...

    def load_status(self) -> dict[str, Any]:
        """The node's headroom ([load]): figures, budgets, whether it sheds new calls."""
        ...

    def call_snapshots(self) -> list[CallSnapshot]:
        """Every SIP call in progress, in the order they came in."""
        ...

    def call_agent(self, call_id: str) -> Agent | None:
        """The agent answering the call (None while it is set up); ValueError when no such
        call is in progress here."""
        ...

    def hangup(self, call_id: str, reason: str) -> None:
        """End the call (BYE, or CANCEL/487 before it was answered)."""
        ...

    def transfer(self, call_id: str, target: str) -> None:
        """Blind-transfer the call to ``target`` (a SIP URI): REFER; ValueError if not up."""
        ...

    async def reload(self, new: BridgeConfig) -> list[str]:
        """Use ``new`` for calls from now on; returns the keys that need a restart."""
        ...

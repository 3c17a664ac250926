"""What a running bridge offers the parts that watch and steer it: operator commands and
status (:mod:`sip_bridge.operator_view`), the console (:mod:`sip_bridge.console_view`),
the web server and config reload.

:class:`sip_bridge.server.BridgeServer` imports those parts; they type against these
protocols instead of importing it back, and see only what is here: no private member of
the server or of its per-call record. May import the config, agent and media types it
names; nothing that imports the server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from agent.base import Agent, CallInfo
    from sip_bridge.admission import InboundPolicy
    from sip_bridge.call_telemetry import CallFacts, CallTelemetry
    from sip_bridge.config import BridgeConfig
    from sip_bridge.media import CallMedia
    from sip_bridge.registrar_link import RegistrarLink

__all__ = ["Bridge", "LiveCall"]


class LiveCall(Protocol):
    """One SIP call the bridge holds, read-only."""

    @property
    def call_id(self) -> str: ...
    @property
    def info(self) -> CallInfo: ...
    @property
    def media(self) -> CallMedia | None: ...  # None until answered
    @property
    def ended(self) -> bool: ...
    @property
    def trunk(self) -> str | None: ...
    @property
    def route(self) -> str | None: ...
    @property
    def config(self) -> BridgeConfig | None: ...  # its route's, kept across a reload
    @property
    def started_at(self) -> float: ...
    @property
    def answered_at(self) -> float | None: ...
    @property
    def facts(self) -> CallFacts | None: ...


class Bridge(Protocol):
    """The bridge as its operators' tools see it: its state, and what they may ask of it."""

    @property
    def config(self) -> BridgeConfig: ...
    @property
    def config_source(self) -> str: ...  # what chose config.path (--config, the lookup...)
    @property
    def agent_factory(self) -> Callable[[BridgeConfig], Agent]: ...
    @property
    def calls(self) -> Mapping[str, LiveCall]: ...
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

    def hangup(self, call_id: str, reason: str) -> None:
        """End the call (BYE, or CANCEL/487 before it was answered)."""
        ...

    def transfer(self, call_id: str, target: str) -> None:
        """Blind-transfer the call to ``target`` (a SIP URI): REFER; ValueError if not up."""
        ...

    async def reload(self, new: BridgeConfig) -> list[str]:
        """Use ``new`` for calls from now on; returns the keys that need a restart."""
        ...

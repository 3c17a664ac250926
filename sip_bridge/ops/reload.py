"""Reloading a running bridge's config: on SIGHUP, or when one of its files changed.

New calls use the new config; calls in progress keep theirs (their agent and media were
made from it). A broken edit (a config mistake, a broken agent profile, a missing model) is
refused with its one-line error, and the running config stays. What the bridge is bound
to (listen address, transports, TLS listener, SIP timers, RTP ports, control socket, the
model runtime, trunk registrations) needs a restart: a reload keeps the running value and
names what it kept.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from sip_bridge.config.loader import BridgeConfig, ConfigError

if TYPE_CHECKING:
    from sip_bridge.bridge_surface import Bridge

__all__ = ["ConfigWatcher", "keep_bound", "reload_bridge", "watched_files"]

log = logging.getLogger(__name__)

_REGISTRATION_KEYS = (
    "registrar", "username", "auth_username", "domain", "password", "expires_s", "transport",
)  # fmt: skip


def keep_bound(old: BridgeConfig, new: BridgeConfig) -> tuple[BridgeConfig, list[str]]:
    """``new`` with what needs a restart taken from ``old``, and the names of those that
    differed (kept at their running values)."""
    kept: list[str] = []
    for name, a, b in (
        ("sip.listen", old.sip.listen, new.sip.listen),
        ("sip.transports", old.sip.transports, new.sip.transports),
        ("sip.tls", old.sip.tls, new.sip.tls),
        ("sip.timers", old.sip.timers, new.sip.timers),
        ("sip.external_address", old.sip.external_address, new.sip.external_address),
        ("rtp.ports", old.rtp.ports, new.rtp.ports),
        ("control", old.control, new.control),
        ("models", old.models, new.models),
        ("http.listen", old.http.listen, new.http.listen),
    ):
        if a != b:
            kept.append(name)
    regs_old = {t.name: [getattr(t, k) for k in _REGISTRATION_KEYS] for t in old.trunks}
    regs_new = {t.name: [getattr(t, k) for k in _REGISTRATION_KEYS] for t in new.trunks}
    if regs_old != regs_new:
        kept.append("trunks (registrations)")
    sip = replace(
        new.sip,
        listen=old.sip.listen,
        transports=old.sip.transports,
        tls=old.sip.tls,
        timers=old.sip.timers,
        external_address=old.sip.external_address,
    )
    rtp = replace(new.rtp, ports=old.rtp.ports)
    http = replace(new.http, listen=old.http.listen)
    merged = replace(new, sip=sip, rtp=rtp, control=old.control, models=old.models, http=http)
    return merged, kept


def watched_files(config: BridgeConfig) -> list[Path]:
    """The files a running bridge's behaviour comes from: the config and the agent
    profiles it names (nothing for the built-in defaults)."""
    if config.path == "<defaults>":
        return []
    files = {Path(config.path)}
    for cfg in config.agent_configs():
        if cfg.agent.name == "voice":
            files.add(Path(cfg.agent.voice_profile))
    return sorted(files)


class ConfigWatcher:
    """Notices a change of any watched file (modification time, size, or the file coming
    or going) by polling: no inotify dependency, and an editor's rename-over is seen."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files
        self._seen = self._snapshot()

    def _snapshot(self) -> dict[Path, tuple[int, int] | None]:
        out: dict[Path, tuple[int, int] | None] = {}
        for f in self.files:
            try:
                st = os.stat(f)
                out[f] = (st.st_mtime_ns, st.st_size)
            except OSError:
                out[f] = None
        return out

    def changed(self) -> bool:
        now = self._snapshot()
        if now == self._seen:
            return False
        self._seen = now
        return True

    def watch(self, files: list[Path]) -> None:
        """Follow a new set of files (a reload may name other profiles)."""
        self.files = files
        self._seen = self._snapshot()


async def reload_bridge(server: Bridge, load: Callable[[], BridgeConfig]) -> bool:
    """Load the config again and hand it to the running bridge; False (and one logged
    line) when the edit is refused, the running config unchanged."""
    from agent.dialogue.profile import ProfileError
    from model_runtime.store import ModelError

    try:
        config = load()
        kept = await server.reload(config)
    except (ConfigError, ProfileError, ModelError, ValueError) as exc:
        log.error("config reload refused, the running config stays: %s", exc)
        return False
    for warning in config.warnings:  # taken, but probably not what was meant
        log.warning("%s", warning)
    if kept:
        log.warning("config reloaded; these need a restart and kept their values: %s",
                    ", ".join(kept))  # fmt: skip
    else:
        log.warning("config reloaded: new calls use it, calls in progress keep theirs")
    return True

"""Where the bridge's files are: the defaults it ships, and which bridge.toml a command uses.

Why: an operator installs a wheel, not a checkout. The wheel carries ``config/`` (the
default bridge.toml, the agent profiles and their README, the prompts, the call scripts)
as ``sip_bridge/defaults/``; a checkout has it at ``config/``. Without ``--config`` a
command takes the first of :data:`LOOKUP` that applies, and says which, so nobody has to
guess what a running bridge read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ENV",
    "LOOKUP",
    "RUNTIME_DIR",
    "SYSTEM_CONFIG",
    "ConfigChoice",
    "find_config",
    "packaged_config",
    "packaged_dir",
]

#: The environment variable that names the config file (first in the lookup).
ENV = "SIP_BRIDGE_CONFIG"
#: Where a system-wide install keeps it (``sip-bridge init /etc/sip-bridge``).
SYSTEM_CONFIG = Path("/etc/sip-bridge/bridge.toml")
#: The systemd unit's RuntimeDirectory: the control socket's default home under systemd.
RUNTIME_DIR = Path("/run/sip-bridge")
#: The lookup order without ``--config``, as printed at start and by ``--help``.
LOOKUP = (f"${ENV}", "./config/bridge.toml", str(SYSTEM_CONFIG), "the packaged default")

_PACKAGE = Path(__file__).resolve().parents[1]  # sip_bridge/


def packaged_dir() -> Path:
    """The shipped defaults: ``sip_bridge/defaults/`` in an installed wheel, else the
    checkout's ``config/`` (an editable install or a source tree)."""
    installed = _PACKAGE / "defaults"
    if (installed / "bridge.toml").is_file():
        return installed
    return _PACKAGE.parent / "config"


def packaged_config() -> Path:
    return packaged_dir() / "bridge.toml"


@dataclass(frozen=True)
class ConfigChoice:
    """The file a command reads, and what chose it (one of :data:`LOOKUP`, or --config)."""

    path: Path | None  # None: no file at all, the built-in defaults
    source: str

    def short(self) -> str:
        """The file and, when that says more, what chose it."""
        if self.path is None:
            return "none: the built-in defaults"
        if self.source in ("--config", str(self.path)):
            return str(self.path)
        return f"{self.path} ({self.source})"

    def describe(self) -> str:
        """One line for the start banner: the file, why that one, and where else it looked."""
        if self.path is None:
            return f"config: none found ({', '.join(LOOKUP)}): the built-in defaults"
        if self.source == "--config":
            return f"config: {self.path} (--config)"
        return f"config: {self.path} ({self.source}; lookup: {', '.join(LOOKUP)})"


def find_config(
    explicit: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    system: Path = SYSTEM_CONFIG,
) -> ConfigChoice:
    """``--config`` if given; else ``$SIP_BRIDGE_CONFIG`` (used even when it names a file
    that is missing: the load then says so, rather than silently running something else);
    else ``./config/bridge.toml``, ``/etc/sip-bridge/bridge.toml`` and the packaged
    default, the first that exists (a source tree copied without ``config/`` has none:
    then no file, the built-in defaults)."""
    if explicit is not None:
        return ConfigChoice(Path(explicit).absolute(), "--config")
    named = (os.environ if env is None else env).get(ENV, "")
    if named:
        return ConfigChoice(Path(named).absolute(), f"${ENV}")
    local = (cwd or Path.cwd()) / "config" / "bridge.toml"
    if local.is_file():
        return ConfigChoice(local.absolute(), "./config/bridge.toml")
    if system.is_file():
        return ConfigChoice(system, str(system))
    packaged = packaged_config()
    if packaged.is_file():
        return ConfigChoice(packaged, "the packaged default")
    return ConfigChoice(None, "built-in defaults")

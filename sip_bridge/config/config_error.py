"""A configuration mistake, located (`file:line: key: message`), and the checks every part
of the config's parsing shares. A leaf: the section parsers, routes and trunks raise it,
and :mod:`sip_bridge.config.loader` (which imports them all) re-exports it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ConfigError", "is_file"]


class ConfigError(ValueError):
    """A configuration mistake, located: `file:line: key: message`."""

    def __init__(self, path: str, line: int | None, key: str, message: str) -> None:
        self.path, self.line, self.key = path, line, key
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {key}: {message}")


def is_file(path: Path) -> bool:
    """``path.is_file()``, False for a name the OS refuses (too long, NUL...) rather than
    an exception: a config names files, and a mangled name is a config mistake."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False

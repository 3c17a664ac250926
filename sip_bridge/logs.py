"""The bridge's log output: text for a person, or one JSON object per line for a collector
(``[log] format``), at ``[log] level``; every JSON line about a call carries its call id.

Why a context variable: most lines about a call are written far from the code that knows
its id (the agent's dialogue, a model fault, a media error), and those layers never import
``sip_bridge``. The server runs each call's work with :data:`CALL_ID` set (its tasks, and
the media clock around each call's agent), and asyncio copies it into whatever that work
schedules. A line whose format starts ``call %s`` names its call in its first argument,
and ``extra={"call_id": ...}`` names it outright; either wins over the context.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, TextIO

__all__ = [
    "CALL_ID",
    "JsonFormatter",
    "banner",
    "call_context",
    "call_id_of",
    "configure",
    "neutral_context",
]

#: The call the running code works for (None: the bridge itself, or several calls).
CALL_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("call_id", default=None)

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}  # fmt: skip
# the message conventions that name a call (or a browser session) in the first argument
_NAMED = ("call %s", "browser %s", "browser session %s")


@contextlib.contextmanager
def call_context(call_id: str | None) -> Iterator[None]:
    """Run the block (and what it schedules) as ``call_id``'s work."""
    token = CALL_ID.set(call_id)
    try:
        yield
    finally:
        CALL_ID.reset(token)


def neutral_context() -> contextvars.Context:
    """A context that belongs to no call: for timers shared by every call (the SIP timer,
    the media clock), which would otherwise keep the context of the call that started
    them and put its id on every other call's lines."""
    ctx = contextvars.copy_context()
    ctx.run(CALL_ID.set, None)
    return ctx


def call_id_of(record: logging.LogRecord) -> str | None:
    """The call a record is about: ``extra``, the ``call %s`` convention, else the context."""
    explicit = getattr(record, "call_id", None)
    if isinstance(explicit, str):
        return explicit
    msg, args = record.msg, record.args
    named = isinstance(msg, str) and msg.startswith(_NAMED)
    if named and isinstance(args, tuple) and args and isinstance(args[0], str):
        return args[0]
    return CALL_ID.get()


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``msg``,
    ``call_id`` when the line is about a call, ``exc`` with a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        call_id = call_id_of(record)
        if call_id is not None:
            out["call_id"] = call_id
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, ensure_ascii=False, default=str)


def configure(fmt: str = "text", level: str = "warning", *, verbose: bool = False,
              stream: TextIO | None = None) -> None:  # fmt: skip
    """Replace the root logger's handlers with one on ``stream`` (stderr) in ``fmt``.
    ``verbose`` (``run -v``) logs at least INFO. Called again on a reload."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)
    wanted = _LEVELS[level]
    root.setLevel(min(wanted, logging.INFO) if verbose else wanted)
    # registration changes are worth a line unless only errors are wanted
    reg = wanted if wanted > logging.WARNING else min(wanted, logging.INFO)
    logging.getLogger("sip_bridge.registration").setLevel(reg)


def banner(line: str, fmt: str) -> None:
    """A start-up line (where it listens, what to dial) on stdout: as it is in text, as a
    JSON object in json (so a collector's stream stays one object per line)."""
    if fmt == "json":
        now = datetime.now(UTC).isoformat(timespec="milliseconds")
        line = json.dumps({"ts": now, "level": "INFO", "logger": "sip_bridge.cli", "msg": line})
    print(line, flush=True)

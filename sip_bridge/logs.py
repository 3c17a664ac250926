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

from agent.redaction import redact_card_numbers

__all__ = [
    "CALL_ID",
    "JsonFormatter",
    "TextFormatter",
    "banner",
    "call_context",
    "call_id_of",
    "configure",
    "make_handler",
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


class TextFormatter(logging.Formatter):
    """A line for a person (:data:`TEXT_FORMAT`), its time in ISO 8601, local with its zone
    (``2026-11-25T18:26:27.120+01:00``) as the CLI and the console show times; ``redact``:
    card numbers masked in the message and traceback (``[records] redact_card_numbers``,
    see :mod:`agent.redaction`)."""

    def __init__(self, redact: bool = True) -> None:
        super().__init__(TEXT_FORMAT)
        self.redact = redact

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        local = datetime.fromtimestamp(record.created).astimezone()
        return local.isoformat(timespec="milliseconds")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        return redact_card_numbers(line)[0] if self.redact else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``msg``,
    ``call_id`` when the line is about a call, ``exc`` with a traceback; ``redact``: card
    numbers masked in ``msg`` and ``exc``."""

    def __init__(self, redact: bool = False) -> None:
        super().__init__()
        self.redact = redact

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
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        if self.redact:
            for key in ("msg", "exc"):
                if key in out:
                    out[key] = redact_card_numbers(out[key])[0]
        return json.dumps(out, ensure_ascii=False, default=str)


def make_handler(fmt: str = "text", stream: TextIO | None = None, *, redact: bool = True
                 ) -> logging.Handler:  # fmt: skip
    """A handler writing ``fmt`` lines to ``stream`` (stderr), card numbers masked unless
    ``redact`` is off."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(redact) if fmt == "json" else TextFormatter(redact))
    return handler


def configure(fmt: str = "text", level: str = "warning", *, verbose: bool = False,
              stream: TextIO | None = None, redact: bool = True) -> None:  # fmt: skip
    """Replace the root logger's handlers with one on ``stream`` (stderr) in ``fmt``.
    ``verbose`` (``run -v``) logs at least INFO; ``redact`` masks card numbers
    (``[records] redact_card_numbers``). Called again on a reload."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(make_handler(fmt, stream, redact=redact))
    wanted = _LEVELS[level]
    root.setLevel(min(wanted, logging.INFO) if verbose else wanted)
    # registration changes are worth a line unless only errors are wanted
    reg = wanted if wanted > logging.WARNING else min(wanted, logging.INFO)
    logging.getLogger("sip_bridge.sip.registration").setLevel(reg)


def banner(line: str, fmt: str) -> None:
    """A start-up line (where it listens, what to dial) on stdout: as it is in text, as a
    JSON object in json (so a collector's stream stays one object per line)."""
    if fmt == "json":
        now = datetime.now(UTC).isoformat(timespec="milliseconds")
        line = json.dumps({"ts": now, "level": "INFO", "logger": "sip_bridge.cli", "msg": line})
    print(line, flush=True)

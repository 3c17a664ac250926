"""systemd's notify protocol (sd_notify(3)), written out: no library needed.

A service of ``Type=notify`` tells systemd how it is doing with datagrams of ``KEY=VALUE``
lines sent to the Unix socket named in ``$NOTIFY_SOCKET`` (a leading ``@`` names one in the
abstract namespace). The bridge says ``READY=1`` once its models are loaded and its ports
are bound (until then ``systemctl start`` waits, and dependants with it), ``RELOADING=1``
and ``READY=1`` around a SIGHUP reload, ``STOPPING=1`` with ``EXTEND_TIMEOUT_USEC`` when
SIGTERM starts a drain (the stop timeout then follows ``sip.drain_s``), and ``WATCHDOG=1``
every half ``$WATCHDOG_USEC`` from a timer of the event loop: a loop that hangs stops
pinging, and systemd kills and restarts the bridge (``WatchdogSec=``).

Without ``$NOTIFY_SOCKET`` (not under systemd) every call is a no-op.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import MutableMapping

from sip_bridge.logs import neutral_context

__all__ = ["ServiceNotifier", "notify_message", "socket_address"]

log = logging.getLogger(__name__)

_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def socket_address(value: str) -> str:
    """The address to send to: a path, or ``@name`` as the abstract socket ``\\0name``."""
    return "\0" + value[1:] if value.startswith("@") else value


def notify_message(*fields: str) -> bytes:
    """``KEY=VALUE`` fields as one datagram; a newline inside a value would start a new
    field, so it is refused."""
    for f in fields:
        key, eq, _ = f.partition("=")
        if not eq or not key or "\n" in f:
            raise ValueError(f"not a KEY=VALUE field: {f!r}")
    return "\n".join(fields).encode()


class ServiceNotifier:
    """Talks to systemd when started by it (``$NOTIFY_SOCKET``), else does nothing.

    Reading the environment removes the variables from it (what ``sd_notify``'s
    ``unset_environment`` does), so that no process the bridge starts speaks for it."""

    def __init__(self, env: MutableMapping[str, str] | None = None) -> None:
        source = os.environ if env is None else env
        values = {k: source.get(k, "") for k in _ENV}
        if env is None:
            for k in _ENV:
                os.environ.pop(k, None)
        self.address = socket_address(values["NOTIFY_SOCKET"]) if values["NOTIFY_SOCKET"] else ""
        self.watchdog_s: float | None = None  # the interval systemd expects pings within
        usec, pid = values["WATCHDOG_USEC"], values["WATCHDOG_PID"]
        ours = not pid or (pid.isdigit() and int(pid) == os.getpid())  # not a parent's
        if self.address and usec.isdigit() and int(usec) > 0 and ours:
            self.watchdog_s = int(usec) / 1e6
        self._sock: socket.socket | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.sent = 0  # datagrams sent (tests, status)

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *fields: str) -> bool:
        """Send one datagram; False (and a debug line) when there is no socket or it failed:
        the bridge answers calls whether or not systemd hears it."""
        if not self.address:
            return False
        data = notify_message(*fields)
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(data, self.address)
        except OSError as exc:
            log.debug("sd_notify %s: %s", fields[0], exc)
            return False
        self.sent += 1
        return True

    # -- the service's life ------------------------------------------------------------------

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def reloading(self) -> bool:
        # MONOTONIC_USEC: what Type=notify-reload (systemd 253+) wants beside RELOADING=1
        now_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send("RELOADING=1", "STATUS=reloading the config", f"MONOTONIC_USEC={now_us}")

    def stopping(self, within_s: float, status: str) -> bool:
        """Stopping, done within ``within_s`` (systemd waits that long, not less)."""
        usec = max(1, round(within_s * 1e6))
        return self.send("STOPPING=1", f"STATUS={status}", f"EXTEND_TIMEOUT_USEC={usec}")

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    # -- the watchdog ------------------------------------------------------------------------

    def start_watchdog(self, loop: asyncio.AbstractEventLoop) -> None:
        """Ping every half interval from ``loop``'s own timer (not a thread: a loop that
        hangs must go silent)."""
        if self.watchdog_s is None or self._timer is not None:
            return
        self._ping(loop)

    def _ping(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self.watchdog_s is not None
        self.send("WATCHDOG=1")
        self._timer = loop.call_later(
            self.watchdog_s / 2, self._ping, loop, context=neutral_context()
        )

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

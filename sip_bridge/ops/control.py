"""The running bridge's control socket: ``sip-bridge status`` asks, the bridge answers JSON.

A Unix socket, not a TCP port: only local users with file access can ask, nothing is
exposed to the network, and a call center's monitoring can read it with ``socat``.
One request line (``status``) in, one JSON line out, then the connection closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "ControlError",
    "ControlServer",
    "format_load",
    "format_status",
    "query",
    "running_bridges",
]

log = logging.getLogger(__name__)

MAX_REQUEST = 256


class ControlError(OSError):
    """No bridge answered on the control socket."""


class ControlServer:
    """Serves ``status`` on a Unix socket; ``status_fn`` builds the JSON-able answer."""

    def __init__(self, path: str, status_fn: Callable[[], dict[str, Any]]) -> None:
        self.path = path
        self.status_fn = status_fn
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        if os.path.exists(self.path):
            if _is_live(self.path):
                raise ControlError(f"another bridge already answers on {self.path}")
            os.unlink(self.path)  # left behind by a bridge that was killed
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)
        os.chmod(self.path, 0o660)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 2.0)
            command = line[:MAX_REQUEST].decode("utf-8", "replace").strip()
            if command == "status":
                answer: dict[str, Any] = self.status_fn()
            else:
                answer = {"error": f"unknown command {command!r}; known: status"}
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except (TimeoutError, ConnectionError) as exc:
            log.debug("control connection dropped: %s", exc)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def _is_live(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(path)
        except OSError:
            return False
        return True


def query(path: str, command: str = "status", timeout_s: float = 3.0) -> dict[str, Any]:
    """Ask the bridge on ``path``; ControlError when none answers."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(path)
            s.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
    except OSError as exc:
        raise ControlError(f"no bridge answers on {path}: {exc.strerror or exc}") from None
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError:
        raise ControlError(f"garbled answer from {path}") from None
    if not isinstance(answer, dict):
        raise ControlError(f"garbled answer from {path}")
    return answer


def running_bridges(
    folders: Iterable[str], skip: Iterable[str] = ()
) -> list[tuple[str, dict[str, Any]]]:
    """The bridges that answer on a default-named socket (``sip-bridge-<port>.sock``) in
    ``folders``, with their status: how ``sip-bridge status`` finds one started on another
    port than its config says (``--listen``). Stale sockets (a killed bridge) are left out."""
    seen = {str(Path(p)) for p in skip}
    out = []
    for folder in dict.fromkeys(folders):  # each once, in order
        with contextlib.suppress(OSError):
            for sock in sorted(Path(folder).glob("sip-bridge-*.sock")):
                if str(sock) in seen or not sock.is_socket():
                    continue
                seen.add(str(sock))
                with contextlib.suppress(ControlError):
                    out.append((str(sock), query(str(sock), timeout_s=1.0)))
    return out


def format_load(load: dict[str, Any]) -> str:
    """One line: the node's headroom against its [load] budgets, and whether it sheds."""

    def num(v: Any, unit: str) -> str:
        return "-" if v is None else f"{v:.0f} {unit}"

    turn = load.get("turn_p95_ms")
    turns = f"{num(turn, 'ms')}" if turn is not None else f"- ({load.get('turns', 0)} turns)"
    head = (
        f"load: headroom {load.get('headroom_pct', 0):.0f} %; turn p95 {turns} of "
        f"{num(load.get('turn_p95_budget_ms'), 'ms')}; CPU {num(load.get('cpu_busy_pct'), '%')}"
        f" of {num(load.get('cpu_budget_pct'), '%')}"
    )
    if load.get("ceiling") is not None:
        head += f"; at most {load['ceiling']} calls"
    if load.get("shedding"):
        verdict = f"SHEDDING: new calls get 503 ({load.get('reason', '')})"
    elif load.get("over_budget"):
        verdict = f"over budget ({load.get('reason', '')}); [load] shed is off"
    else:
        verdict = "taking new calls"
    return f"{head}; {verdict}; refused {load.get('shed_calls', 0)}"


def format_status(st: dict[str, Any]) -> str:
    """The human view of a status answer."""
    lines = [
        f"sip-bridge {st.get('version', '?')}  up {st.get('uptime_s', 0):.0f} s  "
        f"listening {st.get('listen', '?')}  agent {st.get('agent', '?')}  "
        f"media path {st.get('media_path', '?')}",
        "calls: {active} active / {max_calls} max; offered {offered}, answered {established}, "
        "ended {ended}".format(**{**st.get("counters", {}), **st.get("limits", {})}),
    ]
    cfg = st.get("config") or {}
    if cfg.get("path"):
        said = cfg.get("source") not in (None, "", "--config", cfg["path"])
        source = f" ({cfg['source']})" if said else ""
        lines.insert(1, f"config: {cfg['path']}{source}")
    load = st.get("load") or {}
    if load:
        lines.append(format_load(load))
    adm = st.get("admission", {})
    if adm:
        lines.append("inbound: " + ", ".join(f"{k} {v}" for k, v in adm.items()))
    regs = st.get("registrations", [])
    lines.append(f"registrations ({len(regs)}):")
    for r in regs:
        exp = f", expires in {r['expires_in_s']:.0f} s" if r.get("expires_in_s") else ""
        err = f", last error: {r['last_error']}" if r.get("last_error") else ""
        lines.append(
            f"  {r['trunk']:<16} {r['state']:<12} {r['aor']} via {r['registrar']}{exp}{err}"
        )
    models = st.get("models", {})
    if models:
        lines.append("models: " + ", ".join(f"{m} on {p}" for m, p in sorted(models.items())))
    calls = st.get("calls", [])
    lines.append(f"active calls ({len(calls)}):")
    lines.extend(
        f"  {c['call_id']:<36} {c['state']:<9} {c['duration_s']:>7.1f} s  "
        f"{c['caller']} -> {c['callee']}  trunk {c.get('trunk') or '-'}  "
        f"route {c.get('route') or '-'} ({c.get('agent', '?')})  "
        f"rx {c.get('packets_in', 0)} tx {c.get('packets_out', 0)} "
        f"jb {c.get('jitter_delay_ms', 0):.0f} ms loss {c.get('loss_pct', 0):.1f} %"
        for c in calls
    )
    return "\n".join(lines)

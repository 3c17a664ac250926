# size: the MQTT link as one state machine: connect, reconnect with backoff, the bounded publish
#       queue, command intake
"""Call events out and call commands in over MQTT, through a disk spool that survives outages.

Wiring (for the server)::

    link = MqttLink("127.0.0.1", 1883, node="n1", spool_dir=state_dir / "mqtt",
                    on_command=handle)          # handle(call_id, command), may be async
    await link.start()                           # returns at once; connects in the background
    link.publish(call_id, "turn", call_events.turn("hi", "hello", {"asr": 41.0}))
    ...
    await link.stop(drain_timeout=2.0)           # at shutdown: try to deliver, then close

``publish`` is synchronous and cheap (one ``write`` to an append-only file, no network, no
await), so the media path may call it; it may also be called from another thread. It
assigns the event's ``seq`` (returned), appends the payload as one JSON line to the spool
and wakes the sender task. The sender publishes spooled events in order with QoS 1 (a small
window in flight) and advances a delivery cursor (``cursor.json``) only over events whose
PUBACK arrived, so after a broker outage or a bridge restart whatever was not acknowledged is
sent again: at least once, in order per node, duplicates recognisable by ``seq``.

Spool layout in ``spool_dir``: segment files ``<first seq>.jsonl`` (one event per line,
exactly the MQTT payload) and ``cursor.json`` (``{"delivered": seq, "next_seq": n}``,
replaced atomically). A crash can leave a torn last line; it is cut off at start. Segments
whose events are all delivered are deleted, the active one too as soon as everything is
delivered (past ``compact_bytes``, 0 by default): events hold what callers said, and what
the broker has is not kept here as well. Beyond ``max_spool_bytes`` the oldest segment is
deleted and its undelivered events are counted in ``stats.dropped`` (logged once). Writes
are flushed to the OS but not fsync'ed: a process crash loses nothing, a power cut may lose
the newest lines.

Commands on ``sipbridge/<node>/cmd/+`` are validated (``call_events.parse_command``) and
handed to ``on_command``; a bad one, or one whose handler raises, becomes an ``error``
event for that call. The session is clean: commands sent while the link is down are not
replayed later (a stale hangup must not hit a newer call).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NamedTuple

import aiomqtt

from sip_bridge.ops.call_events import (
    NO_CALL,
    Command,
    CommandError,
    build_event,
    commands_filter,
    encode_event,
    error,
    event_topic,
    parse_command,
)

log = logging.getLogger(__name__)

CURSOR = "cursor.json"
SUFFIX = ".jsonl"
CommandHandler = Callable[[str, Command], object]


@dataclass
class LinkStats:
    """Counters since this link was made (``pending`` lives on the link)."""

    spooled: int = 0  # events publish() wrote to the spool
    published: int = 0  # PUBLISH packets sent, resends included
    delivered: int = 0  # events acknowledged by the broker (PUBACK)
    dropped: int = 0  # undelivered events lost to the spool bound or a failed write
    reconnects: int = 0  # connections made after the first one
    connect_failures: int = 0  # connection attempts that failed (each waits a backoff)
    commands: int = 0  # valid commands handed to on_command
    commands_rejected: int = 0  # malformed or unknown commands (each sent as an error event)


class _Record(NamedTuple):
    seq: int
    topic: str
    payload: bytes
    segment: int
    end: int  # offset just past the line in its segment


class MqttLink:
    """One node's MQTT connection: spooled events out, commands in."""

    def __init__(
        self,
        host: str,
        port: int,
        node: str,
        spool_dir: str | os.PathLike[str],
        on_command: CommandHandler,
        *,
        client_id: str | None = None,
        username: str | None = None,
        password: str | None = None,
        keepalive: int = 30,
        max_spool_bytes: int = 100 * 1024 * 1024,
        compact_bytes: int = 0,
        backoff: tuple[float, float] = (0.5, 10.0),
        window: int = 16,
        clock: Callable[[], float] = time.time,
    ) -> None:
        commands_filter(node)  # validates the node name
        self.host, self.port, self.node = host, port, node
        self.client_id = client_id or f"sip-bridge-{node}"
        self._username, self._password, self._keepalive = username, password, keepalive
        self._on_command = on_command
        self._max_bytes = max_spool_bytes
        self._segment_bytes = max(4096, max_spool_bytes // 8)
        self._compact_bytes = compact_bytes
        self._backoff = backoff
        self._window = window
        self._clock = clock
        self.stats = LinkStats()
        self.connected = False
        self._dir = Path(spool_dir)
        self._lock = threading.Lock()
        self._segs: list[int] = []
        self._sizes: dict[int, int] = {}
        self._total = 0
        self._wfd: int | None = None
        self._delivered = 0
        self._next_seq = 1
        self._last_written = 0
        self._floor = 1  # events below this seq were dropped
        self._warned: set[str] = set()
        self._rfh: BinaryIO | None = None
        self._rseg: int | None = None
        self._pos: tuple[int, int] | None = None  # (segment, offset) past the last ack
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Future[object]] = set()
        self._recover()

    # ---- spool ----

    def _path(self, first: int) -> Path:
        return self._dir / f"{first:020d}{SUFFIX}"

    def _recover(self) -> None:
        """Read the cursor, cut a torn tail, find the last seq: the state a crash left."""
        self._dir.mkdir(parents=True, exist_ok=True)
        next_seq = 1
        try:
            cursor = json.loads((self._dir / CURSOR).read_text())
            self._delivered = int(cursor["delivered"])
            next_seq = int(cursor["next_seq"])
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError) as exc:
            log.warning(
                "mqtt spool %s: unreadable cursor (%s): resending everything", self._dir, exc
            )
        names = (p.name[: -len(SUFFIX)] for p in self._dir.glob(f"*{SUFFIX}"))
        self._segs = sorted(int(n) for n in names if n.isdigit())
        for first in self._segs:
            self._sizes[first] = self._path(first).stat().st_size
        last_seq = 0
        if self._segs:
            path = self._path(self._segs[-1])
            data = path.read_bytes()
            cut = data.rfind(b"\n") + 1
            if cut != len(data):
                log.warning(
                    "mqtt spool %s: ignoring a torn last line (%d bytes)", path, len(data) - cut
                )
                os.truncate(path, cut)
                self._sizes[self._segs[-1]] = cut
            for line in reversed(data[:cut].splitlines()):
                record = self._decode(line, 0, 0)
                if record is not None:
                    last_seq = record.seq
                    break
            last_seq = last_seq or self._segs[-1] - 1
        self._total = sum(self._sizes.values())
        self._last_written = max(last_seq, self._delivered)
        self._next_seq = max(next_seq, self._last_written + 1)
        self._floor = self._segs[0] if self._segs else self._next_seq
        self._compact()

    def _decode(self, line: bytes, segment: int, end: int) -> _Record | None:
        try:
            doc = json.loads(line)
            topic = event_topic(doc["node"], doc["call_id"], doc["event"])
            return _Record(int(doc["seq"]), topic, line.rstrip(b"\n"), segment, end)
        except (ValueError, KeyError, TypeError) as exc:
            self._warn_once("corrupt", f"mqtt spool {self._dir}: skipping a corrupt line ({exc})")
            return None

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", message)

    def _append(self, seq: int, line: bytes) -> None:
        """One O_APPEND write per event; a failed write seals the segment (torn tail)."""
        if self._wfd is None or self._sizes[self._segs[-1]] >= self._segment_bytes:
            self._close_writer()
            if not self._segs or self._sizes[self._segs[-1]] >= self._segment_bytes:
                self._segs.append(seq)
                self._sizes[seq] = 0
            self._wfd = os.open(self._path(self._segs[-1]), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        view = memoryview(line)
        try:
            while view:
                n = os.write(self._wfd, view)
                view = view[n:]
                self._sizes[self._segs[-1]] += n
                self._total += n
        except OSError:
            self._close_writer()
            self._sizes[self._segs[-1]] = max(self._sizes[self._segs[-1]], self._segment_bytes)
            raise

    def _close_writer(self) -> None:
        if self._wfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._wfd)
            self._wfd = None

    def _unlink(self, first: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(first).unlink()
        self._total -= self._sizes.pop(first)

    def _enforce_bound(self) -> None:
        """Over the bound: delete the oldest segment, counting its undelivered events."""
        while self._total > self._max_bytes and len(self._segs) > 1:
            first = self._segs.pop(0)
            last = self._segs[0] - 1
            lost = max(0, last - max(first, self._delivered + 1) + 1)
            self.stats.dropped += lost
            self._unlink(first)
            self._floor = self._segs[0]
            if lost:
                self._warn_once(
                    "bound",
                    f"mqtt spool {self._dir} over {self._max_bytes} bytes: dropping the oldest "
                    "undelivered events (stats.dropped counts them)",
                )

    def _compact(self) -> None:
        """Delete delivered segments; the active one too once all is delivered and it is big."""
        with self._lock:
            while len(self._segs) > 1 and self._segs[1] - 1 <= self._delivered:
                self._unlink(self._segs.pop(0))
            everything = self._delivered >= self._last_written
            active = self._sizes[self._segs[-1]] if self._segs else 0
            if everything and active and active >= self._compact_bytes:
                self._close_writer()
                self._unlink(self._segs.pop())
            self._floor = self._segs[0] if self._segs else self._next_seq

    def _save_cursor(self) -> None:
        with self._lock:
            doc = {"delivered": self._delivered, "next_seq": self._next_seq}
        tmp = self._dir / (CURSOR + ".tmp")
        try:
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, self._dir / CURSOR)
        except OSError as exc:
            self._warn_once("cursor", f"mqtt spool {self._dir}: cannot save the cursor ({exc})")

    @property
    def pending(self) -> int:
        """Events in the spool not yet acknowledged by the broker."""
        with self._lock:
            return max(0, self._last_written - max(self._delivered, self._floor - 1))

    def publish(self, call_id: str, event: str, fields: Mapping[str, object] | None = None) -> int:
        """Spool one event and wake the sender; never touches the network. Returns its seq.

        A bad call id, event name or field (not JSON) raises ValueError/TypeError; a failed
        disk write is logged once and counted in ``stats.dropped``.
        """
        with self._lock:
            seq = self._next_seq
            payload = build_event(self.node, call_id, event, seq, self._clock(), fields or {})
            line = encode_event(payload) + b"\n"
            self._next_seq = seq + 1
            try:
                self._append(seq, line)
            except OSError as exc:
                self.stats.dropped += 1
                self._warn_once("write", f"mqtt spool {self._dir}: cannot write ({exc})")
                return seq
            self._last_written = seq
            self.stats.spooled += 1
            self._enforce_bound()
        self._wake_sender()
        return seq

    def _wake_sender(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._wake.set()
        else:
            loop.call_soon_threadsafe(self._wake.set)

    # ---- reading the spool back ----

    def _rewind(self) -> None:
        """Restart reading just past the last acknowledged event (after a reconnect)."""
        self._close_reader()
        with self._lock:
            segs = list(self._segs)
        if self._pos is not None and self._pos[0] in segs:
            self._open_reader(self._pos[0], self._pos[1])
            return
        before = [s for s in segs if s <= self._delivered + 1]
        self._rseg = before[-1] - 1 if before else None

    def _open_reader(self, segment: int, offset: int) -> bool:
        self._rseg = segment
        try:
            self._rfh = open(self._path(segment), "rb")  # noqa: SIM115 (kept open across calls)
        except FileNotFoundError:
            return False  # deleted meanwhile (dropped or compacted)
        self._rfh.seek(offset)
        return True

    def _close_reader(self) -> None:
        if self._rfh is not None:
            self._rfh.close()
            self._rfh = None

    def _later_segment(self) -> int | None:
        with self._lock:
            later = [s for s in self._segs if self._rseg is None or s > self._rseg]
        return later[0] if later else None

    def _read_next(self) -> _Record | None:
        """The next complete, undelivered, undropped line; None when caught up."""
        while True:
            if self._rfh is None:
                nxt = self._later_segment()
                if nxt is None:
                    return None
                if not self._open_reader(nxt, 0):
                    continue  # deleted meanwhile: try the one after
            fh = self._rfh
            assert fh is not None and self._rseg is not None
            start = fh.tell()
            line = fh.readline()
            if not line.endswith(b"\n"):
                fh.seek(start)
                if self._later_segment() is None:
                    return None  # the active segment: wait for more
                line = fh.readline()
                if not line.endswith(b"\n"):  # a finished segment (a torn tail is skipped)
                    self._close_reader()
                    continue
            record = self._decode(line, self._rseg, fh.tell())
            if record is None or record.seq <= self._delivered or record.seq < self._floor:
                continue
            return record

    # ---- the connection ----

    async def start(self) -> None:
        """Start the background task that connects, sends and receives."""
        if self._task is not None and not self._task.done():
            return
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run(), name=f"mqtt-link-{self.node}")
        self._wake.set()

    async def stop(self, drain_timeout: float = 0.0) -> None:
        """Stop the link; with a drain timeout, first wait that long for the spool to empty."""
        deadline = time.monotonic() + drain_timeout
        while self.pending and self.connected and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.connected = False
        self._save_cursor()
        self._close_reader()
        with self._lock:
            self._close_writer()
        self._loop = None

    async def _run(self) -> None:
        delay = self._backoff[0]
        ever_connected = False
        while True:
            up = False
            try:
                async with aiomqtt.Client(
                    self.host,
                    self.port,
                    identifier=self.client_id,
                    username=self._username,
                    password=self._password,
                    keepalive=self._keepalive,
                    clean_session=True,
                    timeout=10.0,
                ) as client:
                    await client.subscribe(commands_filter(self.node), qos=1)
                    up = self.connected = True
                    self.stats.reconnects += int(ever_connected)
                    ever_connected = True
                    delay = self._backoff[0]
                    self._warned.discard("down")
                    log.info("mqtt: connected to %s:%d as %s", self.host, self.port, self.client_id)
                    await self._serve(client)
            except Exception as exc:  # an outage or a bug: either way retry, never die
                if not up:
                    self.stats.connect_failures += 1
                if not isinstance(exc, aiomqtt.MqttError):
                    log.exception("mqtt link failed")
                self._warn_once("down", f"mqtt: broker {self.host}:{self.port} unreachable ({exc})")
            finally:
                self.connected = False
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._backoff[1])

    async def _serve(self, client: aiomqtt.Client) -> None:
        """Send and receive until either side fails (a lost connection ends both)."""
        tasks = {
            asyncio.create_task(self._send_loop(client)),
            asyncio.create_task(self._receive_loop(client)),
        }
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            task.result()
        raise aiomqtt.MqttError("connection ended")

    async def _send_loop(self, client: aiomqtt.Client) -> None:
        inflight: deque[tuple[_Record, asyncio.Task[None]]] = deque()
        self._rewind()
        try:
            while True:
                self._wake.clear()
                while len(inflight) < self._window and (record := self._read_next()) is not None:
                    send = client.publish(record.topic, record.payload, qos=1, timeout=10.0)
                    inflight.append((record, asyncio.create_task(send)))
                    self.stats.published += 1
                if not inflight:
                    await self._wake.wait()
                    continue
                await asyncio.wait([inflight[0][1]])
                while inflight and inflight[0][1].done():
                    record, task = inflight.popleft()
                    task.result()  # a failed publish ends this connection
                    with self._lock:
                        self._delivered = max(self._delivered, record.seq)
                    self._pos = (record.segment, record.end)
                    self.stats.delivered += 1
                self._save_cursor()
                self._compact()
        finally:
            for _, task in inflight:
                task.cancel()
            self._close_reader()

    async def _receive_loop(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            payload = message.payload
            raw = payload if isinstance(payload, bytes | bytearray | str) else b""
            self._handle_command(str(message.topic), raw)

    def _handle_command(self, topic: str, payload: bytes | bytearray | str) -> None:
        """Validate and dispatch one command; every failure becomes an error event."""
        command = parse_command(topic, payload, self.node)
        if isinstance(command, CommandError):
            self.stats.commands_rejected += 1
            log.warning("mqtt: rejected command on %s: %s", topic[:200], command.message)
            self._publish_error(command.call_id or NO_CALL, command.message, topic, command.cmd)
            return
        self.stats.commands += 1
        try:
            result = self._on_command(command.call_id, command)
        except Exception as exc:
            log.exception("mqtt: command handler failed for %s", command)
            self._publish_error(command.call_id, f"handler failed: {exc}", topic, None)
            return
        if inspect.isawaitable(result):
            future = asyncio.ensure_future(result)
            self._handlers.add(future)
            future.add_done_callback(lambda f: self._handler_done(f, command, topic))

    def _handler_done(self, future: asyncio.Future[object], command: Command, topic: str) -> None:
        self._handlers.discard(future)
        if not future.cancelled() and future.exception() is not None:
            exc = future.exception()
            log.error("mqtt: command handler failed for %s: %s", command, exc)
            self._publish_error(command.call_id, f"handler failed: {exc}", topic, None)

    def _publish_error(self, call_id: str, message: str, topic: str, cmd: str | None) -> None:
        try:
            self.publish(call_id, "error", error("command", message, topic=topic[:200], cmd=cmd))
        except (ValueError, TypeError):
            log.exception("mqtt: could not report a command error")

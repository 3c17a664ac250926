# size: every Prometheus metric the bridge exports, declared together so an operator reads the names
#       in one place, and their endpoint
"""Prometheus metrics and a ``/healthz`` probe, served over plain HTTP by asyncio.

Why here: operators run many bridges behind a dispatcher and need call counts, setup time,
media quality and turn latency in the monitoring they already have, and a load balancer or
Kubernetes needs a readiness probe that says "not yet" while models load and "stop sending"
while the bridge drains. The server is a few dozen lines on ``asyncio.start_server`` (no
threads, no ``prometheus_client.start_http_server``) so it shares the bridge's event loop
and a slow or hostile client cannot pin it: a request head is at most 8 KiB and must
arrive within 5 s, and at most ``max_clients`` connections are served at once.

Every :class:`BridgeMetrics` owns its own ``CollectorRegistry`` (never the global one), so
tests and several bridges in one process never share values. Label values are bounded:
``outcome`` and ``stage`` come from fixed sets (anything else counts as ``"other"``), and
free-form names (trunks, models, providers) keep the first ``max_label_values`` distinct
values, later ones become ``"other"``. Metric calls never raise into the call path:
non-finite or negative figures are dropped.

Wiring into ``server.py`` (suggested config: ``[metrics] listen = "127.0.0.1:9100"``; no
section, no server)::

    metrics = BridgeMetrics()
    metrics.media_path(self.media_path)                      # "compiled" | "python"
    http = MetricsServer(host, port, metrics, ready=lambda: self.listening)
    await http.start()                                       # after the models warmed up
    ...
    # CallOffered:         metrics.call_offered(ev.trunk)   (None: no trunk matched)
    # CallEstablished:     metrics.call_answered(answered_at - offered_at)   (seconds)
    # any change in calls: metrics.set_active(len(self.calls))
    # rejected (503, ...): metrics.call_ended("rejected", 0.0, 0, 0, 0.0, 0.0)
    # CallEnded:           metrics.call_ended(outcome, duration_s, stats.late_frames,
    #                          stats.packets_out, stats.jb_delay_ms, stats.loss_pct)
    # agent turn result:   metrics.turn({"end_of_turn": 362.0, "asr_tail": 45.0, ...})
    #                      (keys with or without "_ms"; "total" given or summed)
    # agent's DeadAir:     metrics.dead_air_gap(gap_s)
    # CallEnded, measured: metrics.call_dead_air(longest_s)
    # each model run:      metrics.model_inference("silero_vad", "CPUExecutionProvider", s)
    # a transfer's end:    metrics.transfer_ended(outcome, status)
    # SIGTERM:             http.set_draining(True) before hanging up the calls
    await http.stop()

Outcomes are those of the call records: ``answered``, ``rejected``, ``cancelled``,
``failed``.

Exposed (all prefixed ``sipbridge_``): ``calls_offered_total{trunk}``,
``calls_total{outcome}``, ``active_calls``, ``call_setup_seconds``,
``call_duration_seconds``, ``late_frames_total``, ``frames_sent_total``,
``jitter_buffer_delay_seconds``, ``call_loss_ratio``, ``turn_latency_seconds{stage}``,
``model_inference_seconds{model,provider}``, ``media_path_info{mode}``,
``model_faults_total{stage}`` (a model that raised or hung mid-call: the call got the
fallback prompt), ``dead_air_gap_seconds`` (each silence a caller waited through for the
agent, agent.dead_air), ``dead_air_seconds_total`` (their sum) and
``call_dead_air_longest_seconds`` (each ended call's longest), ``transfers_total{outcome,
status}`` (every transfer's final outcome and the SIP status behind it; 0: none, as for a
bad target or no final report in time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.voice.phrase_cache import shared_stats

__all__ = [
    "MAX_REQUEST",
    "OUTCOMES",
    "READ_TIMEOUT_S",
    "TURN_STAGES",
    "BridgeMetrics",
    "MetricsServer",
]

log = logging.getLogger(__name__)

OUTCOMES = ("answered", "rejected", "cancelled", "failed")
TURN_STAGES = ("end_of_turn", "asr_tail", "dialogue", "tts_first_audio", "write_to_wire")
FAULT_STAGES = ("vad", "turn", "asr", "tts", "speech_model")
MEDIA_PATHS = ("compiled", "python")
OTHER = "other"

SETUP_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
TURN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0)
INFERENCE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
DURATION_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
JB_DELAY_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.1, 0.12, 0.16, 0.2, 0.3)
LOSS_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
DEAD_AIR_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)

MAX_REQUEST = 8192  # bytes of request head (request line + headers)
READ_TIMEOUT_S = 5.0  # the whole head must arrive within this
WRITE_TIMEOUT_S = 5.0  # a client that does not read its answer is dropped
MAX_CLIENTS = 64
LINGER_S = 0.5  # after an error answer, how long unread input is drained before closing
LINGER_BYTES = 65536

_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VERSION = re.compile(rb"HTTP/1\.[0-9]")


def _figure(x: float) -> float | None:
    """A finite, non-negative number, or None: bad figures must not poison the series."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v >= 0.0 else None


class _Bounded:
    """Keeps a label's cardinality bounded: a fixed set, or the first ``cap`` seen."""

    def __init__(self, allowed: Iterable[str] = (), cap: int = 0) -> None:
        self._fixed = frozenset(allowed)
        self._seen: set[str] = set()
        self._cap = cap

    def __call__(self, value: str | None, none: str = "none") -> str:
        if value is None:
            return none
        text = str(value)
        if text in self._fixed or text in self._seen:
            return text
        if self._fixed or not text or len(text) > 64 or len(self._seen) >= self._cap:
            return OTHER
        self._seen.add(text)
        return text


class BridgeMetrics:
    """The bridge's metrics in a private registry; ``render()`` gives the scrape body."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, max_label_values: int = 32) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._outcome = _Bounded(OUTCOMES)
        self._stage = _Bounded((*TURN_STAGES, "total"))
        self._fault_stage = _Bounded(FAULT_STAGES)
        self._mode = _Bounded(MEDIA_PATHS)
        self._trunk = _Bounded(cap=max_label_values)
        self._model = _Bounded(cap=max_label_values)
        self._provider = _Bounded(cap=max_label_values)
        self._transfer_status = _Bounded(cap=max_label_values)
        self.offered = Counter(
            "sipbridge_calls_offered",
            "Calls offered to the bridge (INVITEs that started a call), by trunk.",
            ["trunk"],
            registry=r,
        )
        self.calls = Counter(
            "sipbridge_calls",
            "Calls that ended, by outcome (answered, rejected, cancelled, failed, other).",
            ["outcome"],
            registry=r,
        )
        self.active = Gauge("sipbridge_active_calls", "Calls in progress now.", registry=r)
        self.setup = Histogram(
            "sipbridge_call_setup_seconds",
            "Time from the INVITE to our 200 OK.",
            buckets=SETUP_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "sipbridge_call_duration_seconds",
            "Length of ended calls.",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.late_frames = Counter(
            "sipbridge_late_frames",
            "Outbound 20 ms frames sent after their due time (pacing misses).",
            registry=r,
        )
        self.frames_sent = Counter(
            "sipbridge_frames_sent",
            "Outbound RTP frames sent; late_frames / frames_sent is the late ratio.",
            registry=r,
        )
        self.jb_delay = Histogram(
            "sipbridge_jitter_buffer_delay_seconds",
            "Receive jitter-buffer delay of each call when it ended.",
            buckets=JB_DELAY_BUCKETS,
            registry=r,
        )
        self.loss = Histogram(
            "sipbridge_call_loss_ratio",
            "Fraction of the caller's RTP packets lost, per ended call (0..1).",
            buckets=LOSS_BUCKETS,
            registry=r,
        )
        self.turns = Histogram(
            "sipbridge_turn_latency_seconds",
            "Voice-agent turn latency by stage; stage=total is caller stop -> reply on wire.",
            ["stage"],
            buckets=TURN_BUCKETS,
            registry=r,
        )
        self.inference = Histogram(
            "sipbridge_model_inference_seconds",
            "Wall time of one model run, by model and ONNX Runtime execution provider.",
            ["model", "provider"],
            buckets=INFERENCE_BUCKETS,
            registry=r,
        )
        self.faults = Counter(
            "sipbridge_model_faults",
            "Model runs that raised or hung mid-call, by stage; each ended its call's agent.",
            ["stage"],
            registry=r,
        )
        self.transfers = Counter(
            "sipbridge_transfers",
            "Transfers (REFER) that ended, by outcome (succeeded, failed) and the SIP status "
            "behind it (0: no SIP status: a bad target, no final report in time).",
            ["outcome", "status"],
            registry=r,
        )
        self.dead_air = Histogram(
            "sipbridge_dead_air_gap_seconds",
            "Each silence a caller waited through for the agent (its answer, its work, a "
            "transfer): from their last input or our last audio to our next audio.",
            buckets=DEAD_AIR_BUCKETS,
            registry=r,
        )
        self.dead_air_total = Counter(
            "sipbridge_dead_air_seconds",
            "Dead air of all calls, summed (seconds).",
            registry=r,
        )
        self.dead_air_longest = Histogram(
            "sipbridge_call_dead_air_longest_seconds",
            "The longest dead-air gap of each ended call that measured it.",
            buckets=DEAD_AIR_BUCKETS,
            registry=r,
        )
        self.shedding = Gauge(
            "sipbridge_load_shedding",
            "1 while the node refuses new calls for load ([load] shed, over budget), else 0.",
            registry=r,
        )
        self.headroom = Gauge(
            "sipbridge_headroom_ratio",
            "What the node has left before its nearer [load] budget: 1 idle, 0 at it, "
            "below 0 past it.",
            registry=r,
        )
        self.window_turn_p95 = Gauge(
            "sipbridge_turn_latency_window_p95_seconds",
            "p95 of the turns of the last [load] window_s (NaN: fewer than min_turns).",
            registry=r,
        )
        self.cpu_busy = Gauge(
            "sipbridge_cpu_busy_ratio",
            "Busy share of the node's CPUs over [load] cpu_window_s (0..1).",
            registry=r,
        )
        self.ceiling = Gauge(
            "sipbridge_load_call_ceiling",
            "The calls the node was measured to carry within its [load] budgets: it takes "
            "no more (NaN: no budget breached yet).",
            registry=r,
        )
        self.shed = Counter(
            "sipbridge_calls_shed",
            "New calls refused with 503 because the node was over its [load] budget.",
            registry=r,
        )
        self._shed_seen = 0
        self.mode = Info(
            "sipbridge_media_path",
            "How the media path runs: compiled (mypyc) or python.",
            registry=r,
        )
        r.register(_PhraseCacheFigures())
        for outcome in OUTCOMES:  # zeros from the start, so rate() sees the first call
            self.calls.labels(outcome)
        for stage in (*TURN_STAGES, "total"):
            self.turns.labels(stage)
        for stage in FAULT_STAGES:
            self.faults.labels(stage)

    def call_offered(self, trunk: str | None) -> None:
        """An INVITE started a call; ``trunk`` None (no trunk matched) counts as "none"."""
        self.offered.labels(self._trunk(trunk)).inc()

    def call_answered(self, setup_s: float) -> None:
        """We answered: INVITE -> 200 OK in seconds."""
        v = _figure(setup_s)
        if v is not None:
            self.setup.observe(v)

    def call_ended(
        self,
        outcome: str,
        duration_s: float,
        late_frames: int,
        frames_sent: int,
        jitter_delay_ms: float,
        loss_pct: float,
    ) -> None:
        """A call is over; media figures are only observed for calls that had media."""
        self.calls.labels(self._outcome(outcome, none=OTHER)).inc()
        had_media = (_figure(frames_sent) or 0.0) > 0.0
        for counter, n in ((self.late_frames, late_frames), (self.frames_sent, frames_sent)):
            v = _figure(n)
            if v:
                counter.inc(v)
        d = _figure(duration_s)
        if d is not None:
            self.duration.observe(d)
        if not had_media:
            return
        jb = _figure(jitter_delay_ms)
        if jb is not None:
            self.jb_delay.observe(jb / 1000.0)
        loss = _figure(loss_pct)
        if loss is not None:
            self.loss.observe(min(loss, 100.0) / 100.0)

    def set_active(self, n: int) -> None:
        """Calls in progress now."""
        v = _figure(n)
        if v is not None:
            self.active.set(v)

    def turn(self, stages_ms: Mapping[str, float]) -> None:
        """One agent turn's stage timings in ms (``end_of_turn`` or ``end_of_turn_ms``).

        ``total`` is taken from the mapping when given (stages overlap when the reply is
        prepared during the pause), else it is the sum of the stages.
        """
        total: float | None = None
        summed = 0.0
        seen = False
        for key, ms in stages_ms.items():
            name = key.removesuffix("_ms")
            v = _figure(ms)
            if v is None:
                continue
            if name == "total":
                total = v
                continue
            summed += v
            seen = True
            self.turns.labels(self._stage(name, none=OTHER)).observe(v / 1000.0)
        if total is not None or seen:
            self.turns.labels("total").observe((summed if total is None else total) / 1000.0)

    def dead_air_gap(self, seconds: float) -> None:
        """A caller waited this long in silence for the agent (one gap)."""
        v = _figure(seconds)
        if v is not None:
            self.dead_air.observe(v)
            self.dead_air_total.inc(v)

    def call_dead_air(self, longest_s: float) -> None:
        """A call ended: its longest dead-air gap."""
        v = _figure(longest_s)
        if v is not None:
            self.dead_air_longest.observe(v)

    def model_inference(self, model: str, provider: str, seconds: float) -> None:
        """One model run (a batch counts once) on an execution provider."""
        v = _figure(seconds)
        if v is not None:
            labels = self._model(model, none=OTHER), self._provider(provider, none=OTHER)
            self.inference.labels(*labels).observe(v)

    def model_fault(self, stage: str) -> None:
        """A call's model raised or hung (``stage``: vad, turn, asr, tts, speech_model)."""
        self.faults.labels(self._fault_stage(stage, none=OTHER)).inc()

    def transfer_ended(self, outcome: str, status: int) -> None:
        """A transfer's final outcome (``succeeded`` or ``failed``) and its SIP status."""
        label = "failed" if outcome != "succeeded" else "succeeded"
        self.transfers.labels(label, self._transfer_status(str(int(status)), none=OTHER)).inc()

    def load(
        self,
        shedding: bool,
        headroom_pct: float,
        turn_p95_ms: float | None,
        cpu_busy_pct: float | None,
        shed_calls: int,
        ceiling: int | None = None,
    ) -> None:
        """The node's headroom (sip_bridge.ops.headroom); ``shed_calls``: refused so far;
        ``ceiling``: the calls it was measured to carry (None: no budget breached yet)."""
        self.ceiling.set(math.nan if ceiling is None else float(ceiling))
        self.shedding.set(1.0 if shedding else 0.0)
        self.headroom.set(headroom_pct / 100.0)
        self.window_turn_p95.set(math.nan if turn_p95_ms is None else turn_p95_ms / 1000.0)
        self.cpu_busy.set(math.nan if cpu_busy_pct is None else cpu_busy_pct / 100.0)
        if shed_calls > self._shed_seen:
            self.shed.inc(shed_calls - self._shed_seen)
            self._shed_seen = shed_calls

    def media_path(self, mode: str) -> None:
        """Whether the media path runs compiled or as Python (``media_path_info{mode}``)."""
        self.mode.info({"mode": self._mode(mode, none=OTHER)})

    def render(self) -> bytes:
        """The Prometheus text exposition of everything above."""
        return generate_latest(self.registry)


class _PhraseCacheFigures(Collector):
    """The voice agent's phrase cache (agent.voice.phrase_cache), read at each scrape."""

    def collect(self) -> Iterable[Metric]:
        st = shared_stats()
        if st is None:
            return
        yield CounterMetricFamily(
            "sipbridge_phrase_cache_hits",
            "Pieces of speech a call took from the phrase cache (not rendered again).",
            value=st.hits,
        )
        yield CounterMetricFamily(
            "sipbridge_phrase_cache_misses",
            "Pieces of speech a call had rendered (not in the phrase cache yet, or never kept).",
            value=st.misses,
        )
        yield GaugeMetricFamily(
            "sipbridge_phrase_cache_bytes", "Audio the phrase cache holds (bytes).", value=st.bytes
        )
        yield GaugeMetricFamily(
            "sipbridge_phrase_cache_queued",
            "The profiles' fixed phrases still to be rendered ahead (0: warm).",
            value=st.queued,
        )


class _BadRequest(Exception):
    """The client sent something that is not an HTTP/1.x request head."""


class MetricsServer:
    """``GET /metrics`` and ``GET /healthz`` over HTTP/1.1, one request per connection."""

    def __init__(
        self,
        host: str,
        port: int,
        metrics: BridgeMetrics,
        ready: Callable[[], bool],
        *,
        max_request: int = MAX_REQUEST,
        read_timeout_s: float = READ_TIMEOUT_S,
        max_clients: int = MAX_CLIENTS,
    ) -> None:
        self.host = host
        self.port = port
        self.metrics = metrics
        self.ready = ready
        self.max_request = max_request
        self.read_timeout_s = read_timeout_s
        self.max_clients = max_clients
        self.draining = False
        self.shedding = False
        self._server: asyncio.AbstractServer | None = None
        self._clients: set[asyncio.Task[None]] = set()

    def set_draining(self, draining: bool = True) -> None:
        """While draining, ``/healthz`` answers 503 so balancers stop sending calls."""
        self.draining = draining

    def set_shedding(self, shedding: bool) -> None:
        """While over its [load] budget and shedding, ``/healthz`` answers 503 too."""
        self.shedding = shedding

    async def start(self) -> None:
        """Listen; with port 0 the kernel picks one and ``self.port`` tells which."""
        self._server = await asyncio.start_server(
            self._accept, self.host, self.port, limit=self.max_request
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and drop the connections still being served."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._clients):
            task.cancel()
        if self._clients:
            await asyncio.gather(*self._clients, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 1.0)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._clients.add(task)
        try:
            if len(self._clients) > self.max_clients:
                await self._respond(writer, 503, b"busy\n")
            else:
                await self._serve(reader, writer)
        except (TimeoutError, ConnectionError):
            pass
        except Exception:  # never let one client's trouble reach the loop's handler
            log.exception("metrics: serving a request failed")
        finally:
            self._clients.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(self._read_head(reader), self.read_timeout_s)
        except TimeoutError:
            await self._respond(writer, 408, b"request timeout\n")
            return
        except (ValueError, asyncio.LimitOverrunError):
            await self._respond(writer, 431, b"request too large\n")
            await _discard_rest(reader, writer)
            return
        except _BadRequest:
            await self._respond(writer, 400, b"bad request\n")
            await _discard_rest(reader, writer)
            return
        if head is None:  # the client went away before finishing
            return
        method, path = head
        if method not in ("GET", "HEAD"):
            await self._respond(writer, 405, b"method not allowed\n", allow=True)
            return
        body_only = method == "GET"
        if path == "/metrics":
            body = self.metrics.render()
            await self._respond(writer, 200, body, self.metrics.content_type, send=body_only)
        elif path == "/healthz":
            code, text = self._health()
            await self._respond(writer, code, text, send=body_only)
        else:
            await self._respond(writer, 404, b"not found\n", send=body_only)

    def _health(self) -> tuple[int, bytes]:
        if self.draining:
            return 503, b"draining\n"
        if self.shedding:
            return 503, b"overloaded\n"
        try:
            ok = bool(self.ready())
        except Exception:
            log.exception("metrics: the readiness check failed")
            return 503, b"error\n"
        return (200, b"ok\n") if ok else (503, b"starting\n")

    async def _read_head(self, reader: asyncio.StreamReader) -> tuple[str, str] | None:
        """The request line's method and path (query dropped); headers are checked, unused."""
        total = 0
        first: bytes | None = None
        while True:
            line = await reader.readline()  # raises ValueError past the stream's limit
            total += len(line)
            if total > self.max_request:
                raise ValueError("request head too large")
            if not line.endswith(b"\n"):
                return None  # EOF mid-head
            line = line.rstrip(b"\r\n")
            if first is None:
                if not line:
                    continue  # RFC 9112 2.2: ignore empty lines before the request line
                first = line
                continue
            if not line:
                break
            name, colon, _ = line.partition(b":")
            if not colon or not _TOKEN.fullmatch(name):
                raise _BadRequest
        parts = first.split(b" ")
        if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not _VERSION.fullmatch(parts[2]):
            raise _BadRequest
        target = parts[1]
        if not target.startswith(b"/") or any(c < 0x21 or c > 0x7E for c in target):
            raise _BadRequest
        path = target.split(b"?", 1)[0].decode("ascii")
        return parts[0].decode("ascii"), path

    async def _respond(
        self,
        writer: asyncio.StreamWriter,
        code: int,
        body: bytes,
        content_type: str = "text/plain; charset=utf-8",
        *,
        send: bool = True,
        allow: bool = False,
    ) -> None:
        reason = _REASONS.get(code, "")
        head = [
            f"HTTP/1.1 {code} {reason}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
            "Cache-Control: no-store",
            "Connection: close",
        ]
        if allow:
            head.append("Allow: GET, HEAD")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("ascii"))
        if send:
            writer.write(body)
        await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)


async def _discard_rest(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-close, then swallow what the client still sends (bounded in bytes and time).

    Closing a socket with unread input makes the kernel send a reset, which can destroy our
    error response before the client reads it.
    """
    with contextlib.suppress(OSError, RuntimeError):
        if writer.can_write_eof():
            writer.write_eof()
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(LINGER_S):
            left = LINGER_BYTES
            while left > 0 and (chunk := await reader.read(min(left, 4096))):
                left -= len(chunk)


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}

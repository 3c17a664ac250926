# size: a call's life from the UA's events to media, agent, telemetry and teardown, plus the public
#       surface operators' tools use (bridge_surface.Bridge)
"""The running bridge: SIP transport + the sans-I/O UA + one media session per call.

This is the only place where the pieces meet an event loop: datagrams go into
:class:`~sip_bridge.sip.ua.BridgeUA` with the loop's monotonic time, its events
come out as bytes to send and calls to set up or tear down, and its next
timer deadline is scheduled with ``loop.call_at``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from agent.base import (
    Agent,
    AgentEvent,
    CallInfo,
    DeadAir,
    DtmfEvent,
    HangupEvent,
    ModelFault,
    TransferRequest,
    TransferResult,
    TurnCompleted,
)
from agent.lines.fallback_prompt import FAULT_REASON
from sip_bridge.agents import load_agent_models, make_agent, profile_name, take_over
from sip_bridge.bridge_surface import CallSnapshot
from sip_bridge.config.loader import BridgeConfig
from sip_bridge.config.routes import match_route
from sip_bridge.logs import call_context, neutral_context
from sip_bridge.media.call_media import (
    CallMedia,
    MediaParams,
    MediaStats,
    RtpLease,
    reserve_rtp_port,
)
from sip_bridge.media.call_recording import StereoRecorder, recording_path
from sip_bridge.media.rtp_ports import PortsExhausted, RtpPortPool
from sip_bridge.native import compile_hint, require_fresh
from sip_bridge.ops import call_events as ce
from sip_bridge.ops.call_events import Command
from sip_bridge.ops.call_telemetry import CallFacts, CallTelemetry, hostport, turn_total_ms
from sip_bridge.ops.control import ControlServer
from sip_bridge.ops.headroom import CpuMeter, Headroom
from sip_bridge.ops.heap import HeapTrimmer
from sip_bridge.ops.operator_view import apply_command, bridge_status
from sip_bridge.ops.records_retention import purge_daily
from sip_bridge.sip.admission import InboundPolicy
from sip_bridge.sip.message import SipResponse, parse_message
from sip_bridge.sip.offer_answer import NegotiatedMedia
from sip_bridge.sip.registrar_link import RegistrarLink
from sip_bridge.sip.timers import TimerConfig
from sip_bridge.sip.transport import (
    Received,
    SipTransport,
    TransportError,
    tls_client_context,
    tls_server_context,
)
from sip_bridge.sip.trunk_registrations import TrunkRegistrations
from sip_bridge.sip.ua import (
    BridgeUA,
    CallEnded,
    CallEstablished,
    CallOffered,
    DtmfInfo,
    MediaUpdated,
    Send,
    TransferProgress,
    UaEvent,
)

if TYPE_CHECKING:
    from sip_bridge.web.web_server import WebServer

__all__ = ["BridgeServer", "make_agent"]

log = logging.getLogger(__name__)

CARD_MARGIN_SAMPLES = 8000  # a second of the caller's side before a turn with a card number


@dataclass(eq=False)
class _Call:
    call_id: str
    info: CallInfo
    lease: RtpLease | None = None
    media: CallMedia | None = None
    ended: bool = False
    limit: asyncio.TimerHandle | None = None
    trunk: str | None = None
    started_at: float = 0.0
    answered_at: float | None = None
    config: BridgeConfig | None = None  # the call's own: its route's agent (a reload leaves it)
    route: str | None = None  # the [[routes]] entry that picked the agent; None: the default
    facts: CallFacts | None = None  # what telemetry reports of it
    fault: ModelFault | None = None  # its agent's model failed: the fallback prompt took over
    turn_mark: int = 0  # the recording's caller sample at the last turn (see _agent_event)


class BridgeServer:
    """Listens, answers, runs the agent of every call; `stop()` hangs up and closes."""

    def __init__(
        self,
        config: BridgeConfig,
        agent_factory: Callable[[BridgeConfig], Agent] = make_agent,
        *,
        control: bool = False,
    ) -> None:
        self.config = config
        self.agent_factory = agent_factory
        low, high = config.rtp.port_range
        self.pool = RtpPortPool(low, high)
        self.transport = SipTransport(self._on_received)
        self.ua: BridgeUA | None = None
        self.calls: dict[str, _Call] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.media_host = config.sip.listen_host
        self.stats = {"offered": 0, "established": 0, "ended": 0}
        # Media statistics of the last calls that ended (CDR material; benches read it).
        self.finished: deque[MediaStats] = deque(maxlen=1_000)  # benches; records keep all
        self.heap = HeapTrimmer()  # freed call buffers back to the OS now and then
        self.policy: InboundPolicy | None = None
        self.registrations: RegistrarLink | None = None
        self._control: ControlServer | None = None
        self._want_control = control  # `sip-bridge run` serves `sip-bridge status`
        self._started_at = 0.0
        self.media_path = "python"  # or "compiled" (mypyc): see sip_bridge.native
        # records, metrics, events: off until start() opens what the config asks for
        self.telemetry = CallTelemetry(config.node.node_name, active=lambda: len(self.calls))
        self.ready = False  # models loaded and listening: /healthz says ok
        # [load]: turn latency and CPU -> whether new calls get 503 (ops.headroom)
        self.headroom = Headroom(config.load)
        self._cpu = CpuMeter()
        self.web: WebServer | None = None  # [http]: the talk page and the console
        self.config_source = ""  # what chose config.path (`sip-bridge run`: the lookup)
        # the SIP timer serves every call: it must not keep the context (call id) of the
        # call whose work happened to schedule it
        self._timer_context = neutral_context()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        sip = self.config.sip
        self.media_path = require_fresh().mode  # a stale compiled module: refuse, say why
        # records, metrics (/healthz says "starting" while models load), MQTT events
        await self.telemetry.open(self.config, self.media_path, lambda: self.ready,
                                  self._on_command)  # fmt: skip
        if self.media_path != "compiled":
            log.warning("media path runs as Python (2.5x the CPU per call): %s", compile_hint())
        if self.agent_factory is make_agent:  # models load before we listen, for every route
            loop = asyncio.get_running_loop()
            for cfg in self.config.agent_configs():
                await loop.run_in_executor(None, load_agent_models, cfg)
        await self.transport.start(sip.listen_host, sip.listen_port, sip.transports)
        assert self.transport.local is not None
        if sip.tls.enabled:
            t = sip.tls
            try:
                server_ctx = tls_server_context(
                    t.certificate, t.private_key, t.ca_file, t.verify_peer
                )
                client_ctx = tls_client_context(
                    t.certificate, t.private_key, t.ca_file, t.verify_peer
                )
                await self.transport.start_tls(sip.listen_host, t.port, server_ctx, client_ctx)
            except (OSError, ValueError) as exc:  # unreadable key, busy port: say so, clean up
                await self.transport.close()
                if isinstance(exc, TransportError):
                    raise
                raise TransportError(f"TLS on port {t.port}: {exc}") from None
        loop = asyncio.get_running_loop()
        now = self._started_at = loop.time()
        tls = self.transport.tls_local
        self.policy = InboundPolicy(
            self.config.trunks, self.config.inbound, now, retry_after_s=sip.retry_after_s
        )
        self.ua = BridgeUA(
            sip,
            self.transport.local[1],
            sip.advertised_host,
            now,
            tls_port=tls[1] if tls else None,
            admit=self.policy,
            transfer_timeout_s=self.config.transfer.timeout_s,
        )
        self.ua.silenced = self.policy.silenced
        self._schedule()
        self._spawn(self._watch_media())
        self._spawn(self._watch_load())
        # [records] keep_days: purged now and daily, in a thread, in small transactions
        store = self.telemetry.records
        self._spawn(purge_daily(lambda: self.config.records, store.path if store else None))
        if self._want_control:
            control = ControlServer(self.config.control.socket_path(self.port), self.status)
            try:
                await control.start()
            except OSError as exc:
                await self.transport.close()
                raise TransportError(f"control socket: {exc}") from None
            self._control = control
        await self._start_registrations(now)
        if self.config.http.listen:  # the talk page and the operator console
            from sip_bridge.web.web_server import WebServer

            web = WebServer(self)
            try:
                await web.start()
            except OSError as exc:
                await self.transport.close()
                raise TransportError(f"http.listen {self.config.http.listen}: {exc}") from None
            self.web = web
        self.ready = True

    async def _watch_media(self) -> None:
        """Hang up calls whose peer vanished without a BYE: no RTP for ``rtp.timeout_s``
        while it should be sending (a call it holds with inactive/sendonly is exempt); and
        trim the heap when due (:mod:`sip_bridge.ops.heap`)."""
        loop = asyncio.get_running_loop()
        seen: dict[str, tuple[int, float]] = {}  # call -> (packets in, when that changed)
        while True:
            await asyncio.sleep(1.0)
            limit, now = self.config.rtp.timeout_s, loop.time()
            current: dict[str, tuple[int, float]] = {}
            for call_id, call in list(self.calls.items()):
                media = call.media
                if media is None or call.ended:
                    continue
                packets = media.receiver.packets
                before = seen.get(call_id)
                since = before[1] if before is not None and before[0] == packets else now
                if not media.params.receive:
                    since = now  # held: the peer sends nothing on purpose
                current[call_id] = (packets, since)
                if limit > 0 and now - since >= limit:
                    log.warning("call %s: no RTP for %.0f s; hanging up", call_id, now - since)
                    self.hangup(call_id, "RTP timeout")
            seen = current
            self.heap.maybe_trim(now, len(self.calls))

    async def _watch_load(self) -> None:
        """Each second: the CPUs' busy share into the headroom, and its decision out."""
        loop = asyncio.get_running_loop()
        last = loop.time()
        self._cpu.read()
        while True:
            await asyncio.sleep(1.0)
            now = loop.time()
            busy = self._cpu.read()
            if busy is not None:
                self.headroom.cpu(busy, now - last, now, len(self.calls))
            last = now
            self._load_changed(now)

    def _load_changed(self, now: float) -> None:
        """Decide, tell the UA (503 to INVITE and OPTIONS while shedding) and telemetry."""
        self.headroom.calls_in_progress(len(self.calls))
        self.headroom.update(now)
        shed = 0
        if self.ua is not None:
            self.ua.shedding = self.headroom.shedding
            shed = self.ua.shed_count
        self.telemetry.load(self.headroom.latest, shed)

    def load_status(self) -> dict[str, Any]:
        """The node's headroom for status and the console: figures, budgets, refusals."""
        loop = asyncio.get_running_loop()
        c = self.config.load
        return {
            **self.headroom.figures(loop.time()).as_dict(),
            "shed_enabled": c.shed,
            "turn_p95_budget_ms": c.turn_p95_ms,
            "cpu_budget_pct": c.cpu_pct,
            "shed_calls": self.ua.shed_count if self.ua is not None else 0,
        }

    def _on_command(self, call_id: str, command: Command) -> None:
        """An operator's command for one call (MQTT); ValueError becomes an error event."""
        apply_command(self, call_id, command)

    async def _start_registrations(self, now: float) -> None:
        ports = {"udp": self.port, "tcp": self.port}
        if self.transport.tls_local:
            ports["tls"] = self.transport.tls_local[1]
        t = self.config.sip.timers
        regs = TrunkRegistrations(
            self.config.trunks,
            self.config.sip.advertised_host,
            ports,
            now,
            timers=TimerConfig(t1=t.t1, t2=t.t2, t4=t.t4),
        )
        if not len(regs):
            return
        self.registrations = RegistrarLink(
            regs, self.transport.send_nowait, self._registrar_addresses
        )
        self.registrations.start([t.name for t in self.config.trunks if t.registers])

    @property
    def port(self) -> int:
        assert self.transport.local is not None
        return self.transport.local[1]

    @property
    def uri(self) -> str:
        host = self.config.sip.advertised_host
        if ":" in host:
            host = f"[{host}]"
        return f"sip:{self.config.agent.name}@{host}:{self.port}"

    async def reload(self, new: BridgeConfig) -> list[str]:
        """Use ``new`` for calls from now on (calls in progress keep theirs). Its agents
        load first: a broken profile or a missing model raises and changes nothing. What
        needs a restart keeps its running value; returns the names of those that differed.
        """
        from sip_bridge.ops.reload import keep_bound

        merged, kept = keep_bound(self.config, new)
        if self.agent_factory is make_agent:
            loop = asyncio.get_running_loop()
            for cfg in merged.agent_configs():
                await loop.run_in_executor(None, load_agent_models, cfg)
        self.config = merged
        if self.ua is not None:
            now = asyncio.get_running_loop().time()
            policy = InboundPolicy(
                merged.trunks, merged.inbound, now, retry_after_s=merged.sip.retry_after_s
            )
            if self.policy is not None:
                policy.adopt(self.policy)
            self.policy = self.ua.admit = policy
            self.ua.silenced = policy.silenced
            self.ua.config = merged.sip
            self.ua.transfer_timeout_s = merged.transfer.timeout_s  # for the next REFER
        self.headroom.config = merged.load
        return kept

    @property
    def draining(self) -> bool:
        return self.ua is not None and self.ua.draining

    async def drain(self, timeout_s: float | None = None) -> int:
        """Stop taking calls (INVITE and OPTIONS get 503: a dispatcher probing with OPTIONS
        moves traffic away), let calls in progress finish for up to ``timeout_s`` (default
        ``sip.drain_s``), then :meth:`stop`, which hangs up the rest. Returns how many calls
        were still up at the deadline."""
        loop = asyncio.get_running_loop()
        if self.ua is not None:
            self.ua.draining = True
        if self.telemetry.http is not None:
            self.telemetry.http.set_draining(True)
        deadline = loop.time() + (self.config.sip.drain_s if timeout_s is None else timeout_s)
        log.warning("draining: %d call(s) in progress, new calls get 503", len(self.calls))
        while self.calls and loop.time() < deadline:
            await asyncio.sleep(0.1)
        left = len(self.calls)
        if left:
            log.warning("drain deadline: hanging up %d call(s)", left)
        await self.stop()
        return left

    async def stop(self, grace_s: float = 2.0) -> None:
        """Hang up every call (BYE), unregister, give both a moment, then close everything."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = now + grace_s
        unregistered = None
        if self.registrations is not None:
            unregistered = loop.create_task(self.registrations.stop(deadline))
        if self.ua is not None:
            for call_id in list(self.calls):
                self._handle(self.ua.hangup(call_id, now, "shutting down"))
        while self.ua is not None and self.ua.transactions and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if unregistered is not None:
            await unregistered
        if self._control is not None:
            await self._control.close()
        if self.web is not None:
            await self.web.stop()
        for t in list(self._tasks):
            t.cancel()
        for call in list(self.calls.values()):
            await self._teardown(call, "shutting down")
        if self._timer is not None:
            self._timer.cancel()
        await self.transport.close()
        await self.telemetry.close()

    def _registrar_addresses(self, trunk: str, addresses: Iterable[str]) -> None:
        if self.policy is not None:  # the current one: a reload replaces it
            self.policy.set_registrar_addresses(trunk, addresses)

    # -- SIP in, events out -------------------------------------------------------------------

    def _on_received(self, r: Received) -> None:
        ua = self.ua
        if ua is None:
            return
        now = asyncio.get_running_loop().time()
        regs = self.registrations
        if regs is not None and r.data is not None and r.data.startswith(b"SIP/2.0 "):
            try:
                r = Received(r.transport, r.source, message=parse_message(r.data))
            except ValueError:
                return  # a malformed response: nothing to answer
        if regs is not None and isinstance(r.message, SipResponse) and regs.regs.owns(r.message):
            regs.receive(r.message, r.source, r.transport)
            return
        shed = ua.shed_count
        if r.data is not None:
            events = ua.receive_bytes(r.data, r.source, r.transport, now)
        elif r.message is not None:
            events = ua.receive_message(r.message, r.source, r.transport, now)
        else:
            log.info("dropped a broken SIP stream from %s: %s", r.source, r.error)
            return
        self._handle(events)
        if ua.shed_count != shed:  # a new call refused for load: counted at once
            self.telemetry.load(self.headroom.latest, ua.shed_count)

    def _tick(self) -> None:
        self._timer = None
        if self.ua is not None:
            self._handle(self.ua.tick(asyncio.get_running_loop().time()))

    def _schedule(self) -> None:
        if self.ua is None:
            return
        deadline = self.ua.next_deadline()
        if self._timer is not None:
            if deadline is not None and self._timer.when() <= deadline:
                return
            self._timer.cancel()
            self._timer = None
        if deadline is not None:
            self._timer = asyncio.get_running_loop().call_at(
                deadline, self._tick, context=self._timer_context
            )

    def _handle(self, events: list[UaEvent]) -> None:
        for ev in events:
            if isinstance(ev, Send):
                self.transport.send_nowait(ev.data, ev.destination, ev.transport)
            else:
                with call_context(getattr(ev, "call_id", None)):  # its log lines name it
                    self._handle_call_event(ev)
        self._schedule()

    def _handle_call_event(self, ev: UaEvent) -> None:
        if isinstance(ev, CallOffered):
            self.stats["offered"] += 1
            self._spawn(self._offered(ev))
        elif isinstance(ev, CallEstablished):
            self.stats["established"] += 1
            self._spawn(self._established(ev.call_id, ev.media))
        elif isinstance(ev, CallEnded):
            self.stats["ended"] += 1
            call = self.calls.get(ev.call_id)
            log.info("call %s ended by %s: %s", ev.call_id, ev.by, ev.reason)
            if call is not None:
                self._spawn(self._teardown(call, ev.reason, ev.by))
        elif isinstance(ev, DtmfInfo):
            call = self.calls.get(ev.call_id)
            if call is not None and call.media is not None:
                # recorded first, as RFC 4733 keys are (CallMedia): in the agent's state the
                # key was typed in (the last key of a sensitive slot's entry leaves the slot)
                sensitive = call.media.agent.sensitive
                self.telemetry.dtmf(ev.call_id, ev.digit, "info", sensitive)
                call.media.agent.on_event(DtmfEvent(ev.digit))
        elif isinstance(ev, MediaUpdated):
            self._media_updated(ev.call_id, ev.media)
        elif isinstance(ev, TransferProgress):
            log.info(
                "call %s: transfer to %s %s (%s)", ev.call_id, ev.target, ev.outcome, ev.reason
            )
            call = self.calls.get(ev.call_id)
            if ev.final:  # a failure is logged at WARNING and counted there
                self.telemetry.transfer_ended(
                    ev.call_id, ev.target, ev.outcome, ev.status, ev.reason
                )
            if ev.final and call is not None and call.media is not None:
                result = TransferResult(ev.target, "failed", ev.status, ev.reason)
                if ev.outcome == "succeeded":
                    result = TransferResult(ev.target, "succeeded", ev.status, ev.reason)
                call.media.agent.on_event(result)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        # the task keeps the current context: the call :meth:`_handle` works for
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("call task failed", exc_info=task.exception())

    # -- calls ---------------------------------------------------------------------------------

    async def _offered(self, ev: CallOffered) -> None:
        ua = self.ua
        assert ua is not None
        loop = asyncio.get_running_loop()
        info = CallInfo(ev.call_id, caller=ev.from_uri, callee=ev.request_uri)
        call = _Call(ev.call_id, info, trunk=ev.trunk, started_at=loop.time())
        headers = {name.lower(): value for name, value in ev.headers}
        route = match_route(self.config.routes, ev.request_uri, ev.from_uri, ev.trunk, headers)
        call.config = self.config.for_route(route)
        call.route = route.name if route is not None else None
        call.facts = CallFacts(
            ev.call_id, ev.from_uri, ev.request_uri, ev.trunk, call.route,
            call.config.agent.name, hostport(ev.source),
        )  # fmt: skip
        self.telemetry.offered(call.facts)
        if ev.trunk or route is not None:
            log.info(
                "call %s from %s on trunk %s, route %s: agent %s", ev.call_id, ev.source,
                ev.trunk or "-", call.route or "(default)", call.config.agent.name,
            )  # fmt: skip
        self.calls[ev.call_id] = call
        self._load_changed(loop.time())  # a burst of INVITEs is judged call by call
        try:
            call.lease = await reserve_rtp_port(self.pool, self.media_host)
        except PortsExhausted as exc:
            log.warning("call %s refused: %s", ev.call_id, exc)
            self.telemetry.ended(call.facts, "rejected", f"503 {exc}")
            call.ended = True  # the record is final: the CallEnded that follows adds nothing
            self._handle(ua.reject(ev.call_id, 503, loop.time()))
            return
        if call.ended:  # cancelled while we were binding
            await call.lease.aclose()
            return
        ring = self.config.sip.answer_after_s
        if ring > 0:
            self._handle(ua.ring(ev.call_id, loop.time()))
            await asyncio.sleep(ring)
        if not call.ended:
            self._handle(ua.answer(ev.call_id, call.lease.port, loop.time()))

    async def _established(self, call_id: str, neg: NegotiatedMedia) -> None:
        call = self.calls.get(call_id)
        if call is None or call.ended or call.lease is None:
            return
        loop = asyncio.get_running_loop()
        try:
            params = self._media_params(neg)
        except ValueError as exc:
            log.warning("call %s: unusable media (%s); hanging up", call_id, exc)
            self.hangup(call_id, "unusable media")
            return
        agent = self.agent_factory(call.config or self.config)
        info = CallInfo(call_id, call.info.caller, call.info.callee, codec=neg.codec)
        media = CallMedia(
            agent,
            self.pool,
            params,
            info,
            on_agent_event=lambda e: self._agent_event(call_id, e),
            lease=call.lease,
        )
        call.media = media
        call.answered_at = loop.time()
        rec_dir = (call.config or self.config).records.recordings_dir
        if rec_dir:
            try:  # silence while the agent asks for a sensitive slot (a PIN, a card)
                muted = lambda: agent.sensitive  # noqa: E731
                media.recorder = StereoRecorder(recording_path(rec_dir, call_id), muted)
                path = str(media.recorder.path)
                self.telemetry.event(call_id, "recording", ce.recording(path))
            except OSError as exc:  # a full disk or no permission: the call goes on
                log.warning("call %s: not recorded: %s", call_id, exc)
        # the digit's record and event are masked when it belongs to a sensitive slot (the
        # agent hears the key after this, see CallMedia._deliver_digits: its state is still
        # the one the key was typed in)
        media.on_caller_dtmf = lambda e: self.telemetry.dtmf(call_id, e.digit, "rfc4733",
                                                             agent.sensitive)  # fmt: skip
        if call.facts is not None:
            remote = hostport((params.remote_host, params.remote_port))
            self.telemetry.answered(call.facts, neg.codec, remote, agent.name, profile_name(agent))
        await media.start()
        if call.ended:  # hung up while the media was starting: _teardown saw no media yet
            await media.close("ended during setup")
            return
        log.info("call %s answered: %s", call_id, media.describe())
        limit = self.config.sip.max_call_s
        if limit > 0:
            call.limit = loop.call_later(limit, self.hangup, call_id, "call length limit")

    def _media_params(self, neg: NegotiatedMedia) -> MediaParams:
        """What CallMedia needs from an offer/answer outcome; ValueError if unusable."""
        symmetric = self.config.rtp.symmetric
        latch = symmetric == "on" or (symmetric == "auto" and neg.remote_is_private)
        jitter = self.config.jitter
        return MediaParams.negotiated(
            neg, latch=latch, jitter_min_ms=jitter.min_delay_ms, jitter_max_ms=jitter.max_delay_ms
        )

    def _media_updated(self, call_id: str, neg: NegotiatedMedia) -> None:
        """A re-INVITE/UPDATE (hold, new address...): apply it to the running media."""
        call = self.calls.get(call_id)
        log.info("call %s: media updated by re-INVITE (%s)", call_id, neg)
        if call is None or call.media is None or call.ended:
            return
        try:
            call.media.update(self._media_params(neg))
        except ValueError as exc:  # keep the call on its current media
            log.warning("call %s: media update not applied (%s)", call_id, exc)

    def _agent_event(self, call_id: str, event: AgentEvent) -> None:
        if isinstance(event, TurnCompleted):
            card = self.telemetry.turn(call_id, event)
            self._mark_turn(call_id, card)
            total = turn_total_ms(event.stages_ms)
            if total is not None and not event.barged_in:  # a cut-short turn waited for nothing
                now = asyncio.get_running_loop().time()
                self.headroom.turn(total, now, len(self.calls))
                self._load_changed(now)
        elif isinstance(event, DeadAir):
            self.telemetry.dead_air_gap(call_id, event)
        elif isinstance(event, HangupEvent):
            self.hangup(call_id, event.reason or "agent hung up")
        elif isinstance(event, ModelFault):
            self._model_fault(call_id, event)
        elif isinstance(event, TransferRequest) and self.ua is not None:
            log.info("call %s: the agent asks for a transfer to %s", call_id, event.target)
            self.transfer(call_id, event.target)

    def _mark_turn(self, call_id: str, card_said: bool) -> None:
        """A turn ended. When the caller said a card number in it, the recording's caller
        side goes silent back to the turn before (less a second: a caller who barged in
        started before it was reported)."""
        call = self.calls.get(call_id)
        recorder = call.media.recorder if call is not None and call.media is not None else None
        if call is None or recorder is None:
            return
        if card_said:
            recorder.silence_caller(call.turn_mark - CARD_MARGIN_SAMPLES)
        call.turn_mark = recorder.caller_samples

    def _model_fault(self, call_id: str, fault: ModelFault) -> None:
        """A model of the call's agent raised or hung: the bridge takes this call over (the
        fallback prompt, then hang-up or transfer); no other call is touched."""
        call = self.calls.get(call_id)
        if call is None or call.ended or call.media is None or call.fault is not None:
            return
        call.fault = fault
        a = (call.config or self.config).agent
        log.error("call %s: model fault in %s (%s): fallback prompt, then %s", call_id,
                  fault.stage, fault.reason, a.on_model_fault)  # fmt: skip
        self.telemetry.model_fault(call_id, fault.stage, fault.reason, a.on_model_fault)
        self._spawn(take_over(call.media, a))

    # -- the public surface its operators' tools use (sip_bridge.bridge_surface.Bridge) ---------

    def hangup(self, call_id: str, reason: str) -> None:
        """End the call (BYE, or CANCEL/487 before it was answered)."""
        if self.ua is not None:
            self._handle(self.ua.hangup(call_id, asyncio.get_running_loop().time(), reason))

    def transfer(self, call_id: str, target: str) -> None:
        """Blind-transfer the call to ``target`` (a SIP URI): REFER; ValueError if not up."""
        if self.ua is None:
            raise ValueError("the bridge is not running")
        self._handle(self.ua.transfer(call_id, target, asyncio.get_running_loop().time()))

    @property
    def active_calls(self) -> int:
        return len(self.calls)

    def call_snapshots(self) -> list[CallSnapshot]:
        now = asyncio.get_running_loop().time()
        tel = self.telemetry
        out = []
        for c in self.calls.values():
            tally = tel.dead_air.get(c.call_id)
            out.append(CallSnapshot(
                call_id=c.call_id, caller=c.info.caller, callee=c.info.callee,
                trunk=c.trunk, route=c.route, config=c.config or self.config,
                profile=c.facts.profile if c.facts is not None else "",
                answered=c.media is not None,
                duration_s=now - (c.answered_at or c.started_at), codec=c.info.codec,
                media=c.media.stats if c.media is not None else None,
                recent_turns=tuple(tel.recent_turns.get(c.call_id, ())),
                dead_air=replace(tally) if tally is not None else None,
            ))  # fmt: skip
        return out

    def call_agent(self, call_id: str) -> Agent | None:
        call = self.calls.get(call_id)
        if call is None or call.ended:
            raise ValueError(f"no call {call_id} in progress here")
        return call.media.agent if call.media is not None else None

    @property
    def uptime_s(self) -> float:
        """Seconds since :meth:`start` (0 before)."""
        if not self._started_at:
            return 0.0
        return asyncio.get_running_loop().time() - self._started_at

    async def _teardown(self, call: _Call, reason: str, by: str = "local") -> None:
        if call.ended:
            self.calls.pop(call.call_id, None)
            return
        call.ended = True
        self.calls.pop(call.call_id, None)
        if call.fault is not None:  # however it ended (BYE, transfer), a model fault did it
            reason = FAULT_REASON
        if call.limit is not None:
            call.limit.cancel()
        if call.media is not None:
            await call.media.close(reason)
            self.finished.append(call.media.stats)
            self.heap.call_ended()
            if call.media.recorder is not None:
                try:
                    call.media.recorder.close()
                except OSError as exc:
                    log.warning("call %s: recording incomplete: %s", call.call_id, exc)
        elif call.lease is not None and not call.lease.transport.is_closing():
            await call.lease.aclose()
        if call.facts is not None:
            outcome = "answered" if call.media is not None else (
                "cancelled" if by == "remote" else "failed"
            )  # fmt: skip
            media = call.media.stats if call.media is not None else None
            self.telemetry.ended(call.facts, outcome, reason, media)

    # -- status (``sip-bridge status``) --------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What an operator asks a running bridge: calls, registrations, counters."""
        return bridge_status(self)


def settle_heap() -> None:
    """Move everything alive after start (modules, models, tables: it lives as long as the
    process) out of the garbage collector's scans, whose pauses would stall every call's
    media. For a long-running bridge process, after :meth:`BridgeServer.start`."""
    gc.collect()
    gc.freeze()

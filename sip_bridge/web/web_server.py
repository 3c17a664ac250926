"""The bridge's web server (aiohttp): the talk page (an operator talks to an agent profile
from the browser, :mod:`sip_bridge.web.webrtc_leg`) and the operator console (live calls of
both legs, past calls from the records, hang-up and transfer).

Trust model, because this page can start agent sessions and end calls:
- A talk page carries a page token (random, valid ``token_ttl_s``) that only a page served
  by us can read (same-origin policy); starting a session needs it in an ``Authorization``
  header, which a page of another origin cannot send without a CORS preflight we never
  answer. Requests whose ``Origin`` is not our own are refused as well. A token starts one
  session; the answer carries the next (``X-Next-Token``).
- The console, its API, recordings and a session's events need a viewer or operator token
  whenever the listener is not loopback-only (a bridge refuses to start so without one,
  unless ``[http] allow_anonymous_reads``); actions (hang up, transfer, say) always need an
  operator token, and go on the call's timeline with its name. Browsers sign in on
  ``/login`` and carry an HttpOnly cookie; see :mod:`sip_bridge.web.web_auth` and
  :mod:`sip_bridge.web.web_access`.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from aiohttp import web

from agent.base import AgentEvent, DeadAir, ModelFault, SayText, TurnCompleted
from sip_bridge.agents import profile_name, take_over
from sip_bridge.config.config_types import (
    AgentConfig,
    ConfigError,
    HttpToken,
    exposure_problem,
    loopback_host,
    parse_hostport,
)
from sip_bridge.ops.call_events import Command, HangupCommand, SayCommand, TransferCommand
from sip_bridge.ops.call_telemetry import CallFacts, turn_total_ms
from sip_bridge.ops.operator_view import apply_command
from sip_bridge.ops.records import RecordsError
from sip_bridge.web.console_view import live_calls, talk_profiles
from sip_bridge.web.web_access import Access, bearer, error, same_origin
from sip_bridge.web.webrtc_leg import BrowserSession, ice_hosts

if TYPE_CHECKING:
    from sip_bridge.bridge_surface import Bridge

__all__ = ["PageTokens", "WebServer"]

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
_STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
_MAX_OFFER = 64 * 1024
_SSE_PING_S = 15.0


class PageTokens:
    """Short-lived tokens handed to talk pages; at most ``limit`` alive (the oldest go)."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic,
                 limit: int = 1000) -> None:  # fmt: skip
        self.ttl_s = ttl_s
        self._clock = clock
        self._limit = limit
        self._tokens: dict[str, float] = {}  # token -> expiry, oldest first

    def issue(self) -> str:
        self._prune()
        while len(self._tokens) >= self._limit:
            del self._tokens[next(iter(self._tokens))]
        token = secrets.token_urlsafe(24)
        self._tokens[token] = self._clock() + self.ttl_s
        return token

    def valid(self, token: str) -> bool:
        self._prune()
        return token in self._tokens

    def spend(self, token: str) -> str:
        """``token`` has started its session: it is void, and the page gets the next."""
        self._tokens.pop(token, None)
        return self.issue()

    def _prune(self) -> None:
        now = self._clock()
        for t in [t for t, exp in self._tokens.items() if exp <= now]:
            del self._tokens[t]


class _Leg(NamedTuple):
    facts: CallFacts  # what the call records and events say of the session
    agent: AgentConfig  # its [agent]: the fallback prompt after a model fault


class WebServer:
    """Serves the pages and APIs on ``[http] listen`` for one :class:`BridgeServer`."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        cfg = bridge.config.http
        problem = exposure_problem(cfg)  # the config refuses it too: this is the last word
        if problem:
            raise ConfigError(bridge.config.path, None, "http.viewer_token_env", problem)
        self.host, self.port = parse_hostport(cfg.listen)
        self.tokens = PageTokens(cfg.token_ttl_s)
        self.sessions: dict[str, BrowserSession] = {}
        self._legs: dict[str, _Leg] = {}  # per session: what telemetry and faults need
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: web.AppRunner | None = None
        self._pages: dict[str, str] = {}
        app = web.Application(client_max_size=_MAX_OFFER)
        self.access = Access(lambda: self.bridge.config.http, self._page)
        self.access.install(app)
        app.router.add_get("/", self._root)
        app.router.add_get("/talk", self._talk_page)
        app.router.add_get("/console", self._console_page)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_post("/talk/offer", self._offer)
        app.router.add_delete("/talk/sessions/{sid}", self._end_session)
        app.router.add_get("/talk/sessions/{sid}/events", self._session_events)
        app.router.add_get("/api/calls", self._api_calls)
        app.router.add_get("/api/history", self._api_history)
        app.router.add_get("/api/calls/{call_id}", self._api_call)
        app.router.add_post("/api/calls/{call_id}/hangup", self._api_hangup)
        app.router.add_post("/api/calls/{call_id}/transfer", self._api_transfer)
        app.router.add_post("/api/calls/{call_id}/say", self._api_say)
        app.router.add_get("/api/calls/{call_id}/recording", self._api_recording)
        self.app = app

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        http = self.bridge.config.http
        if not loopback_host(self.host) and http.allow_anonymous_reads:
            log.warning("http.allow_anonymous_reads = true: whoever reaches %s reads callers' "
                        "numbers, transcripts and recordings and talks to the agents",
                        http.listen)  # fmt: skip
        elif not loopback_host(self.host):
            log.info("http.listen %s is not loopback: reading needs one of %d token(s)",
                     http.listen, len(http.tokens))  # fmt: skip
        if self.port == 0:  # the OS picked one (tests)
            server = getattr(site, "_server", None)
            if server is not None and server.sockets:
                self.port = int(server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        for s in list(self.sessions.values()):
            await s.close("shutting down")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- pages ---------------------------------------------------------------------------------

    def _page(
        self, name: str, values: dict[str, str], data: dict[str, Any] | None = None
    ) -> web.Response:
        """A page with its placeholders filled: ``values`` HTML-escaped, ``data`` as JSON
        for a ``<script type="application/json">`` (whose text is never entity-decoded:
        ``<``, ``>`` and ``&`` are escaped the JSON way instead)."""
        text = self._pages.get(name)
        if text is None:
            text = self._pages[name] = (STATIC / name).read_text()
        for key, value in values.items():
            text = text.replace("{{" + key + "}}", html.escape(value))
        for key, value in (data or {}).items():
            blob = json.dumps(value)
            for ch in "<>&":
                blob = blob.replace(ch, f"\\u{ord(ch):04x}")
            text = text.replace("{{" + key + "}}", blob)
        headers = {
            "Cache-Control": "no-store",
            # nothing from elsewhere: scripts, styles and connections to ourselves only
            "Content-Security-Policy": "default-src 'self'; media-src 'self' blob: mediastream:;"
            " img-src 'self' data:; frame-ancestors 'none'",
            "X-Content-Type-Options": "nosniff",
        }
        return web.Response(text=text, content_type="text/html", headers=headers)

    async def _root(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/console")

    async def _talk_page(self, request: web.Request) -> web.Response:
        profiles = [
            {"key": key, "label": label, "agent": cfg.agent.name}
            for key, (label, cfg) in talk_profiles(self.bridge.config).items()
        ]
        values = {"page_token": self.tokens.issue(), "node": self.bridge.telemetry.node}
        return self._page("talk.html", values, {"profiles_json": profiles})

    async def _console_page(self, request: web.Request) -> web.Response:
        me = self.access.page_values(request)
        source = self.bridge.config_source
        config = self.bridge.config.path + (f" ({source})" if source else "")
        values = {
            "node": self.bridge.telemetry.node,
            "actions_enabled": "true" if me["may_act"] else "false",
            "operators": "true" if self.bridge.config.http.operator_token else "false",
            "signed_in": me["signed_in"],
            "csrf": me["csrf"],
            "config": config,
        }
        return self._page("console.html", values)

    async def _static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        path = STATIC / name
        if "/" in name or name.startswith(".") or path.suffix not in _STATIC_TYPES:
            raise web.HTTPNotFound()
        if not path.is_file():
            raise web.HTTPNotFound()
        return web.FileResponse(path, headers={"Content-Type": _STATIC_TYPES[path.suffix],
                                               "Cache-Control": "no-cache"})  # fmt: skip

    # -- the browser leg -----------------------------------------------------------------------

    async def _offer(self, request: web.Request) -> web.Response:
        if not same_origin(request):
            return error(403, "cross-origin request refused")
        token = bearer(request)
        if not self.tokens.valid(token):
            return error(401, "no valid page token: reload the page")
        http = self.bridge.config.http
        live = sum(1 for s in self.sessions.values() if s.closed_reason is None)
        if live >= http.max_sessions or self.bridge.draining:
            return error(503, f"busy: {live} browser sessions (http.max_sessions)")
        if request.content_type != "application/sdp":
            return error(415, "send the SDP offer as application/sdp")
        profiles = talk_profiles(self.bridge.config)
        key = request.query.get("profile") or next(iter(profiles))
        if key not in profiles:
            return error(404, f"no agent profile {key!r}; known: {', '.join(profiles)}")
        offer = await request.text()
        if "m=audio" not in offer:
            return error(400, "the offer has no audio")
        _label, cfg = profiles[key]
        loop = asyncio.get_running_loop()
        try:  # a profile not loaded at start loads now (models are shared and warm)
            agent = await loop.run_in_executor(None, self.bridge.agent_factory, cfg)
        except Exception as exc:
            log.warning("browser session: agent for profile %s: %s", key, exc)
            return error(500, f"agent for profile {key}: {exc}")
        peer = request.remote or "browser"
        session = BrowserSession(
            agent, f"browser {peer}", ice=ice_hosts(self.host, http.ice_addresses), profile=key,
            on_event=self._session_event, on_closed=self._session_closed,
        )  # fmt: skip
        call = session.call
        facts = CallFacts(call.call_id, call.caller, key, None, f"webrtc:{key}", agent.name, peer)
        self.sessions[session.id] = session
        self._legs[session.id] = _Leg(facts, cfg.agent)
        self.bridge.telemetry.offered(facts)
        try:
            answer = await session.answer(offer, max_s=cfg.sip.max_call_s)
        except Exception as exc:  # a malformed or unusable offer: say so, keep nothing
            await session.close(f"offer refused: {exc}")
            return error(400, f"offer refused: {exc}")
        self.bridge.telemetry.answered(facts, "opus", peer, agent.name, profile_name(agent))
        log.info("browser session %s: %s talks to profile %s (%s)", session.id, peer, key,
                 agent.name)  # fmt: skip
        headers = {"Location": f"/talk/sessions/{session.id}",
                   "X-Next-Token": self.tokens.spend(token)}  # fmt: skip
        return web.Response(status=201, text=answer, content_type="application/sdp",
                            headers=headers)  # fmt: skip

    def _session_event(self, session: BrowserSession, event: AgentEvent) -> None:
        telemetry = self.bridge.telemetry
        if isinstance(event, TurnCompleted):
            telemetry.turn(session.call.call_id, event)
        elif isinstance(event, DeadAir):
            telemetry.dead_air_gap(session.call.call_id, event)
        elif isinstance(event, ModelFault) and not session.faulted:
            session.faulted = True  # as for a SIP call: the fallback prompt, then hang up
            log.error("browser session %s: model fault in %s (%s): fallback prompt", session.id,
                      event.stage, event.reason)  # fmt: skip
            telemetry.model_fault(session.call.call_id, event.stage, event.reason, "hangup")
            a = replace(self._legs[session.id].agent, on_model_fault="hangup")  # no line to refer
            task = asyncio.get_running_loop().create_task(take_over(session, a))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _session_closed(self, session: BrowserSession, reason: str) -> None:
        leg = self._legs.pop(session.id, None)
        self.sessions.pop(session.id, None)
        if leg is not None:
            outcome = "answered" if leg.facts.answered is not None else "failed"
            self.bridge.telemetry.ended(leg.facts, outcome, reason)

    def _session(self, request: web.Request) -> BrowserSession:
        session = self.sessions.get(request.match_info["sid"])
        if session is None:
            raise web.HTTPNotFound(text="no such session (ended?)")
        return session

    async def _end_session(self, request: web.Request) -> web.Response:
        """Hang up. The session's id, unguessable and known only to the page that started
        it, is the capability (as for its events): a page whose token has since expired
        can still hang up."""
        if not same_origin(request):
            return error(403, "cross-origin request refused")
        await self._session(request).close("hung up")
        return web.Response(status=204)

    async def _session_events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: the session's state and turns (the session id, unguessable
        and known only to the page that started it, is the capability)."""
        session = self._session(request)
        past, queue = session.subscribe()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-store"})  # fmt: skip
        await resp.prepare(request)
        try:
            for ev in past:
                await resp.write(f"data: {json.dumps(ev)}\n\n".encode())
            ended = session.closed_reason is not None
            while not ended:
                try:  # not wait_for: on Python 3.11 it can drop the page's cancellation
                    async with asyncio.timeout(_SSE_PING_S):
                        new = await queue.get()
                except TimeoutError:
                    await resp.write(b": ping\n\n")
                    continue
                await resp.write(f"data: {json.dumps(new)}\n\n".encode())
                ended = new.get("type") == "state" and new.get("state") == "ended"
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            session.unsubscribe(queue)
        return resp

    # -- the console ---------------------------------------------------------------------------

    async def _api_calls(self, request: web.Request) -> web.Response:
        now = asyncio.get_running_loop().time()
        calls = live_calls(self.bridge, list(self.sessions.values()), now)
        node = self.bridge.telemetry.node
        load = self.bridge.load_status()
        return web.json_response({"node": node, "load": load, "calls": calls})

    async def _api_history(self, request: web.Request) -> web.Response:
        records = self.bridge.telemetry.records
        if records is None:
            return web.json_response({"calls": [], "note": "call records are off"})
        try:
            limit = max(1, min(500, int(request.query.get("limit", "50"))))
        except ValueError:
            return error(400, "limit must be a number")
        try:
            rows = records.list(limit=limit)
        except RecordsError as exc:
            return error(500, str(exc))
        return web.json_response({"calls": rows})

    async def _api_call(self, request: web.Request) -> web.Response:
        records = self.bridge.telemetry.records
        if records is None:
            return error(404, "call records are off")
        try:
            found = records.show(request.match_info["call_id"])
        except RecordsError as exc:
            return error(500, str(exc))
        if found is None:
            return error(404, "no such call in the records")
        for t in found["turns"]:
            timings = t.get("timings") or {}
            t["total_ms"] = turn_total_ms(timings)
        return web.json_response(found)

    async def _api_recording(self, request: web.Request) -> web.StreamResponse:
        """A call's stereo WAV, when it was recorded and the file is still in
        ``[records] recordings_dir``."""
        records = self.bridge.telemetry.records
        rec_dir = self.bridge.config.records.recordings_dir
        if records is None or not rec_dir:
            return error(404, "no recordings here")
        try:
            found = records.show(request.match_info["call_id"])
        except RecordsError as exc:
            return error(500, str(exc))
        paths = [e["data"].get("path") for e in (found or {}).get("events", [])
                 if e["kind"] == "recording" and isinstance(e["data"], dict)]  # fmt: skip
        folder = Path(rec_dir).resolve()
        for p in paths:
            f = Path(str(p)).resolve()
            if f.parent == folder and f.suffix == ".wav" and f.is_file():
                headers = {"Content-Type": "audio/wav", "Cache-Control": "no-store",
                           "Content-Disposition": f'inline; filename="{f.name}"'}  # fmt: skip
                return web.FileResponse(f, headers=headers)
        return error(404, "this call has no recording (any more)")

    async def _acting(
        self, request: web.Request, field: str = "", limit: int = 0, example: str = ""
    ) -> tuple[HttpToken, str, str] | web.Response:
        """An action's operator token, call id and JSON ``field`` ("" without); else the
        refusal."""
        token = self.access.operator(request)
        if isinstance(token, web.Response):
            return token
        value = await _field(request, field, limit) if field else ""
        if value is None:
            return error(400, f'send {{"{field}": "{example}"}}')
        return token, request.match_info["call_id"], value

    async def _api_hangup(self, request: web.Request) -> web.Response:
        acting = await self._acting(request)
        if isinstance(acting, web.Response):
            return acting
        token, call_id, _ = acting
        session = self._by_call_id(call_id)
        if session is not None:
            self.bridge.telemetry.operator(call_id, "hangup", token.name, "http")
            await session.close("operator hung up")
            return web.json_response({"ok": True})
        return self._command(HangupCommand(call_id), token)

    async def _api_transfer(self, request: web.Request) -> web.Response:
        acting = await self._acting(request, "target", 256, "sip:...")
        if isinstance(acting, web.Response):
            return acting
        token, call_id, target = acting
        if self._by_call_id(call_id) is not None:
            return error(409, "a browser session has no phone line to transfer")
        try:
            answered = self.bridge.call_agent(call_id) is not None
        except ValueError:
            answered = False
        if not answered:
            return error(404, f"no answered call {call_id} here")
        return self._command(TransferCommand(call_id, target), token)

    async def _api_say(self, request: web.Request) -> web.Response:
        acting = await self._acting(request, "text", 4096, "what the agent says")
        if isinstance(acting, web.Response):
            return acting
        token, call_id, text = acting
        session = self._by_call_id(call_id)
        if session is None:
            return self._command(SayCommand(call_id, text), token)
        if not session.agent.takes_commands:
            return error(409, f"agent {session.agent.name} does not take say")
        self.bridge.telemetry.operator(call_id, "say", token.name, "http", text=text)
        session.agent.on_event(SayText(text))
        return web.json_response({"ok": True})

    def _command(self, command: Command, token: HttpToken) -> web.Response:
        """A SIP call's hang-up, transfer or say: the MQTT commands' path (logged there,
        and on the call's timeline with the token's name)."""
        try:
            apply_command(self.bridge, command.call_id, command, by=token.name, via="http")
        except ValueError as exc:  # no such call in progress, or an agent that cannot
            return error(404, str(exc))
        return web.json_response({"ok": True})

    def _by_call_id(self, call_id: str) -> BrowserSession | None:
        if call_id.startswith("webrtc-"):
            return self.sessions.get(call_id.removeprefix("webrtc-"))
        return None


async def _field(request: web.Request, name: str, limit: int) -> str | None:
    """The non-empty string ``name`` of a JSON object body (stripped), else None."""
    try:
        body: Any = await request.json()
    except ValueError:
        return None
    value = body.get(name) if isinstance(body, dict) else None
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        return None
    return value.strip()

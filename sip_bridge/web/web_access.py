"""The web server's doors: the read guard in front of every page, API and event stream,
``/login`` and ``/logout`` for browsers, and the operator check of actions. The rules and
their reasons are in :mod:`sip_bridge.web.web_auth`; this is their aiohttp side."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from sip_bridge.config.config_types import HttpConfig, HttpToken
from sip_bridge.web.web_auth import GuessLimit, Login, Logins, find_token

__all__ = ["COOKIE", "Access", "Who", "bearer", "error", "same_origin"]

log = logging.getLogger("sip_bridge.web.web_server")

COOKIE = "sb_login"
# what anyone may fetch: the login form and what pages are made of (no callers' data)
_PUBLIC = frozenset({"/", "/login", "/logout"})
_PAGES = ("/console", "/talk")  # where a login may send the browser back to
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PageMaker = Callable[[str, dict[str, str]], web.Response]


def bearer(request: web.Request) -> str:
    auth = request.headers.get("Authorization", "")
    return auth[7:].strip() if auth[:7].lower() == "bearer " else ""


def same_origin(request: web.Request) -> bool:
    """A browser names the page's origin on every POST/DELETE; it must be ours."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True  # not a browser (curl, a test): the tokens still apply
    return urlsplit(origin).netloc == request.host


def error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


@dataclass(frozen=True)
class Who:
    """Who a request comes from: a token (by header or a browser's login), or nobody."""

    token: HttpToken | None = None
    login: Login | None = None

    @property
    def name(self) -> str:
        return self.token.name if self.token is not None else ""


WHO = web.RequestKey("who", Who)  # set on every guarded request


class Access:
    """Guards one app for ``http()`` (the bridge's current [http]: a reload may change the
    tokens); ``page(name, values)`` renders a static page."""

    def __init__(self, http: Callable[[], HttpConfig], page: PageMaker) -> None:
        self._http = http
        self._page = page
        self.logins = Logins()
        self.guesses = GuessLimit()

    def install(self, app: web.Application) -> None:
        app.middlewares.append(self._guard)
        app.router.add_get("/login", self._login_page)
        app.router.add_post("/login", self._login)
        app.router.add_post("/logout", self._logout)

    # -- reading ------------------------------------------------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every request but the public ones says who it is from, or is refused."""
        if request.path in _PUBLIC or request.path.startswith("/static/"):
            return await handler(request)
        who = self._reader(request)
        if isinstance(who, web.StreamResponse):
            return who
        request[WHO] = who
        return await handler(request)

    def _reader(self, request: web.Request) -> Who | web.StreamResponse:
        http = self._http()
        login = self.logins.get(request.cookies.get(COOKIE, ""), http.tokens)
        if login is not None:
            return Who(login.token, login)
        api = request.path.startswith("/api/")
        secret = bearer(request) if api else ""  # /talk's Authorization is its page token
        if secret:
            token = self._check(request, secret)
            return token if isinstance(token, web.StreamResponse) else Who(token)
        if not http.reads_need_token:
            return Who()
        if api or request.method != "GET" or request.path not in _PAGES:
            return error(401, "reading needs a viewer or operator token: sign in on /login, "
                         "or send Authorization: Bearer TOKEN",
                         **{"WWW-Authenticate": 'Bearer realm="sip-bridge"'})  # fmt: skip
        raise web.HTTPSeeOther(f"/login?next={request.path}")

    def _check(self, request: web.Request, secret: str) -> HttpToken | web.StreamResponse:
        """A token given by header, counted against its source's wrong guesses."""
        source = request.remote or "?"
        wait = self.guesses.retry_after(source)
        if wait:
            return error(429, "too many wrong tokens: try again later",
                         **{"Retry-After": str(int(wait) + 1)})  # fmt: skip
        token = find_token(self._http().tokens, secret)
        if token is None:
            self._wrong(source)
            return error(401, "wrong token", **{"WWW-Authenticate": 'Bearer realm="sip-bridge"'})
        return token

    def _wrong(self, source: str) -> None:
        if self.guesses.failed(source):
            log.warning("console: %s sent %d wrong tokens: refused for %.0f s", source,
                        self.guesses.max_failures, self.guesses.lockout_s)  # fmt: skip
        else:
            log.warning("console: wrong token from %s", source)

    # -- acting -------------------------------------------------------------------------------

    def operator(self, request: web.Request) -> HttpToken | web.Response:
        """The operator token an action is made with; else the refusal."""
        if not same_origin(request):
            return error(403, "cross-origin request refused")
        if not any(t.role == "operator" for t in self._http().tokens):
            return error(403, "the console is read-only: set [http] operator_token_env")
        who = _who(request)
        if who.token is None:
            return error(401, "wrong or missing operator token: sign in as an operator on "
                         "/login, or send Authorization: Bearer TOKEN")  # fmt: skip
        if who.token.role != "operator":
            name = who.token.name
            return error(403, f"token {name!r} is a viewer token: it reads, it cannot act")
        csrf = request.headers.get("X-CSRF-Token", "")
        if who.login is not None and csrf != who.login.csrf:
            return error(403, "no valid CSRF token with this action: reload the page")
        return who.token

    # -- browsers signing in and out -------------------------------------------------------

    def _form(self, note: str, next_page: str, status: int = 200) -> web.Response:
        resp = self._page("login.html", {"note": note, "next": next_page})
        resp.set_status(status)
        return resp

    async def _login_page(self, request: web.Request) -> web.Response:
        if not self._http().tokens:
            return self._form("No console tokens are configured: reading is open here, "
                              "acting is not possible.", "/console")  # fmt: skip
        return self._form("", _next(request.query.get("next")))

    async def _login(self, request: web.Request) -> web.Response:
        if not same_origin(request):
            return error(403, "cross-origin request refused")
        form = await request.post()
        next_page = _next(str(form.get("next", "")))
        source = request.remote or "?"
        wait = self.guesses.retry_after(source)
        if wait:
            return self._form(f"Too many wrong tokens: try again in {int(wait) + 1} s.",
                              next_page, 429)  # fmt: skip
        token = find_token(self._http().tokens, str(form.get("token", "")).strip())
        if token is None:
            self._wrong(source)
            return self._form("Wrong token.", next_page, 401)
        login = self.logins.open(token)
        log.info("console: %s (%s) signed in from %s", token.name, token.role, source)
        resp = web.HTTPSeeOther(next_page)
        resp.set_cookie(COOKIE, login.id, max_age=int(self.logins.ttl_s), path="/",
                        httponly=True, samesite="Strict", secure=request.secure)  # fmt: skip
        raise resp

    async def _logout(self, request: web.Request) -> web.Response:
        if not same_origin(request):
            return error(403, "cross-origin request refused")
        login = self.logins.get(request.cookies.get(COOKIE, ""), self._http().tokens)
        form = await request.post()
        csrf = request.headers.get("X-CSRF-Token") or str(form.get("csrf", ""))
        if login is not None and csrf == login.csrf:
            self.logins.close(login.id)
            log.info("console: %s signed out", login.token.name)
        resp = web.HTTPSeeOther("/login")
        resp.del_cookie(COOKIE, path="/")
        raise resp

    def page_values(self, request: web.Request) -> dict[str, Any]:
        """What a page shows of its reader: name, role, CSRF token, whether it may act."""
        who = _who(request)
        token = who.token
        return {
            "signed_in": f"{token.name} ({token.role})" if token is not None else "",
            "csrf": who.login.csrf if who.login is not None else "",
            "may_act": token is not None and token.role == "operator",
            "tokens": bool(self._http().tokens),
        }


def _who(request: web.Request) -> Who:
    return request[WHO] if WHO in request else Who()


def _next(page: str | None) -> str:
    """Where a login sends the browser: one of our pages, never another site."""
    return page if page in _PAGES else "/console"

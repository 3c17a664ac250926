"""Who may read the operator console and who may act on calls (no I/O).

Tokens come from ``[http]``: a viewer token reads (live calls, history, transcripts,
recordings, a browser session's events), an operator token reads and acts (hang up,
transfer, say). Reading needs one whenever the listener is not loopback-only (unless
``allow_anonymous_reads`` says otherwise); acting always needs an operator token.

A script or a monitoring tool sends ``Authorization: Bearer TOKEN`` to ``/api/...``. A
browser signs in once on ``/login`` (the token is POSTed in a form, never put in a URL
that would end up in a proxy's log or the browser's history) and gets a :class:`Login`:
a random id in a cookie that is ``HttpOnly`` (page script cannot read it, so an injected
script cannot steal it) and ``SameSite=Strict`` (another site's page cannot send it). An
action made with the cookie must also carry the login's CSRF token in a header, which
only our own page knows (belt and braces over SameSite, for browsers that lack it).

Wrong tokens are limited per source address (:class:`GuessLimit`): after a few, that
source is refused for a while, the right token included, so guessing gets nowhere.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sip_bridge.config.config_types import HttpToken

__all__ = ["LOGIN_TTL_S", "GuessLimit", "Login", "Logins", "find_token"]

LOGIN_TTL_S = 8 * 3600.0  # a browser login lasts a working day


def find_token(tokens: Sequence[HttpToken], secret: str) -> HttpToken | None:
    """The token whose secret this is (every token compared, in constant time each)."""
    found = None
    given = secret.encode()
    for t in tokens:
        if hmac.compare_digest(given, t.secret.encode()) and found is None:
            found = t
    return found if secret else None


@dataclass(frozen=True)
class Login:
    """A browser signed in with ``token``: its cookie value, and the CSRF token its
    pages send with actions."""

    id: str
    token: HttpToken
    csrf: str
    expires: float


class Logins:
    """The browsers signed in; at most ``limit`` (the oldest go first)."""

    def __init__(self, ttl_s: float = LOGIN_TTL_S, clock: Callable[[], float] = time.monotonic,
                 limit: int = 1000) -> None:  # fmt: skip
        self.ttl_s = ttl_s
        self._clock = clock
        self._limit = limit
        self._logins: dict[str, Login] = {}

    def open(self, token: HttpToken) -> Login:
        now = self._clock()
        for old in [k for k, v in self._logins.items() if v.expires <= now]:
            del self._logins[old]
        while len(self._logins) >= self._limit:
            del self._logins[next(iter(self._logins))]
        login = Login(secrets.token_urlsafe(32), token, secrets.token_urlsafe(24), now + self.ttl_s)
        self._logins[login.id] = login
        return login

    def get(self, login_id: str, tokens: Sequence[HttpToken]) -> Login | None:
        """The login with this id, unless it expired or its token is no longer configured
        (a reload took it away: the login goes with it)."""
        login = self._logins.get(login_id) if login_id else None
        if login is None:
            return None
        if login.expires <= self._clock() or login.token not in tokens:
            del self._logins[login_id]
            return None
        return login

    def close(self, login_id: str) -> None:
        self._logins.pop(login_id, None)


class GuessLimit:
    """Wrong tokens per source: ``max_failures`` within ``window_s`` and the source is
    refused for ``lockout_s`` (whatever it sends). At most ``limit`` sources are tracked."""

    def __init__(
        self,
        max_failures: int = 5,
        window_s: float = 60.0,
        lockout_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        limit: int = 10_000,
    ) -> None:
        self.max_failures, self.window_s, self.lockout_s = max_failures, window_s, lockout_s
        self._clock = clock
        self._limit = limit
        self._fails: dict[str, deque[float]] = {}
        self._blocked: dict[str, float] = {}  # source -> until
        self.refused = 0  # requests refused while blocked

    def retry_after(self, source: str) -> float:
        """Seconds until ``source`` may try again (0: it may now)."""
        until = self._blocked.get(source)
        if until is None:
            return 0.0
        left = until - self._clock()
        if left <= 0:
            del self._blocked[source]
            return 0.0
        self.refused += 1
        return left

    def failed(self, source: str) -> bool:
        """A wrong token from ``source``; True when that blocks it."""
        now = self._clock()
        fails = self._fails.pop(source, None) or deque()
        fails.append(now)
        while fails and fails[0] <= now - self.window_s:
            fails.popleft()
        if len(fails) >= self.max_failures:
            self._blocked[source] = now + self.lockout_s
            return True
        self._fails[source] = fails  # re-inserted: the dict's order is the last failure's
        while len(self._fails) > self._limit:
            del self._fails[next(iter(self._fails))]
        while len(self._blocked) > self._limit:
            del self._blocked[next(iter(self._blocked))]
        return False

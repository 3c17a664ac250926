"""Routes: which agent (and agent profile) answers a call, from what the call says.

A ``[[routes]]`` entry matches on the called number (a DID or an extension: the user part
of the Request-URI), the caller (the user part of From), the trunk the call came through
and a SIP header; every condition given must hold. The first matching route wins, in file
order; a call no route matches gets ``[agent]``. Numbers and header values match as
shell-style patterns (``+4420555*``, ``7[0-4]??``), case-sensitive, so one route can take a
whole DID block.

Validation follows config.py's rule: a mistake names the file, the line, the key
(``routes[2].profile``) and what is allowed.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sip_bridge.config.config_error import ConfigError, is_file
from sip_bridge.config.trunks import TrunkConfig, entry_key_line
from sip_bridge.sip.fields import SipParseError, SipUri

__all__ = ["ROUTE_KEYS", "RouteConfig", "match_route", "parse_routes", "user_part"]

# key -> expected python type(s)
ROUTE_KEYS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "called": (str,),
    "caller": (str,),
    "trunk": (str,),
    "header": (str,),
    "header_value": (str,),
    "agent": (str,),
    "profile": (str,),
}


@dataclass(frozen=True)
class RouteConfig:
    name: str
    called: str = ""  # pattern on the called number (Request-URI user part); "" = any
    caller: str = ""  # pattern on the caller (From user part); "" = any
    trunk: str = ""  # the call came through this [[trunks]] entry; "" = any (or none)
    header: str = ""  # a SIP header the INVITE must carry ...
    header_value: str = ""  # ... with a value matching this pattern ("" = any value)
    agent: str = ""  # the agent that answers; "" = [agent] name
    profile: str = ""  # the voice agent's profile (absolute once loaded); "" = [agent.voice]

    def matches(
        self, called: str, caller: str, trunk: str | None, headers: Mapping[str, str]
    ) -> bool:
        """Every condition this route sets holds for the call (``headers``: lower-case
        names)."""
        if self.called and not fnmatch.fnmatchcase(called, self.called):
            return False
        if self.caller and not fnmatch.fnmatchcase(caller, self.caller):
            return False
        if self.trunk and self.trunk != trunk:
            return False
        if self.header:
            value = headers.get(self.header.lower())
            if value is None:
                return False
            if self.header_value and not fnmatch.fnmatchcase(value.strip(), self.header_value):
                return False
        return True


def user_part(uri: str) -> str:
    """``sip:+4420555@host;user=phone`` -> ``+4420555``; a bare number stays itself."""
    try:
        return SipUri.parse(uri.strip().strip("<>")).user or ""
    except (SipParseError, ValueError):
        return uri.strip()


def match_route(
    routes: tuple[RouteConfig, ...],
    request_uri: str,
    from_uri: str,
    trunk: str | None,
    headers: Mapping[str, str],
) -> RouteConfig | None:
    """The first route the call matches, or None (the default agent answers)."""
    called, caller = user_part(request_uri), user_part(from_uri)
    for route in routes:
        if route.matches(called, caller, trunk, headers):
            return route
    return None


def parse_routes(
    value: Any,
    text: str,
    path: str,
    agents: tuple[str, ...],
    trunks: tuple[TrunkConfig, ...],
) -> tuple[RouteConfig, ...]:
    """Validate the ``routes`` array of tables; ConfigError says where a mistake is."""

    def fail(index: int, key: str | None, message: str) -> ConfigError:
        dotted = f"routes[{index + 1}]" + (f".{key}" if key else "")
        return ConfigError(path, entry_key_line(text, "routes", index, key), dotted, message)

    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ConfigError(path, None, "routes", "must be [[routes]] tables")
    trunk_names = {t.name for t in trunks}
    routes: list[RouteConfig] = []
    names: set[str] = set()
    catch_all: int | None = None
    for i, entry in enumerate(value):
        for key, v in entry.items():
            if key not in ROUTE_KEYS:
                raise fail(i, key, f"unknown key; allowed: {', '.join(sorted(ROUTE_KEYS))}")
            if not isinstance(v, ROUTE_KEYS[key]):
                raise fail(i, key, f"expected a string, got {v!r}")
        name = entry.get("name", "")
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            why = "every route needs a name" if not name else "use letters, digits, '_', '.', '-'"
            raise fail(i, "name" if "name" in entry else None, why)
        if name in names:
            raise fail(i, "name", f"duplicate route name {name!r}")
        names.add(name)
        if catch_all is not None:
            raise fail(i, None, f"unreachable: routes[{catch_all + 1}] matches every call")
        route = RouteConfig(**entry)
        if route.agent and route.agent not in agents:
            raise fail(i, "agent", f"{route.agent!r} is not one of {', '.join(agents)}")
        if route.trunk and route.trunk not in trunk_names:
            known = ", ".join(sorted(trunk_names)) or "none are configured"
            raise fail(i, "trunk", f"no [[trunks]] entry named {route.trunk!r} ({known})")
        if route.header_value and not route.header:
            raise fail(i, "header_value", "needs header (the header's name)")
        if route.header and not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", route.header):
            raise fail(i, "header", "not a SIP header name")
        if route.profile:
            f = Path(route.profile)
            f = f if f.is_absolute() else Path(path).resolve().parent / f  # relative to file
            if not is_file(f):
                raise fail(i, "profile", f"no such file: {f}")
            route = RouteConfig(**{**route.__dict__, "profile": str(f)})
        if not (route.called or route.caller or route.trunk or route.header):
            catch_all = i
        routes.append(route)
    return tuple(routes)

"""Who may read callers' data and act on calls through the web server.

A bridge listening on 0.0.0.0 (reached here through 127.0.0.1 only) answers nothing of
callers without a viewer or operator token: not the console's data, the JSON API, the
recordings, nor a session's server-sent events. A browser signs in with a form and gets an
HttpOnly, SameSite=Strict cookie; actions need an operator token (and, with the cookie, the
page's CSRF token) and land on the call's timeline with the token's name, as MQTT commands
do with theirs. Wrong tokens are limited per source. Without any token such a bridge does
not start, and says which key to set; `allow_anonymous_reads` is the explicit way out.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import aiomqtt
import pytest

from sip_bridge.config.loader import ConfigError, parse_config_text
from sip_bridge.ops.records import CallRecords
from sip_bridge.script.caller import CallOptions, place_call
from sip_bridge.server import BridgeServer
from testkit.mosquitto_runner import Mosquitto
from testkit.sipp_media import random_port_range, tone, write_wav

VIEWER = "viewer-token-0123456789abcdef"
OPERATOR = "operator-token-0123456789abcdef"
ROOT = Path(__file__).resolve().parents[1]


def _config_text(tmp: Path, rtp: tuple[int, int], http: str, mqtt_port: int = 0) -> str:
    mqtt = f"[mqtt]\nenabled = true\nport = {mqtt_port}\nspool_dir = 'spool'\n" if mqtt_port else ""
    return (
        f'[sip]\nlisten = "127.0.0.1:0"\n[rtp]\nports = "{rtp[0]}-{rtp[1]}"\n'
        '[agent]\nname = "echo"\n[node]\nname = "n-access"\n'
        f'[records]\nenabled = true\ndb = "calls.sqlite"\nrecordings_dir = "rec"\n{mqtt}'
        f"[http]\n{http}\n"
    )


def _write(tmp: Path, text: str) -> Path:
    f = tmp / "bridge.toml"
    f.write_text(text)
    (tmp / "ops.tokens").write_text(f"# the desk's people\ndesk-1 {OPERATOR}\n")
    return f


@pytest.fixture
def tokens_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SB_VIEWER", VIEWER)


def _headers(token: str = "") -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


async def _status(http: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> int:
    async with http.request(method, url, allow_redirects=False, **kw) as r:
        await r.read()
        return r.status


def test_reads_need_a_token_and_actions_an_operators_on_a_listener_others_can_reach(
    tmp_path: Path, tokens_env: None
) -> None:
    http_cfg = ('listen = "0.0.0.0:0"\nviewer_token_env = "SB_VIEWER"\n'
                'operator_token_file = "ops.tokens"')  # fmt: skip
    rtp = random_port_range(40, 30000, 39000)
    play = write_wav(tmp_path / "a.wav", tone((440,), 1.0, 0.2))

    async def main(broker: Mosquitto) -> tuple[str, str]:
        text = _config_text(tmp_path, (rtp[0], rtp[0] + 19), http_cfg, broker.port)
        config = parse_config_text(text, str(_write(tmp_path, text)))
        server = BridgeServer(config)
        await server.start()
        assert server.web is not None and server.web.host == "0.0.0.0"
        base = f"http://127.0.0.1:{server.web.port}"  # reached through loopback only
        try:
            async with aiohttp.ClientSession() as http:
                for path in ("/api/calls", "/api/history", "/api/calls/x", "/api/calls/x/recording",
                             "/talk/sessions/abc/events"):  # fmt: skip
                    assert await _status(http, "GET", base + path) == 401, path
                wrong = _headers("not-a-token-of-ours")  # one wrong guess (the limit: 5)
                assert await _status(http, "GET", base + "/api/calls", headers=wrong) == 401
                async with http.get(base + "/console", allow_redirects=False) as r:
                    assert r.status == 303 and r.headers["Location"] == "/login?next=/console"
                assert await _status(http, "GET", base + "/talk") == 303
                assert await _status(http, "GET", base + "/static/console.js") == 200
                async with http.get(base + "/api/calls", headers=_headers(VIEWER)) as r:
                    assert r.status == 200 and (await r.json())["calls"] == []

                # a call in progress: the viewer sees it, cannot act; the operator can
                first = asyncio.ensure_future(place_call(CallOptions(
                    f"sip:7000@127.0.0.1:{server.port}", play, tmp_path / "heard1.wav",
                    duration_s=15.0, rtp_ports=(rtp[0] + 20, rtp[0] + 29),
                )))  # fmt: skip
                call_id = await _live_call(http, base)
                hang = f"{base}/api/calls/{call_id}/hangup"
                async with http.post(hang, headers=_headers(VIEWER)) as r:
                    assert r.status == 403 and "viewer token" in (await r.json())["error"]
                assert await _status(http, "POST", hang) == 401
                say, body = f"{base}/api/calls/{call_id}/say", {"text": "One moment."}
                async with http.post(say, json=body, headers=_headers(OPERATOR)) as r:
                    assert r.status == 404 and "does not take say" in (await r.json())["error"]
                assert await _status(http, "POST", hang, headers=_headers(OPERATOR)) == 200
                assert (await first).recorded_s < 10

                # a second call, hung up by an operator over MQTT, who names themselves
                second = asyncio.ensure_future(place_call(CallOptions(
                    f"sip:7000@127.0.0.1:{server.port}", play, tmp_path / "heard2.wav",
                    duration_s=15.0, rtp_ports=(rtp[0] + 30, rtp[0] + 39),
                )))  # fmt: skip
                other = await _live_call(http, base, not_this=call_id)
                async with aiomqtt.Client("127.0.0.1", broker.port, identifier="ops") as ops:
                    cmd = json.dumps({"cmd": "hangup", "by": "night-shift"})
                    await ops.publish(f"sipbridge/n-access/cmd/{other}", cmd, qos=1)
                assert (await second).recorded_s < 10

                # the recording is read with a token only
                rec = f"{base}/api/calls/{call_id}/recording"
                assert await _status(http, "GET", rec) == 401
                async with http.get(rec, headers=_headers(VIEWER)) as r:
                    assert r.status == 200 and r.headers["Content-Type"] == "audio/wav"
                    assert (await r.read())[:4] == b"RIFF"
        finally:
            await server.stop()
        return call_id, other

    with Mosquitto(tmp_path / "broker") as broker:
        first_id, second_id = asyncio.run(main(broker))
    store = CallRecords(tmp_path / "calls.sqlite", readonly=True)
    acts = {}
    for cid in (first_id, second_id):
        shown = store.show(cid)
        assert shown is not None
        acts[cid] = [e["data"] for e in shown["events"] if e["kind"] == "operator"]
    assert acts[first_id] == [{"action": "hangup", "by": "desk-1", "via": "http"}]
    assert acts[second_id] == [{"action": "hangup", "by": "night-shift", "via": "mqtt"}]


async def _live_call(http: aiohttp.ClientSession, base: str, not_this: str = "") -> str:
    for _ in range(200):
        async with http.get(base + "/api/calls", headers=_headers(VIEWER)) as r:
            calls = [c for c in (await r.json())["calls"] if c["call_id"] != not_this]
        if calls and calls[0]["state"] == "answered":
            return str(calls[0]["call_id"])
        await asyncio.sleep(0.05)
    raise AssertionError("no call showed up live")


def test_a_browser_signs_in_with_a_form_and_acts_with_its_csrf_token(
    tmp_path: Path, tokens_env: None
) -> None:
    http_cfg = ('listen = "0.0.0.0:0"\nviewer_token_env = "SB_VIEWER"\n'
                'operator_token_file = "ops.tokens"')  # fmt: skip
    rtp = random_port_range(20, 30000, 39000)

    async def main() -> None:
        text = _config_text(tmp_path, rtp, http_cfg)
        server = BridgeServer(parse_config_text(text, str(_write(tmp_path, text))))
        await server.start()
        assert server.web is not None
        base = f"http://127.0.0.1:{server.web.port}"
        try:
            async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
                async with http.get(base + "/login?next=/console") as r:
                    page = await r.text()
                    assert r.status == 200 and 'method="post"' in page and VIEWER not in page
                login = base + "/login"
                form = {"token": "wrong-token-0123456789", "next": "/console"}
                async with http.post(login, data=form, allow_redirects=False) as r:
                    assert r.status == 401 and "Wrong token." in await r.text()
                evil = {"Origin": "http://evil.example"}
                form = {"token": VIEWER, "next": "/console"}
                assert await _status(http, "POST", login, data=form, headers=evil) == 403
                form = {"token": VIEWER, "next": "https://evil.example/"}  # no open redirect
                async with http.post(login, data=form, allow_redirects=False) as r:
                    assert r.status == 303 and r.headers["Location"] == "/console"
                    cookie = r.headers["Set-Cookie"]
                assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
                assert VIEWER not in cookie  # a random login id, not the token
                async with http.get(base + "/console") as r:
                    page = await r.text()
                    assert r.status == 200 and "SB_VIEWER (viewer)" in page
                    assert 'name="actions-enabled" content="false"' in page
                assert await _status(http, "GET", base + "/api/calls") == 200
                assert await _status(http, "POST", base + "/api/calls/x/hangup") == 403
                # sign out: the login is gone
                csrf = _csrf(page)
                assert await _status(http, "POST", base + "/logout", data={"csrf": csrf}) == 303
                assert await _status(http, "GET", base + "/api/calls") == 401

                form = {"token": OPERATOR, "next": "/console"}
                async with http.post(login, data=form) as r:
                    page = await r.text()
                    assert "desk-1 (operator)" in page
                    assert 'name="actions-enabled" content="true"' in page
                act = base + "/api/calls/no-such-call/hangup"
                async with http.post(act) as r:  # the cookie alone is not enough to act
                    assert r.status == 403 and "CSRF" in (await r.json())["error"]
                async with http.post(act, headers={"X-CSRF-Token": _csrf(page)}) as r:
                    assert r.status == 404  # allowed: there is just no such call
        finally:
            await server.stop()

    asyncio.run(main())


def _csrf(page: str) -> str:
    m = re.search(r'name="csrf-token" content="([^"]+)"', page)
    assert m is not None, page[:400]
    return m.group(1)


def test_wrong_tokens_are_limited_per_source(tmp_path: Path, tokens_env: None) -> None:
    rtp = random_port_range(20, 30000, 39000)

    async def main() -> None:
        text = _config_text(tmp_path, rtp, 'listen = "0.0.0.0:0"\nviewer_token_env = "SB_VIEWER"')
        server = BridgeServer(parse_config_text(text, str(_write(tmp_path, text))))
        await server.start()
        assert server.web is not None
        url = f"http://127.0.0.1:{server.web.port}/api/history"
        try:
            async with aiohttp.ClientSession() as http:
                for i in range(5):
                    assert (
                        await _status(http, "GET", url, headers=_headers(f"guess-{i:016d}")) == 401
                    )
                async with http.get(url, headers=_headers(VIEWER)) as r:
                    # blocked now, the right token too: guessing gets nowhere
                    assert r.status == 429 and int(r.headers["Retry-After"]) >= 59
                form = {"token": VIEWER}
                login = f"http://127.0.0.1:{server.web.port}/login"
                assert await _status(http, "POST", login, data=form) == 429
        finally:
            await server.stop()

    asyncio.run(main())


def test_no_token_on_such_a_listener_refuses_to_start_naming_the_key(tmp_path: Path) -> None:
    rtp = random_port_range(20, 30000, 39000)
    text = _config_text(tmp_path, rtp, 'listen = "0.0.0.0:8088"')
    with pytest.raises(ConfigError) as err:
        parse_config_text(text, str(_write(tmp_path, text)))
    assert err.value.key == "http.viewer_token_env" and "allow_anonymous_reads" in str(err.value)
    # the command line too, whatever the file says
    f = _write(tmp_path, _config_text(tmp_path, rtp, 'listen = "127.0.0.1:0"'))
    run = subprocess.run(
        [sys.executable, "-m", "sip_bridge.cli", "run", "--config", str(f), "--http", "0.0.0.0:0"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 2 and "http.viewer_token_env" in run.stderr, run.stderr


def test_allow_anonymous_reads_is_the_explicit_way_out_and_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rtp = random_port_range(20, 30000, 39000)
    text = _config_text(tmp_path, rtp, 'listen = "0.0.0.0:0"\nallow_anonymous_reads = true')

    async def main() -> int:
        server = BridgeServer(parse_config_text(text, str(_write(tmp_path, text))))
        await server.start()
        assert server.web is not None
        try:
            async with aiohttp.ClientSession() as http:
                return await _status(http, "GET", f"http://127.0.0.1:{server.web.port}/api/calls")
        finally:
            await server.stop()

    with caplog.at_level(logging.WARNING, logger="sip_bridge.web.web_server"):
        assert asyncio.run(main()) == 200
    assert any("allow_anonymous_reads = true" in r.getMessage() for r in caplog.records)

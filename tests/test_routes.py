"""[[routes]]: which agent answers which call, checked in the file and on real calls."""

from __future__ import annotations

import asyncio
import wave
from pathlib import Path

import numpy as np
import pytest

from sip_bridge.cli import main as cli_main
from sip_bridge.config.loader import ConfigError, load_config
from sip_bridge.config.routes import RouteConfig, match_route, user_part
from sip_bridge.script.caller import CallOptions, place_call
from sip_bridge.server import BridgeServer
from testkit.sipp_media import tone, write_wav

DEMO = Path(__file__).resolve().parents[1] / "config" / "agents" / "demo.toml"


def _write(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "bridge.toml"
    f.write_text(text)
    return f


ROUTES = """\
[agent]
name = "echo"

[[trunks]]
name = "carrier"
acl = ["127.0.0.0/8"]

[[routes]]
name = "tone-line"
called = "7001"
agent = "tone"

[[routes]]
name = "support-block"
called = "+4420555*"
trunk = "carrier"
profile = "{demo}"

[[routes]]
name = "vip"
caller = "+1212*"
header = "X-Queue"
header_value = "gold*"
agent = "echo"
"""


def test_first_matching_route_wins_and_no_match_is_the_default(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, ROUTES.format(demo=DEMO)))
    routes = cfg.routes
    assert [r.name for r in routes] == ["tone-line", "support-block", "vip"]

    def pick(ruri: str, frm: str = "sip:alice@x", trunk: str | None = None, **h: str) -> str:
        headers = {k.replace("_", "-").lower(): v for k, v in h.items()}
        r = match_route(routes, ruri, frm, trunk, headers)
        return r.name if r is not None else "default"

    assert pick("sip:7001@bridge") == "tone-line"
    assert pick("sip:70011@bridge") == "default"  # a pattern is the whole number
    assert pick("sip:+442055501@bridge;user=phone", trunk="carrier") == "support-block"
    assert pick("sip:+442055501@bridge", trunk=None) == "default"  # not via the trunk
    assert pick("sip:x@b", "sip:+12125550100@c", X_Queue="gold-tier") == "vip"
    assert pick("sip:x@b", "sip:+12125550100@c", X_Queue="silver") == "default"
    assert pick("sip:x@b", "sip:+12125550100@c") == "default"  # the header is required
    # what each route makes of the call's config
    assert cfg.for_route(routes[0]).agent.name == "tone"
    support = cfg.for_route(routes[1]).agent
    assert support.name == "voice" and support.voice_profile == str(DEMO)  # profile => voice
    assert cfg.for_route(None) is cfg
    names = [(c.agent.name, Path(c.agent.voice_profile).name) for c in cfg.agent_configs()]
    assert ("voice", "demo.toml") in names and ("tone", "demo.toml") in names


def test_user_part() -> None:
    assert user_part("sip:+4420555@host;user=phone") == "+4420555"
    assert user_part("<sips:7001@pbx.example:5061>") == "7001"
    assert user_part("7001") == "7001"


@pytest.mark.parametrize(
    ("extra", "key", "words"),
    [
        ('[[routes]]\nname = "a"\ncalled = "1"\ncolour = 1\n', "routes[1].colour", "unknown"),
        ('[[routes]]\nname = "a"\ncalled = "1"\nagent = "ai"\n', "routes[1].agent", "not one of"),
        ('[[routes]]\nname = "a"\ntrunk = "nope"\n', "routes[1].trunk", "no [[trunks]] entry"),
        ('[[routes]]\nname = "a"\nprofile = "missing.toml"\n', "routes[1].profile", "no such file"),
        ('[[routes]]\nname = "a"\nheader_value = "x"\n', "routes[1].header_value", "needs header"),
        ('[[routes]]\ncalled = "1"\n', "routes[1]", "needs a name"),
        (
            '[[routes]]\nname = "all"\nagent = "echo"\n\n[[routes]]\nname = "b"\ncalled = "1"\n',
            "routes[2]",
            "unreachable",
        ),
        ('[[routes]]\nname = "a"\ncalled = "1"\nagent = "speech_model"\n', "routes[1].agent", ""),
        ('[[routes]]\nname = "a"\ncalled = 7001\n', "routes[1].called", "expected a string"),
    ],
)
def test_route_mistakes_name_file_line_and_key(
    tmp_path: Path, extra: str, key: str, words: str
) -> None:
    text = '[agent]\nname = "echo"\n\n' + extra
    f = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(f)
    msg = str(err.value)
    assert f"{f}:" in msg and key in msg and words in msg
    # the line is the key's own (or the table header's), in the file
    line = int(msg.split(":")[1])
    lines = text.splitlines()
    last = key.rsplit(".", 1)[-1]
    assert lines[line - 1].startswith(last if "." in key else "[[routes]]")


def test_config_check_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path, ROUTES.format(demo=DEMO))
    assert cli_main(["config", "check", str(good)]) == 0
    out = capsys.readouterr().out
    assert "ok" in out and "3 route(s)" in out and "1 trunk(s)" in out
    bad_profile = tmp_path / "broken.toml"
    bad_profile.write_text('greeting = "hi"\nbogus_key = 1\n')
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[[routes]]\nname = "x"\ncalled = "1"\nprofile = "{bad_profile}"\n')
    assert cli_main(["config", "check", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "broken.toml" in err[0]
    assert cli_main(["config", "check", str(tmp_path / "absent.toml")]) == 2


def _dominant_hz(path: Path) -> float:
    with wave.open(str(path), "rb") as w:
        x = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float64)
        rate = w.getframerate()
    x = x[len(x) // 3 :]  # past the echo's delay and the jitter buffer's start
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / rate)[int(np.argmax(spectrum))])


def test_calls_to_two_numbers_reach_the_agents_their_routes_name(tmp_path: Path) -> None:
    f = _write(
        tmp_path,
        '[sip]\nlisten = "127.0.0.1:0"\n[rtp]\nports = "44700-44799"\n'
        '[agent]\nname = "echo"\n[agent.echo]\ndelay_s = 0.1\n'
        "[agent.tone]\nfreq_hz = 1000.0\n"
        '[http]\nlisten = ""\n[records]\nenabled = false\n'
        '[[routes]]\nname = "tone-line"\ncalled = "7001"\nagent = "tone"\n',
    )
    play = write_wav(tmp_path / "440.wav", tone((440.0,), 1.5))
    seen: list[tuple[str | None, str]] = []

    async def main() -> dict[str, float]:
        server = BridgeServer(load_config(f))
        await server.start()
        heard = {}
        try:
            for number in ("7000", "7001"):
                rec = tmp_path / f"{number}.wav"
                opts = CallOptions(
                    f"sip:{number}@127.0.0.1:{server.port}", play, rec,
                    duration_s=1.5, rtp_ports=(44800, 44899),
                )  # fmt: skip
                task = asyncio.ensure_future(place_call(opts))
                for _ in range(100):  # while it is up, status says which route took it
                    await asyncio.sleep(0.05)
                    calls = server.status()["calls"]
                    if calls and calls[0]["state"] == "answered":
                        seen.append((calls[0]["route"], calls[0]["agent"]))
                        break
                result = await asyncio.wait_for(task, 20)
                assert result.answered, result
                heard[number] = _dominant_hz(rec)
        finally:
            await server.stop()
        return heard

    heard = asyncio.run(main())
    assert seen == [(None, "echo"), ("tone-line", "tone")]
    assert abs(heard["7000"] - 440) < 10  # the echo of what we played
    assert abs(heard["7001"] - 1000) < 10  # the tone agent, not our 440 Hz


def test_route_config_is_a_plain_value() -> None:
    r = RouteConfig("a", called="1*")
    assert r.matches("123", "", None, {}) and not r.matches("23", "", None, {})

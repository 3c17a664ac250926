"""One source of defaults: the dataclasses the loader fills a left-out key from, the
generated config/REFERENCE.md and the shipped config/bridge.toml say the same, key by key;
and a profile the file names but no call would use is pointed out, not silently ignored."""

from __future__ import annotations

import dataclasses
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from sip_bridge.cli import main as cli_main
from sip_bridge.config import config_reference as ref
from sip_bridge.config.loader import DEMO_PROFILE, BridgeConfig, load_config, parse_config_text

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "config" / "bridge.toml"
# not keys: where the config came from, what the loader noticed, the token it read
NOT_KEYS = {"path", "warnings", "http.operator_token"}


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted names of the fields where two configs differ."""
    out = []
    for f in dataclasses.fields(a):
        name = f"{prefix}{f.name}"
        x, y = getattr(a, f.name), getattr(b, f.name)
        if name in NOT_KEYS:
            continue
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            out += _differences(x, y, f"{name}.")
        elif x != y:
            out.append(f"{name}: {x!r} != {y!r}")
    return out


def _reference_defaults() -> dict[str, str]:
    """`section.key` -> the default column of config/REFERENCE.md."""
    out, section = {}, ""
    for line in ref.REFERENCE.read_text().splitlines():
        if m := re.fullmatch(r"## `\[+([^\]]+)\]+`", line):
            section = m.group(1)
        elif m := re.fullmatch(r"\| `(\w+)` \| [^|]+ \| (.+?) \| .*", line):
            out[f"{section}.{m.group(1)}"] = m.group(2)
    return out


def _scalars(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in table.items():
        if isinstance(v, dict):
            out |= _scalars(v, f"{prefix}{k}.")
        elif not (isinstance(v, list) and v and isinstance(v[0], dict)):  # not [[trunks]]
            out[f"{prefix}{k}"] = v
    return out


def test_the_shipped_file_the_empty_file_and_the_dataclasses_are_the_same_bridge(
    tmp_path: Path,
) -> None:
    shipped = load_config(SHIPPED)
    assert _differences(shipped, BridgeConfig()) == []
    assert shipped.agent.name == "voice" and shipped.agent.voice_profile == str(DEMO_PROFILE)
    assert shipped.records.enabled and shipped.http.listen == "127.0.0.1:8088"
    assert shipped.warnings == ()
    empty = tmp_path / "bridge.toml"
    empty.write_text("")
    # an empty file: the voice agent on the demo profile, the same as `make run`
    assert _differences(load_config(empty), shipped) == []


def test_every_key_the_shipped_file_sets_is_the_reference_default() -> None:
    documented = _reference_defaults()
    keys = _scalars(tomllib.loads(SHIPPED.read_text()))
    assert len(keys) > 60  # the file really sets (nearly) every key
    paths = {  # relative to the file; the reference names what they resolve to
        "agent.voice.profile": "the demo profile",
        "agent.fallback_prompt": "`prompts/technical_difficulty.wav`",
    }
    for key, value in keys.items():
        cell = documented.get(key, "(not in REFERENCE.md)")
        if key in paths:
            assert cell == paths[key], key
            continue
        said = tomllib.loads(f"v = {cell.strip('`')}")["v"] if cell.startswith("`") else cell
        assert said == value, f"{key}: bridge.toml {value!r}, REFERENCE.md {cell}"


def test_a_profile_no_call_uses_is_a_warning_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "dentist.toml").write_text(DEMO_PROFILE.read_text())
    p = str(tmp_path / "bridge.toml")
    unused = parse_config_text(
        '[agent]\nname = "echo"\n[agent.voice]\nprofile = "dentist.toml"\n', p
    )
    (warning,) = unused.warnings
    assert warning.startswith(f"{p}:2: agent.name = 'echo': agent.voice.profile")
    assert "dentist.toml" in warning and 'agent.name = "voice"' in warning
    # the profile alone: the voice agent answers with it
    alone = parse_config_text('[agent.voice]\nprofile = "dentist.toml"\n', p)
    assert alone.agent.name == "voice" and alone.warnings == ()
    assert alone.agent.voice_profile == str(tmp_path / "dentist.toml")
    # a route that sends calls to the voice agent without a profile of its own uses it
    routed = parse_config_text(
        '[agent]\nname = "echo"\n[agent.voice]\nprofile = "dentist.toml"\n'
        '[[routes]]\nname = "desk"\ncalled = "100"\nagent = "voice"\n',
        p,
    )
    assert routed.warnings == ()
    # --agent names the agent on purpose
    assert unused.with_overrides(agent="tone").warnings == ()


def test_config_check_names_the_profiles_it_loaded_and_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "dentist.toml").write_text(DEMO_PROFILE.read_text())
    f = tmp_path / "bridge.toml"
    f.write_text('[agent.voice]\nprofile = "dentist.toml"\n')
    assert cli_main(["config", "check", str(f)]) == 0
    out = capsys.readouterr().out
    assert "ok: agent voice, 0 trunk(s), 0 route(s), 1 agent profile(s)" in out
    assert f"  profile loaded: {tmp_path / 'dentist.toml'}\n" in out
    assert "warning" not in out
    f.write_text('[agent]\nname = "echo"\n[agent.voice]\nprofile = "dentist.toml"\n')
    assert cli_main(["config", "check", str(f)]) == 0  # allowed: a warning, not an error
    out = capsys.readouterr().out
    assert "0 agent profile(s)" in out and "profile loaded" not in out
    assert f"warning: {f}:2: agent.name = 'echo': agent.voice.profile" in out


def test_run_logs_the_warning_at_start(tmp_path: Path) -> None:
    (tmp_path / "dentist.toml").write_text(DEMO_PROFILE.read_text())
    f = tmp_path / "bridge.toml"
    f.write_text(
        '[sip]\nlisten = "127.0.0.1:0"\n[agent]\nname = "tone"\n[agent.voice]\n'
        'profile = "dentist.toml"\n[http]\nlisten = ""\n[records]\nenabled = false\n'
        '[control]\nsocket = "ctl.sock"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "sip_bridge.cli", "run", "--config", str(f)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert "listening on" in proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert f"{f}:4: agent.name = 'tone': agent.voice.profile" in err, err
    assert "WARNING" in err.split("agent.voice.profile")[0].splitlines()[-1], err


def test_a_reload_logs_the_warning_too(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import asyncio
    import logging

    from sip_bridge.ops.reload import reload_bridge

    (tmp_path / "dentist.toml").write_text(DEMO_PROFILE.read_text())
    text = '[agent]\nname = "echo"\n[agent.voice]\nprofile = "dentist.toml"\n'
    config = parse_config_text(text, str(tmp_path / "bridge.toml"))

    class Bridge:  # takes any config, nothing needs a restart
        async def reload(self, _: BridgeConfig) -> list[str]:
            return []

    with caplog.at_level(logging.WARNING, logger="sip_bridge.ops.reload"):
        assert asyncio.run(reload_bridge(Bridge(), lambda: config))  # type: ignore[arg-type]
    said = [r.getMessage() for r in caplog.records]
    assert any("agent.name = 'echo': agent.voice.profile" in m for m in said), said

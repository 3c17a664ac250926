"""Which bridge.toml a command reads (the lookup order), what `sip-bridge init` writes, and
the shipped bridge.toml explaining every key it takes."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from agent.dialogue.profile_loader import load_profile
from sip_bridge.cli import main as cli_main
from sip_bridge.config import loader as c
from sip_bridge.config.config_files import LOOKUP, find_config, packaged_config, packaged_dir
from sip_bridge.config.init_dir import InitError, plan, write_starting_point
from sip_bridge.config.loader import ConfigError, ControlConfig, load_config
from sip_bridge.config.routes import ROUTE_KEYS
from sip_bridge.config.trunks import TRUNK_KEYS
from sip_bridge.ops.control import format_status

ROOT = Path(__file__).resolve().parents[1]


def test_in_a_checkout_the_packaged_defaults_are_config() -> None:
    assert packaged_dir() == ROOT / "config"
    assert packaged_config() == ROOT / "config" / "bridge.toml"


def test_the_lookup_order(tmp_path: Path) -> None:
    system = tmp_path / "etc" / "bridge.toml"
    cwd = tmp_path / "work"
    local = cwd / "config" / "bridge.toml"
    named = tmp_path / "named.toml"

    def found(explicit: str | None = None, env: dict[str, str] | None = None) -> tuple[str, str]:
        choice = find_config(explicit, env=env or {}, cwd=cwd, system=system)
        return str(choice.path), choice.source

    assert found() == (str(packaged_config()), "the packaged default")
    system.parent.mkdir()
    system.write_text("")
    assert found() == (str(system), str(system))
    local.parent.mkdir(parents=True)
    local.write_text("")
    assert found() == (str(local), "./config/bridge.toml")
    assert found(env={"SIP_BRIDGE_CONFIG": str(named)}) == (str(named), "$SIP_BRIDGE_CONFIG")
    assert found(env={"SIP_BRIDGE_CONFIG": ""}) == (str(local), "./config/bridge.toml")
    assert found("other.toml", {"SIP_BRIDGE_CONFIG": str(named)}) == (
        str(Path("other.toml").absolute()), "--config",
    )  # fmt: skip
    # $SIP_BRIDGE_CONFIG naming a missing file is an error, not a quiet fall-through
    missing = find_config(None, env={"SIP_BRIDGE_CONFIG": str(named)}, cwd=cwd, system=system)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(missing.path)
    line = find_config(None, env={}, cwd=tmp_path, system=system).describe()
    assert line == f"config: {system} ({system}; lookup: {', '.join(LOOKUP)})"


def test_the_status_names_the_config_and_the_socket_follows_systemd(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    counters = {"active": 0, "offered": 0, "established": 0, "ended": 0}
    st = {"counters": counters, "limits": {"max_calls": 9},
          "config": {"path": "/srv/b.toml", "source": "$SIP_BRIDGE_CONFIG"}}  # fmt: skip
    assert format_status(st).splitlines()[1] == "config: /srv/b.toml ($SIP_BRIDGE_CONFIG)"
    st["config"] = {"path": "/etc/sip-bridge/bridge.toml", "source": "/etc/sip-bridge/bridge.toml"}
    assert format_status(st).splitlines()[1] == "config: /etc/sip-bridge/bridge.toml"
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(tmp_path))  # RuntimeDirectory=sip-bridge
    assert ControlConfig().socket_path(5060) == str(tmp_path / "sip-bridge-5060.sock")
    assert ControlConfig(socket="/x.sock").socket_path(5060) == "/x.sock"


def test_init_writes_the_starting_point_and_refuses_to_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "new"
    assert cli_main(["init", str(target)]) == 0
    out = capsys.readouterr().out
    written = sorted(p.relative_to(target) for p in target.rglob("*") if p.is_file())
    assert written == sorted(x.target for x in plan())
    assert (target / "bridge.toml").read_bytes() == (ROOT / "config/bridge.toml").read_bytes()
    assert (target / "agents/blank.toml").read_bytes() == (
        ROOT / "config/templates/blank.toml"
    ).read_bytes()
    assert load_profile(target / "agents" / "blank.toml").greeting  # a profile that loads
    assert f"sip-bridge config check {target / 'bridge.toml'}" in out
    assert f"sip-bridge run --config {target / 'bridge.toml'}" in out
    assert cli_main(["config", "check", str(target / "bridge.toml")]) == 0
    # with the blank profile instead of the demo, it still checks
    conf = target / "bridge.toml"
    conf.write_text(conf.read_text().replace('"agents/demo.toml"', '"agents/blank.toml"'))
    assert cli_main(["config", "check", str(conf)]) == 0
    # one file in the way: nothing is written, and it says which
    other = tmp_path / "other"
    (other / "agents").mkdir(parents=True)
    (other / "agents" / "demo.toml").write_text("mine")
    assert cli_main(["init", str(other)]) == 1
    assert "not overwriting agents/demo.toml" in capsys.readouterr().err
    assert [p.name for p in other.rglob("*")] == ["agents", "demo.toml"]
    assert (other / "agents" / "demo.toml").read_text() == "mine"


def test_init_copies_call_scripts_when_they_ship(tmp_path: Path) -> None:
    src = tmp_path / "defaults"
    for name in ("bridge.toml", "agents/demo.toml", "scripts/demo/hours.toml",
                 "scripts/demo/README.md", "templates/blank.toml"):  # fmt: skip
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(name)
    (src / "scripts" / "demo" / "__pycache__").mkdir()
    (src / "scripts" / "demo" / "__pycache__" / "x.toml").write_text("")
    written = write_starting_point(tmp_path / "out", src)
    assert sorted(str(p.relative_to(tmp_path / "out")) for p in written) == [
        "agents/blank.toml", "agents/demo.toml", "bridge.toml", "scripts/demo/README.md",
        "scripts/demo/hours.toml",
    ]  # fmt: skip
    with pytest.raises(InitError, match="nothing was written"):
        write_starting_point(tmp_path / "out", src)


def test_the_package_data_ships_what_init_copies() -> None:
    """pyproject's package data for the defaults covers every glob init copies from them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert project["package-dir"]["sip_bridge.defaults"] == "config"
    shipped = set(project["package-data"]["sip_bridge.defaults"])
    from sip_bridge.config.init_dir import COPIED, RENAMED

    assert set(COPIED) <= shipped and {"templates/*.toml"} <= shipped, set(COPIED) - shipped
    assert set(RENAMED) == {"templates/blank.toml"}


def _keys_in(text: str) -> dict[tuple[str, str], bool]:
    """(section, key) -> explained? for every key set or shown commented out; a key is
    explained by a comment on its line, or by the comment its paragraph's keys follow."""
    out: dict[tuple[str, str], bool] = {}
    section, explained = "", False
    for raw in text.splitlines():
        line = raw.strip()
        body = line.lstrip("#").strip()
        if not line:
            explained = False
            continue
        header = re.fullmatch(r"\[\[?([a-z_.]+)\]\]?", body)
        if header:
            section, explained = header.group(1), False
            continue
        key = re.match(r"([a-z_0-9]+)\s*=", body)
        if key and (not line.startswith("#") or "=" in body.split("#")[0]):
            inline = "#" in body.split("=", 1)[1]
            out.setdefault((section, key.group(1)), explained or inline)
        elif line.startswith("#"):
            explained = True
    return out


def test_the_shipped_bridge_toml_explains_every_key() -> None:
    found = _keys_in((ROOT / "config" / "bridge.toml").read_text())
    schema = [*c._SCHEMA.items(), ("trunks", TRUNK_KEYS), ("routes", ROUTE_KEYS)]
    missing, unexplained = [], []
    for section, keys in schema:
        for key, types in keys.items():
            if types == (dict,):  # a sub-table: it has its own header
                continue
            if (section, key) not in found:
                missing.append(f"{section}.{key}")
            elif not found[(section, key)]:
                unexplained.append(f"{section}.{key}")
    assert not missing, missing
    assert not unexplained, unexplained


def test_status_also_looks_where_the_systemd_unit_keeps_the_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An operator's shell has no $RUNTIME_DIRECTORY: status tries the temp dir, then
    /run/sip-bridge (the unit's RuntimeDirectory), and names both when nobody answers."""
    import tempfile

    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # not the machine's other bridges
    conf = tmp_path / "bridge.toml"
    conf.write_text('[sip]\nlisten = "127.0.0.1:5999"\n')
    assert cli_main(["status", "--config", str(conf)]) == 1
    err = capsys.readouterr().err
    assert "no bridge answers on" in err and "sip-bridge-5999.sock" in err, err
    assert f"no bridge answers on {tmp_path / 'sip-bridge-5999.sock'}" in err, err
    assert "(nor on /run/sip-bridge/sip-bridge-5999.sock)" in err, err


def test_status_finds_a_bridge_started_on_another_port_or_lists_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The config says port 5999; the bridge runs with --listen on another: `status` finds
    it among the sockets that answer; with two running, it lists them and hints --socket."""
    import asyncio
    import tempfile
    from dataclasses import replace

    from sip_bridge.config.loader import BridgeConfig
    from sip_bridge.server import BridgeServer

    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # not the machine's other bridges
    conf = tmp_path / "bridge.toml"
    conf.write_text('[sip]\nlisten = "127.0.0.1:5999"\n')
    base = BridgeConfig.line_check()
    config = replace(base, sip=replace(base.sip, listen="127.0.0.1:0"))
    (tmp_path / "sip-bridge-6001.sock").touch()  # not a socket: passed over

    async def status_with(n: int) -> tuple[int, str, str, list[int]]:
        servers = [BridgeServer(config, control=True) for _ in range(n)]
        for s in servers:
            await s.start()
        try:
            code = await asyncio.to_thread(cli_main, ["status", "--config", str(conf)])
        finally:
            for s in servers:
                await s.stop()
        out, err = capsys.readouterr()
        return code, out, err, [s.port for s in servers]

    code, out, err, (port,) = asyncio.run(status_with(1))
    sock = tmp_path / f"sip-bridge-{port}.sock"
    assert code == 0, err
    assert "no bridge answers on" in err and "sip-bridge-5999.sock" in err
    assert f"the bridge running here answers on {sock}" in err
    assert f"listening udp+tcp 127.0.0.1:{port}" in out
    code, out, err, ports = asyncio.run(status_with(2))
    assert code == 1 and out == ""
    for p in ports:
        assert f"  {tmp_path / f'sip-bridge-{p}.sock'}  listening udp+tcp 127.0.0.1:{p}" in err
    assert "pick one: sip-bridge status --socket PATH" in err
    code, out, err, _ = asyncio.run(status_with(0))
    assert code == 1 and "give it: sip-bridge status --socket PATH" in err

"""The example configurations in pbx_examples/ hold together.

Asterisk and FreeSWITCH cannot be installed here, so their files are parsed and
cross-checked: every name one section refers to exists, the dialplans reach the bridge
through a peer that exists, and the bridge's address is the same everywhere. Kamailio is
installed (`make setup`), so it checks its own configuration (`kamailio -c`) and loads the
shipped dispatcher list. The TOML snippets in the documents load with the bridge's own
config loader, so a renamed key breaks this test rather than an operator's set-up.
"""

from __future__ import annotations

import asyncio
import re
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sip_bridge.config.loader import BridgeConfig, load_config
from testkit.kamailio_runner import (
    DISPATCHER_LIST,
    EXAMPLES,
    KAMAILIO_CFG,
    ROOT,
    Kamailio,
    check_config,
    defines,
)
from testkit.sipp_runner import free_port

ASTERISK = EXAMPLES / "asterisk"
FREESWITCH = EXAMPLES / "freeswitch"
DID = "+442079460000"


# -- Asterisk ------------------------------------------------------------------------------


@dataclass
class Section:
    name: str
    options: dict[str, list[str]] = field(default_factory=dict)

    def get(self, key: str) -> str:
        values = self.options.get(key, [])
        assert len(values) == 1, f"[{self.name}] {key}: {values}"
        return values[0]

    def items(self, key: str) -> list[str]:
        """A comma-separated option, possibly repeated: every item."""
        return [v.strip() for raw in self.options.get(key, []) for v in raw.split(",")]


def parse_asterisk(path: Path) -> list[Section]:
    """Asterisk's config syntax: [sections] (names may repeat), key = value, key => value,
    ';' comments anywhere on a line."""
    sections: list[Section] = []
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = re.sub(r"(?<!\\);.*", "", raw).strip()
        if not line:
            continue
        header = re.fullmatch(r"\[([^\]]+)\](\(.*\))?", line)
        if header:
            sections.append(Section(header.group(1)))
            continue
        option = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\s*=>?\s*(.*)", line)
        assert option and sections, f"{path.name}:{n}: not a section or an option: {raw!r}"
        sections[-1].options.setdefault(option.group(1), []).append(option.group(2).strip())
    return sections


def pjsip() -> dict[str, dict[str, Section]]:
    """pjsip.conf by type, then by name (one name may have an endpoint, aor and identify)."""
    by_type: dict[str, dict[str, Section]] = {}
    for s in parse_asterisk(ASTERISK / "pjsip.conf"):
        kind = s.get("type")
        assert s.name not in by_type.setdefault(kind, {}), f"two {kind} sections [{s.name}]"
        by_type[kind][s.name] = s
    return by_type


@dataclass
class Step:
    exten: str
    priority: int
    app: str
    args: str


def dialplan() -> dict[str, list[Step]]:
    """extensions.conf: context -> its steps (`same => n` continues the last extension)."""
    contexts: dict[str, list[Step]] = {}
    context, exten, prio = "", "", 0
    for n, raw in enumerate((ASTERISK / "extensions.conf").read_text().splitlines(), 1):
        line = re.sub(r"(?<!\\);.*", "", raw).strip()
        header = re.fullmatch(r"\[([^\]]+)\]", line)
        if header:
            context, exten = header.group(1), ""
            if context != "general":
                contexts[context] = []
            continue
        if not line or context == "general":
            continue
        m = re.fullmatch(r"(exten|same)\s*=>\s*(.*)", line)
        assert m and context, f"extensions.conf:{n}: {raw!r}"
        if m.group(1) == "exten":
            exten, p, app = (x.strip() for x in m.group(2).split(",", 2))
            prio = int(p)
        else:
            assert exten, f"extensions.conf:{n}: same => before any exten"
            p, app = (x.strip() for x in m.group(2).split(",", 1))
            assert p == "n", f"extensions.conf:{n}: {raw!r}"
            prio += 1
        call = re.fullmatch(r"(\w+)\((.*)\)", app)
        assert call, f"extensions.conf:{n}: not an application call: {app!r}"
        contexts[context].append(Step(exten, prio, call.group(1), call.group(2)))
    return contexts


def dial_targets(step: Step) -> list[str]:
    """The PJSIP endpoints a Dial() step calls (`PJSIP/ep` or `PJSIP/number@ep`)."""
    devices = step.args.split(",", 1)[0]
    out = []
    for dev in devices.split("&"):
        tech, _, rest = dev.partition("/")
        assert tech == "PJSIP", f"{step}: only PJSIP channels in these examples"
        out.append(rest.rsplit("@", 1)[-1])
    return out


def sip_hostport(uri: str) -> tuple[str, int]:
    m = re.fullmatch(r"sip:(?:[^@]+@)?([^:;>]+)(?::(\d+))?(?:;.*)?", uri)
    assert m, uri
    return m.group(1), int(m.group(2) or 5060)


def bridge_address() -> tuple[str, int]:
    """Where config/bridge.toml (what `make run` starts) listens."""
    data = tomllib.loads((ROOT / "config" / "bridge.toml").read_text())
    host, port = data["sip"]["listen"].rsplit(":", 1)
    return host, int(port)


def test_pjsip_every_reference_resolves() -> None:
    conf = pjsip()
    contexts = dialplan()
    endpoints = conf["endpoint"]
    assert {"sip-bridge", "carrier", "desk", "bridge-user"} <= set(endpoints)
    for name, ep in endpoints.items():
        for aor in ep.items("aors"):
            assert aor in conf["aor"], f"endpoint {name}: no aor [{aor}]"
        for key in ("auth", "outbound_auth"):
            for auth in ep.items(key):
                assert auth in conf["auth"], f"endpoint {name}: no auth [{auth}]"
        assert ep.get("transport") in conf["transport"]
        assert ep.get("context") in contexts, f"endpoint {name}: no context {ep.get('context')}"
        # G.711 only, RFC 4733 keys, Asterisk in the media path: what the bridge speaks.
        assert ep.items("disallow") == ["all"]
        assert ep.items("allow") == ["ulaw", "alaw"]
        assert ep.get("dtmf_mode") == "rfc4733"
        assert ep.get("direct_media") == "no"
        if not ep.items("auth"):  # no password: matched by source address, and only so
            assert ep.get("identify_by") == "ip", f"endpoint {name} could be claimed by name"
            assert any(i.get("endpoint") == name for i in conf["identify"].values()), name
    for name, ident in conf["identify"].items():
        assert ident.get("endpoint") in endpoints, f"identify {name}"
        assert ident.get("match")
    for name, reg in conf.get("registration", {}).items():
        assert reg.get("outbound_auth") in conf["auth"], f"registration {name}"
        assert reg.get("transport") in conf["transport"], f"registration {name}"
    for name, credentials in conf["auth"].items():
        assert credentials.get("auth_type") == "userpass" and credentials.get("username"), name


def test_pjsip_points_at_the_bridge_and_leaves_its_port_free() -> None:
    conf = pjsip()
    host, port = bridge_address()
    assert sip_hostport(conf["aor"]["sip-bridge"].get("contact")) == (host, port)
    assert conf["aor"]["sip-bridge"].get("qualify_frequency") != "0"  # OPTIONS: bridge says 200
    assert conf["identify"]["sip-bridge"].get("match") == host
    ep = conf["endpoint"]["sip-bridge"]
    assert ep.get("allow_transfer") == "yes"  # the agent's REFER is followed
    for transport in conf["transport"].values():
        bind_host, bind_port = transport.get("bind").rsplit(":", 1)
        # Asterisk shares the bridge's host in the example: it must not take the bridge's port.
        assert int(bind_port) != port or bind_host not in ("0.0.0.0", host)


def test_dialplan_reaches_the_bridge_through_existing_endpoints() -> None:
    endpoints = pjsip()["endpoint"]
    contexts = dialplan()
    for context, steps in contexts.items():
        for step in steps:
            if step.app == "Dial":
                for target in dial_targets(step):
                    assert target in endpoints, f"[{context}] {step.exten}: Dial {target}"
            if step.app == "Goto":
                ctx, exten, prio = (x.strip() for x in step.args.split(","))
                exten = exten.replace("${EXTEN}", step.exten.lstrip("+"))
                assert any(s.exten == exten and s.priority == int(prio) for s in contexts[ctx]), (
                    f"[{context}] {step.exten}: Goto {step.args}"
                )
        by_exten: dict[str, list[int]] = {}
        for step in steps:
            by_exten.setdefault(step.exten, []).append(step.priority)
        for exten, prios in by_exten.items():
            assert prios == list(range(1, len(prios) + 1)), f"[{context}] {exten}: {prios}"

    def dials(context: str, exten: str) -> list[str]:
        return [t for s in contexts[context] if s.exten == exten and s.app == "Dial"
                for t in dial_targets(s)]  # fmt: skip

    assert dials("from-internal", "7000") == ["sip-bridge"]
    assert dials("from-internal", "7001") == ["bridge-user"]
    assert dials("from-carrier", DID) == ["sip-bridge"]
    did_dial = next(s for s in contexts["from-carrier"] if s.exten == DID and s.app == "Dial")
    assert did_dial.args.startswith("PJSIP/${EXTEN}@sip-bridge")  # the DID is the R-URI user
    # The carrier's endpoint lands in from-carrier; the bridge's context never reaches it.
    assert pjsip()["endpoint"]["carrier"].get("context") == "from-carrier"
    assert "carrier" not in {t for s in contexts["from-sip-bridge"] if s.app == "Dial"
                             for t in dial_targets(s)}  # fmt: skip


def test_readme_registration_trunk_matches_asterisk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = pjsip()
    block = next(b for b in toml_blocks(EXAMPLES / "README.md") if 'registrar = "pbx' in b)
    monkeypatch.setenv("ASTERISK_SIP_PASSWORD", conf["auth"]["bridge-user-auth"].get("password"))
    cfg = _load(block, tmp_path)
    (trunk,) = cfg.trunks
    assert trunk.username == conf["auth"]["bridge-user-auth"].get("username") == "bridge-user"
    assert trunk.password == "bridge-secret"
    bind_port = int(conf["transport"]["transport-udp"].get("bind").rsplit(":", 1)[1])
    assert sip_hostport(f"sip:{trunk.registrar}")[1] == bind_port
    assert "bridge-user-auth" in conf["endpoint"]["bridge-user"].items("auth")


# -- FreeSWITCH ----------------------------------------------------------------------------


def _xml(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()  # raises on anything not well-formed
    assert root.tag == "include", f"{path}: FreeSWITCH pre-processor files are <include>"
    return root


def gateway() -> tuple[str, dict[str, str]]:
    root = _xml(FREESWITCH / "sip_profiles" / "external" / "sip-bridge.xml")
    (gw,) = root.findall("gateway")
    params = {p.attrib["name"]: p.attrib["value"] for p in gw.findall("param")}
    return gw.attrib["name"], params


def test_freeswitch_gateway_points_at_the_bridge() -> None:
    name, params = gateway()
    assert name == "sip-bridge"
    host, port = bridge_address()
    assert params["proxy"] == f"{host}:{port}"
    assert params["register"] == "false"
    assert params["username"]  # sofia wants one even without registration
    assert int(params["ping"]) > 0  # OPTIONS, which the bridge answers 200


@pytest.mark.parametrize(
    ("path", "matching", "not_matching", "dialled"),
    [
        ("public", ["+442079460000", "442079460000"], ["442079460001", "7000"], "+442079460000"),
        ("default", ["7000"], ["70000", "7001", "+442079460000"], "7000"),
    ],
)
def test_freeswitch_dialplan_bridges_to_the_gateway(
    path: str, matching: list[str], not_matching: list[str], dialled: str
) -> None:
    gw_name, _ = gateway()
    root = _xml(FREESWITCH / "dialplan" / path / "sip-bridge.xml")
    (ext,) = root.findall("extension")
    (cond,) = ext.findall("condition")
    assert cond.attrib["field"] == "destination_number"
    expression = re.compile(cond.attrib["expression"])  # PCRE; this one is plain enough
    for number in matching:
        assert expression.search(number), number
    for number in not_matching:
        assert not expression.search(number), number
    (bridge,) = [
        a.attrib["data"] for a in cond.findall("action") if a.attrib["application"] == "bridge"
    ]
    m = re.fullmatch(r"\{([^}]*)\}sofia/gateway/([^/]+)/(.+)", bridge)
    assert m, bridge
    variables, target_gw, target = m.groups()
    assert target_gw == gw_name
    assert "absolute_codec_string='PCMU,PCMA'" in variables
    groups = expression.search(matching[0])
    assert groups is not None
    assert re.sub(r"\$(\d)", lambda g: groups.group(int(g.group(1))), target) == dialled


def test_the_examples_use_one_did() -> None:
    text = (FREESWITCH / "dialplan" / "public" / "sip-bridge.xml").read_text()
    assert DID.lstrip("+") in text
    assert any(s.exten == DID for s in dialplan()["from-carrier"])
    assert DID in (EXAMPLES / "README.md").read_text()


# -- Kamailio ------------------------------------------------------------------------------


def _trydefs() -> dict[str, str]:
    out = {}
    for line in KAMAILIO_CFG.read_text().splitlines():
        m = re.fullmatch(r"#!trydef\s+(\w+)\s+(.*)", line.strip())
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def test_kamailio_cfg_passes_kamailios_own_check() -> None:
    done = check_config()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "config file ok" in done.stdout + done.stderr
    assert "udp: 0.0.0.0 [0.0.0.0]:5060" in done.stdout  # the default listen


def test_kamailio_cfg_takes_the_overrides_the_tests_use(tmp_path: Path) -> None:
    # Every define the dispatch test sets is a #!trydef (else -A would be ignored, or clash).
    probe = Kamailio(tmp_path, 5999, [5071])
    assert set(probe.settings) <= set(_trydefs())
    done = check_config(KAMAILIO_CFG, *defines(**probe.settings))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "udp: 127.0.0.1 [127.0.0.1]:5999" in done.stdout


def test_kamailio_check_catches_a_broken_cfg(tmp_path: Path) -> None:
    """The syntax check bites: a misspelt function makes it fail."""
    broken = tmp_path / "kamailio.cfg"
    broken.write_text(KAMAILIO_CFG.read_text().replace("ds_next_dst()", "ds_next_dest()"))
    done = check_config(broken)
    assert done.returncode != 0
    assert "ds_next_dest" in done.stdout + done.stderr


def parse_dispatcher_list(path: Path) -> list[tuple[int, str, int, int, dict[str, str]]]:
    entries = []
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        assert len(fields) == 5, f"{path.name}:{n}: set uri flags priority attrs: {raw!r}"
        setid, uri, flags, priority, attrs = fields
        assert re.fullmatch(r"sip:[0-9A-Za-z.\-]+:\d+", uri), f"{path.name}:{n}: {uri}"
        pairs = dict(a.split("=", 1) for a in attrs.split(";"))
        entries.append((int(setid), uri, int(flags), int(priority), pairs))
    return entries


def test_dispatcher_list_format() -> None:
    entries = parse_dispatcher_list(DISPATCHER_LIST)
    assert len(entries) >= 2  # something to balance
    assert {e[0] for e in entries} == {int(_trydefs()["DS_SET"])}
    assert len({e[1] for e in entries}) == len(entries)
    duids = [e[4]["duid"] for e in entries]
    assert len(set(duids)) == len(duids)
    # The README's two nodes on one host: their ports are the list's.
    readme = (EXAMPLES / "README.md").read_text()
    for _, uri, _, _, _ in entries:
        assert f"--listen {uri.removeprefix('sip:')}" in readme, uri


def test_kamailio_loads_the_shipped_dispatcher_list(tmp_path: Path) -> None:
    entries = parse_dispatcher_list(DISPATCHER_LIST)

    async def main() -> str:
        async with Kamailio(tmp_path, free_port(), [], list_file=DISPATCHER_LIST) as proxy:
            return proxy.rpc("dispatcher.list")

    listing = asyncio.run(asyncio.wait_for(main(), 30))
    assert sorted(re.findall(r"URI: (\S+)", listing)) == sorted(e[1] for e in entries)
    assert sorted(re.findall(r"DUID: (\S+)", listing)) == sorted(e[4]["duid"] for e in entries)


# -- the documents' TOML -------------------------------------------------------------------


def toml_blocks(path: Path) -> list[str]:
    """```toml fenced blocks, de-indented (some sit inside list items)."""
    blocks = re.findall(r"^( *)```toml\n(.*?)^\1```", path.read_text(), re.M | re.S)
    return [re.sub(rf"(?m)^{indent}", "", body) for indent, body in blocks]


def _load(block: str, tmp_path: Path) -> BridgeConfig:
    path = tmp_path / "bridge.toml"
    path.write_text(block)
    return load_config(path)


@pytest.mark.parametrize("doc", ["README.md", "carrier-trunk.md"])
def test_toml_in_the_documents_loads(
    doc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = toml_blocks(EXAMPLES / doc)
    assert blocks
    for block in blocks:
        for env in re.findall(r'password_env = "(\w+)"', block):
            monkeypatch.setenv(env, "secret")
        cfg = _load(block, tmp_path)  # raises ConfigError naming the key on any mistake
        assert cfg.trunks, block


def test_carrier_walkthrough_config() -> None:
    text = (EXAMPLES / "carrier-trunk.md").read_text()
    (block,) = toml_blocks(EXAMPLES / "carrier-trunk.md")
    data = tomllib.loads(block)
    (trunk,) = data["trunks"]
    assert trunk["registrar"] and trunk["username"] and trunk["password_env"] and trunk["acl"]
    assert data["sip"]["external_address"] and data["sip"]["listen"].startswith("0.0.0.0:")
    low, high = data["rtp"]["ports"].split("-")
    # The NAT forward and the firewall open exactly the RTP range the config uses.
    assert text.count(f"{low}-{high}") >= 3
    for cidr in trunk["acl"]:
        assert f"elements = {{ {cidr} }}" in text  # the firewall admits the same addresses

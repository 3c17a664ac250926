"""The bridge's configuration file (TOML): typed, validated, with errors that say where.

An operator edits `config/bridge.toml` by hand, so every mistake is reported
with the file, the line, the key and what is allowed; unknown keys are errors
(a typo must not silently fall back to a default).
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import tempfile
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agent.voice_settings import DEVICES, ModelSettings, VoiceSettings
from sip_bridge.routes import RouteConfig, parse_routes
from sip_bridge.trunks import TrunkConfig, entry_key_line, parse_trunks

#: The shipped demo agent profile (config/agents/demo.toml in a checkout).
DEMO_PROFILE = Path(__file__).resolve().parent.parent / "config" / "agents" / "demo.toml"

__all__ = [
    "AgentConfig",
    "BridgeConfig",
    "ConfigError",
    "ControlConfig",
    "InboundConfig",
    "JitterConfig",
    "MetricsConfig",
    "MqttConfig",
    "NodeConfig",
    "RecordsConfig",
    "RtpConfig",
    "SipConfig",
    "SpeechModelConfig",
    "TimersConfig",
    "TlsConfig",
    "load_config",
    "parse_hostport",
    "parse_port_range",
]


class ConfigError(ValueError):
    """A configuration mistake, located: `file:line: key: message`."""

    def __init__(self, path: str, line: int | None, key: str, message: str) -> None:
        self.path, self.line, self.key = path, line, key
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {key}: {message}")


@dataclass(frozen=True)
class TimersConfig:
    t1: float = 0.5
    t2: float = 4.0
    t4: float = 5.0


@dataclass(frozen=True)
class TlsConfig:
    """SIP over TLS (sips): off unless `port` is set; paths are resolved against the file."""

    port: int = 0  # 0 = no TLS listener; 5061 is the usual one
    certificate: str = ""
    private_key: str = ""
    ca_file: str = ""  # CAs that sign peers' certificates; empty: the system's
    verify_peer: bool = False  # demand (and check) a certificate from peers

    @property
    def enabled(self) -> bool:
        return self.port != 0


@dataclass(frozen=True)
class SipConfig:
    listen: str = "127.0.0.1:5060"
    transports: tuple[str, ...] = ("udp", "tcp")
    external_address: str = ""
    max_calls: int = 100
    retry_after_s: int = 5
    user_agent: str = "sip-bridge"
    answer_after_s: float = 0.0  # ring this long (180 Ringing) before answering
    max_call_s: float = 0.0  # hang up (BYE) after this long; 0 = no limit
    drain_s: float = 30.0  # SIGTERM: calls in progress may go on this long (new ones: 503)
    timers: TimersConfig = field(default_factory=TimersConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)

    @property
    def listen_host(self) -> str:
        return parse_hostport(self.listen)[0]

    @property
    def listen_port(self) -> int:
        return parse_hostport(self.listen)[1]

    @property
    def advertised_host(self) -> str:
        """What goes into Contact/Via/SDP: the external address, else the listen host."""
        return self.external_address or self.listen_host


@dataclass(frozen=True)
class RtpConfig:
    ports: str = "20000-20999"
    symmetric: str = "auto"

    @property
    def port_range(self) -> tuple[int, int]:
        return parse_port_range(self.ports)


@dataclass(frozen=True)
class JitterConfig:
    min_delay_ms: int = 20
    max_delay_ms: int = 200


@dataclass(frozen=True)
class SpeechModelConfig:
    """[agent.speech_model]: a user's own speech-to-speech ONNX model, audio in and out."""

    path: str
    input: str
    output: str
    sample_rate: int
    frame_samples: int
    state: tuple[tuple[str, str], ...] = ()  # (state input, state output) pairs
    batch: bool = True  # a leading batch axis: one run per tick for all calls


@dataclass(frozen=True)
class AgentConfig:
    name: str = "echo"
    echo_delay_s: float = 0.5
    tone_freq_hz: float = 1000.0
    tone_level_dbfs: float = -10.0
    playback_file: str = ""
    playback_loop: bool = False
    playback_hangup_at_end: bool = True
    voice_profile: str = str(DEMO_PROFILE)  # the dialogue: greeting, intents, replies
    voice: VoiceSettings = field(default_factory=VoiceSettings)
    speech_model: SpeechModelConfig | None = None  # name = "speech_model"


@dataclass(frozen=True)
class InboundConfig:
    """INVITE rate limit per source not owned by an IP-authenticated trunk (token bucket);
    rate_per_s = 0 turns it off."""

    rate_per_s: float = 50.0
    burst: int = 100


@dataclass(frozen=True)
class ControlConfig:
    """Where ``sip-bridge status`` finds a running bridge (a Unix socket)."""

    socket: str = ""  # empty: <temp dir>/sip-bridge-<SIP port>.sock
    reload_on_change: bool = True  # reload when the config or a profile it names changes

    def socket_path(self, sip_port: int) -> str:
        return self.socket or str(Path(tempfile.gettempdir()) / f"sip-bridge-{sip_port}.sock")


@dataclass(frozen=True)
class NodeConfig:
    """This bridge among several: its name in call records and event topics."""

    name: str = ""  # empty: the host name

    @property
    def node_name(self) -> str:
        return self.name or socket.gethostname()


@dataclass(frozen=True)
class RecordsConfig:
    """Call records (CDRs, turns, events) in SQLite: ``sip-bridge calls list|show``."""

    enabled: bool = False  # the shipped config/bridge.toml turns them on
    db: str = ""  # empty: $SIP_BRIDGE_DATA/calls.sqlite, else ~/.local/share/sip-bridge/
    recordings_dir: str = ""  # a stereo WAV per call here (caller left, agent right); "": off


@dataclass(frozen=True)
class MetricsConfig:
    """Prometheus ``/metrics`` and the ``/healthz`` readiness probe over HTTP."""

    listen: str = ""  # HOST:PORT; empty: off


@dataclass(frozen=True)
class MqttConfig:
    """Call events out and operator commands in over MQTT (off unless enabled)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 1883
    username: str = ""
    password_env: str = ""  # the password comes from this environment variable
    spool_dir: str = ""  # empty: $SIP_BRIDGE_DATA/mqtt-spool, else ~/.local/share/sip-bridge/
    keepalive_s: int = 30


@dataclass(frozen=True)
class BridgeConfig:
    sip: SipConfig = field(default_factory=SipConfig)
    rtp: RtpConfig = field(default_factory=RtpConfig)
    jitter: JitterConfig = field(default_factory=JitterConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    trunks: tuple[TrunkConfig, ...] = ()
    routes: tuple[RouteConfig, ...] = ()  # first match picks the call's agent; else [agent]
    inbound: InboundConfig = field(default_factory=InboundConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    models: ModelSettings = field(default_factory=ModelSettings)
    node: NodeConfig = field(default_factory=NodeConfig)
    records: RecordsConfig = field(default_factory=RecordsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    mqtt: MqttConfig = field(default_factory=MqttConfig)
    path: str = "<defaults>"

    def for_route(self, route: RouteConfig | None) -> BridgeConfig:
        """The config one call runs with: [agent] as the route (if any) sets it. A route
        with a profile but no agent means the voice agent with that profile."""
        if route is None:
            return self
        a = self.agent
        name = route.agent or ("voice" if route.profile else a.name)
        return replace(
            self, agent=replace(a, name=name, voice_profile=route.profile or a.voice_profile)
        )

    def agent_configs(self) -> list[BridgeConfig]:
        """The default and every route's config, each agent once: what to load at start."""
        out: dict[tuple[str, str], BridgeConfig] = {}
        for route in (None, *self.routes):
            cfg = self.for_route(route)
            out.setdefault((cfg.agent.name, cfg.agent.voice_profile), cfg)
        return list(out.values())

    def with_overrides(
        self,
        *,
        listen: str | None = None,
        agent: str | None = None,
        rtp_ports: str | None = None,
        max_calls: int | None = None,
    ) -> BridgeConfig:
        """Command-line overrides, validated like the file ("<command line>" in errors)."""
        cfg = self
        where = "<command line>"
        if listen is not None:
            _check_hostport(listen, where, None, "--listen")
            cfg = replace(cfg, sip=replace(cfg.sip, listen=listen))
        if agent is not None:
            _check_choice(agent, AGENTS, where, None, "--agent")
            cfg = replace(cfg, agent=replace(cfg.agent, name=agent))
        if rtp_ports is not None:
            _check_port_range(rtp_ports, where, None, "--rtp-ports")
            cfg = replace(cfg, rtp=replace(cfg.rtp, ports=rtp_ports))
        if max_calls is not None:
            if max_calls < 0:
                raise ConfigError(where, None, "--max-calls", "must be >= 0")
            cfg = replace(cfg, sip=replace(cfg.sip, max_calls=max_calls))
        return cfg


AGENTS = ("voice", "speech_model", "echo", "tone", "playback")
TRANSPORTS = ("udp", "tcp")
SYMMETRIC = ("off", "auto", "on")

# section -> key -> expected python type(s)
_SCHEMA: dict[str, dict[str, tuple[type, ...]]] = {
    "sip": {
        "listen": (str,),
        "transports": (list,),
        "external_address": (str,),
        "max_calls": (int,),
        "retry_after_s": (int,),
        "user_agent": (str,),
        "answer_after_s": (int, float),
        "max_call_s": (int, float),
        "drain_s": (int, float),
        "timers": (dict,),
        "tls": (dict,),
    },
    "sip.timers": {"t1": (int, float), "t2": (int, float), "t4": (int, float)},
    "sip.tls": {
        "port": (int,),
        "certificate": (str,),
        "private_key": (str,),
        "ca_file": (str,),
        "verify_peer": (bool,),
    },
    "rtp": {"ports": (str,), "symmetric": (str,)},
    "jitter": {"min_delay_ms": (int,), "max_delay_ms": (int,)},
    "agent": {
        "name": (str,),
        "voice": (dict,),
        "speech_model": (dict,),
        "echo": (dict,),
        "tone": (dict,),
        "playback": (dict,),
    },
    "agent.voice": {
        "profile": (str,),
        "echo_margin_db": (int, float),
        "turn_threshold": (int, float),
        "pause_ms": (int,),
        "max_silence_ms": (int,),
        "min_speech_ms": (int,),
        "speculate": (bool,),
    },
    "agent.speech_model": {
        "path": (str,),
        "input": (str,),
        "output": (str,),
        "sample_rate": (int,),
        "frame_samples": (int,),
        "state": (list,),
        "batch": (bool,),
    },
    "models": {
        "dir": (str,),
        "device": (str,),
        "threads": (int,),
        "workers": (int,),
        "batch_vad": (bool,),
    },
    "agent.echo": {"delay_s": (int, float)},
    "agent.tone": {"freq_hz": (int, float), "level_dbfs": (int, float)},
    "agent.playback": {"file": (str,), "loop": (bool,), "hangup_at_end": (bool,)},
    "inbound": {"rate_per_s": (int, float), "burst": (int,)},
    "control": {"socket": (str,), "reload_on_change": (bool,)},
    "node": {"name": (str,)},
    "records": {"enabled": (bool,), "db": (str,), "recordings_dir": (str,)},
    "metrics": {"listen": (str,)},
    "mqtt": {
        "enabled": (bool,),
        "host": (str,),
        "port": (int,),
        "username": (str,),
        "password_env": (str,),
        "spool_dir": (str,),
        "keepalive_s": (int,),
    },
    "trunks": {},  # an array of tables: checked by sip_bridge.trunks
    "routes": {},  # an array of tables: checked by sip_bridge.routes
}


def parse_hostport(value: str) -> tuple[str, int]:
    """ "host:port" or "[v6]:port" -> (host, port); ValueError when it is neither."""
    m = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\d{1,5})|([^:\[\]]+):(\d{1,5})", value.strip())
    if not m:
        raise ValueError(f"expected HOST:PORT or [IPV6]:PORT, got {value!r}")
    host = m.group(1) or m.group(3)
    port = int(m.group(2) or m.group(4))
    if not 0 <= port < 65536:  # 0: let the OS pick a free port (tests, ad-hoc runs)
        raise ValueError(f"port {port} out of range 0-65535")
    if m.group(1):
        ipaddress.IPv6Address(host)
    return host, port


def parse_port_range(value: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d{1,5})\s*-\s*(\d{1,5})\s*", value)
    if not m:
        raise ValueError(f"expected LOW-HIGH, got {value!r}")
    low, high = int(m.group(1)), int(m.group(2))
    if not 1024 <= low < high <= 65535 or high - low < 2:
        raise ValueError(f"need 1024 <= LOW < HIGH <= 65535 with room for a call, got {value!r}")
    return low, high


def _line_of(text: str, section: str, key: str | None) -> int | None:
    """Line number of `key` inside `[section]` (or of the section header), for messages."""
    current = ""
    section_line = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        header = re.fullmatch(r"\[\s*([^\]]+?)\s*\]", line)
        if header:
            current = header.group(1).replace(" ", "")
            if current == section:
                section_line = n
            continue
        if key is not None and current == section and re.match(rf"{re.escape(key)}\s*=", line):
            return n
    return section_line


def _check_hostport(v: str, path: str, line: int | None, key: str) -> None:
    try:
        parse_hostport(v)
    except ValueError as exc:
        raise ConfigError(path, line, key, str(exc)) from None


def _check_port_range(v: str, path: str, line: int | None, key: str) -> None:
    try:
        parse_port_range(v)
    except ValueError as exc:
        raise ConfigError(path, line, key, str(exc)) from None


def _check_choice(v: str, allowed: tuple[str, ...], path: str, line: int | None, key: str) -> None:
    if v not in allowed:
        raise ConfigError(path, line, key, f"{v!r} is not one of {', '.join(allowed)}")


def _walk(data: dict[str, Any], text: str, path: str) -> None:
    """Unknown sections/keys and wrong types, with the line they are on."""
    for name, value in data.items():
        if name not in _SCHEMA:
            raise ConfigError(
                path, _line_of(text, name, None), name,
                f"unknown section; known: {', '.join(s for s in _SCHEMA if '.' not in s)}",
            )  # fmt: skip
        if name in ("trunks", "routes"):  # arrays of tables: their own modules check them
            continue
        _walk_section(name, value, text, path)


def _walk_section(section: str, value: Any, text: str, path: str) -> None:
    if not isinstance(value, dict):
        raise ConfigError(path, _line_of(text, "", section), section, "must be a [table]")
    schema = _SCHEMA[section]
    for key, v in value.items():
        line = _line_of(text, section, key)
        dotted = f"{section}.{key}"
        if key not in schema:
            raise ConfigError(
                path, line, dotted, f"unknown key; allowed: {', '.join(sorted(schema))}"
            )
        types = schema[key]
        if (isinstance(v, bool) and bool not in types) or not isinstance(v, types):
            want = " or ".join("table" if t is dict else t.__name__ for t in types)
            raise ConfigError(path, line, dotted, f"expected {want}, got {v!r}")
        if isinstance(v, dict):
            _walk_section(dotted, v, text, path)


def load_config(path: str | Path | None = None) -> BridgeConfig:
    """Read and validate a bridge.toml; None gives the built-in defaults."""
    if path is None:
        return BridgeConfig()
    p = str(path)
    try:
        text = Path(p).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(p, None, "file", f"cannot read: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise ConfigError(p, int(m.group(1)) if m else None, "syntax", str(exc)) from None
    _walk(data, text, p)
    return _build(data, text, p)


def _build(data: dict[str, Any], text: str, p: str) -> BridgeConfig:
    sip = dict(data.get("sip", {}))
    timers = TimersConfig(**sip.pop("timers", {}))
    tls = _build_tls(TlsConfig(**sip.pop("tls", {})), text, p)
    for k in ("t1", "t2", "t4"):
        if getattr(timers, k) <= 0:
            raise ConfigError(p, _line_of(text, "sip.timers", k), f"sip.timers.{k}", "must be > 0")
    if "transports" in sip:
        for t in sip["transports"]:
            _check_choice(t, TRANSPORTS, p, _line_of(text, "sip", "transports"), "sip.transports")
        sip["transports"] = tuple(sip["transports"])
    sip_cfg = SipConfig(timers=timers, tls=tls, **sip)
    _check_hostport(sip_cfg.listen, p, _line_of(text, "sip", "listen"), "sip.listen")
    if sip_cfg.external_address in ("0.0.0.0", "::"):
        raise ConfigError(
            p, _line_of(text, "sip", "external_address"), "sip.external_address",
            "must be an address peers can reach, not a wildcard",
        )  # fmt: skip
    if sip_cfg.max_calls < 0:
        raise ConfigError(p, _line_of(text, "sip", "max_calls"), "sip.max_calls", "must be >= 0")
    if not 0 <= sip_cfg.answer_after_s <= 60:
        key = "answer_after_s"
        raise ConfigError(p, _line_of(text, "sip", key), f"sip.{key}", "must be 0..60 s")
    if sip_cfg.max_call_s < 0:
        raise ConfigError(p, _line_of(text, "sip", "max_call_s"), "sip.max_call_s", "must be >= 0")
    if not 0 <= sip_cfg.drain_s <= 86400:
        raise ConfigError(p, _line_of(text, "sip", "drain_s"), "sip.drain_s", "must be 0..86400 s")
    rtp = RtpConfig(**data.get("rtp", {}))
    _check_port_range(rtp.ports, p, _line_of(text, "rtp", "ports"), "rtp.ports")
    _check_choice(rtp.symmetric, SYMMETRIC, p, _line_of(text, "rtp", "symmetric"), "rtp.symmetric")
    jitter = JitterConfig(**data.get("jitter", {}))
    if not 0 <= jitter.min_delay_ms <= jitter.max_delay_ms <= 1000:
        raise ConfigError(
            p, _line_of(text, "jitter", "max_delay_ms"), "jitter",
            "need 0 <= min_delay_ms <= max_delay_ms <= 1000",
        )  # fmt: skip
    agent = dict(data.get("agent", {}))
    echo = agent.pop("echo", {})
    tone = agent.pop("tone", {})
    playback = agent.pop("playback", {})
    voice = dict(agent.pop("voice", {}))
    speech_model = _build_speech_model(agent.pop("speech_model", None), text, p)
    profile = voice.pop("profile", None)
    agent_cfg = AgentConfig(
        echo_delay_s=float(echo.get("delay_s", 0.5)),
        tone_freq_hz=float(tone.get("freq_hz", 1000.0)),
        tone_level_dbfs=float(tone.get("level_dbfs", -10.0)),
        playback_file=str(playback.get("file", "")),
        playback_loop=bool(playback.get("loop", False)),
        playback_hangup_at_end=bool(playback.get("hangup_at_end", True)),
        voice=_build_voice(voice, text, p),
        speech_model=speech_model,
        **agent,
    )
    if profile is not None:
        f = Path(profile)
        f = f if f.is_absolute() else Path(p).resolve().parent / f  # relative to the config file
        if not f.is_file():
            line = _line_of(text, "agent.voice", "profile")
            raise ConfigError(p, line, "agent.voice.profile", f"no such file: {f}")
        agent_cfg = replace(agent_cfg, voice_profile=str(f))
    _check_choice(agent_cfg.name, AGENTS, p, _line_of(text, "agent", "name"), "agent.name")
    if agent_cfg.name == "speech_model" and speech_model is None:
        line = _line_of(text, "agent", "name")
        raise ConfigError(p, line, "agent.speech_model", "is required when name = speech_model")
    if not 0 <= agent_cfg.echo_delay_s <= 10:
        raise ConfigError(
            p, _line_of(text, "agent.echo", "delay_s"), "agent.echo.delay_s", "must be 0..10 s"
        )
    if not 20 <= agent_cfg.tone_freq_hz <= 3400:
        key = "agent.tone.freq_hz"
        raise ConfigError(p, _line_of(text, "agent.tone", "freq_hz"), key, "must be 20..3400 Hz")
    if not -60 <= agent_cfg.tone_level_dbfs <= 0:
        key = "agent.tone.level_dbfs"
        raise ConfigError(p, _line_of(text, "agent.tone", "level_dbfs"), key, "must be -60..0")
    if agent_cfg.name == "playback" or agent_cfg.playback_file:
        wav = Path(agent_cfg.playback_file)
        if not wav.is_absolute():
            wav = Path(p).resolve().parent / wav  # relative to the config file
        if not wav.is_file():
            line = _line_of(text, "agent.playback", "file") or _line_of(text, "agent", "name")
            what = f"no such file: {wav}" if agent_cfg.playback_file else "is required"
            raise ConfigError(p, line, "agent.playback.file", what)
        agent_cfg = replace(agent_cfg, playback_file=str(wav))
    inbound = InboundConfig(**data.get("inbound", {}))
    if inbound.rate_per_s < 0 or inbound.burst < 1:
        line = _line_of(text, "inbound", "rate_per_s" if inbound.rate_per_s < 0 else "burst")
        raise ConfigError(p, line, "inbound", "need rate_per_s >= 0 (0 = off) and burst >= 1")
    control = ControlConfig(**data.get("control", {}))
    if control.socket and not Path(control.socket).is_absolute():
        control = replace(control, socket=str(Path(p).resolve().parent / control.socket))
    node = NodeConfig(**data.get("node", {}))
    if node.name and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", node.name):
        line = _line_of(text, "node", "name")
        raise ConfigError(p, line, "node.name", "use letters, digits, '_', '.', '-' (at most 64)")
    records = RecordsConfig(**data.get("records", {}))
    if records.db and not Path(records.db).is_absolute():
        records = replace(records, db=str(Path(p).resolve().parent / records.db))
    if records.recordings_dir and not Path(records.recordings_dir).is_absolute():
        where = str(Path(p).resolve().parent / records.recordings_dir)
        records = replace(records, recordings_dir=where)
    metrics = MetricsConfig(**data.get("metrics", {}))
    if metrics.listen:
        _check_hostport(metrics.listen, p, _line_of(text, "metrics", "listen"), "metrics.listen")
    mqtt = MqttConfig(**data.get("mqtt", {}))
    if not 1 <= mqtt.port <= 65535:
        raise ConfigError(p, _line_of(text, "mqtt", "port"), "mqtt.port", "must be 1..65535")
    if not 5 <= mqtt.keepalive_s <= 3600:
        line = _line_of(text, "mqtt", "keepalive_s")
        raise ConfigError(p, line, "mqtt.keepalive_s", "must be 5..3600 s")
    if mqtt.enabled and mqtt.password_env and mqtt.password_env not in os.environ:
        line = _line_of(text, "mqtt", "password_env")
        raise ConfigError(p, line, "mqtt.password_env", f"{mqtt.password_env} is not set")
    if mqtt.spool_dir and not Path(mqtt.spool_dir).is_absolute():
        mqtt = replace(mqtt, spool_dir=str(Path(p).resolve().parent / mqtt.spool_dir))
    trunks = parse_trunks(data.get("trunks", []), text, p)
    routes = parse_routes(data.get("routes", []), text, p, AGENTS, trunks)
    for i, route in enumerate(routes):
        name = BridgeConfig(agent=agent_cfg).for_route(route).agent.name
        if name == "speech_model" and speech_model is None:
            line = entry_key_line(text, "routes", i, "agent")
            raise ConfigError(p, line, f"routes[{i + 1}].agent", "needs [agent.speech_model]")
        if name == "playback" and not agent_cfg.playback_file:
            line = entry_key_line(text, "routes", i, "agent")
            raise ConfigError(p, line, f"routes[{i + 1}].agent", "needs [agent.playback] file")
    models = ModelSettings(**data.get("models", {}))
    _check_choice(models.device, DEVICES, p, _line_of(text, "models", "device"), "models.device")
    for key in ("threads", "workers"):
        if not 1 <= getattr(models, key) <= 64:
            raise ConfigError(p, _line_of(text, "models", key), f"models.{key}", "must be 1..64")
    if models.dir and not Path(models.dir).is_absolute():
        models = replace(models, dir=str(Path(p).resolve().parent / models.dir))
    return BridgeConfig(
        models=models,
        sip=sip_cfg,
        rtp=rtp,
        jitter=jitter,
        agent=agent_cfg,
        trunks=trunks,
        routes=routes,
        node=node,
        records=records,
        metrics=metrics,
        mqtt=mqtt,
        inbound=inbound,
        control=control,
        path=p,
    )


def _build_speech_model(sm: dict[str, Any] | None, text: str, p: str) -> SpeechModelConfig | None:
    """[agent.speech_model]: the model file must exist; names are checked against the model
    itself when it loads (the error then lists the names it really has)."""
    if sm is None:
        return None
    sec = "agent.speech_model"
    for key in ("path", "input", "output", "sample_rate", "frame_samples"):
        if key not in sm:
            raise ConfigError(p, _line_of(text, sec, None), f"{sec}.{key}", "is required")
    pairs = []
    for pair in sm.get("state", []):
        if not (
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
        ):
            line = _line_of(text, sec, "state")
            raise ConfigError(p, line, f"{sec}.state", "expected [[state_in, state_out], ...]")
        pairs.append((pair[0], pair[1]))
    for key in ("sample_rate", "frame_samples"):
        if sm[key] <= 0:
            raise ConfigError(p, _line_of(text, sec, key), f"{sec}.{key}", "must be > 0")
    f = Path(sm["path"])
    f = f if f.is_absolute() else Path(p).resolve().parent / f
    if not f.is_file():
        raise ConfigError(p, _line_of(text, sec, "path"), f"{sec}.path", f"no such file: {f}")
    return SpeechModelConfig(**{**sm, "path": str(f), "state": tuple(pairs)})


def _build_voice(voice: dict[str, Any], text: str, p: str) -> VoiceSettings:
    """[agent.voice] turn-taking settings, each checked against a sane range."""
    v = VoiceSettings(**voice)
    limits = {
        "echo_margin_db": (0, 60),
        "turn_threshold": (0, 1),
        "pause_ms": (20, 5000),
        "max_silence_ms": (100, 10000),
        "min_speech_ms": (0, 2000),
    }
    for key, (low, high) in limits.items():
        if not low <= getattr(v, key) <= high:
            line = _line_of(text, "agent.voice", key)
            raise ConfigError(p, line, f"agent.voice.{key}", f"must be {low}..{high}")
    if v.max_silence_ms < v.pause_ms:
        line = _line_of(text, "agent.voice", "max_silence_ms")
        raise ConfigError(p, line, "agent.voice.max_silence_ms", "must be >= pause_ms")
    return v


def _build_tls(tls: TlsConfig, text: str, p: str) -> TlsConfig:
    """Port range, and the files a TLS listener needs, checked now rather than at start."""
    if not 0 <= tls.port <= 65535:
        line = _line_of(text, "sip.tls", "port")
        raise ConfigError(p, line, "sip.tls.port", "must be 0 (off) or 1-65535")
    if not tls.enabled:
        return tls
    found = {"certificate": "", "private_key": "", "ca_file": ""}
    for key in ("certificate", "private_key", "ca_file"):
        value = getattr(tls, key)
        line = _line_of(text, "sip.tls", key) or _line_of(text, "sip.tls", "port")
        if not value:
            if key == "ca_file":
                continue
            raise ConfigError(p, line, f"sip.tls.{key}", "is required when sip.tls.port is set")
        f = Path(value)
        if not f.is_absolute():
            f = Path(p).resolve().parent / f  # relative to the config file
        if not f.is_file():
            raise ConfigError(p, line, f"sip.tls.{key}", f"no such file: {f}")
        found[key] = str(f)
    return replace(
        tls,
        certificate=found["certificate"],
        private_key=found["private_key"],
        ca_file=found["ca_file"],
    )

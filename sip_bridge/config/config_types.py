# size: every section of bridge.toml as one typed dataclass each, side by side, so that the
#       defaults and their comments read as one reference (config/REFERENCE.md is made from them)
"""The configuration's typed values: what a loaded bridge.toml is, and the checks they
share with command-line overrides. Loading and validating a file: :mod:`sip_bridge.config.loader`.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from agent.voice_settings import ModelSettings, VoiceSettings
from sip_bridge.config.config_error import ConfigError, is_file
from sip_bridge.config.config_files import packaged_dir
from sip_bridge.config.routes import RouteConfig
from sip_bridge.config.trunks import TrunkConfig

__all__ = [
    "AGENTS",
    "DEMO_PROFILE",
    "FALLBACK_PROMPT",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "MODEL_FAULT_ACTIONS",
    "SYMMETRIC",
    "TOKEN_ROLES",
    "TRANSPORTS",
    "AgentConfig",
    "BridgeConfig",
    "ConfigError",
    "ControlConfig",
    "HttpConfig",
    "HttpToken",
    "InboundConfig",
    "JitterConfig",
    "LogConfig",
    "MetricsConfig",
    "MqttConfig",
    "NodeConfig",
    "RecordsConfig",
    "RtpConfig",
    "SipConfig",
    "SpeechModelConfig",
    "TimersConfig",
    "TlsConfig",
    "TransferConfig",
    "exposure_problem",
    "is_file",
    "loopback_host",
    "parse_hostport",
    "parse_port_range",
]

#: The shipped demo agent profile (config/agents/demo.toml in a checkout, inside the package
#: in a wheel: :func:`sip_bridge.config.config_files.packaged_dir`).
DEMO_PROFILE = packaged_dir() / "agents" / "demo.toml"
#: The shipped "technical difficulties" prompt (config/prompts/, rendered by our TTS voice).
FALLBACK_PROMPT = packaged_dir() / "prompts" / "technical_difficulty.wav"
#: What the bridge does after a model fault's fallback prompt.
MODEL_FAULT_ACTIONS = ("hangup", "transfer")


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
    srtp: str = "optional"  # SDES-SRTP for calls no trunk claims: off / optional / required
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
    timeout_s: float = 30.0  # no RTP from a peer that should send: hang up; 0 = never

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
    name: str = "voice"  # the talking agent; echo, tone, playback: line checks
    echo_delay_s: float = 0.5
    tone_freq_hz: float = 1000.0
    tone_level_dbfs: float = -10.0
    playback_file: str = ""
    playback_loop: bool = False
    playback_hangup_at_end: bool = True
    voice_profile: str = str(DEMO_PROFILE)  # the dialogue: greeting, intents, replies
    voice: VoiceSettings = field(default_factory=VoiceSettings)
    speech_model: SpeechModelConfig | None = None  # name = "speech_model"
    # a model run that raises or takes longer than model_timeout_s (0: no limit) is a model
    # fault: the bridge plays fallback_prompt ("": none), then hangs up or transfers
    model_timeout_s: float = 10.0
    fallback_prompt: str = str(FALLBACK_PROMPT)
    on_model_fault: str = "hangup"  # or "transfer", to fault_transfer_to
    fault_transfer_to: str = ""


@dataclass(frozen=True)
class TransferConfig:
    """[transfer]: blind transfers (REFER) the agents ask for."""

    # no final report (NOTIFY) this long after the REFER: the transfer failed, the agent
    # takes the caller back (the REFER's own Timer F, 32 s, would be later)
    timeout_s: float = 20.0
    hold_audio: str = ""  # a WAV looped while the target rings; "": ringback tone


@dataclass(frozen=True)
class InboundConfig:
    """INVITE rate limit per source not owned by an IP-authenticated trunk (token bucket);
    rate_per_s = 0 turns it off."""

    rate_per_s: float = 50.0
    burst: int = 100
    # refused this many times in a row (0: never): dropped unread until quiet for silence_s
    silence_after: int = 200
    silence_s: float = 60.0


@dataclass(frozen=True)
class LoadConfig:
    """[load]: the node's own headroom (turn latency over the last minute, the CPU it has
    left) and whether it sheds new calls (503 + Retry-After to INVITEs and to the
    dispatcher's OPTIONS probe) while over budget. Calls in progress are never touched."""

    shed: bool = False  # measure always; refuse new calls only when on
    turn_p95_ms: float = 900.0  # over budget: p95 of the window's turns above this
    cpu_pct: float = 90.0  # or the node's CPUs busier than this, on average (0..100)
    window_s: float = 60.0  # turns of this long ago count
    cpu_window_s: float = 10.0  # the CPU is averaged over this long
    min_turns: int = 20  # fewer turns in the window: their latency decides nothing
    resume_at: float = 0.8  # below this fraction of both budgets the ceiling may rise
    hold_s: float = 10.0  # a ceiling moves at most this often; over budget this long at least
    slow_start_calls: int = 8  # calls answered in the last cpu_window_s: at most this or the older


@dataclass(frozen=True)
class ControlConfig:
    """Where ``sip-bridge status`` finds a running bridge (a Unix socket)."""

    socket: str = ""  # empty: <runtime or temp dir>/sip-bridge-<SIP port>.sock
    reload_on_change: bool = True  # reload when the config or a profile it names changes

    def socket_path(self, sip_port: int) -> str:
        """The socket, or by default ``sip-bridge-<port>.sock`` in ``$RUNTIME_DIRECTORY``
        (what systemd's RuntimeDirectory= sets: the unit's temp dir is private) or else
        the temp dir."""
        if self.socket:
            return self.socket
        folder = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0] or tempfile.gettempdir()
        return str(Path(folder) / f"sip-bridge-{sip_port}.sock")


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

    enabled: bool = True
    db: str = ""  # empty: $SIP_BRIDGE_DATA/calls.sqlite, else ~/.local/share/sip-bridge/
    recordings_dir: str = ""  # a stereo WAV per call here (caller left, agent right); "": off
    keep_days: int = 90  # records and recordings older than this are purged; 0 = forever
    redact_card_numbers: bool = True  # mask Luhn-valid 13-19 digit runs (agent.redaction)


@dataclass(frozen=True)
class MetricsConfig:
    """Prometheus ``/metrics`` and the ``/healthz`` readiness probe over HTTP."""

    listen: str = ""  # HOST:PORT; empty: off


#: What a console token allows: ``viewer`` reads, ``operator`` reads and acts.
TOKEN_ROLES = ("viewer", "operator")


@dataclass(frozen=True)
class HttpToken:
    """A token that opens the console; its name goes on the timeline of what it does."""

    name: str
    role: str  # one of TOKEN_ROLES
    secret: str = field(repr=False)


@dataclass(frozen=True)
class HttpConfig:
    """The browser leg (talk to an agent over WebRTC) and the operator console."""

    listen: str = "127.0.0.1:8088"  # HOST:PORT; empty: off
    ice_addresses: tuple[str, ...] = ()  # WebRTC host candidates; empty: the listen host
    operator_token_env: str = ""  # console actions need this token (hang up, transfer)
    operator_token_file: str = ""
    viewer_token_env: str = ""  # reads (calls, transcripts, recordings) with this token
    viewer_token_file: str = ""
    allow_anonymous_reads: bool = False  # a non-loopback listen without tokens: say so here
    max_sessions: int = 4  # browser sessions at once
    token_ttl_s: float = 600.0  # how long a talk page may start sessions
    # resolved from the env variables and files at load time, never from the file itself
    tokens: tuple[HttpToken, ...] = field(default=(), repr=False)

    @property
    def operator_token(self) -> str:
        """An operator token's secret ("" without one): actions are possible."""
        return next((t.secret for t in self.tokens if t.role == "operator"), "")

    @property
    def loopback(self) -> bool:
        """Only this host can reach the listener."""
        return bool(self.listen) and loopback_host(parse_hostport(self.listen)[0])

    @property
    def reads_need_token(self) -> bool:
        """Calls, transcripts and recordings are read with a viewer or operator token."""
        return bool(self.listen) and not self.loopback and not self.allow_anonymous_reads


def exposure_problem(http: HttpConfig) -> str:
    """Why ``http`` must not start ("" when it may): a listener others can reach, with no
    token to read with and no ``allow_anonymous_reads`` to say that is meant."""
    if not http.reads_need_token or http.tokens:
        return ""
    return (
        f"http.listen {http.listen} is not loopback, and reading callers' numbers, "
        "transcripts and recordings there needs a token: set http.viewer_token_env (or "
        "viewer_token_file, or an operator token), or http.allow_anonymous_reads = true to "
        "let anyone who reaches the port read them"
    )


def loopback_host(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1): nothing else reaches it."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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


#: ``[log] format``: lines for a person, or one JSON object per line for a collector.
LOG_FORMATS = ("text", "json")
#: ``[log] level``, quietest last.
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class LogConfig:
    """How the bridge logs (to stderr: the journal under systemd)."""

    format: str = "text"
    level: str = "warning"  # `sip-bridge run -v` lowers it to info


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
    http: HttpConfig = field(default_factory=HttpConfig)
    log: LogConfig = field(default_factory=LogConfig)
    transfer: TransferConfig = field(default_factory=TransferConfig)
    load: LoadConfig = field(default_factory=LoadConfig)
    path: str = "<defaults>"
    # what is allowed but probably not meant (a profile no call uses...): `config check`
    # prints them, `run` logs them at start
    warnings: tuple[str, ...] = ()

    @classmethod
    def line_check(cls) -> BridgeConfig:
        """The defaults with the echo line check as the agent, no call records and no web
        server: a bridge that needs no models, writes nothing and opens only its SIP port
        (tests, benchmarks, embedders that wire their own agents)."""
        base = cls()
        return replace(
            base,
            agent=replace(base.agent, name="echo"),
            records=replace(base.records, enabled=False),
            http=replace(base.http, listen=""),
        )

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
        http: str | None = None,
        metrics: str | None = None,
    ) -> BridgeConfig:
        """Command-line overrides, validated like the file ("<command line>" in errors);
        ``http="off"`` turns the web server off, ``metrics="off"`` the metrics endpoint."""
        cfg = self
        where = "<command line>"
        if metrics is not None:
            if metrics != "off":
                _check_hostport(metrics, where, None, "--metrics")
            scrape = "" if metrics == "off" else metrics
            cfg = replace(cfg, metrics=replace(cfg.metrics, listen=scrape))
        if http is not None:
            if http != "off":
                _check_hostport(http, where, None, "--http")
            cfg = replace(cfg, http=replace(cfg.http, listen="" if http == "off" else http))
            problem = exposure_problem(cfg.http)
            if problem:
                raise ConfigError(where, None, "http.viewer_token_env", f"--http: {problem}")
        if listen is not None:
            _check_hostport(listen, where, None, "--listen")
            cfg = replace(cfg, sip=replace(cfg.sip, listen=listen))
        if agent is not None:
            _check_choice(agent, AGENTS, where, None, "--agent")
            # --agent names the agent on purpose: a profile it leaves unused is no surprise
            cfg = replace(cfg, agent=replace(cfg.agent, name=agent), warnings=())
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


def _choice(value: str, allowed: tuple[str, ...], text: str, p: str, key: str) -> None:
    """:func:`_check_choice` for ``section.key`` of ``text``; the line (a scan of the whole
    text) is looked up only when there is an error to report."""
    if value not in allowed:
        section, _, name = key.rpartition(".")
        _check_choice(value, allowed, p, _line_of(text, section, name), key)

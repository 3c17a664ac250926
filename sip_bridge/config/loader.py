"""The bridge's configuration file (TOML): typed, validated, with errors that say where.

An operator edits `config/bridge.toml` by hand, so every mistake is reported
with the file, the line, the key and what is allowed; unknown keys are errors
(a typo must not silently fall back to a default).
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.voice_settings import ASR_WEIGHTS, DEVICES, ModelSettings
from sip_bridge.config.config_sections import (
    build_http,
    build_load,
    build_model_fault,
    build_speech_model,
    build_tls,
    build_transfer,
    build_voice,
)
from sip_bridge.config.config_types import (
    AGENTS,
    DEMO_PROFILE,
    LOG_FORMATS,
    LOG_LEVELS,
    SYMMETRIC,
    TRANSPORTS,
    AgentConfig,
    BridgeConfig,
    ConfigError,
    ControlConfig,
    HttpConfig,
    InboundConfig,
    JitterConfig,
    LoadConfig,
    LogConfig,
    MetricsConfig,
    MqttConfig,
    NodeConfig,
    RecordsConfig,
    RtpConfig,
    SipConfig,
    SpeechModelConfig,
    TimersConfig,
    TlsConfig,
    TransferConfig,
    _check_hostport,
    _check_port_range,
    _choice,
    _line_of,
    is_file,
    parse_hostport,
    parse_port_range,
)
from sip_bridge.config.routes import RouteConfig, parse_routes
from sip_bridge.config.trunks import entry_key_line, parse_trunks
from sip_bridge.media.srtp import SRTP_MODES

__all__ = [
    "AGENTS",
    "DEMO_PROFILE",
    "AgentConfig",
    "BridgeConfig",
    "ConfigError",
    "ControlConfig",
    "HttpConfig",
    "InboundConfig",
    "JitterConfig",
    "LoadConfig",
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
    "load_config",
    "parse_config_text",
    "parse_hostport",
    "parse_port_range",
]


log = logging.getLogger(__name__)

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
        "srtp": (str,),
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
    "rtp": {"ports": (str,), "symmetric": (str,), "timeout_s": (int, float)},
    "jitter": {"min_delay_ms": (int,), "max_delay_ms": (int,)},
    "agent": {
        "name": (str,),
        "voice": (dict,),
        "speech_model": (dict,),
        "echo": (dict,),
        "tone": (dict,),
        "playback": (dict,),
        "model_timeout_s": (int, float),
        "fallback_prompt": (str,),
        "on_model_fault": (str,),
        "fault_transfer_to": (str,),
    },
    "agent.voice": {
        "profile": (str,),
        "echo_margin_db": (int, float),
        "echo_canceller": (bool,),
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
        "phrase_cache_mb": (int,),
        "nice": (int,),
        "asr_weights": (str,),
    },
    "agent.echo": {"delay_s": (int, float)},
    "agent.tone": {"freq_hz": (int, float), "level_dbfs": (int, float)},
    "agent.playback": {"file": (str,), "loop": (bool,), "hangup_at_end": (bool,)},
    "inbound": {
        "rate_per_s": (int, float),
        "burst": (int,),
        "silence_after": (int,),
        "silence_s": (int, float),
    },
    "control": {"socket": (str,), "reload_on_change": (bool,)},
    "node": {"name": (str,)},
    "records": {
        "enabled": (bool,),
        "db": (str,),
        "recordings_dir": (str,),
        "keep_days": (int,),
        "redact_card_numbers": (bool,),
    },
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
    "http": {
        "listen": (str,),
        "ice_addresses": (list,),
        "operator_token_env": (str,),
        "operator_token_file": (str,),
        "viewer_token_env": (str,),
        "viewer_token_file": (str,),
        "allow_anonymous_reads": (bool,),
        "max_sessions": (int,),
        "token_ttl_s": (int, float),
    },
    "log": {"format": (str,), "level": (str,)},
    "transfer": {"timeout_s": (int, float), "hold_audio": (str,)},
    "load": {
        "shed": (bool,),
        "turn_p95_ms": (int, float),
        "cpu_pct": (int, float),
        "window_s": (int, float),
        "cpu_window_s": (int, float),
        "min_turns": (int,),
        "resume_at": (int, float),
        "hold_s": (int, float),
        "slow_start_calls": (int,),
    },
    "trunks": {},  # an array of tables: checked by sip_bridge.config.trunks
    "routes": {},  # an array of tables: checked by sip_bridge.config.routes
}


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
        dotted = f"{section}.{key}"
        if key not in schema:  # the line is looked up only for a message: it scans the text
            raise ConfigError(
                path, _line_of(text, section, key), dotted,
                f"unknown key; allowed: {', '.join(sorted(schema))}",
            )  # fmt: skip
        types = schema[key]
        if (isinstance(v, bool) and bool not in types) or not isinstance(v, types):
            want = " or ".join("table" if t is dict else t.__name__ for t in types)
            line = _line_of(text, section, key)
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
    return parse_config_text(text, p)


def parse_config_text(text: str, p: str = "<text>") -> BridgeConfig:
    """The config in ``text`` (``p`` names it in messages; relative paths are relative to
    its folder)."""
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
    tls = build_tls(TlsConfig(**sip.pop("tls", {})), text, p)
    for k in ("t1", "t2", "t4"):
        if getattr(timers, k) <= 0:
            raise ConfigError(p, _line_of(text, "sip.timers", k), f"sip.timers.{k}", "must be > 0")
    if "transports" in sip:
        for t in sip["transports"]:
            _choice(t, TRANSPORTS, text, p, "sip.transports")
        sip["transports"] = tuple(sip["transports"])
    sip_cfg = SipConfig(timers=timers, tls=tls, **sip)
    _choice(sip_cfg.srtp, SRTP_MODES, text, p, "sip.srtp")
    if sip_cfg.srtp == "required" and not sip_cfg.tls.enabled:
        log.warning("%s: sip.srtp = required without [sip.tls]: SDES keys go in clear SIP", p)
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
    _choice(rtp.symmetric, SYMMETRIC, text, p, "rtp.symmetric")
    if not (rtp.timeout_s == 0 or 1 <= rtp.timeout_s <= 3600):
        line = _line_of(text, "rtp", "timeout_s")
        raise ConfigError(p, line, "rtp.timeout_s", "must be 0 (never) or 1..3600 s")
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
    speech_model = build_speech_model(agent.pop("speech_model", None), text, p)
    profile = voice.pop("profile", None)
    d = AgentConfig  # a key left out: the dataclass's default (one source of defaults)
    agent_cfg = AgentConfig(
        echo_delay_s=float(echo.get("delay_s", d.echo_delay_s)),
        tone_freq_hz=float(tone.get("freq_hz", d.tone_freq_hz)),
        tone_level_dbfs=float(tone.get("level_dbfs", d.tone_level_dbfs)),
        playback_file=str(playback.get("file", d.playback_file)),
        playback_loop=bool(playback.get("loop", d.playback_loop)),
        playback_hangup_at_end=bool(playback.get("hangup_at_end", d.playback_hangup_at_end)),
        voice=build_voice(voice, text, p),
        speech_model=speech_model,
        **agent,
    )
    if profile is not None:
        f = Path(profile)
        f = f if f.is_absolute() else Path(p).resolve().parent / f  # relative to the config file
        if not is_file(f):
            line = _line_of(text, "agent.voice", "profile")
            raise ConfigError(p, line, "agent.voice.profile", f"no such file: {f}")
        agent_cfg = replace(agent_cfg, voice_profile=str(f))
    _choice(agent_cfg.name, AGENTS, text, p, "agent.name")
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
        if not is_file(wav):
            line = _line_of(text, "agent.playback", "file") or _line_of(text, "agent", "name")
            what = f"no such file: {wav}" if agent_cfg.playback_file else "is required"
            raise ConfigError(p, line, "agent.playback.file", what)
        agent_cfg = replace(agent_cfg, playback_file=str(wav))
    agent_cfg = build_model_fault(agent_cfg, text, p)
    inbound = InboundConfig(**data.get("inbound", {}))
    if inbound.rate_per_s < 0 or inbound.burst < 1:
        line = _line_of(text, "inbound", "rate_per_s" if inbound.rate_per_s < 0 else "burst")
        raise ConfigError(p, line, "inbound", "need rate_per_s >= 0 (0 = off) and burst >= 1")
    if inbound.silence_after < 0 or not inbound.silence_s > 0:
        key = "silence_after" if inbound.silence_after < 0 else "silence_s"
        raise ConfigError(
            p, _line_of(text, "inbound", key), f"inbound.{key}",
            "need silence_after >= 0 (0 = never) and silence_s > 0",
        )  # fmt: skip
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
    if not 0 <= records.keep_days <= 36500:
        line = _line_of(text, "records", "keep_days")
        raise ConfigError(p, line, "records.keep_days", "must be 0 (keep forever) .. 36500 days")
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
    warnings = _unused_profile(profile, agent_cfg, routes, text, p)
    http = build_http(data.get("http", {}), text, p)
    transfer = build_transfer(data.get("transfer", {}), text, p)
    load = build_load(data.get("load", {}), text, p)
    models = ModelSettings(**data.get("models", {}))
    _choice(models.device, DEVICES, text, p, "models.device")
    _choice(models.asr_weights, ASR_WEIGHTS, text, p, "models.asr_weights")
    for key in ("threads", "workers"):
        if not 1 <= getattr(models, key) <= 64:
            raise ConfigError(p, _line_of(text, "models", key), f"models.{key}", "must be 1..64")
    if not 0 <= models.phrase_cache_mb <= 4096:
        line = _line_of(text, "models", "phrase_cache_mb")
        raise ConfigError(p, line, "models.phrase_cache_mb", "must be 0..4096")
    if not 0 <= models.nice <= 19:
        raise ConfigError(p, _line_of(text, "models", "nice"), "models.nice", "must be 0..19")
    if models.dir and not Path(models.dir).is_absolute():
        models = replace(models, dir=str(Path(p).resolve().parent / models.dir))
    log_cfg = LogConfig(**data.get("log", {}))
    _choice(log_cfg.format, LOG_FORMATS, text, p, "log.format")
    _choice(log_cfg.level, LOG_LEVELS, text, p, "log.level")
    return BridgeConfig(
        log=log_cfg,
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
        http=http,
        transfer=transfer,
        load=load,
        inbound=inbound,
        control=control,
        path=p,
        warnings=warnings,
    )


def _unused_profile(
    profile: str | None, agent: AgentConfig, routes: tuple[RouteConfig, ...], text: str, p: str
) -> tuple[str, ...]:
    """A profile written into the file that no call would use: the operator meant the
    voice agent to answer and another one will (an empty [agent] name is "voice")."""
    if profile is None:
        return ()
    used = BridgeConfig(agent=agent, routes=routes).agent_configs()
    if any(c.agent.name == "voice" and c.agent.voice_profile == agent.voice_profile for c in used):
        return ()
    line = _line_of(text, "agent", "name")
    where = f"{p}:{line}" if line else p
    return (
        f"{where}: agent.name = {agent.name!r}: agent.voice.profile "
        f'({agent.voice_profile}) answers no call; set agent.name = "voice" (or a route '
        'agent = "voice") to use it',
    )

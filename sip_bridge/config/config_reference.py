"""config/REFERENCE.md, generated from the schema the loader checks against.

Why generated: a hand-written list of keys drifts from the code. Types and defaults come
from the schema (``config._SCHEMA``, ``trunks.TRUNK_KEYS``, ``routes.ROUTE_KEYS``) and the
config dataclasses; only the one-line meanings live here, and ``tests/test_config_reference.py``
fails when a key has none or when the file differs from what this prints.

    .venv/bin/python -m sip_bridge.config.config_reference > config/REFERENCE.md
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from agent.voice_settings import ModelSettings, VoiceSettings
from sip_bridge.config import loader as c
from sip_bridge.config.routes import ROUTE_KEYS, RouteConfig
from sip_bridge.config.trunks import TRUNK_KEYS, TrunkConfig

__all__ = ["MEANINGS", "render"]

MEANINGS: dict[str, str] = {
    "sip.listen": 'where SIP is received, `HOST:PORT` (IPv6 `"[::1]:5060"`)',
    "sip.transports": '`["udp", "tcp"]` or one of them, on the listen port',
    "sip.external_address": "address put in Contact, Via and SDP `c=`/`o=` (behind NAT); "
    "empty: the listen address",
    "sip.max_calls": "concurrent calls; one more gets 503 with Retry-After",
    "sip.retry_after_s": "Retry-After of a 503",
    "sip.user_agent": "User-Agent and Server header",
    "sip.answer_after_s": "ring (180) this long before answering, 0..60",
    "sip.max_call_s": "hang up after this long; 0 = no limit",
    "sip.drain_s": "SIGTERM: calls in progress may go on this long, new ones get 503",
    "sip.srtp": "SDES-SRTP for calls no trunk claims: `off`, `optional`, `required`",
    "sip.timers": "RFC 3261 timer base values (table)",
    "sip.tls": "SIP over TLS listener (table)",
    "sip.timers.t1": "RTT estimate, s (Timers A, B, E, F, G, H, J derive from it)",
    "sip.timers.t2": "longest retransmit interval for non-INVITE requests and INVITE responses, s",
    "sip.timers.t4": "longest time a message stays in the network, s",
    "sip.tls.port": "TLS listener port; 0 = no TLS",
    "sip.tls.certificate": "our certificate chain (PEM), relative to the file",
    "sip.tls.private_key": "its unencrypted private key (PEM)",
    "sip.tls.ca_file": "CAs that sign peers' certificates; empty: the system's",
    "sip.tls.verify_peer": "demand and check peers' certificates",
    "rtp.ports": "even ports of this range carry RTP, one per call",
    "rtp.symmetric": '`"off"`, `"auto"` (latch when the SDP address is private) or `"on"`',
    "rtp.timeout_s": "no RTP for this long from a peer that should send: BYE; 0 = never",
    "jitter.min_delay_ms": "the adaptive jitter buffer's lowest delay",
    "jitter.max_delay_ms": "its highest delay",
    "agent.name": "`voice`, `speech_model`, `echo`, `tone` or `playback`",
    "agent.voice": "the voice agent's turn-taking (table)",
    "agent.speech_model": "your speech-to-speech ONNX model (table)",
    "agent.echo": "the echo line check (table)",
    "agent.tone": "the tone line check (table)",
    "agent.playback": "the WAV line check (table)",
    "agent.model_timeout_s": "a model run (ASR, turn, TTS) still going after this long is a "
    "model fault of its call, as is one that raises; 0 = no limit, up to 600",
    "agent.fallback_prompt": "what a caller hears after a model fault: mono 16-bit WAV at "
    "8/16/24 kHz, relative to the file; empty: nothing",
    "agent.on_model_fault": '`"hangup"` (BYE after the prompt) or `"transfer"` (REFER)',
    "agent.fault_transfer_to": 'where `"transfer"` sends the caller: a `sip:` URI or a number',
    "agent.voice.profile": "the dialogue (config/agents/README.md), relative to the file",
    "agent.voice.echo_canceller": "take our line echo out and decide barge-in on what is "
    "left (false: the old loudness rule)",
    "agent.voice.echo_margin_db": "barge-in: the caller must be this much above the echo left",
    "agent.voice.turn_threshold": "smart-turn probability that ends a turn at a pause",
    "agent.voice.pause_ms": "silence after speech before smart-turn is asked",
    "agent.voice.max_silence_ms": "silence that ends a turn whatever the model says",
    "agent.voice.min_speech_ms": "speech shorter than this is not a turn",
    "agent.voice.speculate": "prepare the reply during the pause",
    "agent.speech_model.path": "the .onnx file, relative to the file",
    "agent.speech_model.input": "its audio input's name",
    "agent.speech_model.output": "its audio output's name",
    "agent.speech_model.sample_rate": "the rate it hears and speaks",
    "agent.speech_model.frame_samples": "samples per run",
    "agent.speech_model.state": "`[[input, output], ...]` state carried between runs",
    "agent.speech_model.batch": "a leading batch axis: one run per tick for all calls",
    "agent.echo.delay_s": "how late the caller hears themselves, 0..10 s",
    "agent.tone.freq_hz": "20..3400 Hz",
    "agent.tone.level_dbfs": "-60..0 dBFS",
    "agent.playback.file": "8-48 kHz 16-bit WAV, relative to the file",
    "agent.playback.loop": "play it again and again",
    "agent.playback.hangup_at_end": "hang up when it ends",
    "models.dir": "the model store; empty: `$SIP_BRIDGE_MODELS`, else ~/.cache/sip-bridge/models",
    "models.device": '`"auto"` (CUDA when there), `"cuda"` (refuse without) or `"cpu"`',
    "models.threads": (
        "threads of each ASR, end-of-turn and TTS session, 1..64; `workers` x `threads`: "
        "about the cores the models may have"
    ),
    "models.workers": "model jobs of all calls running at once, 1..64",
    "models.batch_vad": "one VAD run per tick for all calls",
    "models.phrase_cache_mb": (
        "MB of rendered speech kept: the profiles' fixed phrases, rendered once; 0 = off"
    ),
    "models.nice": (
        "how much nicer the model threads run than the media loop (0..19), so that a burst of "
        "model runs never makes calls' frames late; 0 = the same priority"
    ),
    "models.asr_weights": (
        '`"int8"` or `"float"` (as shipped): the speech recogniser\'s decoder with 8-bit '
        "weights, the same word error rate for 29 % less ASR CPU (a GPU runs the float one)"
    ),
    "inbound.rate_per_s": "INVITEs per second per source (not a trunk's); 0 = no limit",
    "inbound.burst": "INVITEs a source may send at once",
    "inbound.silence_after": "refusals in a row (401/403/503) after which a source's datagrams "
    "are dropped unread; 0 = never",
    "inbound.silence_s": "how long such a source must be quiet to be answered again",
    "control.socket": "Unix socket `sip-bridge status` reads; empty: `sip-bridge-<port>.sock` in"
    " `$RUNTIME_DIRECTORY` (systemd's RuntimeDirectory), else in the temp dir",
    "control.reload_on_change": "reload when the file or a profile it names changes",
    "node.name": "this bridge in call records and event topics; empty: the host name",
    "records.enabled": "call records in SQLite (`sip-bridge calls list|show`)",
    "records.db": "empty: `$SIP_BRIDGE_DATA/calls.sqlite`, else ~/.local/share/sip-bridge/",
    "records.recordings_dir": "a stereo WAV per call here (caller left, agent right); empty: off",
    "records.keep_days": "calls (row, turns, events) and recordings older than this are purged"
    " at start and daily; 0 = kept forever (docs/callers-data.md)",
    "records.redact_card_numbers": "mask card numbers (Luhn-valid 13-19 digits, written, spoken"
    " or keyed) in records, events and logs",
    "metrics.listen": "`HOST:PORT` of `/metrics` and `/healthz`; empty: off",
    "http.listen": "`HOST:PORT` of the talk page (`/talk`) and the operator console"
    " (`/console`); empty: off",
    "http.ice_addresses": "IP addresses WebRTC media may use (host candidates, never STUN);"
    " empty: the listen address, or every host address when listening on `0.0.0.0`/`::`",
    "http.operator_token_env": "environment variable holding the operator token (reads and acts:"
    " hang up, transfer, say; named after the variable); none: the console is read-only",
    "http.operator_token_file": "a file (relative to this file) of operator tokens, one a line"
    " (`NAME TOKEN` or `TOKEN`), instead of `operator_token_env`; at least 16 characters each",
    "http.viewer_token_env": "environment variable holding a viewer token: reads calls,"
    " transcripts, recordings; needed (or an operator token) on a non-loopback listen",
    "http.viewer_token_file": "a file of viewer tokens, one a line (`NAME TOKEN` or `TOKEN`),"
    " instead of `viewer_token_env`",
    "http.allow_anonymous_reads": "on a non-loopback listen, let anyone read without a token"
    " (logged at start); false: the bridge refuses to start without a token",
    "http.max_sessions": "browser sessions at once (1..1000); more get 503",
    "http.token_ttl_s": "seconds a talk page may start sessions with its page token (10..86400)",
    "mqtt.enabled": "call events out and commands in over MQTT",
    "mqtt.host": "the broker",
    "mqtt.port": "its port",
    "mqtt.username": "empty: anonymous",
    "mqtt.password_env": "environment variable holding the password",
    "mqtt.spool_dir": "events wait here while the broker is away",
    "mqtt.keepalive_s": "MQTT keepalive, 5..3600 s",
    "log.format": '`"text"` (lines for a person) or `"json"` (one object per line, with'
    " `call_id` on every line about a call)",
    "log.level": '`"debug"`, `"info"`, `"warning"` or `"error"`; `sip-bridge run -v`: at least'
    " info",
    "transfer.timeout_s": "a transfer (REFER) with no final report this long after it is sent"
    " has failed: the agent takes the caller back (`transfer_failed`), 1..300 s",
    "transfer.hold_audio": "what the caller hears while the target rings: a 16-bit WAV"
    " (8-48 kHz, looped), relative to the file; empty: ringback (440+480 Hz, 2 s on, 4 s off);"
    " a profile's `[transfer] hold_audio` comes first",
    "load.shed": "over budget, new INVITEs and the dispatcher's OPTIONS probe get 503 +"
    " Retry-After (calls in progress go on); false: measure and show only",
    "load.turn_p95_ms": "over budget: the p95 of the last `window_s`'s turns above this, ms"
    " (100..60000)",
    "load.cpu_pct": "over budget: the node's CPUs busier than this on average, % (1..100)",
    "load.window_s": "the turns of this long ago count, s (5..3600)",
    "load.cpu_window_s": "the CPU is averaged over this long, s (1..600)",
    "load.min_turns": "fewer turns in the window decide nothing (1..100000)",
    "load.resume_at": "the ceiling rises (and over budget ends) when both figures are under"
    " this fraction of their budgets (0.1..0.95)",
    "load.hold_s": "the ceiling moves at most this often; over budget lasts at least this long,"
    " s (0..3600)",
    "load.slow_start_calls": "calls answered in the last `cpu_window_s` may number this many or"
    " as many as the calls older than that, whichever is more; 0: no slow start (0..100000)",
    "trunks.name": "required, unique: logs, status, records, routes",
    "trunks.registrar": "`host[:port]` or URI to register at; empty: no registration",
    "trunks.username": "user part of our address-of-record (often the DID)",
    "trunks.auth_username": "digest user when it differs from username",
    "trunks.domain": "the AOR's domain; empty: the registrar's host",
    "trunks.password_env": "environment variable holding the password",
    "trunks.password_file": "file holding it (first line), relative to the file",
    "trunks.expires_s": "registration lifetime asked for, 60..86400",
    "trunks.transport": "`udp`, `tcp` or `tls`",
    "trunks.acl": "source CIDRs whose INVITEs are this trunk's",
    "trunks.inbound_auth": "challenge this trunk's INVITEs with digest",
    "trunks.realm": "realm of our challenges",
    "trunks.auth_algorithms": 'challenges offered, in order: `"SHA-256"`, `"MD5"`',
    "trunks.srtp": "SDES-SRTP: `off`, `optional` (if offered), `required` (488 without)",
    "trunks.srtp_without_tls": "allow `srtp = required` without TLS (keys in clear SIP)",
    "routes.name": "required, unique",
    "routes.called": "pattern on the called number (Request-URI user part)",
    "routes.caller": "pattern on the caller (From user part)",
    "routes.trunk": "the call came through this trunk",
    "routes.header": "a SIP header the INVITE must carry",
    "routes.header_value": "pattern its value must match",
    "routes.agent": "the agent that answers; default `[agent] name` (`voice` with a profile)",
    "routes.profile": "the voice agent's profile for these calls",
}

# where a key's default lives when the dataclass field is named otherwise
_FIELD = {
    "agent.voice.profile": (c.AgentConfig, "voice_profile"),
    "agent.echo.delay_s": (c.AgentConfig, "echo_delay_s"),
    "agent.tone.freq_hz": (c.AgentConfig, "tone_freq_hz"),
    "agent.tone.level_dbfs": (c.AgentConfig, "tone_level_dbfs"),
    "agent.playback.file": (c.AgentConfig, "playback_file"),
    "agent.playback.loop": (c.AgentConfig, "playback_loop"),
    "agent.playback.hangup_at_end": (c.AgentConfig, "playback_hangup_at_end"),
}
_CLASS: dict[str, type] = {
    "sip": c.SipConfig, "sip.timers": c.TimersConfig, "sip.tls": c.TlsConfig,
    "rtp": c.RtpConfig, "jitter": c.JitterConfig, "agent": c.AgentConfig,
    "agent.voice": VoiceSettings, "agent.speech_model": c.SpeechModelConfig,
    "models": ModelSettings, "inbound": c.InboundConfig, "control": c.ControlConfig,
    "node": c.NodeConfig, "records": c.RecordsConfig, "metrics": c.MetricsConfig,
    "mqtt": c.MqttConfig, "http": c.HttpConfig, "log": c.LogConfig, "trunks": TrunkConfig,
    "routes": RouteConfig, "transfer": c.TransferConfig, "load": c.LoadConfig,
    "agent.echo": c.AgentConfig, "agent.tone": c.AgentConfig, "agent.playback": c.AgentConfig,
}  # fmt: skip


def _default(section: str, key: str) -> str:
    cls, name = _FIELD.get(f"{section}.{key}", (_CLASS[section], key))
    for f in dataclasses.fields(cls):
        if f.name != name:
            continue
        if f.default is not dataclasses.MISSING:
            value: Any = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            return "required"
        if dataclasses.is_dataclass(value) or value is None:
            return "(table)"
        if name == "voice_profile":
            return "the demo profile"
        if name == "fallback_prompt":
            return "`prompts/technical_difficulty.wav`"
        if isinstance(value, tuple):
            value = list(value)
        return f"`{_toml(value)}`"
    return "required"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


def _type(types: tuple[type, ...]) -> str:
    names = {int: "integer", float: "number", str: "string", bool: "boolean", list: "list",
             dict: "table"}  # fmt: skip
    if types == (int, float):
        return "number"
    return " or ".join(names[t] for t in types)


def _sections() -> list[tuple[str, dict[str, tuple[type, ...]]]]:
    out = [(s, keys) for s, keys in c._SCHEMA.items() if keys]
    return [*out, ("trunks", TRUNK_KEYS), ("routes", ROUTE_KEYS)]


def render() -> str:
    lines = [
        "# bridge.toml reference",
        "",
        "Every key the bridge accepts; any other key is an error (file, line and key named).",
        "Generated by `python -m sip_bridge.config.config_reference` from the schema the loader",
        "checks; `tests/test_config_reference.py` keeps it true. The commented",
        "[`bridge.toml`](bridge.toml) shows them in use; agent profiles:",
        "[`agents/README.md`](agents/README.md).",
    ]
    for section, keys in _sections():
        header = f"[[{section}]]" if section in ("trunks", "routes") else f"[{section}]"
        lines += ["", f"## `{header}`", "", "| key | type | default | meaning |",
                  "| --- | --- | --- | --- |"]  # fmt: skip
        for key, types in keys.items():
            meaning = MEANINGS.get(f"{section}.{key}")
            if meaning is None:
                raise KeyError(f"{section}.{key} has no meaning in MEANINGS")
            lines.append(f"| `{key}` | {_type(types)} | {_default(section, key)} | {meaning} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


REFERENCE = Path(__file__).resolve().parents[2] / "config" / "REFERENCE.md"

if __name__ == "__main__":
    sys.exit(main())

"""The checks of the config sections that need more than a type: [http], the [agent]
model-fault keys, [agent.speech_model], [agent.voice] and [sip.tls]. Each takes the raw
section (or its dataclass), the file's text and path, and raises a :class:`ConfigError`
naming the file, line and key. The loader is :mod:`sip_bridge.config.loader`."""

from __future__ import annotations

import ipaddress
import os
import re
import wave
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.dialogue.transfer_target import target_problem
from agent.voice_settings import VoiceSettings
from agent.wav_format import describe_wav, unsupported_wav
from sip_bridge.config.config_types import (
    MODEL_FAULT_ACTIONS,
    TOKEN_ROLES,
    AgentConfig,
    ConfigError,
    HttpConfig,
    HttpToken,
    LoadConfig,
    SpeechModelConfig,
    TlsConfig,
    TransferConfig,
    _check_hostport,
    _choice,
    _line_of,
    exposure_problem,
    is_file,
)

__all__ = [
    "build_http",
    "build_load",
    "build_model_fault",
    "build_speech_model",
    "build_tls",
    "build_transfer",
    "build_voice",
]


def build_http(section: dict[str, Any], text: str, p: str) -> HttpConfig:
    """[http]: addresses checked, the tokens read now (never kept in the file), and a
    listener others can reach refused unless reading there needs a token or
    ``allow_anonymous_reads`` says it need not."""

    def fail(key: str, why: str) -> ConfigError:
        return ConfigError(p, _line_of(text, "http", key), f"http.{key}", why)

    h = HttpConfig(**{**section, "ice_addresses": tuple(section.get("ice_addresses", ()))})
    if h.listen:
        _check_hostport(h.listen, p, _line_of(text, "http", "listen"), "http.listen")
    for a in h.ice_addresses:
        try:
            ipaddress.ip_address(a)
        except (ValueError, TypeError):
            raise fail("ice_addresses", f"{a!r} is not an IP address") from None
    if not 1 <= h.max_sessions <= 1000:
        raise fail("max_sessions", "must be 1..1000")
    if not 10 <= h.token_ttl_s <= 86400:
        raise fail("token_ttl_s", "must be 10..86400 s")
    tokens: list[HttpToken] = []
    for role in TOKEN_ROLES:
        env, file = getattr(h, f"{role}_token_env"), getattr(h, f"{role}_token_file")
        if env and file:
            raise fail(f"{role}_token_file", f"give {role}_token_env or {role}_token_file")
        if env:
            secret = os.environ.get(env, "").strip()
            if not secret:
                raise fail(f"{role}_token_env", f"{env} is not set")
            tokens.append(HttpToken(env, role, secret))
        elif file:
            tokens += _token_file(Path(p).resolve().parent / file, role, fail)
    names: dict[str, HttpToken] = {}
    for t in tokens:
        key = f"{t.role}_token_env" if getattr(h, f"{t.role}_token_env") else f"{t.role}_token_file"
        if len(t.secret) < 16:
            raise fail(key, f"the {t.role} token {t.name!r} must have at least 16 characters")
        if t.name in names or any(t.secret == o.secret for o in names.values()):
            raise fail(key, f"token {t.name!r}: each token needs a name and a secret of its own")
        names[t.name] = t
    h = replace(h, tokens=tuple(tokens))
    problem = exposure_problem(h)
    if problem:
        raise ConfigError(p, _line_of(text, "http", "listen"), "http.viewer_token_env", problem)
    return h


_TOKEN_NAME = re.compile(r"[\w.@+-]{1,64}")


def _token_file(f: Path, role: str, fail: Callable[[str, str], ConfigError]) -> list[HttpToken]:
    """A token file: one token a line, ``NAME TOKEN`` or just ``TOKEN`` (named after the
    file); blank lines and ``#`` comments skipped."""
    key = f"{role}_token_file"
    try:
        lines = f.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        raise fail(key, f"cannot read a token from {f}") from None
    out = []
    for n, raw in enumerate(lines, 1):
        words = raw.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) > 2 or (len(words) == 2 and not _TOKEN_NAME.fullmatch(words[0])):
            raise fail(key, f"{f}:{n}: expected TOKEN or NAME TOKEN")
        name = words[0] if len(words) == 2 else f.name
        out.append(HttpToken(name, role, words[-1]))
    if not out:
        raise fail(key, f"cannot read a token from {f}")
    return out


def build_model_fault(a: AgentConfig, text: str, p: str) -> AgentConfig:
    """[agent] model fault keys. The prompt is checked now (mono 16-bit WAV at 8, 16 or
    24 kHz), not when a model fails mid-call and the caller is waiting for it."""
    if not 0 <= a.model_timeout_s <= 600:
        line = _line_of(text, "agent", "model_timeout_s")
        raise ConfigError(p, line, "agent.model_timeout_s", "must be 0 (no limit) .. 600 s")
    _choice(a.on_model_fault, MODEL_FAULT_ACTIONS, text, p, "agent.on_model_fault")
    target = a.fault_transfer_to.strip()
    if a.on_model_fault == "transfer" and not target:
        line = _line_of(text, "agent", "on_model_fault")
        raise ConfigError(p, line, "agent.fault_transfer_to", "is required with on_model_fault"
                          ' = "transfer"')  # fmt: skip
    if target and (why := target_problem(target)):
        line = _line_of(text, "agent", "fault_transfer_to")
        raise ConfigError(p, line, "agent.fault_transfer_to", why)
    prompt = a.fallback_prompt
    if prompt:
        f = Path(prompt)
        f = f if f.is_absolute() else Path(p).resolve().parent / f  # relative to the file
        problem = _prompt_problem(f)
        if problem:
            line = _line_of(text, "agent", "fallback_prompt")
            raise ConfigError(p, line, "agent.fallback_prompt", problem)
        prompt = str(f)
    return replace(a, model_timeout_s=float(a.model_timeout_s), fallback_prompt=prompt,
                   fault_transfer_to=target)  # fmt: skip


def build_transfer(section: dict[str, Any], text: str, p: str) -> TransferConfig:
    """[transfer]: the wait for a transfer's outcome, and what the caller hears meanwhile
    (a WAV checked now: 16-bit PCM, mono or stereo, any rate the player resamples)."""
    t = TransferConfig(**section)
    if not 1 <= t.timeout_s <= 300:
        line = _line_of(text, "transfer", "timeout_s")
        raise ConfigError(p, line, "transfer.timeout_s", "must be 1..300 s")
    hold = t.hold_audio
    if hold:
        f = Path(hold)
        f = f if f.is_absolute() else Path(p).resolve().parent / f  # relative to the file
        problem = _wav_problem(f, rates=None, mono=False)
        if problem:
            line = _line_of(text, "transfer", "hold_audio")
            raise ConfigError(p, line, "transfer.hold_audio", problem)
        hold = str(f)
    return replace(t, timeout_s=float(t.timeout_s), hold_audio=hold)


#: [load] key -> (lowest, highest) allowed
LOAD_RANGES: dict[str, tuple[float, float]] = {
    "turn_p95_ms": (100, 60_000),
    "cpu_pct": (1, 100),
    "window_s": (5, 3600),
    "cpu_window_s": (1, 600),
    "min_turns": (1, 100_000),
    "resume_at": (0.1, 0.95),  # below 1: a band under the budgets
    "hold_s": (0, 3600),
    "slow_start_calls": (0, 100_000),
}


def build_load(section: dict[str, Any], text: str, p: str) -> LoadConfig:
    """[load]: every budget in its range; ``resume_at`` below 1, a band under the budgets
    so that a node does not flap at its budget."""
    load = LoadConfig(**section)
    for key, (low, high) in LOAD_RANGES.items():
        if not low <= getattr(load, key) <= high:
            why = f"must be {low:g}..{high:g}"
            raise ConfigError(p, _line_of(text, "load", key), f"load.{key}", why)
    return load


def _prompt_problem(f: Path) -> str:
    """What is wrong with a fallback prompt file ("" when nothing)."""
    return _wav_problem(f, rates=(8000, 16000, 24000), mono=True)


def _wav_problem(f: Path, *, rates: tuple[int, ...] | None, mono: bool) -> str:
    """What is wrong with a WAV the bridge plays ("" when nothing)."""
    if not is_file(f):
        return f"no such file: {f}"
    try:
        with wave.open(str(f), "rb") as w:
            shape = (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes())
    except (wave.Error, EOFError, OSError):  # "unknown format: 65534": say it in words
        return f"{f}: {unsupported_wav(f)}"
    channels, width, rate, frames = shape
    bad_rate = rate not in rates if rates else not 8000 <= rate <= 48000
    if channels not in ((1,) if mono else (1, 2)) or width != 2 or bad_rate or frames == 0:
        got = f"{channels} channel(s), {describe_wav(f)}, {rate} Hz, {frames} samples"
        need = "mono" if mono else "mono or stereo"
        at = "8, 16 or 24 kHz" if rates else "8-48 kHz"
        return f"{f}: need {need} 16-bit PCM at {at} with audio, got {got}"
    return ""


def build_speech_model(sm: dict[str, Any] | None, text: str, p: str) -> SpeechModelConfig | None:
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
    if not is_file(f):
        raise ConfigError(p, _line_of(text, sec, "path"), f"{sec}.path", f"no such file: {f}")
    return SpeechModelConfig(**{**sm, "path": str(f), "state": tuple(pairs)})


def build_voice(voice: dict[str, Any], text: str, p: str) -> VoiceSettings:
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


def build_tls(tls: TlsConfig, text: str, p: str) -> TlsConfig:
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
        if not is_file(f):
            raise ConfigError(p, line, f"sip.tls.{key}", f"no such file: {f}")
        found[key] = str(f)
    return replace(
        tls,
        certificate=found["certificate"],
        private_key=found["private_key"],
        ca_file=found["ca_file"],
    )

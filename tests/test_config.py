"""The operator's file: defaults load, and every mistake names file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from sip_bridge.config.loader import BridgeConfig, ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_default_is_valid_and_equals_the_built_in_defaults() -> None:
    cfg = load_config(ROOT / "config" / "bridge.toml")
    builtin = BridgeConfig()
    assert cfg.sip == builtin.sip
    assert cfg.rtp == builtin.rtp
    assert cfg.jitter == builtin.jitter
    # the shipped file answers with the voice agent, as do the built-in defaults (key by
    # key: test_config_defaults.py); BridgeConfig.line_check() is the model-free echo agent
    assert cfg.agent.name == builtin.agent.name == "voice"
    assert cfg.agent == builtin.agent
    assert cfg.models == builtin.models
    assert cfg.load == builtin.load and not cfg.load.shed  # measured, shown, not shedding
    assert cfg.sip.listen_port == 5060
    assert cfg.rtp.port_range == (20000, 20999)


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bridge.toml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("text", "line", "key", "words"),
    [
        ('[sip]\nlisten = "127.0.0.1:5060"\nmax_call = 3\n', 3, "sip.max_call", "unknown key"),
        ("[sipp]\nlisten = 1\n", 1, "sipp", "unknown section"),
        ('[sip]\n\nmax_calls = "ten"\n', 3, "sip.max_calls", "expected int"),
        ('[sip]\nlisten = "localhost"\n', 2, "sip.listen", "HOST:PORT"),
        ('[sip]\nlisten = "127.0.0.1:70000"\n', 2, "sip.listen", "out of range 0-65535"),
        ('[sip]\ntransports = ["udp", "sctp"]\n', 2, "sip.transports", "not one of udp, tcp"),
        ('[sip]\nexternal_address = "0.0.0.0"\n', 2, "sip.external_address", "wildcard"),
        ("[sip.timers]\nt1 = 0\n", 2, "sip.timers.t1", "> 0"),
        ('[rtp]\nports = "30000-20000"\n', 2, "rtp.ports", "LOW < HIGH"),
        ('[rtp]\nsymmetric = "maybe"\n', 2, "rtp.symmetric", "off, auto, on"),
        ('[models]\ndevice = "tpu"\n', 2, "models.device", "not one of auto, cuda, cpu"),
        ("[models]\nthreads = 0\n", 2, "models.threads", "must be 1..64"),
        ('[models]\n\nasr_weights = "int4"\n', 3, "models.asr_weights", "not one of float, int8"),
        ("[agent.voice]\necho_margin_db = 90\n", 2, "agent.voice.echo_margin_db", "must be 0..60"),
        ('[agent.voice]\nprofile = "nope.toml"\n', 2, "agent.voice.profile", "no such file"),
        ("[agent.voice]\nbarge_ms = 1\n", 2, "agent.voice.barge_ms", "unknown key"),
        (
            "[agent.voice]\npause_ms = 900\nmax_silence_ms = 500\n",
            3,
            "agent.voice.max_silence_ms",
            "must be >= pause_ms",
        ),
        ('[agent]\nname = "eliza"\n', 2, "agent.name", "not one of voice, speech_model, echo"),
        ("[agent.echo]\ndelay_s = 99\n", 2, "agent.echo.delay_s", "0..10"),
        ("[sip]\nanswer_after_s = 61\n", 2, "sip.answer_after_s", "0..60"),
        ("[agent.tone]\nfreq_hz = 5000\n", 2, "agent.tone.freq_hz", "20..3400"),
        ("[agent.playback]\nloop = 1\n", 2, "agent.playback.loop", "expected bool"),
        ('[agent]\nname = "playback"\n', 2, "agent.playback.file", "is required"),
        ('[agent.playback]\nfile = "missing.wav"\n', 2, "agent.playback.file", "no such file"),
        ("[sip]\nmax_call_s = -1\n", 2, "sip.max_call_s", ">= 0"),
        ('[http]\nlisten = "8088"\n', 2, "http.listen", "HOST:PORT"),
        ('[http]\n\nice_addresses = ["eth0"]\n', 3, "http.ice_addresses", "not an IP address"),
        ("[http]\nmax_sessions = 0\n", 2, "http.max_sessions", "1..1000"),
        ('[http]\noperator_token = "x"\n', 2, "http.operator_token", "unknown key"),
        (
            '[http]\noperator_token_env = "SB_NOT_SET_ANYWHERE"\n',
            2,
            "http.operator_token_env",
            "SB_NOT_SET_ANYWHERE is not set",
        ),
        (
            '[http]\noperator_token_file = "none.txt"\n',
            2,
            "http.operator_token_file",
            "cannot read a token",
        ),
        ("[load]\nshed = true\nturn_p95_ms = 50\n", 3, "load.turn_p95_ms", "100..60000"),
        ("[load]\ncpu_pct = 120\n", 2, "load.cpu_pct", "must be 1..100"),
        ("[load]\nresume_at = 1.0\n", 2, "load.resume_at", "0.1..0.95"),
        ('[load]\nshed = "yes"\n', 2, "load.shed", "expected bool"),
        ("[load]\nbudget_ms = 900\n", 2, "load.budget_ms", "unknown key"),
        ("[sip\nlisten=1\n", 1, "syntax", ""),
    ],
)
def test_errors_name_file_line_and_key(
    tmp_path: Path, text: str, line: int, key: str, words: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    e = err.value
    assert (e.path, e.line, e.key) == (str(path), line, key)
    assert str(e).startswith(f"{path}:{line}: {key}: ")
    assert words in str(e)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.toml")


def test_command_line_overrides_are_validated() -> None:
    cfg = BridgeConfig().with_overrides(
        listen="[::1]:5070", agent="echo", rtp_ports="40000-40100", max_calls=2
    )
    assert (cfg.sip.listen_host, cfg.sip.listen_port) == ("::1", 5070)
    assert cfg.sip.advertised_host == "::1"
    assert cfg.rtp.port_range == (40000, 40100)
    assert cfg.sip.max_calls == 2
    with pytest.raises(ConfigError, match="--rtp-ports"):
        BridgeConfig().with_overrides(rtp_ports="5-6")
    with pytest.raises(ConfigError, match="--agent"):
        BridgeConfig().with_overrides(agent="nobody")
    assert BridgeConfig().with_overrides(metrics="127.0.0.1:0").metrics.listen == "127.0.0.1:0"
    on = BridgeConfig().with_overrides(metrics="127.0.0.1:9464")
    assert on.with_overrides(metrics="off").metrics.listen == ""
    with pytest.raises(ConfigError, match="--metrics"):
        BridgeConfig().with_overrides(metrics="9464")


def test_line_check_agents_from_the_file(tmp_path: Path) -> None:
    import wave

    import numpy as np

    from agent import EchoAgent, PlaybackAgent, ToneAgent
    from sip_bridge.server import make_agent

    with wave.open(str(tmp_path / "prompt.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(np.zeros(800, "<i2").tobytes())
    cfg = load_config(
        _write(
            tmp_path,
            '[agent]\nname = "playback"\n[agent.playback]\nfile = "prompt.wav"\nloop = true\n',
        )
    )
    assert cfg.agent.playback_file == str(tmp_path / "prompt.wav")  # relative to the file
    playback = make_agent(cfg)
    assert isinstance(playback, PlaybackAgent) and playback.duration_s == 0.1
    tone = make_agent(
        load_config(_write(tmp_path, '[agent]\nname = "tone"\n[agent.tone]\nfreq_hz = 440\n'))
    )
    assert isinstance(tone, ToneAgent)
    assert isinstance(make_agent(BridgeConfig.line_check()), EchoAgent)


def test_the_operator_token_comes_from_a_file_or_the_environment_never_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "op.token").write_text("a-long-enough-operator-token\n")
    cfg = load_config(
        _write(tmp_path, '[http]\nlisten = "127.0.0.1:0"\noperator_token_file = "op.token"\n')
    )
    assert cfg.http.operator_token == "a-long-enough-operator-token"
    monkeypatch.setenv("SB_OPERATOR", "short")
    with pytest.raises(ConfigError, match="at least 16 characters"):
        load_config(_write(tmp_path, '[http]\noperator_token_env = "SB_OPERATOR"\n'))
    assert BridgeConfig().with_overrides(http="off").http.listen == ""
    with pytest.raises(ConfigError, match="--http"):
        BridgeConfig().with_overrides(http="8088")

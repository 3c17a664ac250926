"""[log]: text or one JSON object per line, at a level; a JSON line about a call carries
that call's id, however far from the server the line was written (an agent, a task it
started), and never another call's."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from agent.base import Agent
from agent.lines.echo import EchoAgent
from sip_bridge import logs
from sip_bridge.config.loader import BridgeConfig, ConfigError, parse_config_text
from sip_bridge.script.caller import CallOptions, place_call
from sip_bridge.server import BridgeServer
from testkit.sipp_media import tone, write_wav

log = logging.getLogger("tests.chatty")


def _record(msg: str, *args: object, **attrs: Any) -> logging.LogRecord:
    rec = logging.LogRecord("x.y", logging.INFO, __file__, 1, msg, args, None)
    rec.__dict__.update(attrs)
    return rec


def test_a_json_line_has_the_fields_a_collector_reads() -> None:
    fmt = logs.JsonFormatter()
    line = json.loads(fmt.format(_record("model %s loaded in %.1f s", "vad", 1.25)))
    assert line["msg"] == "model vad loaded in 1.2 s" and line["level"] == "INFO"
    assert line["logger"] == "x.y" and line["ts"].endswith("+00:00") and "call_id" not in line
    try:
        raise RuntimeError("boom ✓")
    except RuntimeError:
        rec = _record("failed")
        rec.exc_info = sys.exc_info()
    text = fmt.format(rec)
    assert "\n" not in text  # one line, the traceback inside it
    assert "RuntimeError: boom ✓" in json.loads(text)["exc"]


def test_a_text_line_starts_with_the_local_time_in_iso_8601_with_its_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One timestamp format everywhere: the CLI's and the console's (local, with the zone)."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        rec = _record("answered")
        rec.created = 1795618800.25  # 2026-11-25T15:00:00.250 UTC
        line = logs.TextFormatter().format(rec)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert line == "2026-11-25T20:30:00.250+05:30 INFO x.y: answered", line


def test_the_call_id_comes_from_extra_the_message_or_the_context() -> None:
    fmt = logs.JsonFormatter()

    def call_id(rec: logging.LogRecord) -> str | None:
        value: str | None = json.loads(fmt.format(rec)).get("call_id")
        return value

    assert call_id(_record("hello", call_id="c-extra")) == "c-extra"
    assert call_id(_record("call %s answered: %s", "c-msg", "PCMU")) == "c-msg"
    assert call_id(_record("browser %s: agent %s failed", "b-1", "voice")) == "b-1"
    assert call_id(_record("recall %s", "nope")) is None  # only the convention's start
    with logs.call_context("c-ctx"):
        assert call_id(_record("caller: hello")) == "c-ctx"
        assert call_id(_record("call %s ended", "c-other")) == "c-other"  # named wins
        with logs.call_context(None):
            assert call_id(_record("the bridge's own line")) is None
    assert logs.neutral_context().run(logs.CALL_ID.get) is None


def test_card_numbers_never_reach_a_log_line_in_either_format() -> None:
    """[records] redact_card_numbers covers the log: written or spoken, in the message or a
    traceback; a JSON line still names its call. Off, the line is as it was."""
    card = "4111 1111 1111 1111"
    spoken = "four " + "one " * 14 + "one"
    out = {fmt: io.StringIO() for fmt in ("text", "json")}
    root = logging.getLogger()
    handlers = [logs.make_handler(fmt, stream) for fmt, stream in out.items()]
    plain = io.StringIO()
    handlers.append(logs.make_handler("text", plain, redact=False))
    old_level = root.level
    root.setLevel(logging.INFO)
    for h in handlers:
        root.addHandler(h)
    try:
        log.warning("call %s: caller said %s", "c-7", card)
        with logs.call_context("c-8"):
            log.warning("caller: my card is %s", spoken)
            try:
                raise ValueError(f"cannot charge {card}")
            except ValueError:
                log.exception("payment failed")
    finally:
        for h in handlers:
            root.removeHandler(h)
        root.setLevel(old_level)
    for fmt, stream in out.items():
        text = stream.getvalue()
        assert "1111" not in text and "one one" not in text, (fmt, text)
        assert text.count("[redacted 16 digits]") == 3, (fmt, text)
    lines = [json.loads(x) for x in out["json"].getvalue().splitlines()]
    assert [x.get("call_id") for x in lines] == ["c-7", "c-8", "c-8"]
    assert "ValueError: cannot charge [redacted 16 digits]" in lines[2]["exc"]
    assert card in plain.getvalue()  # redact = false: kept


def test_configure_sets_format_and_level() -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        out = io.StringIO()
        logs.configure("json", "warning", stream=out)
        logging.getLogger("t").info("quiet")
        logging.getLogger("t").warning("loud %d", 1)
        (line,) = out.getvalue().splitlines()
        assert json.loads(line)["msg"] == "loud 1"
        out = io.StringIO()
        logs.configure("text", "error", verbose=True, stream=out)  # -v: at least info
        logging.getLogger("t").info("now heard")
        assert out.getvalue().endswith("INFO t: now heard\n")
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])


def test_the_log_section_is_checked() -> None:
    cfg = parse_config_text('[log]\nformat = "json"\nlevel = "debug"\n')
    assert (cfg.log.format, cfg.log.level) == ("json", "debug")
    assert BridgeConfig().log == replace(cfg.log, format="text", level="warning")
    for bad, key in (('format = "xml"', "log.format"), ('level = "loud"', "log.level"),
                     ("colour = true", "log.colour")):  # fmt: skip
        try:
            parse_config_text(f"[log]\n{bad}\n", "b.toml")
        except ConfigError as exc:
            assert exc.key == key and exc.line == 2, exc
        else:
            raise AssertionError(bad)


class ChattyAgent(EchoAgent):
    """An echo agent that logs, the way a real agent does, without naming its call: from
    the media clock (every 25 frames heard) and from a task it starts."""

    count = 0

    def __init__(self) -> None:
        super().__init__(delay_s=0.1, sample_rate=8000)
        ChattyAgent.count += 1
        self.label = f"agent-{ChattyAgent.count}"
        self.frames = 0
        self._task: asyncio.Task[None] | None = None

    def on_audio(self, pcm: NDArray[np.int16]) -> None:
        super().on_audio(pcm)
        self.frames += 1
        if self.frames % 25 == 0:
            log.info("%s heard %d frames", self.label, self.frames)
        if self.frames == 10:
            self._task = asyncio.get_running_loop().create_task(self._later())

    async def _later(self) -> None:
        await asyncio.sleep(0.3)
        log.info("%s: a task it started", self.label)


def test_each_call_s_lines_carry_its_own_id(tmp_path: Path) -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    saved = root.level
    root.setLevel(logging.INFO)
    agents: list[ChattyAgent] = []

    def factory(config: BridgeConfig) -> Agent:
        agents.append(ChattyAgent())
        return agents[-1]

    play = write_wav(tmp_path / "a.wav", tone((440,), 2.0, 0.2))
    base = BridgeConfig.line_check()
    cfg = replace(base, sip=replace(base.sip, listen="127.0.0.1:0"),
                  rtp=replace(base.rtp, ports="47300-47399"))  # fmt: skip

    async def main() -> None:
        server = BridgeServer(cfg, factory)
        await server.start()
        try:
            results = await asyncio.gather(*(
                place_call(CallOptions(
                    f"sip:{user}@127.0.0.1:{server.port}", play, tmp_path / f"{user}.wav",
                    duration_s=2.0, rtp_ports=(low, low + 49),
                ))
                for user, low in (("one", 47400), ("two", 47450))
            ))  # fmt: skip
            assert all(r.answered for r in results)
            for _ in range(50):
                if not server.calls:
                    break
                await asyncio.sleep(0.05)
        finally:
            await server.stop()

    try:
        asyncio.run(main())
    finally:
        root.removeHandler(handler)
        root.setLevel(saved)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(agents) == 2
    for agent in agents:
        assert agent.call is not None
        mine = [x for x in lines if x["msg"].startswith(agent.label)]
        assert len(mine) >= 3 and any("a task it started" in x["msg"] for x in mine), mine
        assert {x.get("call_id") for x in mine} == {agent.call.call_id}, mine
    ids = {a.call.call_id for a in agents if a.call is not None}
    assert len(ids) == 2
    for x in lines:  # a line that names a call is that call's
        named = [i for i in ids if i in x["msg"]]
        if named:
            assert x.get("call_id") == named[0], x

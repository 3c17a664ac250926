"""The LLM path against a real local HTTP server speaking the OpenAI streaming protocol."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent.dialogue.engine import DialogueEngine, Hangup, ReplyPart, Say, Transfer
from agent.dialogue.llm import LlmClient, LlmError
from agent.dialogue.profile import AgentProfile
from agent.dialogue.profile_loader import load_profile

FALLBACK = "Sorry, I didn't catch that."
PROFILE = """\
[agent]
greeting = "Hello."
[variables]
company = "Acme"
[fallback]
replies = ["Sorry, I didn't catch that."]
[intents.human]
keywords = ["person"]
reply = "Putting you through."
transfer = "sip:agent@pbx"
[intents.bye]
keywords = ["goodbye"]
override_llm = true
reply = "Bye."
hangup = true
[llm]
mode = "{mode}"
base_url = "http://127.0.0.1:{port}/v1"
model = "tiny"
api_key_env = "TEST_LLM_KEY"
system_prompt = "You answer calls for {{company}}."
temperature = 0.2
max_tokens = 60
timeout_s = {timeout}
"""


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Server:
    port: int
    requests: list[Request] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    rest_sent: bool = False


Writer = asyncio.StreamWriter
Handler = Callable[[Server, Writer], Awaitable[None]]


async def _serve(handler: Handler) -> tuple[Server, asyncio.Server]:
    srv_state = Server(0)

    async def on_client(reader: asyncio.StreamReader, writer: Writer) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        lines = head.split("\r\n")
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        body = await reader.readexactly(int(headers["content-length"]))
        srv_state.requests.append(Request(lines[0].split()[1], headers, json.loads(body)))
        try:
            await handler(srv_state, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    srv_state.port = server.sockets[0].getsockname()[1]
    return srv_state, server


def _event(text: str) -> bytes:
    data = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return f"data: {json.dumps(data)}\n\n".encode()


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


async def _two_sentences(srv: Server, w: Writer) -> None:
    """Streams the first sentence token by token, then waits until the client has spoken it."""
    w.write(CHUNKED_HEAD)
    w.write(_chunk(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n'))
    for tok in ["We", " open", " at", " nine", " a.m.", " Every", " weekday"]:
        w.write(_chunk(_event(tok)))
        await w.drain()
        await asyncio.sleep(0.01)
    await asyncio.wait_for(srv.release.wait(), 5)
    srv.rest_sent = True
    for tok in [",", " and", " we close", " at five.", " See", " you!"]:
        w.write(_chunk(_event(tok)))
        await asyncio.sleep(0.01)
    w.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await w.drain()


def _profile(tmp_path: Path, port: int, mode: str = "fallback", timeout: float = 2) -> AgentProfile:
    p = tmp_path / "llm.toml"
    p.write_text(PROFILE.format(mode=mode, port=port, timeout=timeout))
    return load_profile(p)


def test_first_sentence_is_spoken_before_the_rest_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_LLM_KEY", "sk-test")

    async def go() -> tuple[list[ReplyPart], list[bool], Server, DialogueEngine]:
        srv, server = await _serve(_two_sentences)
        engine = DialogueEngine(_profile(tmp_path, srv.port))
        engine.played("Hello.")
        parts: list[ReplyPart] = []
        rest_sent_at_part: list[bool] = []
        async for part in engine.respond("When do you open?"):
            rest_sent_at_part.append(srv.rest_sent)
            parts.append(part)
            srv.release.set()  # only now may the server send the rest
        server.close()
        return parts, rest_sent_at_part, srv, engine

    parts, rest_sent_at_part, srv, engine = asyncio.run(go())
    assert parts == [
        Say("We open at nine a.m."),
        Say("Every weekday, and we close at five."),
        Say("See you!"),
    ]
    assert rest_sent_at_part == [False, True, True]
    (req,) = srv.requests
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == "Bearer sk-test"
    assert req.body["stream"] is True and req.body["model"] == "tiny"
    assert req.body["max_tokens"] == 60 and req.body["temperature"] == 0.2
    assert req.body["messages"] == [
        {"role": "system", "content": "You answer calls for Acme."},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "When do you open?"},
    ]
    assert engine.misses == 0


def test_rules_win_and_llm_is_not_asked(tmp_path: Path) -> None:
    async def go() -> tuple[list[ReplyPart], Server]:
        srv, server = await _serve(_two_sentences)
        engine = DialogueEngine(_profile(tmp_path, srv.port))
        parts = [p async for p in engine.respond("a person please")]
        server.close()
        return parts, srv

    parts, srv = asyncio.run(go())
    assert parts == [Say("Putting you through."), Transfer("sip:agent@pbx")]
    assert srv.requests == []


async def _plain(srv: Server, w: Writer) -> None:
    body = _event("Hi there.") + _event(" Bye.") + b"data: [DONE]\n\n"
    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    await w.drain()


async def _until_close(srv: Server, w: Writer) -> None:
    w.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
    w.write(b": keep-alive comment\r\n\r\n" + _event("No").replace(b"\n", b"\r\n"))
    w.write(_event(" length."))  # no [DONE]: the server just closes


@pytest.mark.parametrize(
    ("handler", "want"), [(_plain, ["Hi there.", " Bye."]), (_until_close, ["No", " length."])]
)
def test_client_reads_content_length_and_close_delimited_bodies(
    handler: Handler, want: list[str]
) -> None:
    async def go() -> tuple[list[str], Server]:
        srv, server = await _serve(handler)
        client = LlmClient(f"http://127.0.0.1:{srv.port}", "m", timeout_s=2)
        out = [t async for t in client.stream_chat([{"role": "user", "content": "hi"}])]
        server.close()
        return out, srv

    out, srv = asyncio.run(go())
    assert out == want
    assert srv.requests[0].path == "/v1/chat/completions"
    assert "authorization" not in srv.requests[0].headers


async def _http_500(srv: Server, w: Writer) -> None:
    w.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\n\r\noops!")


async def _silent(srv: Server, w: Writer) -> None:
    await asyncio.sleep(3)


async def _malformed(srv: Server, w: Writer) -> None:
    w.write(CHUNKED_HEAD + _chunk(b"data: {not json\n\n") + b"0\r\n\r\n")


async def _stall_after_first(srv: Server, w: Writer) -> None:
    w.write(CHUNKED_HEAD + _chunk(_event("One moment. ")) + _chunk(_event("And")))
    await w.drain()
    await asyncio.sleep(3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("handler", [None, _http_500, _silent, _malformed])
def test_failures_give_the_fallback_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, handler: Handler | None
) -> None:
    async def go() -> list[list[ReplyPart]]:
        srv, server = await _serve(handler or _plain)
        port = srv.port if handler else _free_port()  # None: connection refused
        engine = DialogueEngine(_profile(tmp_path, port, timeout=0.3))
        out = [[p async for p in engine.respond(q)] for q in ("What's new?", "And else?")]
        server.close()
        return out

    with caplog.at_level(logging.DEBUG, logger="agent.dialogue.engine"):
        first, second = asyncio.run(go())
    assert first == [Say(FALLBACK)] and second == [Say(FALLBACK)]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "LLM failed" in warnings[0].getMessage()


def test_failure_mid_stream_keeps_what_was_said(tmp_path: Path) -> None:
    async def go() -> list[ReplyPart]:
        srv, server = await _serve(_stall_after_first)
        engine = DialogueEngine(_profile(tmp_path, srv.port, timeout=0.3))
        parts = [p async for p in engine.respond("Tell me something")]
        server.close()
        return parts

    assert asyncio.run(go()) == [Say("One moment.")]


def test_client_errors_are_llm_errors() -> None:
    async def go() -> None:
        srv, server = await _serve(_http_500)
        client = LlmClient(f"http://127.0.0.1:{srv.port}/v1", "m", timeout_s=1)
        with pytest.raises(LlmError, match="HTTP 500"):
            async for _ in client.stream_chat([]):
                pass
        server.close()

    asyncio.run(go())
    with pytest.raises(ValueError, match="http://"):
        LlmClient("https://api.openai.com/v1", "gpt")


def test_primary_mode_sends_ordinary_turns_to_the_llm(tmp_path: Path) -> None:
    async def go() -> tuple[list[ReplyPart], Server]:
        srv, server = await _serve(_plain)
        engine = DialogueEngine(_profile(tmp_path, srv.port, mode="primary"))
        parts = [p async for p in engine.respond("a person please")]
        parts += [p async for p in engine.respond("OK, goodbye")]  # override_llm: rules
        server.close()
        return parts, srv

    parts, srv = asyncio.run(go())
    assert parts == [Say("Hi there."), Say("Bye."), Say("Bye."), Hangup("intent")]
    assert len(srv.requests) == 1

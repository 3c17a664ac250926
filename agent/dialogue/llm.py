"""A streaming client for OpenAI-compatible chat servers (llama.cpp, vLLM, Ollama, OpenAI).

Written on asyncio streams rather than an HTTP library so that the bridge gains no
dependency and every token is handed on the moment it arrives: the dialogue engine speaks
the first sentence while the model is still writing the second. Plain ``http://`` only
(a model server next to the bridge); put a TLS proxy in front for anything else.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from agent.dialogue.profile import LlmSettings

__all__ = ["LlmClient", "LlmError"]


class LlmError(Exception):
    """The server could not be reached, refused, timed out or spoke something else."""


class LlmClient:
    """POST ``/v1/chat/completions`` with ``"stream": true`` and yield the text deltas.

    ``base_url`` is ``http://host:port`` or ``http://host:port/v1`` (the OpenAI SDK's
    convention); ``timeout_s`` bounds the connect and every wait for more bytes, so a
    server that stalls mid-answer is given up on as well as one that never answers.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 10.0,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"need http://HOST[:PORT][/v1], got {base_url!r}")
        self.host, self.port = url.hostname, url.port or 80
        path = url.path.rstrip("/")
        self.path = path + ("/chat/completions" if path.endswith("/v1") else "/v1/chat/completions")
        self.model, self.api_key, self.timeout_s = model, api_key, timeout_s
        self.temperature, self.max_tokens = temperature, max_tokens

    @classmethod
    def from_settings(cls, s: LlmSettings) -> LlmClient:
        """The profile's [llm] table; the API key comes from the environment, never the file."""
        key = os.environ.get(s.api_key_env) if s.api_key_env else None
        return cls(
            s.base_url,
            s.model,
            key,
            timeout_s=s.timeout_s,
            temperature=s.temperature,
            max_tokens=s.max_tokens,
        )

    def _request(self, messages: Sequence[Mapping[str, str]]) -> bytes:
        body: dict[str, Any] = {"model": self.model, "messages": list(messages), "stream": True}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        payload = json.dumps(body).encode()
        host = self.host if ":" not in self.host else f"[{self.host}]"
        head = [
            f"POST {self.path} HTTP/1.1",
            f"Host: {host}:{self.port}",
            "Content-Type: application/json",
            "Accept: text/event-stream",
            f"Content-Length: {len(payload)}",
            "Connection: close",
        ]
        if self.api_key:
            head.append(f"Authorization: Bearer {self.api_key}")
        return ("\r\n".join(head) + "\r\n\r\n").encode() + payload

    async def stream_chat(self, messages: Sequence[Mapping[str, str]]) -> AsyncGenerator[str, None]:
        """Yield the assistant's text as it streams; LlmError on any failure."""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), self.timeout_s
            )
        except (OSError, TimeoutError) as exc:
            raise LlmError(f"cannot connect to {self.host}:{self.port}: {exc!r}") from None
        try:
            writer.write(self._request(messages))
            await writer.drain()
            headers = await self._read_head(reader)
            events = _SseParser()
            async for chunk in self._body(reader, headers):
                for data in events.feed(chunk):
                    if data == "[DONE]":
                        return
                    text = _delta(data)
                    if text:
                        yield text
            for data in events.feed(b"\n\n"):  # a last event without its blank line
                if data != "[DONE]" and (text := _delta(data)):
                    yield text
        except TimeoutError:
            raise LlmError(f"no data from {self.host}:{self.port} for {self.timeout_s} s") from None
        except (OSError, asyncio.IncompleteReadError) as exc:
            raise LlmError(f"connection to {self.host}:{self.port} failed: {exc!r}") from None
        finally:
            writer.close()

    async def _line(self, reader: asyncio.StreamReader) -> bytes:
        return await asyncio.wait_for(reader.readline(), self.timeout_s)

    async def _read_head(self, reader: asyncio.StreamReader) -> dict[str, str]:
        status = (await self._line(reader)).decode("latin-1").split(" ", 2)
        if len(status) < 2 or not status[0].startswith("HTTP/") or not status[1].isdigit():
            raise LlmError(f"not an HTTP response: {' '.join(status)[:80]!r}")
        headers: dict[str, str] = {}
        while (line := (await self._line(reader)).decode("latin-1").strip()) != "":
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if status[1] != "200":
            body = await asyncio.wait_for(reader.read(500), self.timeout_s)
            raise LlmError(f"HTTP {status[1]} from {self.path}: {body[:200]!r}")
        return headers

    async def _body(
        self, reader: asyncio.StreamReader, headers: Mapping[str, str]
    ) -> AsyncIterator[bytes]:
        """The body as it arrives: chunked, Content-Length or until the server closes."""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                size_line = (await self._line(reader)).split(b";")[0].strip()
                try:
                    size = int(size_line, 16)
                except ValueError:
                    raise LlmError(f"bad chunk size {size_line[:20]!r}") from None
                if size == 0:
                    return
                yield await asyncio.wait_for(reader.readexactly(size), self.timeout_s)
                await self._line(reader)  # the CRLF after each chunk
        left = int(headers["content-length"]) if "content-length" in headers else -1
        while left != 0:
            chunk = await asyncio.wait_for(reader.read(65536 if left < 0 else left), self.timeout_s)
            if not chunk:
                if left > 0:
                    raise LlmError("connection closed before the end of the body")
                return
            left = left - len(chunk) if left > 0 else left
            yield chunk


class _SseParser:
    """Server-sent events: ``data:`` lines up to a blank line make one event."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buf += chunk
        out = []
        *lines, self._buf = self._buf.split(b"\n")
        for raw in lines:
            line = raw.rstrip(b"\r").decode("utf-8", "replace")
            if not line:
                if self._data:
                    out.append("\n".join(self._data))
                    self._data = []
            elif line.startswith("data:"):
                self._data.append(line[5:].removeprefix(" "))
        return out


def _delta(data: str) -> str:
    """``choices[0].delta.content`` of one event; LlmError when it is not that shape."""
    try:
        event = json.loads(data)
    except json.JSONDecodeError:
        raise LlmError(f"malformed event: {data[:80]!r}") from None
    if not isinstance(event, dict):
        raise LlmError(f"malformed event: {data[:80]!r}")
    if "error" in event:
        raise LlmError(f"server error: {str(event['error'])[:200]}")
    choices = event.get("choices")
    if not isinstance(choices, list):
        raise LlmError(f"event without choices: {data[:80]!r}")
    if not choices:
        return ""  # e.g. the final usage event
    first = choices[0]
    delta = first.get("delta") if isinstance(first, dict) else None
    content = delta.get("content") if isinstance(delta, dict) else None
    return content if isinstance(content, str) else ""

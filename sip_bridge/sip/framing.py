"""Framing SIP on stream transports (TCP, TLS): where one message ends and the next begins.

A datagram is one message; a stream is not, so RFC 3261 18.3 makes Content-Length
mandatory there. Apart from :mod:`sip_bridge.sip.message` because it is state (a buffer)
while the parser is a pure function.
"""

from __future__ import annotations

import re

from sip_bridge.sip.message import (
    _HEAD_END,
    MAX_BODY_SIZE,
    MAX_HEADER_SIZE,
    SipMessage,
    SipParseError,
    _build,
    _content_length,
    _parse_head,
)

__all__ = ["StreamFramer"]

_STREAM_CL = re.compile(rb"^(?:content-length|l)[ \t]*:[ \t]*([^\r\n]*)", re.I | re.M)


class StreamFramer:
    """Cut a stream (TCP/TLS) into messages by Content-Length, which streams must carry.

    ``feed`` returns the messages completed so far.  A malformed message raises
    :class:`SipParseError`; messages complete before it are returned first and the error
    comes on the next ``feed`` (``feed(b"")`` is enough).  If the message boundaries are
    lost (no or bad Content-Length, head or body over the size caps) the framer stays
    broken, raising the same error, until :meth:`reset`.
    """

    def __init__(self, max_header: int = MAX_HEADER_SIZE, max_body: int = MAX_BODY_SIZE) -> None:
        self.max_header = max_header
        self.max_body = max_body
        self._buf = bytearray()
        self._broken: SipParseError | None = None

    def reset(self) -> None:
        self._buf.clear()
        self._broken = None

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[SipMessage]:
        if self._broken is not None:
            raise self._broken
        self._buf += data
        out: list[SipMessage] = []
        while True:
            start = len(self._buf) - len(self._buf.lstrip(b"\r\n"))  # CRLF keep-alives
            try:
                framed = self._frame(start)
            except SipParseError as exc:
                if out:
                    return out
                self._broken = exc
                self._buf.clear()
                raise
            if framed is None:
                del self._buf[:start]
                return out
            head, body_start, end = framed
            try:
                start_line, headers = _parse_head(bytes(self._buf[start:head]))
                msg = _build(start_line, headers, bytes(self._buf[body_start:end]))
            except SipParseError:
                if out:
                    return out
                del self._buf[:end]
                raise
            del self._buf[:end]
            out.append(msg)

    def _frame(self, start: int) -> tuple[int, int, int] | None:
        """(head end, body start, message end) of the next message, None if incomplete."""
        m = _HEAD_END.search(self._buf, start)
        if m is None:
            if len(self._buf) - start > self.max_header:
                raise SipParseError("message head too large", 413)
            return None
        if m.start() - start > self.max_header:
            raise SipParseError("message head too large", 413)
        values = {v.strip(b" \t") for v in _STREAM_CL.findall(self._buf, start, m.start())}
        if not values:
            raise SipParseError("Content-Length is required on stream transports")
        if len(values) > 1:
            raise SipParseError("conflicting Content-Length headers")
        length = _content_length(values.pop().decode("ascii", "replace"))
        assert length is not None
        if length > self.max_body:
            raise SipParseError(f"body of {length} bytes too large", 413)
        end = m.end() + length
        return (m.start(), m.end(), end) if len(self._buf) >= end else None

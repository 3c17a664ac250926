"""One caller turn on a dialogue engine, as the words the agent then says: the helper the
dialogue and slot tests share."""

from __future__ import annotations

import asyncio

from agent.dialogue.engine import DialogueEngine, ReplyPart, Say


def said(engine: DialogueEngine, text: str) -> str:
    """What the engine says back to ``text`` (its Say parts, joined)."""

    async def go() -> list[ReplyPart]:
        return [p async for p in engine.respond(text)]

    return " ".join(p.text for p in asyncio.run(go()) if isinstance(p, Say))

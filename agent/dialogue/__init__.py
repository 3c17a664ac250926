"""What the agent says and does: the dialogue engine (:mod:`agent.dialogue.engine`), the agent
profiles an operator writes and their loader (``file:line: key`` on any mistake), slots and
their rules, spoken numbers and formats, business hours, the optional LLM, backchannels,
sentence splitting for TTS.

May import: the top of ``agent``, :mod:`agent.lines` (a profile's hold audio, read as the
playback agent reads a WAV).
"""

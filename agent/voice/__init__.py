"""The voice pipeline: VAD, end of turn (smart-turn), ASR (Moonshine), TTS (Piper), the echo
canceller and barge-in gate, speculation, dead-air and call-flow timing, and the agent that
runs them tick by tick (:mod:`agent.voice.voice_agent`).

May import: the top of ``agent`` (the interface and what is shared), :mod:`agent.dialogue`
(what to say), ``model_runtime``, ``resample``.
"""

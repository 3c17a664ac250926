"""Turn-taking and dialogue (VAD, end of turn, barge-in, TTS streaming).

Empty until the speech-agent issue lands; it must never import RTP or SIP code.
"""

"""Agents that check a line rather than talk: echo, tone, playback, play-and-record, and the
fallback prompt the bridge plays when a model fails.

May import: the top of ``agent``, ``resample``.
"""

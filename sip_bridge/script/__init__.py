"""Calling as a caller does: ``sip-bridge call`` (``caller``) and the call-script runner
(``sip-bridge script``): script files, steps, the caller's voice and its simulated line,
what was heard, and the report.

May import: ``agent``, ``jitter``, ``resample``, ``model_runtime``,
:mod:`sip_bridge.config`, :mod:`sip_bridge.sip`, :mod:`sip_bridge.media`.
"""

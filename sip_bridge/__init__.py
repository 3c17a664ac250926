"""sip-bridge: answers SIP calls with a voice agent.

Sub-packages by job, each saying in its docstring what it owns and may import
(``tests/test_layout.py`` holds them to it): :mod:`sip_bridge.sip` (the SIP stack),
:mod:`sip_bridge.media` (RTP, the media chain and clock), :mod:`sip_bridge.config`
(bridge.toml), :mod:`sip_bridge.ops` (records, metrics, MQTT, control, reload, status),
:mod:`sip_bridge.web` (the talk page, the console, WebRTC) and :mod:`sip_bridge.script`
(calling as a caller: ``sip-bridge call`` and call scripts). At the top: ``server`` (a
call's life across them), ``cli``, ``agents`` (which agent answers),
``bridge_surface`` (the server as its operators' tools see it), ``logs``, ``native``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("sip-bridge")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+src"

__all__ = ["__version__"]

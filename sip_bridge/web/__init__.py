"""The bridge on HTTP: the talk page and the operator console (``web_server``, ``static/``),
the console's view of live calls, access tokens, and the browser's WebRTC leg.

May import: ``agent``, ``resample``, :mod:`sip_bridge.config`, :mod:`sip_bridge.ops`, and
of the top level only :mod:`sip_bridge.bridge_surface`, :mod:`sip_bridge.agents` and
:mod:`sip_bridge.logs`.
"""

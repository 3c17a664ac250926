"""What operators run a bridge with: call records and their retention, metrics, MQTT
events and commands, call telemetry, the control socket, config reload, the status and
commands of ``sip-bridge status``/``ctl`` (``operator_view``), sd_notify, heap trimming.

May import: ``agent``, ``model_runtime``, :mod:`sip_bridge.config`, :mod:`sip_bridge.sip`,
:mod:`sip_bridge.media`, and of the top level only :mod:`sip_bridge.bridge_surface` (the
server, as these tools see it), :mod:`sip_bridge.logs` and the version.
"""

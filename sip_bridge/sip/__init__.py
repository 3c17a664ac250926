"""The SIP stack, sans I/O where it can be: messages and header fields, transactions and
dialogs, SDP offer/answer, digest auth, registration, the user agent of every inbound call
(``ua``) and of our own outbound calls (``uac``), transfer (REFER), the transports.

May import: :mod:`sip_bridge.config` (the settings it runs on), :mod:`sip_bridge.media`
(SRTP keys an SDP offer carries). Never the operators' tools, the web, the server.
"""

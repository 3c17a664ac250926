"""Drivers and helpers for interop tests against real SIP softphones (pjsua2, linphonec)."""

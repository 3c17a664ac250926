"""sip-bridge: the SIP stack, RTP sockets, per-call sessions and the CLI."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("sip-bridge")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+src"

__all__ = ["__version__"]

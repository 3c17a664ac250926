"""bridge.toml: its typed values (``config_types``), the loader that checks a file and says
``file:line: key`` about any mistake (``loader``), the sections, trunks and routes, where
the files are (``config_files``) and the generated reference (``config_reference``).

May import: ``agent`` (voice settings), :mod:`sip_bridge.sip` (URIs and ACLs a trunk
names), :mod:`sip_bridge.media` (SRTP modes).
"""

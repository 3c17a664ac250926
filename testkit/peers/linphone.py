"""Drive linphonec (Debian `linphone-cli`, liblinphone 5.1) headless through its stdin.

linphonec is a readline shell; fed from a pipe it reads one command per line. Its
"files" sound card (`soundcard use files`) plays a WAV into the call (`play`, looped) and
records what it hears (`record`), so no audio hardware is needed. Each instance gets its
own HOME and linphonerc with free loopback SIP/RTP ports, TCP/TLS and IPv6 off, and
RFC 4733 DTMF; its debug log (SIP messages included) is HOME/log.txt.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from testkit.peers.support import LineReader, ShellPeer, free_udp_port

LINPHONEC = shutil.which("linphonec")


class Linphonec(ShellPeer):
    """One linphonec process; `send` a command, `wait_for` what it prints."""

    def __init__(self, home: Path, play: Path, record: Path, autoanswer: bool = False) -> None:
        assert LINPHONEC is not None, "linphonec not found: run `make setup` (linphone-cli)"
        # Without a writable call-log database the core never leaves "Startup" and answers
        # every incoming INVITE with 503 (outgoing calls work regardless).
        (home / ".local" / "share" / "linphone").mkdir(parents=True, exist_ok=True)
        self.sip_port = free_udp_port()
        rtp_port = free_udp_port(even=True)
        rc = home / "linphonerc"
        rc.write_text(
            "[sip]\n"
            f"sip_port={self.sip_port}\nsip_tcp_port=0\nsip_tls_port=0\n"  # 0: off, -1: random
            "use_ipv6=0\nguess_hostname=0\ncontact=sip:lin@127.0.0.1\n"
            "use_info=0\nuse_rfc2833=1\n"
            "[rtp]\n"
            f"audio_rtp_port={rtp_port}\nbind_address=127.0.0.1\n"  # also the SDP c= address
            "[sound]\nechocancellation=0\n"
            "[video]\ncapture=0\ndisplay=0\nautomatically_initiate=0\nautomatically_accept=0\n"
        )
        env = {**os.environ, "HOME": str(home)}
        self.proc = subprocess.Popen(
            [LINPHONEC, "-c", str(rc), "-d", "5", "-l", str(home / "log.txt")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=env, cwd=home,
        )  # fmt: skip
        self.reader = LineReader(self.proc)
        try:
            self._setup(play, record, autoanswer)
        except BaseException:
            self.close()
            raise

    def _setup(self, play: Path, record: Path, autoanswer: bool) -> None:
        self.send("states global")
        self.wait_for("LinphoneGlobalOn")
        self.send("ipv6 disable")
        self.wait_for("ipv6 use disabled")
        self.send("soundcard use files")
        self.wait_for("Using wav files")
        self.send(f"play {play}")
        self.send(f"record {record}")
        if autoanswer:
            self.send("autoanswer enable")
            self.wait_for("Auto answer enabled")

    @property
    def uri(self) -> str:
        return f"sip:lin@127.0.0.1:{self.sip_port}"

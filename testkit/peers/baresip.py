"""Drive baresip (Debian `baresip-core` 1.0.0) headless through its stdin.

baresip's `stdio` UI reads keys from a pipe too (it only warns that it cannot set up a
terminal), so the `menu` module's long commands work by typing them: `/dial URI`,
`/sndcode 47` (RFC 4733 telephone-events), `/hold`, `/resume`, `/hangup`, `/quit`. The
`aufile` source plays a WAV into the call; the `sndfile` filter records what baresip
decoded (`dump-*-dec.wav`) and what it sent (`dump-*-enc.wav`) in its own directory. Each
instance gets its own config directory and a free loopback SIP port; its account answers
by itself when asked to (`;answermode=auto`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from testkit.peers.support import LineReader, ShellPeer, free_udp_port

BARESIP = shutil.which("baresip")
# What baresip prints for each telephone-event it decoded; end=1 once per key press.
RECEIVED_KEY = re.compile(r"received event: '(.)' \(end=1\)")


class Baresip(ShellPeer):
    """One baresip process; `send` a command, `wait_for` what it prints."""

    QUIT = "/quit"

    def __init__(
        self,
        home: Path,
        play: Path,
        autoanswer: bool = False,
        max_s: int = 40,
        mediaenc: str = "",
    ) -> None:
        """``mediaenc``: the account's media encryption, e.g. ``srtp-mand`` (SDES-SRTP on
        RTP/SAVP, refusing plain RTP) or ``srtp`` (best effort, on RTP/AVP)."""
        assert BARESIP is not None, "baresip not found: run `make setup` (apt baresip-core)"
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.sip_port = free_udp_port()
        answer = ";answermode=auto" if autoanswer else ""
        answer += f";mediaenc={mediaenc}" if mediaenc else ""
        (home / "accounts").write_text(f"<sip:tester@127.0.0.1>;regint=0{answer}\n")
        (home / "config").write_text(
            "poll_method epoll\n"
            f"sip_listen 127.0.0.1:{self.sip_port}\n"
            "net_interface 127.0.0.1\n"  # SDP c= 127.0.0.1: media stays on loopback
            "module_path /usr/lib/baresip/modules\n"
            "module stdio.so\nmodule g711.so\nmodule aufile.so\nmodule sndfile.so\n"
            f"{'module srtp.so' if mediaenc else ''}\n"  # before account.so reads mediaenc
            "module account.so\nmodule menu.so\n"
            "statmode_default off\n"  # no "[0:00:04] audio=..." status line in the log
            f"audio_source aufile,{play}\n"
            f"audio_player aufile,{home / 'unused.wav'}\n"
            "audio_alert aufile,/dev/null\n"
            "audio_srate 8000\naudio_channels 1\n"
            f"snd_path {home}\n"
        )
        # -t: baresip quits by itself after `max_s` even if a test forgets it.
        self.proc = subprocess.Popen(
            [BARESIP, "-f", str(home), "-t", str(max_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, cwd=home,
        )  # fmt: skip
        self.reader = LineReader(self.proc)
        try:
            self.wait_for("baresip is ready")
        except BaseException:
            self.close()
            raise

    @property
    def uri(self) -> str:
        return f"sip:tester@127.0.0.1:{self.sip_port}"

    def keys_received(self) -> list[str]:
        """The DTMF keys baresip decoded from RFC 4733 telephone-events, in order."""
        return [m.group(1) for m in map(RECEIVED_KEY.search, self.reader.lines) if m]

    def rtp_received(self) -> int:
        """RTP packets baresip has received on the call so far (its RTCP member counters).

        This counts packets even where `sndfile` no longer records: baresip 1.0.0 drops the
        filter from its receive chain when a re-INVITE (hold, resume) updates the stream.
        """
        mark = self.send("/audio_debug")
        return int(self.reader.wait_for(r"psent=\d+ rcvd=(\d+)", start=mark).group(1))

    def heard(self) -> Path:
        """The WAV `sndfile` wrote of what baresip decoded (one call per instance)."""
        [path] = self.home.glob("dump-*-dec.wav")
        return path

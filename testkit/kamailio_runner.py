"""Running the example Kamailio dispatcher (pbx_examples/kamailio) in tests.

Kamailio runs in the foreground (``-DD -E``: its children stay attached, the log goes to
stderr, captured in a file) with its runtime dir, pid file and dispatcher list under the
test's tmp_path, listening on a free loopback UDP port. The shipped kamailio.cfg is used as
is; only its ``#!trydef`` defines are set on the command line (``-A``), as an operator would.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "pbx_examples"
KAMAILIO_CFG = EXAMPLES / "kamailio" / "kamailio.cfg"
DISPATCHER_LIST = EXAMPLES / "kamailio" / "dispatcher.list"
HOST = "127.0.0.1"


def _binary(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
    # Not a skip: `make setup` installs Debian's kamailio, so a missing one is a broken setup.
    assert found is not None, f"{name} not found: run `make setup` (Debian package kamailio)"
    return found


def kamailio_binary() -> str:
    return _binary("kamailio")


def defines(**values: str | int) -> list[str]:
    """``-A NAME=VALUE`` for each define (strings must carry their own double quotes)."""
    out: list[str] = []
    for name, value in values.items():
        out += ["-A", f"{name}={value}"]
    return out


def check_config(cfg: Path = KAMAILIO_CFG, *args: str) -> subprocess.CompletedProcess[str]:
    """``kamailio -c``: parses the file and loads its modules and parameters."""
    return subprocess.run(
        [kamailio_binary(), "-c", "-f", str(cfg), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def options_ping(port: int, timeout: float = 0.5) -> str | None:
    """One OPTIONS to the proxy itself; its status line, or None without an answer."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((HOST, 0))
        s.settimeout(timeout)
        local = s.getsockname()[1]
        branch = f"z9hG4bK-probe-{time.monotonic_ns()}"
        msg = (
            f"OPTIONS sip:{HOST}:{port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP {HOST}:{local};branch={branch};rport\r\n"
            f"From: <sip:test@{HOST}:{local}>;tag=probe\r\n"
            f"To: <sip:{HOST}:{port}>\r\n"
            f"Call-ID: {branch}@{HOST}\r\n"
            "CSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
        )
        s.sendto(msg.encode(), (HOST, port))
        try:
            data = s.recv(65535)
        except TimeoutError:
            return None
        return data.decode(errors="replace").split("\r\n", 1)[0]


class Kamailio:
    """The example proxy in front of bridge nodes on 127.0.0.1; ``async with`` runs it."""

    def __init__(
        self,
        workdir: Path,
        port: int,
        nodes: list[int],
        *,
        ping_interval_s: int = 1,
        fr_timer_ms: int = 1000,
        algorithm: int = 4,
        list_file: Path | None = None,
    ) -> None:
        self.workdir = workdir
        self.port = port
        self.nodes = nodes
        self.log_path = workdir / "kamailio.log"
        self.own_list = list_file is None  # else an existing list, used as it is
        self.list_path = list_file or workdir / "dispatcher.list"
        self.pid_path = workdir / "kamailio.pid"
        self.runtime = workdir / "run"
        self.settings: dict[str, str | int] = {
            "LISTEN": f"udp:{HOST}:{port}",
            "DS_LIST": f'"{self.list_path}"',
            "DS_PING_INTERVAL": ping_interval_s,
            "FR_TIMER": fr_timer_ms,
            "DS_ALG": algorithm,
            "CHILDREN": 2,
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            kamailio_binary(),
            "-DD", "-E",
            "-f", str(KAMAILIO_CFG),
            "-Y", str(self.runtime),
            "-P", str(self.pid_path),
            "-w", str(self.workdir),
            "-m", "32", "-M", "4",
            *defines(**self.settings),
        ]  # fmt: skip

    async def start(self, timeout: float = 10.0) -> None:
        self.runtime.mkdir(parents=True, exist_ok=True)
        if self.own_list:
            self.list_path.write_text(
                "".join(
                    f"1 sip:{HOST}:{p} 0 0 duid=node-{i}\n" for i, p in enumerate(self.nodes, 1)
                )
            )
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own group: stop() ends it and its children
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"kamailio exited {self.proc.returncode}:\n{self.log()}")
            answer = await asyncio.to_thread(options_ping, self.port, 0.3)
            if answer is not None:
                assert answer == "SIP/2.0 200 Keepalive", answer
                return
        raise AssertionError(f"kamailio did not answer on {self.port}:\n{self.log()}")

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def rpc(self, *command: str) -> str:
        """A kamcmd command on this instance's control socket (the cfg loads ctl)."""
        done = subprocess.run(
            [_binary("kamcmd"), "-s", f"unix:{self.runtime / 'kamailio_ctl'}", *command],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        assert done.returncode == 0, f"kamcmd {' '.join(command)}: {done.stderr}{done.stdout}"
        return done.stdout

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def lines(self, pattern: str) -> list[str]:
        """Log lines matching a regular expression."""
        return [ln for ln in self.log().splitlines() if re.search(pattern, ln)]

    async def wait_for_log(self, pattern: str, timeout: float) -> float:
        """Seconds until a line matching ``pattern`` appears; fails after ``timeout``."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.lines(pattern):
                return time.monotonic() - start
            await asyncio.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in kamailio's log in {timeout} s:\n{self.log()}")

    async def __aenter__(self) -> Kamailio:
        try:
            await self.start()
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# A call through the proxy: the 200 must carry the proxy's Record-Route, and the ACK and
# BYE carry it back as Route (loose routing), addressed to the node's Contact.
PROXY_CALL = """<?xml version="1.0" encoding="ISO-8859-1" ?>
<!DOCTYPE scenario SYSTEM "sipp.dtd">
<scenario name="call through the kamailio dispatcher">
  <send retrans="500">
    <![CDATA[
      INVITE sip:echo@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:echo@[remote_ip]:[remote_port]>
      Call-ID: [call_id]
      CSeq: 1 INVITE
      Contact: sip:sipp@[local_ip]:[local_port]
      Max-Forwards: 70
      Content-Type: application/sdp
      Content-Length: [len]

      v=0
      o=user1 53655765 2353687637 IN IP[local_ip_type] [local_ip]
      s=-
      c=IN IP[media_ip_type] [media_ip]
      t=0 0
      m=audio [media_port] RTP/AVP 0 101
      a=rtpmap:0 PCMU/8000
      a=rtpmap:101 telephone-event/8000
      a=ptime:20
    ]]>
  </send>
  <recv response="100" optional="true"/>
  <recv response="180" optional="true"/>
  <recv response="200" rtd="true" rrs="true">
    <action>
      <ereg regexp="Record-Route: &lt;sip:127\\.0\\.0\\.1:[0-9]+;lr" search_in="msg"
            check_it="true" assign_to="rrhdr"/>
      <ereg regexp="Contact: &lt;sip:bridge@127\\.0\\.0\\.1:[0-9]+" search_in="msg"
            check_it="true" assign_to="cthdr"/>
    </action>
  </recv>
  <send>
    <![CDATA[
      ACK [next_url] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      [routes]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:echo@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 1 ACK
      Max-Forwards: 70
      Content-Length: 0
    ]]>
  </send>
  <pause/>
  <send retrans="500">
    <![CDATA[
      BYE [next_url] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      [routes]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:echo@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 2 BYE
      Max-Forwards: 70
      Content-Length: 0
    ]]>
  </send>
  <recv response="200" crlf="true"/>
  <Reference variables="rrhdr,cthdr"/>
</scenario>
"""


def write_proxy_scenario(folder: Path) -> Path:
    """The scenario above as a file; the call lasts sipp's ``-d`` milliseconds."""
    path = folder / "uac_via_proxy.xml"
    path.write_text(PROXY_CALL)
    return path

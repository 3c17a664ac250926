"""sipp moves its media mid-call by re-INVITE; the bridge's RTP must follow the new SDP.

The real-peer version of tests/test_media_update.py's port change: sipp calls the echo
agent and streams a 440 Hz tone from its media port for 2 s, then re-INVITEs with c=/m=
naming 127.0.0.2:<port>, a UDP socket this test owns that streams 1000 Hz from there (the
phone moved). Checked: the bridge sent nothing to the new address before the re-INVITE
took effect, then echoed RTP arrives there (G.711 with the re-offer's payload type, one
SSRC, consecutive sequence numbers, 1000 Hz: our tone, so the bridge also took audio from
the new address). The re-INVITE's answer keeps the o= session id, the bridge's address and
port; its version follows RFC 3264 section 8: unchanged when the answer's body is the same
(address-only move, PCMU), one up when it changed (the re-offer also switches to PCMA).

`rtp.symmetric` is set explicitly. "off" is the case that proves the SDP was applied: the
bridge sends to and accepts from only the c=/m= address. With "auto" loopback counts as
private (Python's ipaddress), i.e. "on": the bridge latches to whatever source sends first,
which could hide a re-INVITE that was ignored; that case runs too, with the new address
talking only once the re-INVITE is applied, so an ignored re-INVITE (latch kept on sipp's
old port) still fails it.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest

from resample.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from sip_bridge.config.loader import BridgeConfig
from sip_bridge.media.call_media import MediaStats
from sip_bridge.media.rtp import RtpPacket, RtpSender, looks_like_rtcp
from sip_bridge.server import BridgeServer
from testkit.peers.support import dominant_hz
from testkit.sipp_media import HOST, random_port_range, run_sipp_in, tone, write_ulaw

NEW_IP = "127.0.0.2"  # all of 127/8 is local on Linux: a second address without setup
FRAME = 160  # 20 ms of G.711
CODECS = {"PCMU": (0, ulaw_encode, ulaw_decode), "PCMA": (8, alaw_encode, alaw_decode)}


class _NewAddress(asyncio.DatagramProtocol):
    """The caller's new media address: keeps every RTP packet that arrives."""

    def __init__(self) -> None:
        self.rtp: list[RtpPacket] = []

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if not looks_like_rtcp(data):
            self.rtp.append(RtpPacket.parse(data))


@dataclass
class _Seen:
    """What the test saw of the bridge's call while sipp ran."""

    old_remote: tuple[str, int] | None = None
    accepted_before_move: int = 0
    arrived_before_move: int = 0  # RTP at the new address while the bridge still sent to old
    moved: bool = False
    sent: int = 0
    finished: list[MediaStats] = field(default_factory=list)


def _config(symmetric: str, rtp_ports: str) -> BridgeConfig:
    base = BridgeConfig.line_check()
    return replace(
        base,
        sip=replace(base.sip, listen=f"{HOST}:0"),
        rtp=replace(base.rtp, ports=rtp_ports, symmetric=symmetric),
        agent=replace(base.agent, name="echo", echo_delay_s=0.2),
    )


async def _call(
    config: BridgeConfig, codec: str, cwd: Path, log: Path
) -> tuple[_Seen, _NewAddress, int]:
    symmetric = config.rtp.symmetric
    loop = asyncio.get_running_loop()
    server = BridgeServer(config)
    await server.start()
    assert server.port is not None
    transport, sink = await loop.create_datagram_endpoint(_NewAddress, local_addr=(NEW_IP, 0))
    new = (NEW_IP, int(transport.get_extra_info("sockname")[1]))
    seen = _Seen()
    pt, encode, _ = CODECS[codec]
    sender = RtpSender(pt)
    audio = encode(tone((1000.0,), 1.0)).tobytes()
    try:
        run = asyncio.ensure_future(
            run_sipp_in(
                cwd, server.port, "uac_reinvite_new_address.xml", "-m", "1",
                "-key", "new_ip", new[0], "-key", "new_port", str(new[1]),
                "-key", "new_codec", codec, "-key", "new_pt", str(pt),
                timeout=20, log=log,
            )
        )  # fmt: skip
        next_send: float | None = None
        while not run.done():
            call = next(iter(server.calls.values()), None)
            media = call.media if call is not None else None
            if media is not None and call is not None and not call.ended:
                st = media.stats
                if st.remote == new:
                    seen.moved = True
                elif not seen.moved:
                    # Same loop iteration as the read above: nothing can have been sent to the
                    # new address since, so anything that arrived there came before the move.
                    seen.old_remote = st.remote
                    seen.accepted_before_move = st.packets_accepted
                    seen.arrived_before_move = len(sink.rtp)
                # The phone at the new address talks, paced on the loop clock: all along when
                # the bridge filters on the SDP address; with latching only once the re-INVITE
                # was applied (else it would win the latch before the re-INVITE, as it should).
                talk = symmetric == "off" or media.params.remote_port == new[1]
                if talk and next_send is None:
                    next_send = loop.time()
                while next_send is not None and next_send <= loop.time():
                    at = (seen.sent * FRAME) % len(audio)
                    payload = (audio + audio)[at : at + FRAME]
                    transport.sendto(sender.next_packet(payload, FRAME), (HOST, media.local_port))
                    seen.sent += 1
                    next_send += FRAME / 8000
            await asyncio.wait([run], timeout=0.01)
        run.result()  # raises if sipp failed (a 200 without SDP answer, say)
        await asyncio.sleep(0.3)
    finally:
        transport.close()
        await server.stop()
    seen.finished = list(server.finished)
    return seen, sink, new[1]


def _answers(log: Path) -> dict[int, str]:
    """The SDP bodies of the 200s to INVITE that sipp received, by CSeq number.

    sipp's log frames each message with bare-LF lines; the message itself uses CRLF.
    """
    out: dict[int, str] = {}
    text = log.read_bytes().decode(errors="replace")  # read_text() would eat the CRs
    for chunk in text.split("message received")[1:]:
        msg = chunk.split("\n\n", 1)[-1]
        head, _, rest = msg.partition("\r\n\r\n")
        cseq = re.search(r"^CSeq:\s*(\d+) INVITE\r?$", head, re.M)
        if head.startswith("SIP/2.0 200 ") and cseq:
            body = itertools.takewhile(lambda line: line.endswith("\r"), rest.split("\n"))
            out[int(cseq.group(1))] = "\n".join(line[:-1] for line in body)
    return out


def _body(sdp: str) -> str:
    """An SDP without its o= line: what RFC 3264 compares to decide on a new version."""
    return "\n".join(line for line in sdp.strip().splitlines() if not line.startswith("o="))


def _sdp(body: str, key: str) -> list[str]:
    line = re.search(rf"^{key}=(.*)$", body, re.M)
    assert line, body
    return line.group(1).split()


@pytest.mark.parametrize(
    ("symmetric", "codec"),
    [
        ("off", "PCMU"),  # only the address changes: the answer's body is the same
        ("off", "PCMA"),  # address and codec change: the answer changes too
        ("on", "PCMU"),
    ],
)
def test_reinvite_moves_rtp_to_the_new_address(symmetric: str, codec: str, tmp_path: Path) -> None:
    write_ulaw(tmp_path / "tone.ulaw", tone((440.0,), 2.0))
    low, high = random_port_range(20, 30000, 60000)
    log = tmp_path / "messages.log"
    config = _config(symmetric, f"{low}-{high}")
    seen, sink, new_port = asyncio.run(_call(config, codec, tmp_path, log))
    pt, _, decode = CODECS[codec]

    # Before the move: sipp's stream was heard from sipp's address, nothing went to the new one.
    assert seen.old_remote is not None and seen.old_remote[0] == HOST
    assert seen.accepted_before_move >= 50, seen  # >= 1 s of sipp's 2 s stream
    assert seen.arrived_before_move == 0, seen
    assert seen.moved, seen
    [st] = seen.finished
    assert st.remote == (NEW_IP, new_port)
    if symmetric == "off":  # our early packets came from an address the SDP did not name yet
        assert st.wrong_source > 0, st
    else:  # re-latched, to the new address the SDP named and the audio came from
        assert st.latched, st

    # After it: the bridge's RTP arrives at the new address, the new codec, one stream, our tone.
    rtp = sink.rtp
    assert len(rtp) >= 75, f"{len(rtp)} packets at the new address in 2.5 s"  # 125 expected
    assert {p.payload_type for p in rtp} == {pt}
    assert len({p.ssrc for p in rtp}) == 1
    seqs = [p.sequence for p in rtp]
    assert all((b - a) & 0xFFFF == 1 for a, b in itertools.pairwise(seqs)), seqs
    assert all(len(p.payload) == FRAME for p in rtp)
    last = np.concatenate([decode(p.payload) for p in rtp[-50:]])  # the last second
    assert np.sqrt(np.mean(last.astype(np.float64) ** 2)) > 1000  # a tone, not silence
    assert abs(dominant_hz(last) - 1000.0) <= 20, dominant_hz(last)

    # The re-INVITE's answer: same session; the version goes up by one if and only if the
    # body changed (RFC 3264 section 8); the bridge's own address and port stay.
    answers = _answers(log)
    assert set(answers) == {1, 2}, answers
    o1, o2 = _sdp(answers[1], "o"), _sdp(answers[2], "o")
    assert o2[0] == o1[0] and o2[1] == o1[1] and o2[3:] == o1[3:]  # user, sess-id, address
    assert _sdp(answers[2], "m")[3:] == [str(pt), "101"]
    if codec == "PCMU":
        assert _body(answers[2]) == _body(answers[1])
        assert o2[2] == o1[2], (o1, o2)
    else:
        assert _body(answers[2]) != _body(answers[1])
        assert int(o2[2]) == int(o1[2]) + 1, (o1, o2)
    assert _sdp(answers[2], "c") == _sdp(answers[1], "c")
    assert _sdp(answers[2], "m")[1] == _sdp(answers[1], "m")[1] == str(st.local_port)

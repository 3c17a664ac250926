"""`sip-bridge call` against sipp as the callee: session timers and the callee's re-INVITEs.

sipp (tests/sipp/uas_session_timer_uac.xml) answers with Session-Expires: 90;refresher=uac,
then sends a refresh re-INVITE (Session-Expires: 120;refresher=uac) and a hold re-INVITE
(a=sendonly); it checks our answers itself and we read them again from its message log.
"""

from __future__ import annotations

import asyncio
import re
import wave
from pathlib import Path

import numpy as np

from testkit.sipp_runner import finish, free_port, start_sipp

SCENARIO = "uas_session_timer_uac.xml"
BRIDGE = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "sip-bridge"


def _tone_wav(path: Path, seconds: float = 1.0) -> None:
    t = np.arange(int(8000 * seconds)) / 8000
    pcm = (0.25 * 32767 * np.sin(2 * np.pi * 1000 * t)).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(pcm.tobytes())


def _received(log: Path) -> list[tuple[str, str]]:
    """(head, body) of every message sipp received; the log frames them with bare LFs."""
    out = []
    text = log.read_bytes().decode(errors="replace")  # read_text() would eat the CRs
    for chunk in text.split("message received")[1:]:
        msg = chunk.split("\n\n", 1)[-1]
        head, _, rest = msg.partition("\r\n\r\n")
        body = [line[:-1] for line in rest.split("\n") if line.endswith("\r")]
        out.append((head, "\n".join(body)))
    return out


def _header(head: str, name: str) -> str | None:
    match = re.search(rf"^{name}:\s*(.*?)\r?$", head, re.M | re.I)
    return match.group(1) if match else None


async def _call(tmp_path: Path, log: Path) -> tuple[int, str, str]:
    port = free_port()
    sipp = await start_sipp(SCENARIO, None, "-p", str(port), "-m", "1", timeout=30, log=log)
    await asyncio.sleep(0.3)  # let sipp bind before we dial
    play, record, said = tmp_path / "tone.wav", tmp_path / "out.wav", tmp_path / "call.log"
    _tone_wav(play)
    with said.open("wb") as out:  # a file, not a pipe: what it said survives a kill
        proc = await asyncio.create_subprocess_exec(
            str(BRIDGE),
            "call",
            f"sip:callee@127.0.0.1:{port}",
            "--play",
            str(play),
            "--record",
            str(record),
            "--duration",
            "6",
            "--rtp-ports",
            "44600-44699",
            "--verbose",
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )
    try:
        await asyncio.wait_for(proc.wait(), 30)
    except TimeoutError:  # 6 s of call: say where it stood, and sipp's side of it
        proc.kill()
        await proc.wait()
        sipp.kill()
        seen = log.read_text(errors="replace")[-4000:] if log.exists() else "(no sipp log)"
        raise AssertionError(
            f"`sip-bridge call` still running after 30 s:\n{said.read_text(errors='replace')}"
            f"\n--- sipp's messages ---\n{seen}"
        ) from None
    sipp_out = await finish(sipp, SCENARIO, 30)
    assert proc.returncode is not None
    return proc.returncode, said.read_text(errors="replace"), sipp_out


def test_call_answers_the_callees_refresh_and_hold_reinvites(tmp_path: Path) -> None:
    log = tmp_path / "messages.log"
    rc, out, _ = asyncio.run(_call(tmp_path, log))
    assert rc == 0, out  # answered, and sipp passed (finish asserts its exit code)
    assert (tmp_path / "out.wav").exists()
    messages = _received(log)
    (invite,) = [h for h, _ in messages if h.startswith("INVITE ")]
    assert _header(invite, "Session-Expires") == "1800"
    assert _header(invite, "Min-SE") == "90"
    assert "timer" in (_header(invite, "Supported") or "")
    oks = {
        int(m.group(1)): (head, body)
        for head, body in messages
        if head.startswith("SIP/2.0 200 ")
        and (m := re.search(r"^CSeq:\s*(\d+) INVITE\r?$", head, re.M))
    }
    assert set(oks) == {1, 2}  # sipp's refresh (CSeq 1) and hold (CSeq 2) re-INVITEs
    refresh_head, refresh_body = oks[1]
    assert _header(refresh_head, "Session-Expires") == "120;refresher=uac"
    assert _header(refresh_head, "Require") == "timer"
    assert "a=sendrecv" in refresh_body.splitlines()
    hold_head, hold_body = oks[2]
    assert "a=recvonly" in hold_body.splitlines()
    assert _header(hold_head, "Session-Expires") == "120;refresher=uac"
    origin = [re.search(r"^o=\S+ (\d+) (\d+) ", b, re.M) for b in (refresh_body, hold_body)]
    assert origin[0] and origin[1] and origin[0].group(1) == origin[1].group(1)
    assert int(origin[1].group(2)) == int(origin[0].group(2)) + 1  # the hold changed it
    byes = [h for h, _ in messages if h.startswith("BYE ")]
    assert len(byes) == 1  # ours, after --duration, not a session expiry

"""Fuzz every parser that reads what a stranger sends, and the config loader.

Each target is fed mutations of real inputs (bit flips, byte insertions and deletions,
splices of two inputs, truncations, repeated runs, random bytes). A parser may refuse an
input only with its documented error, a ``ValueError`` subclass (SipParseError, SdpError,
RtpError, RtcpError, ConfigError); the SIP user agent's ``receive_bytes`` may not raise at
all (it answers garbage with a 400 or drops it). Anything else is a crash: the input is
saved to ``bench/out/fuzz_crashes/<target>-<n>.bin`` and counted. Seeded: a run is
repeatable. ``tests/test_fuzz.py`` runs a few thousand inputs per target in ``make test``.

    .venv/bin/python bench/fuzz.py [--inputs 1000000] [--seed 1] [--targets sip,sdp,...]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from sip_bridge.config.loader import BridgeConfig, parse_config_text  # noqa: E402
from sip_bridge.media.rtcp import (  # noqa: E402
    Bye,
    ReportBlock,
    SdesChunk,
    SenderReport,
    SourceDescription,
    parse_compound,
    serialize_compound,
)
from sip_bridge.media.rtp import RtpPacket, TelephoneEvent  # noqa: E402
from sip_bridge.sip.message import parse_message  # noqa: E402
from sip_bridge.sip.sdp import parse_sdp  # noqa: E402
from sip_bridge.sip.ua import BridgeUA  # noqa: E402

OUT = ROOT / "bench" / "out" / "fuzz_crashes"

SDP = (
    b"v=0\r\no=alice 2890844526 2890844526 IN IP4 192.0.2.10\r\ns=call\r\n"
    b"c=IN IP4 192.0.2.10\r\nt=0 0\r\nm=audio 49170 RTP/AVP 0 8 101\r\n"
    b"a=rtpmap:0 PCMU/8000\r\na=rtpmap:8 PCMA/8000\r\na=rtpmap:101 telephone-event/8000\r\n"
    b"a=fmtp:101 0-16\r\na=ptime:20\r\na=sendrecv\r\n"
)
INVITE = (
    b"INVITE sip:7000@127.0.0.1:5060 SIP/2.0\r\n"
    b"Via: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bK776asdhds;rport\r\n"
    b"Max-Forwards: 70\r\nTo: <sip:7000@127.0.0.1>\r\n"
    b'From: "Alice" <sip:alice@127.0.0.1:5070>;tag=1928301774\r\n'
    b"Call-ID: a84b4c76e66710@127.0.0.1\r\nCSeq: 314159 INVITE\r\n"
    b"Contact: <sip:alice@127.0.0.1:5070>\r\nSupported: timer, replaces\r\n"
    b"Session-Expires: 1800;refresher=uac\r\nAllow: INVITE, ACK, BYE, CANCEL, OPTIONS\r\n"
    b"Content-Type: application/sdp\r\nContent-Length: " + str(len(SDP)).encode() + b"\r\n\r\n"
) + SDP
OPTIONS = (
    b"OPTIONS sip:bridge@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bKx\r\n"
    b"Max-Forwards: 70\r\nTo: <sip:bridge@127.0.0.1>\r\nFrom: <sip:p@127.0.0.1>;tag=9\r\n"
    b"Call-ID: opt-1\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
)
RESPONSE = (
    b"SIP/2.0 401 Unauthorized\r\nVia: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKr\r\n"
    b"To: <sip:u@h>;tag=x\r\nFrom: <sip:u@h>;tag=y\r\nCall-ID: r\r\nCSeq: 2 REGISTER\r\n"
    b'WWW-Authenticate: Digest realm="h", nonce="abc", qop="auth", algorithm=SHA-256\r\n'
    b"Content-Length: 0\r\n\r\n"
)
RTP = bytes.fromhex("80e0 1234 0000 a0f0 deadbeef".replace(" ", "")) + bytes(160)
RTP_EXT = bytes.fromhex("b0000001000000a0cafebabe00000001bede000112345678") + bytes(8) + b"\x00\x02"
EVENT = bytes.fromhex("018a0320")
RTCP = serialize_compound(
    [
        SenderReport(0x12345678, 0xE5A1B2C3D4E5F607, 1000, 16, 2560,
                     (ReportBlock(0xCAFE, 3, 12, 70000, 40, 0x1234, 0x10),)),
        SourceDescription((SdesChunk(0x12345678, ((1, b"bridge@127.0.0.1"),)),)),
        Bye((0x12345678,), b"over"),
    ]
)  # fmt: skip
CONFIG_FILE = ROOT / "config" / "bridge.toml"  # relative paths in it resolve from here
CONFIG = CONFIG_FILE.read_bytes()
CONFIG_SMALL = (  # every section, few comments: ~10x the inputs per second of the file
    b'[sip]\nlisten = "127.0.0.1:5060"\ntransports = ["udp", "tcp"]\nmax_calls = 100\n'
    b'[sip.timers]\nt1 = 0.5\n[rtp]\nports = "20000-20999"\ntimeout_s = 30\n'
    b'[jitter]\nmin_delay_ms = 20\n[agent]\nname = "echo"\n[agent.echo]\ndelay_s = 0.5\n'
    b'[models]\ndevice = "cpu"\n[inbound]\nburst = 100\n[node]\nname = "n1"\n'
    b'[mqtt]\nport = 1883\n[metrics]\nlisten = "127.0.0.1:9464"\n'
    b'[[trunks]]\nname = "pbx"\nacl = ["10.0.0.0/8"]\n'
    b'[[routes]]\nname = "r"\ncalled = "70*"\ntrunk = "pbx"\nagent = "tone"\n'
)


def _ua() -> Callable[[bytes], object]:
    ua = BridgeUA(BridgeConfig().sip, 5060, "127.0.0.1", 0.0)
    clock = [0.0]

    def feed(data: bytes) -> object:
        clock[0] += 0.01
        events = ua.receive_bytes(data, ("127.0.0.1", 5070), "udp", clock[0])
        ua.tick(clock[0])
        return events

    return feed


def _config(data: bytes) -> object:
    return parse_config_text(data.decode("utf-8", "replace"), str(CONFIG_FILE))


@dataclass
class Target:
    name: str
    seeds: list[bytes]
    run: Callable[[bytes], object]
    refusal: tuple[type[BaseException], ...] = (ValueError,)  # what a refusal may raise


def targets() -> list[Target]:
    return [
        Target("sip", [INVITE, OPTIONS, RESPONSE], parse_message),
        Target("sdp", [SDP], parse_sdp),
        Target("rtp", [RTP, RTP_EXT], RtpPacket.parse),
        Target("rfc4733", [EVENT], TelephoneEvent.parse),
        Target("rtcp", [RTCP], parse_compound),
        Target("config", [CONFIG_SMALL, CONFIG], _config),
        Target("ua", [INVITE, OPTIONS, RESPONSE], _ua(), refusal=()),
    ]


def mutate(rng: random.Random, data: bytes, seeds: list[bytes]) -> bytes:
    """One to four random edits of ``data`` (or random bytes, one time in 50)."""
    if rng.random() < 0.02:
        return rng.randbytes(rng.randrange(0, 300))
    b = bytearray(data)
    for _ in range(rng.randrange(1, 5)):
        op = rng.randrange(8)
        pos = rng.randrange(len(b) + 1)
        if op == 0 and b:  # flip a bit
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # insert bytes (often structure: CRLF, colon, digits)
            b[pos:pos] = rng.choice(
                [b"\r\n", b":", b";", b",", b"<", b">", b"\x00", b"9" * rng.randrange(1, 20),
                 b" ", b"\xff\xfe", rng.randbytes(rng.randrange(1, 8))]
            )  # fmt: skip
        elif op == 2 and b:  # delete a run
            del b[pos : pos + rng.randrange(1, 16)]
        elif op == 3:  # truncate
            del b[pos:]
        elif op == 4:  # splice another seed's tail
            other = rng.choice(seeds)
            b[pos:] = other[rng.randrange(len(other) + 1) :]
        elif op == 5 and b:  # repeat a run
            run = b[pos : pos + rng.randrange(1, 32)]
            b[pos:pos] = run * rng.randrange(2, 50)
        elif op == 6 and b:  # a random byte
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 7:  # a number at its limits
            b[pos:pos] = rng.choice([b"4294967296", b"-1", b"0", b"65536", b"1e309", b"NaN"])
    return bytes(b)


def fuzz(target: Target, inputs: int, seed: int, save: bool = True) -> dict[str, object]:
    rng = random.Random(f"{seed}:{target.name}")
    crashes: list[str] = []
    refused = 0
    t0 = time.perf_counter()
    for n in range(inputs):
        data = mutate(rng, rng.choice(target.seeds), target.seeds)
        try:
            target.run(data)
        except target.refusal:
            refused += 1
        except Exception as exc:  # a crash: keep the input, go on
            crashes.append(f"{type(exc).__name__}: {exc}"[:200])
            if save:
                OUT.mkdir(parents=True, exist_ok=True)
                (OUT / f"{target.name}-{n}.bin").write_bytes(data)
                (OUT / f"{target.name}-{n}.txt").write_text(traceback.format_exc())
    took = time.perf_counter() - t0
    return {
        "inputs": inputs,
        "refused": refused,
        "crashes": len(crashes),
        "first_crashes": crashes[:5],
        "inputs_per_s": round(inputs / took),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--inputs", type=int, default=1_000_000, help="per target")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--targets", default="", help="comma-separated; default: all")
    args = ap.parse_args(argv)
    chosen = [t for t in targets() if not args.targets or t.name in args.targets.split(",")]
    result = {t.name: fuzz(t, args.inputs, args.seed) for t in chosen}
    print(json.dumps({"bench": "fuzz", "seed": args.seed, "targets": result}, indent=1))
    return 1 if any(r["crashes"] for r in result.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

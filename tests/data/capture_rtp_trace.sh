#!/usr/bin/env bash
# Reproduce tests/data/rtp_loopback_pcmu.pcap: one SIP call on 127.0.0.1 between two
# sipp instances (uas_answer.xml answers, uac_rtp_stream.xml calls) while the UAC streams
# 16 s of G.711 mu-law (PT 0, 20 ms packets) with sipp's rtp_stream, captured by tshark.
#
# Needs root (capture on lo) and: apt-get install -y sip-tester tshark
# Usage: tests/data/capture_rtp_trace.sh [OUTPUT.pcap]
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-$HERE/rtp_loopback_pcmu.pcap}
RTP_PORT=6000          # the m= port in uas_answer.xml (a UDP sink listens there)
UAS_SIP_PORT=5070
UAC_SIP_PORT=5071
UAC_MEDIA_PORT=6200    # sipp -mp base for the UAC's own SDP port
PY=${PYTHON:-python3}

WORK=$(mktemp -d /tmp/sipbridge-capture.XXXXXX)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

# 1. The audio: 16.0 s, 8 kHz, raw mu-law (no header): 440 Hz + 1 kHz, the 1 kHz tone
#    slowly amplitude-modulated (0.37 Hz: the waveform only repeats after 100 s) so that
#    packets can be told apart (768 of the 800 payloads are distinct after mu-law
#    quantisation).
"$PY" - "$WORK/tone_440_1000.ulaw" <<'PYEOF'
import math
import sys

RATE = 8000
SECONDS = 16.0


def lin2ulaw(sample: int) -> int:
    """G.711 mu-law encode one int16 sample (bias 0x84, clip 32635)."""
    sign = 0x80 if sample < 0 else 0
    mag = min(-sample if sample < 0 else sample, 32635) + 0x84
    exponent = max(0, min(7, mag.bit_length() - 8))
    mantissa = (mag >> (exponent + 3)) & 0x0F
    return ~(sign | (exponent << 4) | mantissa) & 0xFF


out = bytearray()
for n in range(int(RATE * SECONDS)):
    t = n / RATE
    env = 0.6 + 0.4 * math.sin(2 * math.pi * 0.37 * t)
    x = 0.30 * math.sin(2 * math.pi * 440 * t) + 0.25 * env * math.sin(2 * math.pi * 1000 * t)
    out.append(lin2ulaw(round(x * 32767)))
with open(sys.argv[1], "wb") as f:
    f.write(out)
PYEOF
cp "$HERE/uas_answer.xml" "$HERE/uac_rtp_stream.xml" "$WORK/"

# 2. A UDP sink on the RTP (and RTCP) port: sipp's rtp_stream uses a connected socket and
#    closes it on ECONNREFUSED, so an ICMP port-unreachable would cut the stream short.
"$PY" - "$RTP_PORT" <<'PYEOF' &
import selectors
import socket
import sys
import time

port = int(sys.argv[1])
sel = selectors.DefaultSelector()
for p in (port, port + 1):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", p))
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    for key, _ in sel.select(timeout=0.5):
        key.fileobj.recv(4096)  # type: ignore[union-attr]
PYEOF
PIDS+=($!)

# 3. The capture. Wait until tshark has really started capturing.
tshark -i lo -f "udp and portrange 6000-7000" -F pcap -w "$WORK/capture.pcap" \
    >"$WORK/tshark.log" 2>&1 &
TSHARK_PID=$!
PIDS+=($TSHARK_PID)
for _ in $(seq 100); do
    grep -q "Capturing on" "$WORK/tshark.log" && break
    sleep 0.1
done
grep -q "Capturing on" "$WORK/tshark.log" || { cat "$WORK/tshark.log"; exit 1; }
sleep 0.5

# 4. The call.
(cd "$WORK" && sipp -sf uas_answer.xml -i 127.0.0.1 -p "$UAS_SIP_PORT" -mi 127.0.0.1 \
    -m 1 -nostdin -timeout 60s -timeout_error >"$WORK/uas.log" 2>&1) &
UAS_PID=$!
PIDS+=($UAS_PID)
sleep 0.5
(cd "$WORK" && sipp "127.0.0.1:$UAS_SIP_PORT" -sf uac_rtp_stream.xml -i 127.0.0.1 \
    -p "$UAC_SIP_PORT" -mi 127.0.0.1 -mp "$UAC_MEDIA_PORT" -m 1 -nostdin \
    -timeout 60s -timeout_error >"$WORK/uac.log" 2>&1) || { tail -40 "$WORK/uac.log"; exit 1; }
wait "$UAS_PID" || { tail -40 "$WORK/uas.log"; exit 1; }

# 5. Stop the capture cleanly (SIGINT flushes the file) and keep it.
sleep 0.5
kill -INT "$TSHARK_PID"
wait "$TSHARK_PID" || true
install -m 644 "$WORK/capture.pcap" "$OUT"
echo "wrote $OUT ($(stat -c %s "$OUT") bytes)"
capinfos "$OUT" 2>/dev/null | grep -E "Number of packets|Capture duration|File encapsulation" || true

#!/bin/bash
# Whole turns and calls per GPU on a lent GPU machine, with the runtime bench/gpu_pack.sh packed.
#
#   PARTS=/tmp/p TOOLS=.gpu/tools OUT=/some/dir bench/gpu_turns.sh     (from the repo root)
#
# (The tool that lends the machine removes a carried path at its next call unless carried
# again: move each part to $PARTS as it arrives, and carry .gpu/tools and .gpu/sum last.)
#
# Unpacks the parts once into $G (default /tmp/g; a warm machine keeps it), puts the packed
# compiled media path beside its sources, then runs with the models on CUDA:
# bench/turn_latency.py (1 call, 10 turns; 8 calls at once, 5 turns each) and
# bench/agent_load.py ($CALLS, default "24 48", for $MINUTES each), and one call's turns with
# the models on the CPU of the same machine. config/bridge.toml is edited per run (device,
# workers) and restored at the end. Everything lands in $OUT/gpu_turns.tgz after each step.
set -u
ROOT=$(pwd); G=${G:-/tmp/g}; PARTS=${PARTS:-/tmp/p}; TOOLS=${TOOLS:-$ROOT/.gpu/tools}; OUT=${OUT:?}
if [ ! -x "$G/py/bin/python3.11" ]; then
  [ "$(cat "$PARTS"/part* | sha256sum | cut -c1-64)" = "$(cat "${SUM:-$TOOLS/../sum}")" ] \
    || { echo "the parts in $PARTS do not add up to their sum"; exit 3; }
  Z=zstd; command -v zstd >/dev/null || Z="env LD_LIBRARY_PATH=$TOOLS $TOOLS/zstd"
  mkdir -p "$G" && cat "$PARTS"/part* | $Z -q -d --long=27 | tar -C "$G" -xf - || exit 3
fi
tar -xf "$G/native.tar"
NV=$(find / -path /proc -prune -o -type d -path '*site-packages/nvidia/*' -name lib -print 2>/dev/null | paste -sd:)
export PYTHONHOME=$G/py PYTHONPATH=$ROOT:$G/site LD_LIBRARY_PATH=$G/lib${NV:+:$NV} PYTHONNOUSERSITE=1 \
  PATH=$G/espeak/bin:$G/py/bin:$PATH ESPEAK_DATA_PATH=$G/espeak/data SIP_BRIDGE_MODELS=$G/models PYTHONUNBUFFERED=1
PY=$G/py/bin/python3.11
W=$(mktemp -d)/gpu_turns; mkdir -p "$W"; cp config/bridge.toml "$W/bridge.orig.toml"
trap 'cp "$W/bridge.orig.toml" config/bridge.toml' EXIT
save() { tar -czf "$OUT/gpu_turns.tgz" -C "$(dirname "$W")" gpu_turns; }
cfg() { # device workers
  sed -e "s/^device = .*/device = \"$1\"/" -e "s/^workers = .*/workers = $2/" "$W/bridge.orig.toml" > config/bridge.toml
}
nvidia-smi -L; nproc
(nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader -l 1 > "$W/gpu.csv" 2>&1 &)
$PY -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())"
tl() { # name seconds args...
  n=$1; to=$2; shift 2; t0=$(date +%s)
  timeout "$to" $PY bench/turn_latency.py "$@" > "$W/$n.out" 2> "$W/$n.err"; echo "$n rc=$? $(( $(date +%s) - t0 )) s"
  cp "$(ls -t bench/out/turn_latency*.json | head -1)" "$W/$n.json"
  $PY -c "import json; d = json.load(open('$W/$n.json')); print(d['answered_turns'], d['latency_ms'], d['cpu_percent_of_one_core'], d['stages'])"
  save
}
al() { # device calls seconds
  t0=$(date +%s)
  timeout "$3" $PY bench/agent_load.py --calls "$2" --minutes "${MINUTES:-0.75}" --out "$W/al_$1_$2.json" > "$W/al_$1_$2.out" 2>&1
  echo "agent_load $1 $2 rc=$? $(( $(date +%s) - t0 )) s"
  $PY - "$W/al_$1_$2.json" <<'PYEOF'
import json, sys
for r in json.load(open(sys.argv[1]))["runs"]:
    keep = ("placed", "completed", "failed", "refused", "turn_latency_ms", "dead_air_s", "cpu_pct")
    print({k: r[k] for k in keep}, r["bridge_media"], r["bridge_turn_stages_ms"], r["bridge_status"]["models"])
PYEOF
  save
}
D=${DEVICE:-cuda}  # DEVICE=auto tries the script on a machine without a GPU
cfg "$D" 8; tl tl_cuda_1 110 --turns 10
for n in ${CALLS:-24 48}; do al "$D" "$n" 150; done
tl tl_cuda_8 90 --calls 8 --turns 5
cfg cpu 2; tl tl_cpu_1 90 --turns 8

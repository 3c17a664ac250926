#!/bin/bash
# Pack this machine's bridge runtime for a GPU machine that has no network and another Python.
#
#   bench/gpu_pack.sh [OUTDIR]        (default .gpu, which git ignores)
#
# Carries what `bench/gpu_turns.sh` needs to run the real bridge and benches there: the
# Python 3.11 interpreter and standard library of this Debian machine, the venv's runtime
# packages with onnxruntime-gpu in place of onnxruntime (its wheel: $ORT_GPU_WHEEL, else
# downloaded), the compiled media path, espeak-ng with its data (the benches' callers), the
# speech models, and the shared libraries of all that except glibc's. Out: OUTDIR/part00..
# (zstd, 58 MiB each: one per call of a tool that carries at most 64 MiB), OUTDIR/sum, and
# OUTDIR/tools (zstd, for a machine without it). Measured with it: docs/models.md, "GPU".
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUTDIR=$(realpath -m "${1:-$ROOT/.gpu}")
SP=$ROOT/.venv/lib/python3.11/site-packages
MODELS=${SIP_BRIDGE_MODELS:-$HOME/.cache/sip-bridge/models}
ORT_GPU=$(sed -n 's/^ORT_GPU := //p' "$ROOT/Makefile")  # the version `make GPU=1` installs
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
S=$T/stage; mkdir -p "$S"/py/bin "$S"/py/lib "$S"/site "$S"/lib "$S"/espeak/bin "$S"/espeak/data "$S"/models
cp /usr/bin/python3.11 "$S"/py/bin/
tar -C /usr/lib -cf - --exclude python3.11/test --exclude python3.11/idlelib \
  --exclude python3.11/tkinter --exclude python3.11/lib2to3 --exclude python3.11/ensurepip \
  --exclude 'python3.11/config-3.11*' --exclude python3.11/turtledemo python3.11 | tar -C "$S"/py/lib -xf -
# the runtime packages (no test, lint or plotting tools), onnxruntime-gpu for onnxruntime
keep=$(cd "$SP" && for p in *; do case $p in
  mypy|mypy-*|mypyc|selenium*|matplotlib*|fontTools*|fonttools*|kiwisolver*|contourpy*|PIL|pillow*|\
  pytest*|_pytest|hypothesis*|ruff*|sipvicious*|pip|pip-*|setuptools*|pkg_resources|_distutils_hack|\
  onnxruntime|onnxruntime-*|trio*|websocket*|__editable__*|*.pth) ;; *) echo "$p" ;; esac; done)
# shellcheck disable=SC2086
tar -C "$SP" -cf - --exclude '*/tests' $keep | tar -C "$S"/site -xf -
wheel=${ORT_GPU_WHEEL:-}
if [ -z "$wheel" ]; then
  "$ROOT"/.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
    --implementation cp --platform manylinux_2_28_x86_64 -d "$T"/whl "$ORT_GPU"
  wheel=$(ls "$T"/whl/onnxruntime_gpu-*.whl)
fi
"$ROOT"/.venv/bin/python -m pip install -q --no-deps --no-compile --target "$S"/site "$wheel"
# shared libraries: the interpreter's extension modules' and espeak-ng's, never glibc's own
for f in "$S"/py/lib/python3.11/lib-dynload/*.so /usr/bin/espeak-ng; do ldd "$f"; done \
  | awk '/=> \//{print $3}' | sort -u \
  | grep -v -E '/(libc|libm|libpthread|libdl|librt|libresolv|libutil|libanl)\.so|/ld-linux' \
  | while read -r l; do cp -L "$l" "$S"/lib/; done
cp /usr/bin/espeak-ng "$S"/espeak/bin/
cp -a /usr/lib/x86_64-linux-gnu/espeak-ng-data "$S"/espeak/data/
for m in moonshine-base-en piper-joe-medium silero-vad smart-turn-v3.2 beckett; do cp -a "$MODELS/$m" "$S"/models/; done
# the compiled media path (the .so beside each source) and the manifest it is checked against
(cd "$ROOT" && { git ls-files -o -i --exclude-standard -- '*.so' | grep -v '^\.venv/'; echo build/native/manifest.json; } \
  | tar -cf "$S"/native.tar -T -)
mkdir -p "$OUTDIR"/tools && rm -f "$OUTDIR"/part*
tar -C "$S" -cf - . | zstd -q -19 -T0 --long=27 | split -b 58M -d - "$OUTDIR"/part
cat "$OUTDIR"/part* | sha256sum | cut -c1-64 > "$OUTDIR"/sum
cp /usr/bin/zstd "$OUTDIR"/tools/
ldd /usr/bin/zstd | awk '/=> \//{print $3}' | grep -v -E '/(libc|libm|libpthread)\.so' \
  | while read -r l; do cp -L "$l" "$OUTDIR"/tools/; done
ls -la "$OUTDIR"
